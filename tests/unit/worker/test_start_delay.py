"""``kcops serve --start-delay-file``: the start-slow drill's cause, refused when misused."""

from __future__ import annotations

import time
from pathlib import Path

from click.testing import CliRunner

from kcops.cli.serve import _start_delay, serve_cmd


def test_needs_enable_faults(tmp_path: Path) -> None:
    delay = tmp_path / "delay"
    delay.write_text("5")
    r = CliRunner().invoke(serve_cmd, ["--model", "tiny", "--start-delay-file", str(delay)])
    assert r.exit_code == 2
    assert "needs --enable-faults" in r.output


def test_bad_content_is_a_usage_error(tmp_path: Path) -> None:
    delay = tmp_path / "delay"
    delay.write_text("tomorrow")
    args = ["--model", "tiny", "--enable-faults", "--start-delay-file", str(delay)]
    r = CliRunner().invoke(serve_cmd, args)
    assert r.exit_code == 2
    assert "expected seconds" in r.output and str(delay) in r.output


def test_the_delay_really_waits(tmp_path: Path) -> None:
    delay = tmp_path / "delay"
    delay.write_text("0.2")
    t0 = time.monotonic()
    _start_delay(delay, enable_faults=True)
    assert time.monotonic() - t0 >= 0.2  # a lower bound: sleep never returns early
