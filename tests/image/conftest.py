"""The images `make image` builds, run in place by buildah (`make test-image`).

Each test gets a working container of the image (``buildah from``) and runs commands in it
with ``buildah run`` (vfs storage, chroot isolation, the host's network: everything on
127.0.0.1), with host folders bind-mounted where deploy/ mounts volumes. Without
KCOPS_IMAGE (set by `make test-image` to the image it just built) the tests are skipped
with a reason that says how to run them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BUILDAH = ["buildah", "--storage-driver", "vfs"]
# deploy/base/deployment.yaml: the engine runs as 10001, the agent as 10002, group 10001.
ENGINE_USER = "10001:10001"
AGENT_USER = "10002:10001"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "image: the image `make image` built (make test-image)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("KCOPS_IMAGE"):
        return
    skip = pytest.mark.skip(reason="image smoke test: run `make test-image` (sets KCOPS_IMAGE)")
    for item in items:
        if Path(str(item.fspath)).resolve().parent == HERE:
            item.add_marker(skip)


@dataclass
class Container:
    """A working container of the image; ``run`` is ``buildah run`` with the image's own
    environment and user unless ``user`` is given."""

    ctr: str
    root: Path  # the container's root filesystem on the host (``buildah mount``)
    env: dict[str, str] = field(default_factory=dict)

    def cmd(
        self, argv: Sequence[str], *, user: str | None = None, mounts: dict[Path, str] | None = None
    ) -> list[str]:
        out = [*BUILDAH, "run", "--isolation", "chroot", "--network", "host"]
        if user:
            out += ["--user", user]
        for src, dst in (mounts or {}).items():
            out += ["-v", f"{src}:{dst}"]
        return [*out, self.ctr, "--", *argv]

    def run(
        self, argv: Sequence[str], *, user: str | None = None, mounts: dict[Path, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cmd(argv, user=user, mounts=mounts), capture_output=True, text=True, timeout=300
        )


def _buildah(*args: str) -> str:
    res = subprocess.run([*BUILDAH, *args], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"buildah {' '.join(args)}: {res.stderr[-2000:]}"
    return res.stdout.strip()


@pytest.fixture(scope="session")
def image() -> str:
    name = os.environ["KCOPS_IMAGE"]
    if shutil.which("buildah") is None:
        pytest.fail("buildah is not installed: `make image` installs it")
    _buildah("inspect", "--type", "image", name)
    return name


@pytest.fixture
def container(image: str) -> Iterator[Container]:
    ctr = _buildah("from", "--quiet", image)
    try:
        yield Container(ctr, Path(_buildah("mount", ctr)))
    finally:
        _buildah("rm", ctr)


def owned_dir(path: Path, uid: int, gid: int, mode: int = 0o770) -> Path:
    """A host folder for a volume, owned as deploy/ gives it to the container (fsGroup)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path
