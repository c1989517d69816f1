"""``KCOPS_PROBE=1 python -m kcops.kernels.run -- CMD…``: run an engine with the probe, no code
changes.

It writes a ``sitecustomize.py`` that calls :func:`kcops.kernels.install` (with the
``KCOPS_PROBE_*`` settings, see :meth:`ProbeConfig.from_env`) into a new private temporary
folder, puts that folder first on ``PYTHONPATH`` and executes CMD: every Python process CMD
starts (vLLM's engine and workers included) installs the probe at startup. A
``sitecustomize`` already on the path is shadowed; set ``PYTHONPATH`` yourself to keep it.
"""

from __future__ import annotations

import os
import sys

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
    """A new private folder (mode 0700, unpredictable name) holding ``sitecustomize.py``.

    Never a fixed path under /tmp: another local user could pre-create it or plant
    a symlink there and get code run in every Python process of the engine. One
    small folder per run is left in the temp dir (the engine replaces this process).
    """
    import tempfile

    path = tempfile.mkdtemp(prefix="kcops-autoload-")
    fd = os.open(
        os.path.join(path, "sitecustomize.py"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600
    )
    with os.fdopen(fd, "w") as fh:
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
