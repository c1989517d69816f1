"""YAML is parsed in one place, the bounded loader: no other module calls PyYAML's loaders."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
PACKAGES = ("agent", "kernels", "worker", "dashboards", "alerts", "kcops/cli", "kcops")
LOADERS = re.compile(r"\byaml\.(?:safe_load|load|full_load|unsafe_load|load_all|safe_load_all)\(")


def test_only_yamlload_parses_yaml() -> None:
    offenders = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).glob("**/*.py" if pkg != "kcops" else "*.py")):
            if path == REPO / "agent" / "yamlload.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if LOADERS.search(line):
                    offenders.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not offenders, "parse YAML with kcops.agent.yamlload:\n" + "\n".join(offenders)
