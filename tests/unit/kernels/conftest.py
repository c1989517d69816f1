"""Fixtures for the probe tests: a tiny random Llama (GQA) and real text as token ids."""

from __future__ import annotations

import contextlib
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


class Listener:
    """The agent's end as a test reads it: the stream socket probes connect to, and what
    every connection has sent so far (connections read in the order they came)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(64)
        self.sock.setblocking(False)
        self.conns: list[tuple[socket.socket, bytearray]] = []

    def frames(self) -> list[wire.Frame]:
        with contextlib.suppress(BlockingIOError):
            while True:
                conn, _ = self.sock.accept()
                conn.setblocking(False)
                self.conns.append((conn, bytearray()))
        out = []
        for conn, buf in self.conns:
            with contextlib.suppress(BlockingIOError):
                while chunk := conn.recv(1 << 16):
                    buf += chunk
            while len(buf) >= wire.HEADER.size:
                end = wire.HEADER.size + wire.header(bytes(buf))[1]
                if end > len(buf):
                    break
                out.append(wire.decode(bytes(buf[:end])))
                del buf[:end]
        return out

    def close(self) -> None:
        for conn, _ in self.conns:
            conn.close()
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[tuple[str, Listener]]:
    """The agent's socket path (short: AF_UNIX limits its length) and a listener on it."""
    folder = tempfile.mkdtemp(prefix="kcp-", dir="/tmp")
    path = os.path.join(folder, "p.sock")
    lst = Listener(path)
    try:
        yield path, lst
    finally:
        lst.close()
        os.unlink(path)
        os.rmdir(folder)


def drain(lst: Listener) -> list[wire.Frame]:
    """Every frame sent to ``lst`` since the last call."""
    return lst.frames()
