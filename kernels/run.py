"""``KCOPS_PROBE=1 python -m kcops.kernels.run -- CMD…``: run an engine with the probe, no code
changes.

It writes a ``sitecustomize.py`` that calls :func:`kcops.kernels.install` (with the
``KCOPS_PROBE_*`` settings, see :meth:`ProbeConfig.from_env`) into a folder next to the probe
socket, puts that folder first on ``PYTHONPATH`` and executes CMD: every Python process CMD
starts (vLLM's engine and workers included) installs the probe at startup. A
``sitecustomize`` already on the path is shadowed; set ``PYTHONPATH`` yourself to keep it.
"""

from __future__ import annotations

import os
import sys

from kcops.kernels.wire import default_socket_path

SITECUSTOMIZE = """\
# Written by kcops.kernels.run: install the kcops attention probe at interpreter start.
import os as _os

if _os.environ.get("KCOPS_PROBE", "").strip() == "1":
    try:
        import kcops.kernels as _kernels
        from kcops.kernels.config import ProbeConfig as _ProbeConfig

        _kernels.install(_ProbeConfig.from_env())
    except Exception as _exc:  # never stop the engine from starting
        import sys as _sys

        print(f"kcops probe not installed: {_exc!r}", file=_sys.stderr)
"""

USAGE = "usage: KCOPS_PROBE=1 python -m kcops.kernels.run -- CMD [ARGS...]"


def autoload_dir() -> str:
    """Folder holding the generated ``sitecustomize.py`` (created, mode 0700)."""
    path = os.path.join(os.path.dirname(default_socket_path()), "autoload")
    os.makedirs(path, mode=0o700, exist_ok=True)
    with open(os.path.join(path, "sitecustomize.py"), "w") as fh:
        fh.write(SITECUSTOMIZE)
    return path


def prepare_env(env: dict[str, str]) -> dict[str, str]:
    out = dict(env)
    out.setdefault("KCOPS_PROBE", "1")
    existing = out.get("PYTHONPATH", "")
    out["PYTHONPATH"] = autoload_dir() + (os.pathsep + existing if existing else "")
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print(USAGE, file=sys.stderr)
        return 2
    env = prepare_env(dict(os.environ))
    try:
        os.execvpe(args[0], args, env)
    except OSError as exc:
        print(f"cannot run {args[0]!r}: {exc}", file=sys.stderr)
        return 2
    return 0  # pragma: no cover - execvpe does not return


if __name__ == "__main__":
    sys.exit(main())
