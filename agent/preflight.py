"""The checks ``kcops agent run`` makes before it builds anything, and ``check-config`` makes.

One function, :func:`preflight`, so the two commands cannot drift apart (they
did: check-config never loaded the rule file and passed a non-loopback listen
address without a token, both of which ``agent run`` refuses). It reads what
the configuration names and refuses, with one :class:`~kcops.errors.ConfigError`
line (exit 2), what the agent would refuse at start:

- the token (``agent.token_file`` or ``$KCOPS_TOKEN``): unreadable, empty, not
  UTF-8, or other than visible ASCII;
- a listen address beyond loopback with no token (:func:`check_exposure`);
- an ``engine.adapter`` that names no engine kind;
- the rule file, with its params overrides, when the rule engine is on (off:
  remediation reads it for its ladders and goes without on a bad one, which is a
  warning here as it is a log line there), its ladder steps checked against the
  actions: this is where the rules and the actions meet (neither imports the other);
- a collector switched ``on`` whose source is not configured.

What needs this machine (the state dir written and held by this agent alone, its files
regular files, the probe socket's place, the listen address free) is
:func:`check_machine`, which ``agent run`` calls before any component starts: a failure
there is one line and exit 2, never a component started and stopped.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from kcops.agent.collectors import check_sources
from kcops.auth import load_token
from kcops.errors import ConfigError

if TYPE_CHECKING:
    from kcops.agent.config import Config
    from kcops.agent.rules.loader import RuleSet


@dataclass(frozen=True)
class Checked:
    """What :func:`preflight` read: the token, the rule set (the rule engine's and the
    ladders'; None when the rules are off and the file is bad), and warnings (things that
    will be refused at run time, not at start)."""

    token: str | None
    ruleset: RuleSet | None
    warnings: list[str] = field(default_factory=list)


def preflight(config: Config, token: str | None = None) -> Checked:
    """Everything ``agent run`` refuses before it starts; ConfigError (exit 2) on the first.

    ``token``: one already in hand (tests); else the configured one is loaded.
    """
    from kcops.agent.actions.registry import builtin_actions
    from kcops.agent.config.actions import warnings
    from kcops.agent.engine.kinds import builtin_kinds
    from kcops.agent.promql.model import RuleError
    from kcops.agent.rules.loader import ruleset_from_config

    if token is None:
        token = load_token(config.agent.token_file)
    check_exposure(config.agent.host_port()[0], token is not None)
    builtin_kinds().check_choice(config.engine.adapter)
    found = list(warnings(config.actions))
    ruleset = None
    actions = builtin_actions().ladder_params()
    if config.rules.enabled:
        ruleset = ruleset_from_config(config, actions)
    else:
        try:
            ruleset = ruleset_from_config(config, actions)
        except RuleError as exc:
            found.append(f"rules are off and the rule file is bad: no ladders ({exc})")
    check_sources(config)
    return Checked(token, ruleset, found)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost: assume it is reachable


def check_exposure(host: str, token_configured: bool) -> None:
    """Refuse (ConfigError, exit 2) to listen beyond loopback without a token."""
    if not token_configured and not is_loopback(host):
        raise ConfigError(
            f"agent.listen: {host!r} is not a loopback address and no token is configured: "
            "the control API would be open to the network. Set KCOPS_TOKEN or --token-file, "
            "or listen on 127.0.0.1"
        )


# AF_UNIX: sun_path holds 108 bytes, the last a NUL.
MAX_SOCKET_PATH_BYTES = 107


def check_machine(config: Config) -> BinaryIO:
    """What ``agent run`` needs of this machine, before anything starts; ConfigError (one
    line, exit 2) naming the field: ``agent.state_dir`` written to (created if missing),
    held by no other agent and its files regular files, the probe's socket path usable,
    ``agent.listen`` free to bind. Returns the state dir's lock: held until it is closed."""
    state_dir = Path(config.agent.state_dir)
    _writable_dir(state_dir, "agent.state_dir")
    _regular_files(state_dir)
    probe = config.collectors.probe
    if probe.enabled:
        from kcops.kernels.wire import default_socket_path

        _socket_path(Path(probe.socket_path or default_socket_path()))
    _bindable(config.agent.listen, *config.agent.host_port())
    return lock_state_dir(state_dir)


LOCK_FILE = "agent.lock"


def lock_state_dir(state_dir: Path) -> BinaryIO:
    """An exclusive lock on ``state_dir`` for this process's life (released when the file
    is closed, or by the kernel when the process dies, ``kill -9`` included). A second agent
    on the same folder would mark the first one's live runs interrupted and both would
    write one audit log: it is refused, naming the holder's pid."""
    path = state_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ConfigError(f"agent.state_dir: cannot open {path}: {exc.strerror or exc}") from None
    lock = os.fdopen(fd, "r+b", buffering=0)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = lock.read(32).decode(errors="replace").strip() or "unknown"
        lock.close()
        raise ConfigError(
            f"agent.state_dir: {state_dir} is held by another agent (pid {holder}); "
            "each agent needs a state dir of its own"
        ) from None
    lock.truncate(0)
    lock.write(f"{os.getpid()}\n".encode())
    return lock


def _regular_files(state_dir: Path) -> None:
    """The agent's files in its state dir are regular files of that folder, or absent: a
    FIFO would hang the start, a device (``/dev/full``) grow memory, a folder fail later."""
    from kcops.agent.remediation.remediation import AUDIT_FILE, STATE_FILE
    from kcops.agent.rules.forstate import FILE_NAME

    for name in (AUDIT_FILE, STATE_FILE, FILE_NAME):
        path = state_dir / name
        try:
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                if path.resolve().parent != state_dir.resolve():
                    raise ConfigError(
                        f"agent.state_dir: {path} links out of the state dir (to "
                        f"{path.resolve()}); kcops keeps its state in files of that folder"
                    )
                mode = path.stat().st_mode
        except FileNotFoundError:
            continue
        except (OSError, RuntimeError) as exc:  # a link loop, a folder it may not read
            raise ConfigError(f"agent.state_dir: cannot read {path}: {exc}") from None
        if not stat.S_ISREG(mode):
            kind = {stat.S_IFDIR: "folder", stat.S_IFIFO: "FIFO"}.get(stat.S_IFMT(mode), "device")
            raise ConfigError(
                f"agent.state_dir: {path} is a {kind}, not a regular file; move it away "
                "(the agent writes its state there)"
            )


def _writable_dir(path: Path, field: str) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".kcops-write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{field}: {path} is not a folder kcops can write to: "
                          f"{exc.strerror or exc}") from None  # fmt: skip


def _socket_path(path: Path) -> None:
    field = "collectors.probe.socket_path"
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise ConfigError(
            f"{field}: {str(path)[:80]}... is {len(os.fsencode(path))} bytes; a Unix socket "
            f"path has at most {MAX_SOCKET_PATH_BYTES}"
        )
    if path.exists() and not stat.S_ISSOCK(path.lstat().st_mode):
        raise ConfigError(f"{field}: {path} exists and is not a socket (it would be replaced)")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{field}: cannot create {path.parent}: {exc.strerror or exc}") from None
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{field}: {path.parent} is not writable: the socket cannot be made")


def _bindable(listen: str, host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"agent.listen: cannot listen on {listen}: {exc.strerror or exc}"
            ) from None
