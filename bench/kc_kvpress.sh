#!/usr/bin/env bash
# The K(C) claim against NVIDIA's kvpress (docs/kc.md, "kcops against kvpress"): every
# cell x method x keep ratio, with intervals, then one verdict line per method and cell.
#
#   make kc-kvpress                                   # every cell (many hours on 2 cores)
#   make kc-kvpress KC_KVPRESS_ARGS="prose-2k code-2k"  # some cells
#
# Cells: prose-2k code-2k heldout-2k prose-8k code-8k retrieval. Each sweep folder under
# $OUT (default build/kc-kvpress) resumes where it stopped; the tables are
# $OUT/methods.md (kc claim --by-method over the sweeps) and $OUT/retrieval.md.
# Settings: SEQS (16 at 2k; 8k uses 8), EVAL (64; 128 at 8k), KEEPS, THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
KC=".venv/bin/kcops kc"
OUT=${OUT:-build/kc-kvpress}
SEQS=${SEQS:-16}
EVAL=${EVAL:-64}
KEEPS=${KEEPS:-0.25,0.5,0.75}
THREADS=${THREADS:-2}
HELDOUT=${HELDOUT:-/usr/share/doc/nodejs/api}
OWN="uniform,per_layer"
PRESSES="kvpress:snapkv,kvpress:streamingllm,kvpress:expected,kvpress:knorm,kvpress:tova"
PRESSES+=",kvpress:pyramidkv,kvpress:adakv,kvpress:kc"
PRESSES+=",kvpress:streamingllm+decode,kvpress:knorm+decode,kvpress:tova+decode"
PRESSES+=",kvpress:expected+decode"
CELLS=("$@")
[ ${#CELLS[@]} -gt 0 ] || CELLS=(prose-2k code-2k heldout-2k retrieval prose-8k code-8k)

sweep() {  # cell corpus context sequences eval
    $KC sweep --model smollm2 --threads "$THREADS" --corpus "$2" --context "$3" \
        --sequences "$4" --eval-tokens "$5" --keep "$KEEPS" --policies "$OWN,$PRESSES" \
        --out "$OUT/$1" >/dev/null
}

mkdir -p "$OUT"
folders=()
for cell in "${CELLS[@]}"; do
    echo "== $cell"
    case "$cell" in
    prose-2k) sweep "$cell" pydoc 2048 "$SEQS" "$EVAL" ;;
    code-2k) sweep "$cell" stdlib 2048 "$SEQS" "$EVAL" ;;
    heldout-2k) sweep "$cell" "$HELDOUT" 2048 "$SEQS" "$EVAL" ;;
    prose-8k) sweep "$cell" pydoc 8160 8 128 ;;
    code-8k) sweep "$cell" stdlib 8160 8 128 ;;
    retrieval)
        $KC retrieve --model smollm2 --threads "$THREADS" --task passkey --lengths 512 \
            --depths 0.1,0.5,0.9 --items 40 --n 128,256,384 --policies "$OWN,$PRESSES" \
            --out "$OUT/retrieval" >/dev/null
        ;;
    *) echo "unknown cell $cell: allowed prose-2k code-2k heldout-2k prose-8k code-8k retrieval" >&2
       exit 2 ;;
    esac
    [ "$cell" = retrieval ] || folders+=("$OUT/$cell")
done
if [ ${#folders[@]} -gt 0 ]; then
    $KC claim --by-method "${folders[@]}" | tee "$OUT/methods.md"
fi
if [ -f "$OUT/retrieval/table.md" ]; then
    $KC claim --by-method "$OUT/retrieval" | tee "$OUT/retrieval.md"
fi
