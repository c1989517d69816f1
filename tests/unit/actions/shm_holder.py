"""A real engine-like process for the supervision tests (run as a script).

    python shm_holder.py ROOT [NAME...] [--close] [--exit CODE] [--exit-when PATH]
        [--ignore-term | --term-delay S] [--term-log PATH] [--shutdown-timeout N]
        [--child NAME...]

Maps each NAME under ROOT (creating it) as ``shm_open`` + ``mmap(MAP_SHARED)``
do, so it shows in ``/proc/<pid>/fd`` and ``/proc/<pid>/maps`` like vLLM's
``psm_*`` (``--close``: the mapping only). ``--child`` starts a child in the same
process group, with the same signal options, mapping the names after it.
Prints ``ready`` once all is mapped (the child's first). Then it exits with
CODE at once (``--exit``) or once PATH exists (``--exit-when``), leaving the
child running, or waits for a signal (120 s at most). On SIGTERM it appends
``<role> orphaned=<bool>`` to the ``--term-log`` (orphaned: its parent was gone
by then), waits
``--term-delay`` seconds (draining, as vLLM with ``--shutdown-timeout`` does)
and exits 0; ``--ignore-term`` ignores it. ``--shutdown-timeout`` is only there
to be read from the command line, as vLLM's is.
"""

from __future__ import annotations

import argparse
import mmap
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("names", nargs="*")
    ap.add_argument("--close", action="store_true")
    ap.add_argument("--exit", type=int, default=None)
    ap.add_argument("--exit-when", default=None)
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--term-delay", type=float, default=0.0)
    ap.add_argument("--term-log", default=None)
    ap.add_argument("--shutdown-timeout", type=int, default=0)
    ap.add_argument("--role", default="root")
    ap.add_argument("--child", nargs="*", default=None)
    return ap.parse_args(argv)


def on_term(args: argparse.Namespace, parent: int) -> None:
    def handler(*_: Any) -> None:
        if args.term_log:
            with open(args.term_log, "a") as fh:
                fh.write(f"{args.role} orphaned={os.getppid() != parent}\n")
        time.sleep(args.term_delay)
        os._exit(0)

    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, handler)


def main(argv: list[str]) -> None:
    args = parse(argv)
    on_term(args, os.getppid())
    held = []
    for name in args.names:
        fd = os.open(os.path.join(args.root, name), os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(fd, 4096)
        held.append(mmap.mmap(fd, 4096, mmap.MAP_SHARED))
        if args.close:
            os.close(fd)
    if args.child is not None:
        opts = ["--role", "child", "--term-delay", str(args.term_delay)]
        opts += ["--ignore-term"] if args.ignore_term else []
        opts += ["--term-log", args.term_log] if args.term_log else []
        child = subprocess.Popen(
            [sys.executable, __file__, args.root, *args.child, *opts],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    print("ready", flush=True)
    if args.exit is not None:
        while args.exit_when and not Path(args.exit_when).exists():
            time.sleep(0.02)
        os._exit(args.exit)
    signal.alarm(120)  # a safety net: never outlive a test that forgot to stop it
    while True:
        signal.pause()  # until a signal ends it: SIGTERM as above, SIGKILL


if __name__ == "__main__":
    main(sys.argv[1:])
