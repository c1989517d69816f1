"""``kc sweep``'s decode steps for many budgets at once: one forward per step.

On a CPU a decode step of a small model is bound by reading its weights (on
SmolLM2 at 4 sequences, the linear layers were 0.5 s of each step), so running
each (policy, N) row's steps on its own read every weight once per row. Here
the rows' sequences share the batch of one forward: G groups of S sequences,
each group a row. Everything but attention is the same arithmetic row by row;
attention runs per group over that group's own cache layer (a
:class:`~kcops.kernels.kvkeep.KeptLayer` cut to its budget, or whole), so a
group sees exactly the keys it would see alone. KV bytes and keys attended
are counted per group; speed cannot be told apart in a shared batch, so
:mod:`kcops.lab.sweep` times a few steps of each row on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import DynamicLayer

from kcops.kernels.kvkeep import KeptLayer, evict, kept_attention

if TYPE_CHECKING:
    from transformers import DynamicCache, PretrainedConfig


class GroupedLayer(DynamicLayer):
    """One cache layer of G groups x S rows; group g is its own :class:`KeptLayer`."""

    def __init__(self, subs: Sequence[KeptLayer], rows: int) -> None:
        super().__init__()
        self.subs = list(subs)
        self.rows = rows
        self.logical = subs[0].logical
        self.is_initialized = True
        # groups whose step weights are kept (``kc_live``): mass[g] (S, Hkv, T), the weights
        # of the step's rows summed over each KV group's query heads
        self.track: set[int] = set()
        self.mass: dict[int, torch.Tensor] = {}

    def _slice(self, g: int) -> slice:
        return slice(g * self.rows, (g + 1) * self.rows)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Appends each group's new keys to its own layer; returns the new states only
        (attention reads the groups' layers, see :meth:`attend`)."""
        for g, sub in enumerate(self.subs):
            sub.update(key_states[self._slice(g)], value_states[self._slice(g)])
        self.logical += key_states.shape[-2]
        return key_states, value_states

    def get_seq_length(self) -> int:
        return self.logical

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.logical + query_length, 0

    def attend(self, query: torch.Tensor, scaling: float | None) -> torch.Tensor:
        """Decode rows (Q = 1) of every group over its own keys: (G*S, 1, H, D)."""
        outs = []
        for g, sub in enumerate(self.subs):
            q = query[self._slice(g)]
            if sub.keys is None or sub.values is None:
                raise ValueError("a grouped layer attends after its prefill")
            if sub.score is not None:
                before = sub.score
                outs.append(kept_attention(sub, q, sub.keys, sub.values, scaling))
                if g in self.track:  # kept_attention added the step's weights to the scores
                    self.mass[g] = sub.score - before
                continue
            # a whole layer: the decode row sees every key, no mask
            out = torch.nn.functional.scaled_dot_product_attention(
                q, sub.keys, sub.values, scale=scaling, enable_gqa=True
            )
            outs.append(out.transpose(1, 2))
        return torch.cat(outs, dim=0)

    def evict(self, budgets: Sequence[int | None]) -> None:
        """Each group cut back to its budget (kcops.kernels.kvkeep.evict)."""
        evict(self.subs, budgets)


def grouped_cache(
    config: PretrainedConfig, layers: Sequence[Sequence[KeptLayer]], rows: int
) -> tuple[DynamicCache, list[GroupedLayer]]:
    """A ``DynamicCache`` whose layer i is ``GroupedLayer(layers[i], rows)``, and its layers."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    grouped = [GroupedLayer(subs, rows) for subs in layers]
    cache.layers = list(grouped)
    return cache, grouped


def group_nbytes(layers: Sequence[GroupedLayer], g: int) -> int:
    return sum(layer.subs[g].nbytes for layer in layers)


def group_keys(layers: Sequence[GroupedLayer], g: int) -> float:
    """Keys attended by group g this step, mean over layers."""
    subs = [layer.subs[g] for layer in layers]
    return sum(int(s.keys.shape[-2]) for s in subs if s.keys is not None) / len(subs)
