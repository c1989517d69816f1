"""One version everywhere (issue 27): every image a manifest in deploy/ names is one that
`make image` / `make image-engine` builds, tagged with the package's version, or an
upstream image pinned to the version the suite tests (the vLLM overlay: the vLLM release
`make test-vllm` runs)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import kcops
from tests.unit.deploy.conftest import OVERLAYS, REPO

BUILD_SH = REPO / "images" / "build.sh"
SETUP_VLLM = REPO / "tests" / "engines" / "vllm" / "setup_venv.sh"


def _built() -> dict[str, str]:
    """Image name -> the `images/build.sh` argument that builds it, and the Makefile
    target that runs it, read from the script and the Makefile themselves."""
    text = BUILD_SH.read_text()
    registry = re.search(r"^REGISTRY=(\S+)$", text, re.M)
    assert registry, "images/build.sh sets REGISTRY"
    out: dict[str, str] = {}
    # Each builder function tags "$REGISTRY/<name>:$ver"; the case at the end maps the
    # script's argument to the function.
    for fn, body in re.findall(r"^build_(\w+)\(\) \{\n(.*?)^\}", text, re.M | re.S):
        for name in re.findall(r'"\$REGISTRY/([\w.-]+):\$ver"', body):
            out[f"{registry.group(1)}/{name}"] = fn
    make = (REPO / "Makefile").read_text()
    for name, fn in out.items():
        assert re.search(rf"^image[\w-]*:.*\n(\t.*\n)*\tbash images/build.sh {fn}\b", make, re.M), (
            f"no make target runs images/build.sh {fn} (builds {name})"
        )
    return out


def _pinned() -> dict[str, str]:
    """Upstream images and the one tag each may have: the version the suite tests."""
    vllm = re.search(r"VLLM_VERSION=\$\{VLLM_VERSION:-([\d.]+)\}", SETUP_VLLM.read_text())
    assert vllm, "tests/engines/vllm/setup_venv.sh pins VLLM_VERSION"
    return {"vllm/vllm-openai": f"v{vllm.group(1)}"}


def why_not(image: str) -> str | None:
    """None when ``image`` is built by a make target at this version or is pinned;
    otherwise what is wrong with it."""
    name, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return f"{image}: no tag"
    built, pinned = _built(), _pinned()
    if name in built:
        if tag != kcops.__version__:
            return f"{image}: built as {name}:{kcops.__version__} (kcops.__version__)"
        return None
    if name in pinned:
        if tag != pinned[name]:
            return f"{image}: the suite tests {name}:{pinned[name]}"
        return None
    return f"{image}: no make target builds it and it is not a pinned upstream image"


def _images(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str):
                yield value
            else:
                yield from _images(value)
    elif isinstance(node, list):
        for item in node:
            yield from _images(item)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_image_is_built_here_or_pinned(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    images = sorted(set(_images(rendered[overlay])))
    assert images, "the overlay names images"
    bad = [w for w in map(why_not, images) if w]
    assert not bad, bad


def test_the_check_refuses_what_no_target_builds() -> None:
    v = kcops.__version__
    assert why_not(f"ghcr.io/kcops/kcops:{v}") is None
    assert why_not(f"ghcr.io/kcops/kcops-engine:{v}") is None
    assert why_not(f"vllm/vllm-openai:{_pinned()['vllm/vllm-openai']}") is None
    for image in (
        "ghcr.io/kcops/kcops:0.0.1",  # another version than the package's
        f"ghcr.io/kcops/kcops-tools:{v}",  # nothing builds it
        "vllm/vllm-openai:v0.11.0",  # not the version the suite tests
        "vllm/vllm-openai:latest",
        "registry.example.com/llm-engine:placeholder",  # the base's, replaced by overlays
        f"docker.io/library/python:{v}",
        "ghcr.io/kcops/kcops",  # no tag at all
    ):
        assert why_not(image), image


def test_the_built_images_are_the_two_deploy_names() -> None:
    assert _built() == {"ghcr.io/kcops/kcops": "kcops", "ghcr.io/kcops/kcops-engine": "engine"}
    assert Path(BUILD_SH).is_file()
