"""The hand-written pages: user pages that stay user pages, with the history of runs apart."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DOCS = REPO / "docs"
# Generated from the code's docstrings (docs/reference/): what they say is checked there.
PAGES = [*DOCS.glob("*.md"), REPO / "README.md"]
RECORDS = {"kc-record.md", "benchmarks-record.md"}
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()


def test_no_page_cites_a_document_the_reader_does_not_have() -> None:
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert "DESIGN" not in text, f"{page.name} cites DESIGN: the map is docs/architecture.md"
        if page.name not in RECORDS:
            assert not re.search(r"\b[Ii]ssue \d", text), f"{page.name} names an issue"


def test_user_pages_are_short_and_their_records_are_in_the_site() -> None:
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    for page, record in (("kc.md", "kc-record.md"), ("benchmarks.md", "benchmarks-record.md")):
        lines = (DOCS / page).read_text(encoding="utf-8").count("\n")
        assert lines <= 400, f"docs/{page} is {lines} lines: the history goes to docs/{record}"
        assert f"]({record})" in (DOCS / page).read_text(encoding="utf-8"), page
        assert f": {record}" in nav, record


def test_no_file_cites_the_internal_design_notes() -> None:
    """Code, configuration and docs point at docs/architecture.md, never at a document
    that is not in the repository."""
    out = subprocess.run(
        ["git", "grep", "-n", "-I", "-E", r"DESIGN(\.md)? §", "--", ".", f":!{THIS}"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    assert out.stdout == "", out.stdout[:2000]
