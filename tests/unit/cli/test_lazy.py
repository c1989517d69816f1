"""The CLI without the lab or the demo (the sidecar's install): their commands say where
they come from, and everything else works."""

from __future__ import annotations

import subprocess
import sys

# The lab and the demo made unimportable, as in an install without kcops-lab/kcops-demo.
WITHOUT = (
    "import sys; sys.modules['kcops.lab'] = None; sys.modules['kcops.demo'] = None\n"
    "from kcops.cli import cli\n"
    "cli(sys.argv[1:], prog_name='kcops')\n"
)


def _kcops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT, *args], capture_output=True, text=True, timeout=60
    )


def test_a_lab_command_names_the_distribution_that_brings_it() -> None:
    out = _kcops("kc", "sweep", "--model", "tiny")
    assert out.returncode == 2, out.stderr
    assert "`kcops kc sweep` is not installed here: it comes with kcops-lab" in out.stderr


def test_a_demo_command_names_the_distribution_that_brings_it() -> None:
    out = _kcops("demo")
    assert out.returncode == 2, out.stderr
    assert "`kcops demo` is not installed here: it comes with kcops-demo" in out.stderr


def test_help_lists_only_what_is_installed() -> None:
    top = _kcops("--help")
    assert top.returncode == 0, top.stderr
    listed = {line.split()[0] for line in top.stdout.splitlines() if line.startswith("  ")}
    assert {"agent", "status", "cost", "kc", "top"} <= listed
    assert not {"demo", "load"} & listed
    kc = _kcops("kc", "--help")
    assert kc.returncode == 0, kc.stderr
    assert "recommend" in kc.stdout and "sweep" not in kc.stdout


def test_with_the_lab_and_demo_installed_their_commands_are_listed() -> None:
    from click.testing import CliRunner

    from kcops.cli import cli

    res = CliRunner().invoke(cli, ["kc", "--help"])
    assert res.exit_code == 0
    for name in ("recommend", "measure", "sweep", "kpred", "verify", "report", "claim"):
        assert name in res.output
