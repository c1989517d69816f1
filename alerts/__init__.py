"""Data: the alert table (rules.yaml) and its promtool unit tests."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def packaged_file(name: str) -> Path:
    """Path of a file shipped in this package (``rules.yaml``, ``tests/<x>.yaml``).

    Works for an editable checkout and a pip-installed wheel alike; raises
    FileNotFoundError when the file is not there.
    """
    ref = resources.files(__name__).joinpath(name)
    path = Path(str(ref))
    if not path.is_file():
        raise FileNotFoundError(f"kcops.alerts: no packaged file {name!r}")
    return path


def packaged_tests() -> list[Path]:
    """The promtool unit-test files shipped beside rules.yaml, sorted."""
    root = Path(str(resources.files(__name__).joinpath("tests")))
    return sorted(root.glob("*.yaml"))
