"""K(C) from a paged KV cache (vLLM): the keys of a sampled query row are gathered
from the cache blocks that the attention metadata's block table names.

vLLM writes the step's keys into its cache before ``Impl.forward`` runs
(``forward_includes_kv_cache_update = False`` on the CPU backend), so inside a
wrapped ``forward`` the cache holds every key the call attends over. For each of
at most ``max_seqs`` sequences of the batch, the last query row (the decode row;
for a prefill chunk, its last token) is recomputed over the sequence's
``seq_lens[i]`` keys, through the same :func:`kcops.kernels.kc.kc_rows` that the
transformers integration uses (sequences padded to the longest, padding masked).

Layouts read (self-checked, see below):

- ``cpu``: ``[num_blocks, num_kv_heads, block_size, 2 * head_size]``, keys in the
  first ``block_size * head_size`` elements of each (block, head) — how vLLM's
  ``CPUAttentionBackendImpl`` views it (``view(nb, h, 2 * bs, d).chunk(2, dim=2)``);
- ``flash``: ``[2, num_blocks, block_size, num_kv_heads, head_size]`` (FlashAttention).

The self-check: the last key the step wrote for a sequence is also the ``key``
argument of the call; if the gathered copy differs, the layout is not what this
module thinks and :class:`PagedLayoutError` is raised (the probe counts it as an
internal error, logs it once and never raises into the engine). A K(C) value is
either right or absent.

Calls whose attention this recomputation would not reproduce give no K(C) (None,
not an error): encoder / cross attention, ALiBi, logits soft-capping, attention
sinks, a quantized (fp8) cache, a non-causal or dynamically causal mask.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from kcops.kernels.probe import KcInputs


class PagedLayoutError(RuntimeError):
    """The KV cache is not laid out as expected (the gathered last key does not match)."""


def _supported(impl: Any, meta: Any, kv_cache: Any) -> bool:
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
    if getattr(meta, "causal", True) is not True:
        return False
    if getattr(meta, "dynamic_causal", None) is not None:
        return False
    return all(hasattr(meta, f) for f in ("seq_lens", "block_table", "query_start_loc"))


def key_region(kv_cache: torch.Tensor, num_kv_heads: int) -> tuple[torch.Tensor, int]:
    """The key half of the cache as raw ``[num_blocks, num_kv_heads, block_size * head_size]``
    (a view, no copy), and the block size."""
    if kv_cache.dim() == 4 and kv_cache.shape[1] == num_kv_heads:  # cpu
        nb, h, bs, two_d = kv_cache.shape
        return kv_cache.view(nb, h, 2 * bs * (two_d // 2))[:, :, : bs * (two_d // 2)], bs
    if kv_cache.dim() == 5 and kv_cache.shape[0] == 2 and kv_cache.shape[3] == num_kv_heads:
        k = kv_cache[0].permute(0, 2, 1, 3)  # flash: [nb, bs, h, d] -> [nb, h, bs, d]
        return k.reshape(k.shape[0], k.shape[1], -1), int(k.shape[2])
    raise PagedLayoutError(
        f"kv_cache of shape {tuple(kv_cache.shape)}: expected [blocks, {num_kv_heads} heads, "
        f"block, 2*head] (cpu) or [2, blocks, block, {num_kv_heads} heads, head] (flash)"
    )


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


def gather_keys(
    region: torch.Tensor,
    bs: int,
    d: int,
    block_row: torch.Tensor,
    stop: int,
    unpack: Callable[[torch.Tensor, int, int], torch.Tensor],
) -> torch.Tensor:
    """Keys of positions ``0..stop-1`` of one sequence, ``[num_kv_heads, stop, d]``."""
    n = (stop - 1) // bs + 1
    ids = block_row[:n].to(device=region.device, dtype=torch.long)
    raw = region.index_select(0, ids)  # [n, h, bs*d], a copy of these blocks only
    k = unpack(raw, bs, d)  # [n, h, bs, d]
    return k.permute(1, 0, 2, 3).reshape(region.shape[1], n * bs, d)[:, :stop]


def _find_layout(
    impl: Any, region: torch.Tensor, bs: int, d: int, block_row: torch.Tensor, stop: int,
    written: torch.Tensor,
) -> str:  # fmt: skip
    known = _layout_of.get(type(impl))
    if known is not None:
        return known
    for name, unpack in LAYOUTS.items():
        with contextlib.suppress(RuntimeError):
            k = gather_keys(region, bs, d, block_row, stop, unpack)
            if torch.equal(k[:, -1], written.to(k.dtype)):
                _layout_of[type(impl)] = name
                return name
    raise PagedLayoutError(
        f"no known layout of {type(impl).__name__}'s key blocks holds the key the call wrote "
        f"at position {stop - 1} (block {bs} tokens, head {d}; tried {', '.join(LAYOUTS)})"
    )


def kc_inputs(
    impl: Any,
    query: torch.Tensor,
    key: torch.Tensor | None,
    kv_cache: Any,
    meta: Any,
    max_seqs: int,
) -> KcInputs | None:
    """What :func:`kcops.kernels.kc.kc_rows` needs for the last query row of each of the
    first ``max_seqs`` sequences of this call, or None when the call is not supported.

    ``query`` ``[tokens, num_heads, head_size]``, ``key`` ``[tokens, num_kv_heads,
    head_size]`` (this step's keys, for the self-check). Raises :class:`PagedLayoutError`
    when the cache is not laid out as expected.
    """
    if meta is None or query.dim() != 3 or not _supported(impl, meta, kv_cache):
        return None
    hkv = int(getattr(impl, "num_kv_heads", 0)) or None
    if hkv is None:
        return None
    region, bs = key_region(kv_cache, hkv)
    d = int(query.shape[-1])
    qsl = meta.query_start_loc.tolist()
    seq_lens = meta.seq_lens.tolist()
    n = min(len(qsl) - 1, len(seq_lens), max_seqs)
    if n <= 0:
        return None
    window = int(getattr(impl, "sliding_window", -1) or -1)
    rows, keys = [], []
    for i in range(n):
        last_row, length = qsl[i + 1] - 1, int(seq_lens[i])
        if last_row < qsl[i] or length <= 0:
            continue
        if key is None:
            return None  # nothing to check the layout against: no value rather than a guess
        written = key[last_row]
        name = _find_layout(impl, region, bs, d, meta.block_table[i], length, written)
        k = gather_keys(region, bs, d, meta.block_table[i], length, LAYOUTS[name])
        if not torch.equal(k[:, -1], written.to(k.dtype)):
            raise PagedLayoutError(
                f"the gathered key of sequence {i} at position {length - 1} differs from the "
                f"key the call wrote there (layout {name}, cache shape {tuple(kv_cache.shape)})"
            )
        if window > 0:
            k = k[:, max(0, length - window) :]
        rows.append(last_row)
        keys.append(k)
    if not rows:
        return None
    longest = max(k.shape[1] for k in keys)
    h, d = keys[0].shape[0], keys[0].shape[2]
    kpad = keys[0].new_zeros((len(keys), h, longest, d))
    mask = torch.zeros((len(keys), 1, 1, longest), dtype=torch.bool, device=kpad.device)
    for b, k in enumerate(keys):
        kpad[b, :, : k.shape[1]] = k
        mask[b, 0, 0, : k.shape[1]] = True
    q = query[torch.tensor(rows, device=query.device)].unsqueeze(2)  # [B, Hq, 1, d]
    return KcInputs(q, kpad, mask, float(getattr(impl, "scale", q.shape[-1] ** -0.5)), True)
