#!/usr/bin/env bash
# The GPU path in one run, for a machine with an NVIDIA GPU, PyTorch (and transformers, which
# such images carry beside it) and no package registry. Ends in one line:
#   device check: P passed, F failed, S skipped in T s
# Here:   make gpu-wheels                       (kcops and its runtime wheels -> build/gpu-wheels)
#         tests/gpu/device_check.sh --dry-run   (what it would run, the wheels it carries)
# There:  tests/gpu/device_check.sh             (from a copy of the checkout with build/gpu-wheels)
set -u
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
WHEELS=build/gpu-wheels
EXTRA=(nvtx pytest pytest-timeout)
KC_TEST=tests/unit/kernels/test_gpu.py::test_sdpa_cuda_kc_matches_full_matrix
# The files holding gpu-marked tests: collecting all of tests/ would need the dev-only packages.
mapfile -t GPU_FILES < <(grep -rlE 'mark\.gpu' tests --include='test_*.py' | grep -v '^tests/gpu/' | sort)
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -rfEs)
declare -A RUN=(
  [install]="$PY -m pip install -q --no-index --find-links $WHEELS kcops ${EXTRA[*]}"
  [cuda]="$PY -c 'import torch; assert torch.cuda.is_available(), \"torch sees no CUDA device\"; print(torch.cuda.get_device_name())'"
  [gpu-tests]="${PYTEST[*]} -m gpu --deselect $KC_TEST ${GPU_FILES[*]}"
  [nvml]="${PYTEST[*]} tests/gpu/test_nvml_device.py"
  [kc-cuda]="${PYTEST[*]} $KC_TEST"
  [overhead]="PYTHONPATH=. KCOPS_CACHE_DIR=$WHEELS $PY bench/probe_overhead.py --model tiny --device cuda --modes nvtx,default --pairs 10 --tokens 512"
)
ORDER=(install cuda gpu-tests nvml kc-cuda overhead)

if [ "${1:-}" = --build-wheels ]; then # make gpu-wheels: CPython 3.12 on x86-64, the lent machines'
  rm -rf "$WHEELS" && mkdir -p "$WHEELS" || exit 1
  "$PY" -m pip wheel -q --no-deps -w "$WHEELS" . || exit 1
  "$PY" -m pip download -q -d "$WHEELS" --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 "$WHEELS"/kcops-*.whl "${EXTRA[@]}" || exit 1
  # The tiny model of the overhead check reads the SmolLM2 tokenizer (3 MB), not its weights.
  "$PY" -c "import pathlib, kcops.worker.models as m; m.load_tokenizer(progress=False, root=pathlib.Path('$WHEELS'))"
  exit
fi

if [ "${1:-}" = --dry-run ]; then
  for name in "${ORDER[@]}"; do echo "check $name: ${RUN[$name]}"; done
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    du -b "$WHEELS"/*.whl | awk '{sub(".*/", "", $2); print "wheel " $2 " " $1 " B"; t += $1}
      END {printf "wheels: %d files, %.1f MiB", NR, t / 1048576}'
    echo "; carried with the tokenizer: $(du -sm "$WHEELS" | cut -f1) MiB (at most 64)"
  else
    reqs=$("$PY" -c "import configparser as c; p = c.ConfigParser(); p.read('setup.cfg'); print(*p['options']['install_requires'].split())")
    echo "wheels: not built (make gpu-wheels); it brings kcops $reqs ${EXTRA[*]}, for CPython 3.12 x86-64"
  fi
  exit 0
fi

start=$SECONDS passed=0 failed=0 skipped=0 cuda_ok=0
for name in "${ORDER[@]}"; do
  if [ "$name" != install ] && [ "$name" != cuda ] && [ "$cuda_ok" != 1 ]; then
    echo "=== $name: skipped (no CUDA device)"
    skipped=$((skipped + 1))
    continue
  fi
  echo "=== $name: ${RUN[$name]}"
  # Each check is bounded so that the whole run stays under 5 minutes on a lent machine.
  if timeout 150 bash -c "${RUN[$name]}"; then
    passed=$((passed + 1))
    [ "$name" = cuda ] && cuda_ok=1
  else
    failed=$((failed + 1))
    [ "$name" = cuda ] && cuda_ok=0
  fi
done
echo "device check: $passed passed, $failed failed, $skipped skipped in $((SECONDS - start)) s"
[ "$failed" = 0 ]
