"""Cut a corpus folder into parts for a sweep run in batches (``kc claim --pool``).

At 8,160 tokens one ``kc sweep`` batch of 8 sequences peaks at 17-19 GB, so a sweep
with more sequences runs as several folders over disjoint text. This writes
``part1.md``, ``part2.md``, ... into OUT: the folder's text files (the suffixes
``kc sweep --corpus FOLDER`` reads) in the same sorted order, whole files appended
to a part until it holds at least ``--sequences`` x (``--context`` + 1) tokens of
the model's tokenizer, with a margin. The text left over after the last full part is
not written. docs/kc-record.md's "Prose at 8,160 tokens, with the power to decide" used:

    PYTHONPATH=. .venv/bin/python bench/corpus_parts.py /usr/share/doc/nodejs/api nodejs8k
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MARGIN_TOKENS = 2000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="the corpus folder")
    ap.add_argument("out", type=Path, help="where part1.md, part2.md, ... are written")
    ap.add_argument("--model", default="smollm2", help="whose tokenizer counts the tokens")
    ap.add_argument("--context", type=int, default=8160)
    ap.add_argument("--sequences", type=int, default=8, help="sequences a part must hold")
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"corpus_parts: {args.folder} is not a folder", file=sys.stderr)
        return 2
    if args.context < 2 or args.sequences < 1:
        print("corpus_parts: --context must be >= 2 and --sequences >= 1", file=sys.stderr)
        return 2

    from kcops.lab.sweep import corpus_files
    from kcops.worker.models import load_model

    _, tok = load_model(args.model, progress=False)
    need = args.sequences * (args.context + 1) + MARGIN_TOKENS
    args.out.mkdir(parents=True, exist_ok=True)
    texts: list[str] = []
    tokens, written = 0, 0
    for f in corpus_files(args.folder):
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # not corpus text, as kc sweep skips it
        texts.append(text)
        tokens += len(tok(text, add_special_tokens=False).input_ids)
        if tokens >= need:
            written += 1
            (args.out / f"part{written}.md").write_text("\n\n".join(texts), encoding="utf-8")
            print(f"part{written}.md: {len(texts)} files, {tokens:,} tokens")
            texts, tokens = [], 0
    if not written:
        print(f"corpus_parts: {args.folder} holds fewer than {need:,} tokens", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
