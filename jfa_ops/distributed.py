"""Data-parallel helpers for jagged batches: split a batch across ranks so each rank's attention costs the same.

Attention over a sequence of length L costs ~L^2, so splitting a jagged batch by count (or by tokens) leaves the rank
that got the longest sequences as the straggler every other rank waits for at the gradient all-reduce.
``balance_by_cost`` assigns whole sequences to ranks, longest first, each to the currently least-loaded rank (Graham's
LPT rule): every rank's load is at most the mean load plus the single largest cost, and within 4/3 of the best split.

Typical use (every rank sees the global batch's lengths, keeps its own share)::

    shards = balance_by_cost(offsets.diff().tolist(), world_size, seed=step)
    tokens_r, offsets_r = take_sequences(tokens, offsets, shards[rank])

``merge_attention`` is the building block of context parallelism (docs/scaling.md): attention over disjoint parts
of each sequence's keys, computed apart (on different ranks), combined exactly through the returned ``lse``.
"""
from __future__ import annotations

import heapq
import math
import random
from typing import List, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["balance_by_cost", "merge_attention", "shard_costs", "take_sequences"]


def shard_costs(lengths: Sequence[int], shards: Sequence[Sequence[int]]) -> List[int]:
    """The attention cost (sum of squared lengths) of each shard."""
    return [sum(int(lengths[i]) ** 2 for i in shard) for shard in shards]


def balance_by_cost(lengths: Sequence[int], num_shards: int, *, seed: int = 0) -> List[List[int]]:
    """Split sequence indices ``0..len(lengths)-1`` into ``num_shards`` lists with near-equal sums of squared lengths.

    Longest sequence first, each to the shard with the lowest cost so far (ties: the one holding fewer sequences,
    then the lower shard index), so empty and short sequences spread evenly too. ``seed`` only orders sequences of
    equal length, which varies which shard gets which of them from step to step; the result is a function of
    ``(lengths, num_shards, seed)``. Each shard's indices are returned in ascending order.

    Bound: max shard cost <= total / num_shards + max_i lengths[i]**2 (and <= 4/3 of the optimum).
    """
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError(f"num_shards must be a positive int, got {num_shards!r}")
    lengths = [int(n) for n in lengths]
    if any(n < 0 for n in lengths):
        raise ValueError(f"lengths must be >= 0, got {min(lengths)}")
    order = list(range(len(lengths)))
    random.Random(seed).shuffle(order)
    order.sort(key=lambda i: -lengths[i])  # stable: equal lengths keep the seeded order
    heap: List[Tuple[int, int, int]] = [(0, 0, shard) for shard in range(num_shards)]  # (cost, count, shard)
    shards: List[List[int]] = [[] for _ in range(num_shards)]
    for i in order:
        cost, count, shard = heapq.heappop(heap)
        shards[shard].append(i)
        heapq.heappush(heap, (cost + lengths[i] ** 2, count + 1, shard))
    return [sorted(shard) for shard in shards]


def take_sequences(values: Tensor, offsets: Tensor, indices: Sequence[int]) -> Tuple[Tensor, Tensor]:
    """The packed rows and offsets of the sequences ``indices`` (in that order) of a jagged batch.

    ``values`` ``[T, ...]``, ``offsets`` ``[B+1]`` -> (``values`` ``[T', ...]``, ``offsets`` ``[len(indices)+1]``,
    same dtype and device as ``offsets``). Reads ``offsets`` on the host: call it in the data pipeline, not in a
    compiled region.
    """
    bounds = offsets.tolist()
    starts = [bounds[i] for i in indices]
    lengths = [bounds[i + 1] - bounds[i] for i in indices]
    rows = [torch.arange(s, s + n) for s, n in zip(starts, lengths)]
    rows = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int64)
    new_offsets = torch.zeros(len(indices) + 1, dtype=offsets.dtype)
    torch.cumsum(torch.tensor(lengths, dtype=offsets.dtype), 0, out=new_offsets[1:])
    return values[rows.to(values.device)], new_offsets.to(offsets.device)


def merge_attention(outs: Sequence[Tensor], lses: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
    """Attention over the union of disjoint key sets, from attention over each set: ``(out, lse)``.

    ``outs[i]`` ``[T, H, D]`` and ``lses[i]`` ``[H, T]`` are ``jagged_attention(..., return_lse=True)`` of the same
    queries over the i-th part of their keys. With ``lse = logsumexp_i lse_i``::

        out = sum_i exp(lse_i - lse) * out_i

    Differentiable in every input (gradients flow back through each ``lse_i``). A row that sees no key in any part
    gets out 0, lse -inf and zero gradients, as the op gives; a part where the row sees no key (lse_i = -inf)
    contributes nothing. Sums in float32 at least; ``out`` has ``outs[0]``'s dtype.
    """
    stacked = torch.stack(list(lses))  # [parts, H, T]
    peak = stacked.amax(dim=0)
    peak = torch.where(torch.isinf(peak), torch.zeros_like(peak), peak)
    total = torch.exp(stacked - peak).sum(dim=0)
    seen = total > 0
    # Guard 0/0 (the row sees no key anywhere): log and division see 1 there, and where() passes zero gradients.
    lse_or_zero = peak + torch.log(torch.where(seen, total, torch.ones_like(total)))
    acc_dtype = torch.promote_types(outs[0].dtype, torch.float32)
    out = sum(o.to(acc_dtype) * torch.exp(lse_i - lse_or_zero).transpose(0, 1).unsqueeze(-1).to(acc_dtype)
              for o, lse_i in zip(outs, lses))
    lse = torch.where(seen, lse_or_zero, torch.full_like(lse_or_zero, -math.inf))
    return out.to(outs[0].dtype), lse
