"""Copy kcops into a folder that an engine's Python puts on ``PYTHONPATH``.

The vLLM overlay's init container runs ``python -m kcops.agent.engine_site
/opt/kcops-site`` from the kcops image; the engine container then starts with
``PYTHONPATH=/opt/kcops-site``. The copy holds the ``kcops`` package and a
small ``kcops-<version>.dist-info`` carrying only the engine plugin entry
points, so ``importlib.metadata`` (which scans every ``sys.path`` entry) finds
``vllm.general_plugins`` -> ``kcops_probe`` without pip touching the engine's
environment. Only ``kcops`` is copied: the engine keeps its own torch,
pydantic and every other package (``PYTHONPATH`` comes before site-packages,
so anything more would shadow the engine's versions).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import shutil
import sys
from pathlib import Path

# Entry point groups an engine loads plugins from; the console script stays out.
PLUGIN_GROUPS = ("vllm.general_plugins",)


def _entry_points_txt() -> str:
    try:
        eps = md.distribution("kcops").entry_points
    except md.PackageNotFoundError:
        eps = md.EntryPoints(())
    lines: list[str] = []
    for group in PLUGIN_GROUPS:
        chosen = [ep for ep in eps if ep.group == group]
        if not chosen:
            # A source checkout run without an install still names the plugin.
            chosen = [
                md.EntryPoint(
                    "kcops_probe", "kcops.kernels.integrations.vllm_plugin:register", group
                )
            ]
        lines.append(f"[{group}]")
        lines += [f"{ep.name} = {ep.value}" for ep in chosen]
        lines.append("")
    return "\n".join(lines)


def install(target: Path) -> Path:
    """Copy the running kcops package and its plugin metadata into ``target``.

    Returns the dist-info folder written. An earlier copy is replaced. Raises
    OSError when ``target`` cannot be written.
    """
    import kcops

    src = Path(kcops.__file__).resolve().parent
    target.mkdir(parents=True, exist_ok=True)
    dest = target / "kcops"
    if dest.exists():
        shutil.rmtree(dest)
    # symlinks=False: a source checkout's kcops/agent -> ../agent become real folders.
    shutil.copytree(src, dest, symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    version = getattr(kcops, "__version__", "0")
    for old in target.glob("kcops-*.dist-info"):
        shutil.rmtree(old)
    info = target / f"kcops-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kcops\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(_entry_points_txt())
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("target", type=Path, help="folder to fill, e.g. /opt/kcops-site")
    args = ap.parse_args(argv)
    try:
        info = install(args.target)
    except OSError as exc:
        print(f"error: cannot write {args.target}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"kcops copied to {args.target} ({info.name})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
