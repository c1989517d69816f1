"""What `kcops agent run` needs of the machine is checked before anything starts: one
line, exit 2, no traceback, no component started (and stopped) first."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import free_port, wait_until

pytestmark = pytest.mark.slow
AGENT = (sys.executable, "-c", "from kcops.cli import main; main()", "agent", "run")


def run_agent(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KCOPS_PROBE_SOCKET": str(tmp / "probe.sock")}
    env.pop("KCOPS_TOKEN", None)
    return subprocess.run(
        [*AGENT, *args], capture_output=True, text=True, timeout=60, env=env, cwd=tmp
    )


def one_line_exit_2(out: subprocess.CompletedProcess[str], needle: str) -> None:
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert out.returncode == 2, (out.returncode, lines[-10:])
    assert len(lines) == 1, lines[:40]
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in out.stderr


@contextlib.contextmanager
def read_only_tmpfs(path: Path) -> Iterator[Path]:
    path.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)],
        capture_output=True, text=True,
    )  # fmt: skip
    if res.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here (needs root): {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


def test_an_unwritable_state_dir_is_one_line_and_exit_2(tmp_path: Path) -> None:
    listen = f"127.0.0.1:{free_port()}"
    with read_only_tmpfs(tmp_path / "ro") as ro:
        out = run_agent(tmp_path, "--state-dir", str(ro), "--listen", listen)
    one_line_exit_2(out, f"agent.state_dir: {ro} is not a folder kcops can write to")
    # a file where the folder should be: the same, for anyone (no root needed)
    (tmp_path / "a-file").write_text("x")
    out = run_agent(tmp_path, "--state-dir", str(tmp_path / "a-file" / "state"), "--listen", listen)
    one_line_exit_2(out, "agent.state_dir:")


def test_a_listen_address_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run_agent(
            tmp_path, "--state-dir", str(tmp_path / "s"), "--listen", f"127.0.0.1:{port}"
        )
    one_line_exit_2(out, f"agent.listen: cannot listen on 127.0.0.1:{port}: Address already in use")
    assert not (tmp_path / "probe.sock").exists()  # nothing started before the refusal


def test_a_probe_socket_path_that_cannot_be_a_socket_is_one_line_and_exit_2(
    tmp_path: Path,
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    cfg = tmp_path / "agent.yaml"
    long = tmp_path / ("d" * 120) / "probe.sock"
    cfg.write_text(f"collectors:\n  probe:\n    socket_path: {long}\n")
    out = run_agent(tmp_path, "--config", str(cfg), "--state-dir", str(tmp_path / "s"),
                    "--listen", listen)  # fmt: skip
    one_line_exit_2(out, "collectors.probe.socket_path:")
    assert "a Unix socket path has at most 107" in out.stderr
    not_a_socket = tmp_path / "plain"
    not_a_socket.write_text("keep me")
    cfg.write_text(f"collectors:\n  probe:\n    socket_path: {not_a_socket}\n")
    out = run_agent(tmp_path, "--config", str(cfg), "--state-dir", str(tmp_path / "s"),
                    "--listen", listen)  # fmt: skip
    one_line_exit_2(out, "exists and is not a socket")
    assert not_a_socket.read_text() == "keep me"


def test_a_second_agent_on_the_same_state_dir_is_one_line_and_exit_2(tmp_path: Path) -> None:
    state = tmp_path / "s"
    env = {**os.environ, "KCOPS_PROBE_SOCKET": str(tmp_path / "first.sock")}
    first = subprocess.Popen(
        [*AGENT, "--state-dir", str(state), "--listen", f"127.0.0.1:{free_port()}"],
        env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        lock = state / "agent.lock"
        wait_until(
            lambda: lock.exists() and lock.read_text().strip() == str(first.pid),
            60,
            "the first agent's lock",
        )
        out = run_agent(tmp_path, "--state-dir", str(state), "--listen", f"127.0.0.1:{free_port()}")
        one_line_exit_2(out, f"held by another agent (pid {first.pid})")
        assert first.poll() is None  # the first one never noticed
    finally:
        first.terminate()
        first.wait(30)


@pytest.mark.parametrize("name", ["audit.jsonl", "remediation-state.json"])
@pytest.mark.parametrize("kind", ["fifo", "folder", "device", "link out"])
def test_a_state_file_that_is_not_a_regular_file_is_one_line_and_exit_2(
    tmp_path: Path, name: str, kind: str
) -> None:
    state = tmp_path / "s"
    state.mkdir()
    path = state / name
    if kind == "fifo":
        os.mkfifo(path)  # opening it for reading would wait for a writer forever
    elif kind == "folder":
        path.mkdir()
    elif kind == "device":
        try:  # /dev/full's numbers: a write "succeeds" forever as ENOSPC
            os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 7))
        except PermissionError:
            pytest.skip("mknod needs root")
    else:
        (tmp_path / "elsewhere").write_text("")
        path.symlink_to(tmp_path / "elsewhere")
    out = run_agent(tmp_path, "--state-dir", str(state), "--listen", f"127.0.0.1:{free_port()}")
    one_line_exit_2(out, f"agent.state_dir: {path}")
