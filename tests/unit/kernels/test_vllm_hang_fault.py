"""The test-only hang of the vLLM plugin (``KCOPS_TEST_HANG_FILE``): off without the
variable, a step that waits in ``kcops_test_hang`` while the file exists, armed with a
warning by the plugin (tests/engines/vllm/test_incident.py hangs a real vLLM with it)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kcops.kernels.integrations import vllm_plugin, vllm_requests


def _runner_module() -> types.ModuleType:
    mod = types.ModuleType(vllm_requests.RUNNER_MODULE)

    class GPUModelRunner:
        def execute_model(self, scheduler_output: Any) -> Any:
            return ("ran", scheduler_output)

    mod.GPUModelRunner = GPUModelRunner  # type: ignore[attr-defined]
    return mod


def _count_exists(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = os.path.exists

    def exists(path: Any) -> bool:
        calls.append(str(path))
        return real(path)

    monkeypatch.setattr(os.path, "exists", exists)
    return calls


def _step() -> SimpleNamespace:
    return SimpleNamespace(finished_req_ids=set())


def test_without_the_file_named_a_step_checks_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_exists(monkeypatch)
    fn = vllm_requests.wrap_execute_model(vllm_requests.Requests(), lambda self, out: "ok")
    assert fn(object(), _step()) == "ok"
    assert calls == []


def test_armed_a_step_hangs_in_its_named_frame_while_the_file_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hang = tmp_path / "hang"
    fn = vllm_requests.wrap_execute_model(
        vllm_requests.Requests(), lambda self, out: "ok", str(hang)
    )
    calls = _count_exists(monkeypatch)
    assert fn(object(), _step()) == "ok"  # no file: the step runs
    assert calls == [str(hang)]  # after one check
    hang.touch()
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(fn(object(), _step())), daemon=True)
    t.start()
    t.join(0.3)
    assert t.is_alive() and out == []
    frame: Any = sys._current_frames()[t.ident or 0]
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    assert names[0] == "kcops_test_hang" and "execute_model" in names, names
    hang.unlink()
    t.join(5)
    assert out == ["ok"]


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> Iterator[type]:
    """A runner module where vLLM's would be, for the plugin's hook (undone after)."""
    mod = _runner_module()
    monkeypatch.setitem(sys.modules, vllm_requests.RUNNER_MODULE, mod)
    monkeypatch.setattr(vllm_plugin, "_runner_hooked", False)
    monkeypatch.setattr(vllm_plugin.REQUESTS, "on_finish", None)
    monkeypatch.setattr(vllm_plugin.REQUESTS, "on_model", None)
    try:
        yield mod.GPUModelRunner  # type: ignore[attr-defined]
    finally:
        vllm_requests.uninstall(vllm_requests.RUNNER_MODULE)


def _hook(caplog: pytest.LogCaptureFixture) -> None:
    probe: Any = SimpleNamespace(set_model=lambda model: None)
    with caplog.at_level(logging.WARNING, logger="vllm.plugins.kcops_probe"):
        vllm_plugin.hook_runner(probe)


def test_the_plugin_arms_it_from_the_environment_with_a_warning(
    runner: type,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    hang = tmp_path / "hang"
    monkeypatch.setenv(vllm_requests.HANG_FILE_ENV, str(hang))
    _hook(caplog)
    assert any("TEST FAULT ARMED" in r.getMessage() and str(hang) in r.getMessage()
               for r in caplog.records), caplog.text  # fmt: skip
    calls = _count_exists(monkeypatch)
    assert runner().execute_model(_step())[0] == "ran"
    assert calls == [str(hang)]


def test_the_plugin_leaves_it_off_without_the_variable(
    runner: type, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(vllm_requests.HANG_FILE_ENV, raising=False)
    _hook(caplog)
    assert "TEST FAULT" not in caplog.text
    calls = _count_exists(monkeypatch)
    assert runner().execute_model(_step())[0] == "ran"
    assert calls == []
