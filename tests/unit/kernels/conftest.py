"""Fixtures for the probe tests: a tiny random Llama (GQA) and real text as token ids."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kcops.kernels as kernels  # noqa: E402
from kcops.kernels import wire  # noqa: E402

VOCAB = 256


def tiny_llama(attn: str = "eager", layers: int = 2, seed: int = 0) -> Any:
    """2-layer Llama, 4 query heads / 2 KV heads; a large init range so that attention is
    peaked (K_p varies) rather than uniform."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(  # type: ignore[call-arg]
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.3,
        attn_implementation=attn,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return model.eval()


def text_ids(n: int, offset: int = 0) -> Any:
    """``n`` token ids from CPython's reference docs (bytes mod vocab): real, local text."""
    from pydoc_data import topics

    text = "".join(topics.topics[k] for k in sorted(topics.topics))
    data = text.encode()[offset : offset + n]
    return torch.tensor([[b % VOCAB for b in data]])


@pytest.fixture(autouse=True)
def _no_probe_left() -> Iterator[None]:
    kernels.uninstall()
    yield
    kernels.uninstall()


@pytest.fixture
def listener() -> Iterator[tuple[str, socket.socket]]:
    """A Unix datagram socket the probe can send to (short path: AF_UNIX limits length)."""
    folder = tempfile.mkdtemp(prefix="kcp-", dir="/tmp")
    path = os.path.join(folder, "p.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5.0)
    try:
        yield path, sock
    finally:
        sock.close()
        os.unlink(path)
        os.rmdir(folder)


def drain(sock: socket.socket) -> list[wire.Frame]:
    """Every frame waiting on ``sock``."""
    frames = []
    sock.setblocking(False)
    try:
        while True:
            frames.append(wire.decode(sock.recv(65536)))
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(5.0)
    return frames
