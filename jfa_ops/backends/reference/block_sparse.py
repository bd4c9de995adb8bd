"""The ``reference`` backend's block-sparse family: exact selection (float64 pooled scores) and exact attention
restricted to the selected blocks (the dense reference math with a block mask). Reads offsets and the selection
on the host: the tests' twin of the oracle in ``jfa_ops.testing``, not a fast path."""
from __future__ import annotations

import torch

import meta_kernels
from jfa_ops.backends.base import BlockSelectParams, BlockSparseParams, FamilyImpl
from jfa_ops.backends.reference import _sequences, backward_into, exact, forward_into


def _pool(x: torch.Tensor, block: int) -> torch.Tensor:
    """[L, H, D] -> [ceil(L / block), H, D] float64 block means (the tail block over its real rows)."""
    rows = x.shape[0]
    n = meta_kernels.num_blocks(rows, block)
    padded = x.new_zeros((n * block,) + tuple(x.shape[1:]), dtype=torch.float64)
    padded[:rows] = x
    sizes = (rows - torch.arange(n, device=x.device) * block).clamp(max=block).to(torch.float64)
    return padded.unflatten(0, (n, block)).sum(1) / sizes[:, None, None]


def block_scores(q_seq, k_seq, params: BlockSelectParams):
    """(scores [Hkv, nqb, nkb] float64 with invisible blocks -inf and the local block +inf, kept [Hkv, nqb]) of one
    sequence."""
    heads_kv = k_seq.shape[1]
    q_rows, kv_rows = q_seq.shape[0], k_seq.shape[0]
    pooled_q = _pool(q_seq, params.block_q).unflatten(1, (heads_kv, -1)).mean(2)  # the group's query heads pooled
    pooled_k = _pool(k_seq, params.block_kv)
    scores = torch.einsum("ihd,jhd->hij", pooled_q, pooled_k)
    i = torch.arange(scores.shape[1], device=q_seq.device)[:, None]
    j = torch.arange(scores.shape[2], device=q_seq.device)[None, :]
    visible = meta_kernels.block_visible(q_rows, kv_rows, params.block_q, params.block_kv, params.causal,
                                         params.window_left, params.window_right, i, j)
    scores = scores.masked_fill(~visible, float("-inf"))
    if params.always_local:
        local = meta_kernels.local_block(q_rows, kv_rows, params.block_q, params.block_kv, i) == j
        scores = scores.masked_fill(local & visible, float("inf"))
    kept = meta_kernels.keep_count(visible.sum(1), params.keep_ratio, params.top_k)  # [nqb]
    return scores, kept.expand(heads_kv, -1)


def top_blocks(scores: torch.Tensor, kept: torch.Tensor, n_kv_blocks: int) -> torch.Tensor:
    """The ``kept`` best blocks of each row of ``scores`` [..., n] (ties toward the lower index), ascending, padded
    with -1 to ``n_kv_blocks`` columns: int32 [..., n_kv_blocks]. Device ops only (no host sync)."""
    n = scores.shape[-1]
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    rank = torch.arange(n, device=scores.device)
    chosen = torch.where(rank < kept[..., None], order, n).sort(dim=-1).values
    chosen = torch.where(chosen == n, -1, chosen).to(meta_kernels.INDEX_DTYPE)
    padded = chosen.new_full(tuple(chosen.shape[:-1]) + (n_kv_blocks,), -1)
    width = min(n, n_kv_blocks)
    padded[..., :width] = chosen[..., :width]
    return padded


@exact
def select_kv_blocks(q, k, q_offsets, kv_offsets, params: BlockSelectParams):
    num_seqs, heads_kv = kv_offsets.shape[0] - 1, k.shape[1]
    index = torch.full((num_seqs, heads_kv, params.n_q_blocks, params.n_kv_blocks), -1,
                       dtype=meta_kernels.INDEX_DTYPE, device=q.device)
    count = torch.zeros((num_seqs, heads_kv, params.n_q_blocks), dtype=meta_kernels.INDEX_DTYPE, device=q.device)
    for b, q_start, q_rows, _, kv_start, kv_rows in _sequences(q, q_offsets, kv_offsets, params):
        if q_rows == 0:
            continue
        scores, kept = block_scores(q[q_start:q_start + q_rows], k[kv_start:kv_start + kv_rows], params)
        nqb = scores.shape[1]
        if nqb > params.n_q_blocks or scores.shape[2] > params.n_kv_blocks:
            raise ValueError(f"sequence {b} has {nqb} Q blocks and {scores.shape[2]} KV blocks, more than the "
                             f"{params.n_q_blocks} and {params.n_kv_blocks} that max_seqlen_q/max_seqlen_kv give")
        index[b, :, :nqb] = top_blocks(scores, kept, params.n_kv_blocks)
        count[b, :, :nqb] = kept.to(count.dtype)
    return index, count


def block_mask_fn(kv_block_index, kv_block_count, kv_offsets, params: BlockSparseParams):
    """``block_mask(b, r0, r1)`` -> [Hkv, 1, r1 - r0, L_kv] bool for ``forward_into``/``backward_into``: key c is
    kept for query r iff c's block is among the first kv_block_count selected ids of r's Q block. Ids outside the
    sequence's blocks and Q blocks past the index's NQB select nothing."""
    index, count = kv_block_index.cpu(), kv_block_count.cpu()
    kv_bounds = kv_offsets.tolist()
    n_q_blocks, width = index.shape[2], index.shape[3]

    def block_mask(b, r0, r1):
        kv_rows = kv_bounds[b + 1] - kv_bounds[b]
        nkb = meta_kernels.num_blocks(kv_rows, params.block_kv)
        used = torch.arange(width) < count[b][..., None]  # [Hkv, NQB, width]
        ids = index[b].long()
        ids = torch.where(used & (ids >= 0) & (ids < nkb), ids, nkb)
        selected = torch.zeros(index.shape[1], n_q_blocks + 1, nkb + 1, dtype=torch.bool)
        selected[:, :n_q_blocks].scatter_(2, ids, True)
        q_block = (torch.arange(r0, r1) // params.block_q).clamp(max=n_q_blocks)  # past NQB: the empty row
        kv_block = torch.arange(kv_rows) // params.block_kv
        mask = selected[:, q_block][:, :, kv_block]  # [Hkv, r, Lk]
        return mask.unsqueeze(1).to(kv_block_index.device)

    return block_mask


def forward(q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count, params: BlockSparseParams):
    rows = (kv_offsets.shape[0] - 1) * q.shape[0] if params.broadcast_q else q.shape[0]
    out = torch.zeros(rows, q.shape[1], q.shape[2], dtype=q.dtype, device=q.device)
    lse = torch.full((q.shape[1], rows), float("-inf"), dtype=torch.float32, device=q.device)
    mask = block_mask_fn(kv_block_index, kv_block_count, kv_offsets, params)
    forward_into(out, lse, q, k, v, _sequences(q, q_offsets, kv_offsets, params), params, block_mask=mask)
    return out, lse


def backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, kv_block_index, kv_block_count,
             params: BlockSparseParams):
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    dq, dk, dv = (torch.zeros(t.shape, dtype=cdt, device=q.device) for t in (q, k, v))
    mask = block_mask_fn(kv_block_index, kv_block_count, kv_offsets, params)
    backward_into(dq, dk, dv, grad_out, grad_lse, q, k, v, out, lse, _sequences(q, q_offsets, kv_offsets, params),
                  params, block_mask=mask)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


FAMILIES = {
    "select_kv_blocks": FamilyImpl(forward=select_kv_blocks),
    "block_sparse": FamilyImpl(forward=forward, backward=backward),
}
