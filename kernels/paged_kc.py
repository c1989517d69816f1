"""K(C) from a paged KV cache (vLLM): the keys of a sampled query row are gathered
from the cache blocks that the attention metadata's block table names.

The probe reads the cache after the wrapped ``forward`` returned, so it holds every key
the call attended over, whether vLLM wrote this step's keys before ``forward`` (the
CPU, FlashAttention and Triton backends: ``forward_includes_kv_cache_update = False``)
or inside it. For each of
at most ``max_seqs`` sequences of the batch, the last query row (the decode row;
for a prefill chunk, its last token) is recomputed over the sequence's
``seq_lens[i]`` keys, through the same :func:`kcops.kernels.kc.kc_rows` that the
transformers integration uses (sequences padded to the longest, padding masked).

Layouts read (self-checked, see below), all as vLLM 0.32 hands ``kv_cache`` to ``forward``:

- ``interleaved``: ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` with each
  token's key in its first ``head_size`` elements and its value after it, read through
  the tensor's own strides (so any physical order vLLM chose, e.g. ``LBNHC``): how
  ``FlashAttentionImpl``, ``TritonAttentionImpl`` and ``FlexAttentionImpl`` split it
  (``kv_cache.transpose(1, 2).split(head_size, dim=-1)``);
- ``split``: the same shape, but each (block, head) holds all its keys and then all its
  values: how ``CPUAttentionBackendImpl`` views it (``view(nb, h, 2 * bs, d).chunk(2,
  dim=2)``), with the keys of a block packed in one of :data:`LAYOUTS`;
- ``stacked``: ``[2, num_blocks, block_size, num_kv_heads, head_size]``, FlashAttention
  before vLLM's per-layer ``[blocks, heads, block, 2 * head]`` view.

The self-check: the keys this step wrote for a sequence are also the ``key`` argument of
the call; if the gathered copies differ, the layout is not what this module thinks and
:class:`PagedLayoutError` is raised (the probe counts it as an internal error, logs it
once and never raises into the engine). A K(C) value is either right or absent. Which
layout an attention class uses is found once (the first one whose keys match) and then
checked on every call.

Sliding windows are read as the backends store them: an int window ``W`` (the CPU
backend; ``-1`` or 0 for none) or a ``(left, right)`` pair (FlashAttention, Triton,
FlashInfer, ROCm: ``(W - 1, 0)``, ``(-1, -1)`` for none); the row then sees its last
``W`` keys. A window this module cannot read gives no K(C).

Calls whose attention this recomputation would not reproduce give no K(C) (None,
not an error): encoder / cross attention, ALiBi, logits soft-capping, attention
sinks, a quantized (fp8) cache, a non-causal or dynamically causal mask.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol, TypeGuard

import torch

from kcops.kernels.probe import KcInputs


class PagedLayoutError(RuntimeError):
    """The KV cache is not laid out as expected (the gathered keys do not match)."""


class PagedMeta(Protocol):
    """What kcops reads of vLLM's attention metadata (whichever backend's class it is)."""

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor


def _paged(meta: object) -> TypeGuard[PagedMeta]:
    return all(hasattr(meta, f) for f in ("seq_lens", "block_table", "query_start_loc"))


def _supported(impl: object, meta: object, kv_cache: object) -> bool:
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.numel() == 0:
        return False
    if str(getattr(impl, "attn_type", "decoder")) not in ("decoder", "AttentionType.DECODER"):
        return False
    if getattr(impl, "alibi_slopes", None) is not None or getattr(impl, "sinks", None) is not None:
        return False
    if getattr(impl, "logits_soft_cap", 0):
        return False
    if str(getattr(impl, "kv_cache_dtype", "auto")) != "auto":
        return False
    if getattr(impl, "kv_sharing_target_layer_name", None):
        return False  # the cache holds another layer's keys, not this call's
    if getattr(meta, "causal", True) is not True:
        return False
    return getattr(meta, "dynamic_causal", None) is None


def _rowmajor(x: torch.Tensor, bs: int, d: int) -> torch.Tensor:
    return x.view(*x.shape[:-1], bs, d)


def _transposed(x: torch.Tensor, bs: int, d: int) -> torch.Tensor:
    return x.view(*x.shape[:-1], d, bs).transpose(-1, -2)


def _token_tiles(t: int) -> Callable[[torch.Tensor, int, int], torch.Tensor]:
    """Blocks of ``t`` tokens, each stored transposed: ``[bs/t, d, t]``."""

    def unpack(x: torch.Tensor, bs: int, d: int) -> torch.Tensor:
        y = x.view(*x.shape[:-1], bs // t, d, t).transpose(-1, -2)
        return y.reshape(*x.shape[:-1], bs, d)

    return unpack


def _dim_tiles(t: int) -> Callable[[torch.Tensor, int, int], torch.Tensor]:
    """Slices of ``t`` head dims, each token-major: ``[d/t, bs, t]``."""

    def unpack(x: torch.Tensor, bs: int, d: int) -> torch.Tensor:
        y = x.view(*x.shape[:-1], d // t, bs, t).transpose(-2, -3)
        return y.reshape(*x.shape[:-1], bs, d)

    return unpack


# How a block's keys may be laid out inside its region; the first whose unpacked last key
# equals the key the call wrote wins, per backend class (see :func:`kc_inputs`).
LAYOUTS: dict[str, Callable[[torch.Tensor, int, int], torch.Tensor]] = {
    "rowmajor": _rowmajor,
    "transposed": _transposed,
    **{f"token_tiles{t}": _token_tiles(t) for t in (4, 8, 16, 32)},
    **{f"dim_tiles{t}": _dim_tiles(t) for t in (4, 8, 16, 32)},
}
_layout_of: dict[type, str] = {}


def _gather_blocks(
    cache: torch.Tensor, block_row: torch.Tensor, stop: int, bs: int
) -> torch.Tensor:
    """Blocks ``0..`` of one sequence that hold positions ``0..stop-1`` (a copy of those
    only), selected along ``cache``'s first dimension."""
    n = (stop - 1) // bs + 1
    ids = block_row[:n].to(device=cache.device, dtype=torch.long)
    return cache.index_select(0, ids)


def _interleaved(
    kv_cache: torch.Tensor, block_row: torch.Tensor, stop: int, d: int
) -> torch.Tensor:
    _, h, bs, _ = kv_cache.shape
    k = _gather_blocks(kv_cache, block_row, stop, bs)[..., :d]  # [n, h, bs, d]
    return k.permute(1, 0, 2, 3).reshape(h, -1, d)[:, :stop]


def _stacked(kv_cache: torch.Tensor, block_row: torch.Tensor, stop: int, d: int) -> torch.Tensor:
    _, _, bs, h, _ = kv_cache.shape
    k = _gather_blocks(kv_cache[0], block_row, stop, bs)  # [n, bs, h, d]
    return k.permute(2, 0, 1, 3).reshape(h, -1, d)[:, :stop]


def _split(
    unpack: Callable[[torch.Tensor, int, int], torch.Tensor],
) -> Callable[[torch.Tensor, torch.Tensor, int, int], torch.Tensor]:
    def read(kv_cache: torch.Tensor, block_row: torch.Tensor, stop: int, d: int) -> torch.Tensor:
        nb, h, bs, _ = kv_cache.shape
        region = kv_cache.view(nb, h, 2 * bs * d)[:, :, : bs * d]  # needs a contiguous cache
        return gather_keys(region, bs, d, block_row, stop, unpack)

    return read


Reader = Callable[[torch.Tensor, torch.Tensor, int, int], torch.Tensor]


def readers(kv_cache: torch.Tensor, num_kv_heads: int, d: int) -> dict[str, Reader]:
    """The layouts ``kv_cache`` could be in, by name, in the order they are tried: each
    reads the keys of positions ``0..stop-1`` of one sequence as ``[num_kv_heads, stop, d]``."""
    shape = tuple(kv_cache.shape)
    if len(shape) == 4 and shape[1] == num_kv_heads and shape[3] == 2 * d:
        out: dict[str, Reader] = {"interleaved": _interleaved}
        if kv_cache.is_contiguous():
            out.update({f"split:{name}": _split(unpack) for name, unpack in LAYOUTS.items()})
        return out
    if len(shape) == 5 and shape[0] == 2 and shape[3] == num_kv_heads and shape[4] == d:
        return {"stacked": _stacked}
    raise PagedLayoutError(
        f"kv_cache of shape {shape}: expected [blocks, {num_kv_heads} heads, block, {2 * d}] "
        f"(vLLM 0.32) or [2, blocks, block, {num_kv_heads} heads, {d}] (older FlashAttention)"
    )


def gather_keys(
    region: torch.Tensor,
    bs: int,
    d: int,
    block_row: torch.Tensor,
    stop: int,
    unpack: Callable[[torch.Tensor, int, int], torch.Tensor],
) -> torch.Tensor:
    """Keys of positions ``0..stop-1`` of one sequence from a key region ``[num_blocks,
    num_kv_heads, block_size * head_size]`` packed as ``unpack`` says: ``[num_kv_heads,
    stop, d]``."""
    raw = _gather_blocks(region, block_row, stop, bs)  # [n, h, bs*d]
    k = unpack(raw, bs, d)  # [n, h, bs, d]
    return k.permute(1, 0, 2, 3).reshape(region.shape[1], -1, d)[:, :stop]


def _matches(k: torch.Tensor, written: torch.Tensor) -> bool:
    """The last ``len(written)`` keys of ``k`` ``[h, stop, d]`` are ``written`` ``[t, h, d]``."""
    t = written.shape[0]
    return k.shape[1] >= t and torch.equal(k[:, -t:], written.transpose(0, 1).to(k.dtype))


def _find_layout(
    impl: object, found: dict[str, Reader], kv_cache: torch.Tensor, block_row: torch.Tensor,
    stop: int, d: int, written: torch.Tensor,
) -> str:  # fmt: skip
    known = _layout_of.get(type(impl))
    if known is not None and known in found:
        return known
    for name, read in found.items():
        with contextlib.suppress(RuntimeError):
            if _matches(read(kv_cache, block_row, stop, d), written):
                _layout_of[type(impl)] = name
                return name
    raise PagedLayoutError(
        f"no known layout of {type(impl).__name__}'s KV cache holds the keys the call wrote "
        f"at positions up to {stop - 1} (cache {tuple(kv_cache.shape)}, head {d}; tried "
        f"{', '.join(found)})"
    )


def window_of(impl: object) -> int | None:
    """The keys a row sees, counted back from its own (``W``), None for all of them;
    raises ValueError for a window this module cannot read."""
    w = getattr(impl, "sliding_window", None)
    if w is None or isinstance(w, bool):
        return None
    if isinstance(w, int):
        return w if w > 0 else None
    if isinstance(w, tuple | list) and len(w) == 2 and all(type(x) is int for x in w):
        left, right = w
        if left < 0:
            return None
        if right in (0, -1):  # causal: nothing to the right either way
            return left + 1
    raise ValueError(f"sliding_window {w!r} is not an int or a causal (left, right) pair")


def kc_inputs(
    impl: object,  # vLLM's attention implementation: read by getattr only
    query: torch.Tensor,
    key: object,
    kv_cache: object,
    meta: object,  # vLLM's attention metadata (its class depends on the backend)
    max_seqs: int,
) -> KcInputs | None:
    """What :func:`kcops.kernels.kc.kc_rows` needs for the last query row of each of the
    first ``max_seqs`` sequences of this call, or None when the call is not supported.

    ``query`` ``[tokens, num_heads, head_size]``, ``key`` ``[tokens, num_kv_heads,
    head_size]`` (this step's keys, for the self-check). Raises :class:`PagedLayoutError`
    when the cache is not laid out as expected.
    """
    if query.dim() != 3 or not isinstance(kv_cache, torch.Tensor) or not _paged(meta):
        return None
    if not _supported(impl, meta, kv_cache):
        return None
    hkv = int(getattr(impl, "num_kv_heads", 0)) or None
    if hkv is None or not isinstance(key, torch.Tensor):
        return None  # without this step's keys nothing checks the layout: no value, no guess
    try:
        window = window_of(impl)
    except ValueError:
        return None
    d = int(query.shape[-1])
    found = readers(kv_cache, hkv, d)
    qsl = meta.query_start_loc.tolist()
    seq_lens = meta.seq_lens.tolist()
    n = min(len(qsl) - 1, len(seq_lens), max_seqs)
    rows, keys, entries = [], [], []
    for i in range(max(0, n)):
        first, last_row, length = qsl[i], qsl[i + 1] - 1, int(seq_lens[i])
        if last_row < first or length <= 0 or last_row - first >= length:
            continue
        written = key[first : last_row + 1]  # this step's keys: positions up to length - 1
        row = meta.block_table[i]
        name = _find_layout(impl, found, kv_cache, row, length, d, written)
        k = found[name](kv_cache, row, length, d)
        if not _matches(k, written):
            raise PagedLayoutError(
                f"the gathered keys of sequence {i} up to position {length - 1} differ from "
                f"the keys the call wrote there (layout {name}, cache {tuple(kv_cache.shape)})"
            )
        if window is not None:
            k = k[:, max(0, length - window) :]
        rows.append(last_row)
        keys.append(k)
        entries.append(i)
    if not rows:
        return None
    return _batched(impl, query, rows, keys, entries)


def _batched(
    impl: object, query: torch.Tensor, rows: list[int], keys: list[torch.Tensor], entries: list[int]
) -> KcInputs:
    """The sequences' last query rows and their keys as one batch, keys padded to the longest
    and masked."""
    longest = max(k.shape[1] for k in keys)
    h, d = keys[0].shape[0], keys[0].shape[2]
    kpad = keys[0].new_zeros((len(keys), h, longest, d))
    mask = torch.zeros((len(keys), 1, 1, longest), dtype=torch.bool, device=kpad.device)
    for b, k in enumerate(keys):
        kpad[b, :, : k.shape[1]] = k
        mask[b, 0, 0, : k.shape[1]] = True
    q = query[torch.tensor(rows, device=query.device)].unsqueeze(2)  # [B, Hq, 1, d]
    scale = float(getattr(impl, "scale", q.shape[-1] ** -0.5))
    return KcInputs(q, kpad, mask, scale, True, entries=tuple(entries))
