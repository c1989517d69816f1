"""Smoke test of the sidecar image `make image` builds (issue 27): its version is the
wheel's, it holds no torch, the agent answers /healthz with deploy/'s command, user and
volumes without writing anywhere else, the init container's command fills the site
folder, and the real vLLM of `make test-vllm` loads the probe from that folder alone and
sends frames the agent in the image counts."""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

import kcops
from tests.image.conftest import AGENT_USER, Container, _buildah, owned_dir
from tests.services import free_port, stop, wait_http
from tests.unit.deploy.conftest import DEPLOY, kustomize

pytestmark = pytest.mark.image

REPO = Path(__file__).resolve().parents[2]
WHEEL_DIR = REPO / "build" / "image" / "dist"
AGENT_UID, GID = 10002, 10001
LOUD = "#" * 8


def _wheel() -> Path:
    wheels = sorted(WHEEL_DIR.glob("kcops-*.whl"))
    assert len(wheels) == 1, f"expected the one wheel `make image` built in {WHEEL_DIR}: {wheels}"
    return wheels[0]


@pytest.fixture(scope="module")
def vllm_pod() -> dict[str, dict[str, Any]]:
    """The vLLM overlay's containers and init containers, rendered, by name."""
    docs = kustomize(DEPLOY / "overlays" / "vllm")
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    spec = dep["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"] + spec.get("initContainers", [])}


def test_version_and_entrypoint_are_the_wheels(image: str, container: Container) -> None:
    wheel = _wheel()
    version = wheel.name.split("-")[1]
    assert version == kcops.__version__
    assert image.endswith(f":{version}")
    res = container.run(["kcops", "--version"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"kcops, version {version}"
    config = json.loads(_buildah("inspect", "--type", "image", image))["OCIv1"]["config"]
    assert config["Entrypoint"] == ["kcops"]
    assert config["User"] == AGENT_USER
    assert "PYTHONDONTWRITEBYTECODE=1" in config["Env"]


def test_no_torch_in_the_image_nor_in_the_base_install(container: Container) -> None:
    names_py = (
        "import importlib.metadata as m, json; "
        "print(json.dumps([d.name for d in m.distributions()]))"
    )
    res = container.run(["python", "-c", names_py])
    assert res.returncode == 0, res.stderr
    names = {n.lower() for n in json.loads(res.stdout)}
    assert "kcops" in names and "kubernetes_asyncio" in {n.replace("-", "_") for n in names}
    assert not names & {"torch", "transformers", "accelerate"}, names
    # `pip install kcops-*.whl` with no extra: torch is asked for by the `engine` extra only.
    meta = zipfile.ZipFile(_wheel()).read(f"kcops-{kcops.__version__}.dist-info/METADATA")
    requires = [ln for ln in meta.decode().splitlines() if ln.startswith("Requires-Dist:")]
    base = [r for r in requires if "extra ==" not in r]
    assert base and not [r for r in base if re.search(r"\btorch\b", r)], base
    assert [r for r in requires if "torch" in r and 'extra == "engine"' in r]


LAB_AND_DEMO = re.compile(r"(sweep|retriev|claim|kpred|mapviz|demo|drill|locust)", re.IGNORECASE)


def test_the_image_holds_no_lab_or_demo_module_and_the_on_call_cli_works(
    container: Container,
) -> None:
    """The sidecar carries production only (docs/architecture.md#layout: no kcops-lab, no
    kcops-demo, no Locust); the on-call commands still answer from it."""
    find_py = (
        "import kcops, pathlib, sys; root = pathlib.Path(kcops.__file__).parent; "
        "print('\\n'.join(str(p.relative_to(root)) for p in root.rglob('*.py')))"
    )
    res = container.run(["python", "-c", find_py])
    assert res.returncode == 0, res.stderr
    modules = res.stdout.split()
    assert "agent/app.py" in modules and "kernels/wire.py" in modules
    assert not [m for m in modules if LAB_AND_DEMO.search(m)], modules
    res = container.run(["python", "-c", "import locust"])
    assert res.returncode != 0
    for args in (
        ["kc", "recommend", "--help"], ["status", "--help"], ["top", "--help"],
        ["runbook", "--help"], ["actions", "--help"], ["alerts", "list", "--help"],
        ["cost", "--help"],
    ):  # fmt: skip
        res = container.run(["kcops", *args])
        assert res.returncode == 0, (args, res.stderr)
    res = container.run(["kcops", "kc", "sweep"])
    assert res.returncode == 2 and "comes with kcops-lab" in res.stderr, res.stderr


# What `setcap cap_sys_ptrace+ep` writes: VFS_CAP_REVISION_2 with the effective flag,
# CAP_SYS_PTRACE (19) permitted.
PTRACE_FILE_CAP = struct.pack("<5I", 0x02000001, 1 << 19, 0, 0, 0)


def test_py_spy_runs_as_the_agent_with_its_file_capability_and_nothing_else_escalates(
    container: Container, vllm_pod: dict[str, dict[str, Any]]
) -> None:
    """deploy/ adds SYS_PTRACE to the agent container and lets it be gained (docs/deploy.md,
    "Stacks of a hung engine"): py-spy's file capability is the one thing that gains it."""
    assert vllm_pod["kcops-agent"]["securityContext"]["capabilities"]["add"] == ["SYS_PTRACE"]
    spy = container.root / "opt" / "kcops" / "bin" / "py-spy"
    assert os.getxattr(spy, "security.capability") == PTRACE_FILE_CAP
    argv = container.cmd(["py-spy", "--version"], user=AGENT_USER)
    at = argv.index("run") + 1  # as deploy/ runs it: SYS_PTRACE in the bounding set
    res = subprocess.run(
        [*argv[:at], "--cap-add", "CAP_SYS_PTRACE", *argv[at:]],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0 and res.stdout.startswith("py-spy "), res.stderr
    setid = subprocess.run(
        ["find", str(container.root), "-xdev", "-type", "f", "-perm", "/6000"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert setid.stdout == "", setid.stdout


def _new_files(root: Path, since: Path) -> list[str]:
    """Files (not folders: buildah itself touches /run's mtime) in the container's root
    filesystem written after ``since``; the volumes are bind mounts, not in it."""
    res = subprocess.run(
        ["find", str(root), "-xdev", "-newer", str(since), "!", "-type", "d"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return sorted("/" + os.path.relpath(p, root) for p in res.stdout.split())


def test_agent_answers_healthz_on_a_read_only_root(
    container: Container, vllm_pod: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """deploy/'s own command, user and volumes (base agent.yaml: Kubernetes restart and
    scale, no cluster here); nothing is written outside the volumes."""
    agent = vllm_pod["kcops-agent"]
    sc = agent["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    user = f"{sc['runAsUser']}:{sc['runAsGroup']}"
    assert user == AGENT_USER
    port = free_port()
    *args, script = agent["args"]
    argv = [*agent["command"], *args, f"{script} --listen 127.0.0.1:{port}"]
    config = tmp_path / "config"
    config.mkdir()
    (config / "agent.yaml").write_text((DEPLOY / "base" / "agent.yaml").read_text())
    run_dir = owned_dir(tmp_path / "run", AGENT_UID, GID)
    # /var/run is Debian's symlink to /run, so the token volume (/var/run/kcops/token) lands
    # inside the kcops-run volume (/run/kcops), as a container runtime resolves it in the
    # container's root. buildah would resolve the absolute symlink on the host instead, so
    # the token goes into the run folder here.
    token = run_dir / "token"
    token.mkdir(mode=0o750)
    os.chown(token, 0, GID)
    (token / "token").write_text("image-test-token\n")
    os.chown(token / "token", 0, GID)
    (token / "token").chmod(0o440)
    mounts = {
        run_dir: "/run/kcops",
        owned_dir(tmp_path / "state", AGENT_UID, GID): "/var/lib/kcops",
        owned_dir(tmp_path / "tmp", AGENT_UID, GID, 0o1777): "/tmp",
        config: "/etc/kcops:ro",
    }
    marker = tmp_path / "marker"
    marker.touch()
    log = tmp_path / "agent.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            container.cmd(argv, user=user, mounts=mounts),
            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            wait_http(f"http://127.0.0.1:{port}/healthz", 120, proc)
            assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
            wait_http(f"http://127.0.0.1:{port}/readyz", 120, proc)
            assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError(f"{exc}\n{log.read_text(errors='replace')[-3000:]}") from exc
        finally:
            stop(proc, 30)
    # (buildah reports the agent's end as a kill by the signal the test sent the group.)
    written = _new_files(container.root, marker)
    assert written == [], f"written outside the volumes: {written}"


def test_the_write_check_sees_a_write_outside_the_volumes(
    container: Container, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    marker.touch()
    res = container.run(["touch", "/var/tmp/written"], user=AGENT_USER)
    assert res.returncode == 0, res.stderr
    assert _new_files(container.root, marker) == ["/var/tmp/written"]


@pytest.fixture(scope="module")
def site(
    image: str, vllm_pod: dict[str, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The init container's command, user and volume, run once: the folder it fills."""
    init = vllm_pod["kcops-install"]
    assert init["image"] == vllm_pod["kcops-agent"]["image"]
    (mount,) = init["volumeMounts"]
    folder = owned_dir(tmp_path_factory.mktemp("site") / "kcops-site", 10001, GID, 0o2775)
    ctr = _buildah("from", "--quiet", image)
    try:
        c = Container(ctr, Path(_buildah("mount", ctr)))
        res = c.run(
            init["command"], user=f"{init['securityContext']['runAsUser']}:{GID}",
            mounts={folder: mount["mountPath"]},
        )  # fmt: skip
    finally:
        _buildah("rm", ctr)
    assert res.returncode == 0, res.stderr
    return folder


def test_init_container_fills_the_site_folder(site: Path) -> None:
    assert (site / "kcops" / "__init__.py").is_file()
    assert (site / "kcops" / "kernels" / "integrations" / "vllm_plugin.py").is_file()
    (info,) = site.glob("kcops-*.dist-info")
    assert info.name == f"kcops-{kcops.__version__}.dist-info"
    eps = (info / "entry_points.txt").read_text()
    assert "[vllm.general_plugins]" in eps
    assert "kcops_probe = kcops.kernels.integrations.vllm_plugin:register" in eps
    assert not list(site.rglob("__pycache__")), "no bytecode written by the init container"


def _engine_venv(vllm_venv: Path, dest: Path) -> Path:
    """A venv that sees .venv-vllm's packages but runs none of its .pth files: the
    editable kcops install there (make test-vllm's) is invisible, so kcops can come only
    from PYTHONPATH. Returns its python."""
    base = Path(os.path.realpath(vllm_venv / "bin" / "python"))
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(dest)], check=True)
    (site_packages,) = (vllm_venv / "lib").glob("python3*/site-packages")
    (mine,) = (dest / "lib").glob("python3*/site-packages")
    (mine / "vllm_venv.pth").write_text(f"{site_packages}\n")
    return dest / "bin" / "python"


@pytest.fixture(scope="module")
def vllm_install() -> tuple[Path, Path]:
    venv = Path(os.environ.get("KCOPS_VLLM_VENV") or REPO / ".venv-vllm")
    if not (venv / "bin" / "python").exists():
        pytest.skip(
            f"{LOUD} NOT RUN: the real vLLM's load of the probe from the init container's "
            f"folder needs {venv} (make test-vllm builds it) {LOUD}"
        )
    from kcops.worker import models

    model = Path(os.environ.get("KCOPS_VLLM_MODEL") or models.cache_dir() / models.SMOLLM2_DIR)
    if not (model / "model.safetensors").exists():
        pytest.skip(f"{LOUD} NOT RUN: no SmolLM2 safetensors in {model} (make test-vllm) {LOUD}")
    return venv, model


@pytest.fixture
def engine_env(site: Path, tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site), VLLM_CPU_KVCACHE_SPACE="2", PYTHONUNBUFFERED="1")
    yield env


def test_real_vllm_loads_the_probe_from_the_site_folder_alone(
    container: Container,
    site: Path,
    vllm_install: tuple[Path, Path],
    engine_env: dict[str, str],
    tmp_path: Path,
) -> None:
    from tests.engines.vllm.harness import MODEL_NAME, POLL_S, completion, parse_metrics, tail
    from tests.services import wait_until

    venv, model = vllm_install
    py = _engine_venv(venv, tmp_path / "engine-venv")
    bare = {k: v for k, v in engine_env.items() if k != "PYTHONPATH"}
    # (cwd: not the checkout, whose kcops/ `python -c` would find on sys.path[0])
    res = subprocess.run(
        [str(py), "-c", "import kcops"], env=bare, capture_output=True, text=True, cwd=tmp_path
    )
    assert res.returncode != 0 and "No module named 'kcops'" in res.stderr, (
        "kcops must come only from the site folder"
    )
    res = subprocess.run(
        [str(py), "-c", "import vllm"], env=bare, capture_output=True, text=True, cwd=tmp_path
    )
    assert res.returncode == 0, res.stderr[-2000:]

    vport, aport = free_port(), free_port()
    run_dir = owned_dir(tmp_path / "run", AGENT_UID, GID)
    config = tmp_path / "config"
    config.mkdir()
    (config / "agent.yaml").write_text(
        yaml.safe_dump(
            {
                "agent": {"listen": f"127.0.0.1:{aport}", "state_dir": "/var/lib/kcops"},
                "engine": {"url": f"http://127.0.0.1:{vport}", "adapter": "vllm"},
                "collectors": {"probe": {"socket_path": "/run/kcops/probe.sock"}},
                "actions": {"mode": "off"},
            }
        )
    )
    mounts = {
        run_dir: "/run/kcops",
        owned_dir(tmp_path / "state", AGENT_UID, GID): "/var/lib/kcops",
        owned_dir(tmp_path / "tmp", AGENT_UID, GID, 0o1777): "/tmp",
        config: "/etc/kcops:ro",
    }
    agent_url, engine_url = f"http://127.0.0.1:{aport}", f"http://127.0.0.1:{vport}"
    agent_log, vllm_log = tmp_path / "agent.log", tmp_path / "vllm.log"
    serve = [
        str(py), "-c",
        "import sys; from vllm.entrypoints.cli.main import main; sys.argv[0] = 'vllm'; "
        "sys.exit(main())",
        "serve", str(model), "--host", "127.0.0.1", "--port", str(vport),
        "--served-model-name", MODEL_NAME, "--enforce-eager", "--dtype", "float32",
        "--max-model-len", "2048",
    ]  # fmt: skip
    engine_env["KCOPS_PROBE_SOCKET"] = str(run_dir / "probe.sock")
    with open(agent_log, "wb") as afh, open(vllm_log, "wb") as vfh:
        agent = subprocess.Popen(
            container.cmd(["kcops", "agent", "run", "--config", "/etc/kcops/agent.yaml"],
                          mounts=mounts),
            stdout=afh, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        engine: subprocess.Popen[bytes] | None = None
        try:
            wait_http(f"{agent_url}/healthz", 120, agent)
            engine = subprocess.Popen(
                serve, stdout=vfh, stderr=subprocess.STDOUT, env=engine_env,
                start_new_session=True, cwd=tmp_path,
            )  # fmt: skip

            def healthy() -> bool:
                if engine is not None and engine.poll() is not None:
                    raise AssertionError(f"vLLM exited: {engine.returncode}\n{tail(vllm_log)}")
                try:
                    return httpx.get(f"{engine_url}/health", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(healthy, 900, "vLLM /health", lambda: tail(vllm_log), interval_s=POLL_S)
            for i in range(3):
                completion(engine_url, f"Question {i}: what does a probe measure?", 16)

            def counted() -> float:
                m = parse_metrics(httpx.get(f"{agent_url}/metrics", timeout=5).text)
                ok = m.get(("kcops_probe_frames_total", (("outcome", "ok"),)), 0.0)
                calls = sum(
                    v for (n, lp), v in m.items()
                    if n == "kcops_attention_calls_total" and ("engine", "vllm") in lp
                )  # fmt: skip
                return ok if calls > 0 else 0.0

            frames = wait_until(
                counted,
                180,
                "probe frames from vLLM counted by the agent",
                lambda: tail(agent_log) + "\n" + tail(vllm_log),
                interval_s=POLL_S,
            )
            assert frames > 0
        finally:
            if engine is not None:
                stop(engine, 90)
            stop(agent, 30)
    log = vllm_log.read_text(errors="replace")
    assert "kcops probe installed" in log, tail(vllm_log)
    assert str(run_dir / "probe.sock") in log
    print(
        f"vLLM loaded the probe from {site}; the agent in the image counted {frames:.0f} frames",
        file=sys.stderr,
    )
