"""The ``cpu`` backend: the reference's exact math, batched over sequences of similar length (CPU's automatic choice).

The reference loops over sequences in Python; a batch of thousands of short sequences is then all loop overhead. Here
sequences go into buckets by ``max(L_q, L_k)`` rounded up to a power of two (so padding at most doubles a length),
each bucket is padded to ``[b, Hkv, G * L_q, D]`` and computed with batched matmuls and a mask built from the lengths
(bottom-right causal/window, padding). Python loops over buckets and score-block-sized chunks of them, never over
sequences. A sequence whose score block alone exceeds ``SCORE_BLOCK_BYTES`` goes through the reference's row-chunked
loop instead (memory stays bounded by rows x L_kv).

Padding rows repeat the sequence's own last row (never a neighbour's), so a NaN in one sequence stays there, with the
same pattern as in the reference (whose P·V products also multiply 0 by every key of the sequence).

Finite fp32/bf16/fp16 inputs with a per-sequence q take a fused path: the same padded chunks (float32) go through
ATen's CPU flash attention kernel (``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward) with an
additive mask, so scores and probabilities never reach memory (2-3x faster on B=4000 short sequences: bench/NOTES.md
"CPU path").
Everything else takes the exact batched math below: non-finite inputs (the additive mask would turn a masked NaN score
into NaN where the reference drops it), broadcast-Q, float64, an lse gradient (the kernel's backward takes none), and
a chunk whose lse overflows. Rows that see no key get lse -inf (the kernel gives 0).

Same semantics as the reference: float32 accumulation (float64 for float64), lse -inf and zeros where no key is
visible, NaN propagation, gradient through lse, broadcast-Q dq summed over the batch (deterministic: plain sums).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from jfa_ops.backends import reference
from jfa_ops.backends.base import AttentionParams, Backend, Problem

SCORE_BLOCK_BYTES = 64 * 2**20  # scores of one chunk (float32); temporaries take a few times this


class _Chunk:
    """Padded index tensors of a group of sequences: sequence i's row r is padded row (i, r). Padding rows repeat the
    sequence's last row (never a neighbour's: a NaN must stay in its sequence); the mask hides them."""

    def __init__(self, q_start, q_len, out_start, kv_start, kv_len, pad_q: int, pad_kv: int):
        r_q = torch.arange(pad_q)
        r_kv = torch.arange(pad_kv)
        self.q_len, self.kv_len = q_len, kv_len
        self.valid_q = r_q[None, :] < q_len[:, None]  # [b, pad_q]
        self.valid_kv = r_kv[None, :] < kv_len[:, None]  # [b, pad_kv]
        last_q, last_kv = (q_len - 1)[:, None], (kv_len - 1)[:, None]
        self.q_index = q_start[:, None] + torch.minimum(r_q, last_q)
        self.out_index = out_start[:, None] + torch.minimum(r_q, last_q)
        self.kv_index = kv_start[:, None] + torch.minimum(r_kv, last_kv)

    def visible(self, params: AttentionParams, *, padding_rows_see: bool = False) -> torch.Tensor:
        """[b, pad_q, pad_kv] bool: real key j visible to query i (bottom-right causal/window). Padding query rows see
        nothing unless ``padding_rows_see`` (the forward drops their output: masking them would only cost a pass)."""
        i = torch.arange(self.valid_q.shape[1])[None, :, None]
        j = torch.arange(self.valid_kv.shape[1])[None, None, :]
        diag = i + (self.kv_len - self.q_len)[:, None, None]
        ok = self.valid_kv[:, None, :] if padding_rows_see else self.valid_q[:, :, None] & self.valid_kv[:, None, :]
        if params.causal:
            ok = ok & (j <= diag)
        if params.window_left >= 0:
            ok = ok & (j >= diag - params.window_left)
        if params.window_right >= 0:
            ok = ok & (j <= diag + params.window_right)
        return ok


def _lengths(q, q_offsets, kv_offsets, params):
    """Per sequence (q_start, q_len, out_start, kv_start, kv_len), int64 CPU tensors."""
    kv_bounds = kv_offsets.to("cpu", torch.int64)
    kv_start, kv_len = kv_bounds[:-1], kv_bounds.diff()
    batch = kv_len.shape[0]
    if params.broadcast_q:
        q_start = torch.zeros(batch, dtype=torch.int64)
        q_len = torch.full((batch,), q.shape[0], dtype=torch.int64)
        out_start = torch.arange(batch) * q.shape[0]
    else:
        q_bounds = q_offsets.to("cpu", torch.int64)
        q_start, q_len = q_bounds[:-1], q_bounds.diff()
        out_start = q_start
    return q_start, q_len, out_start, kv_start, kv_len


def _plan(q, q_offsets, kv_offsets, params, elem_bytes: int) -> Tuple[List[_Chunk], list]:
    """(chunks of bucketed sequences, sequences for the reference loop as ``reference._sequences`` tuples)."""
    q_start, q_len, out_start, kv_start, kv_len = _lengths(q, q_offsets, kv_offsets, params)
    heads_q = q.shape[1]
    longest = torch.maximum(q_len, kv_len)
    work = (q_len > 0) & (kv_len > 0)  # the others keep out 0, lse -inf, zero gradients
    too_big = work & (q_len * kv_len * heads_q * elem_bytes > SCORE_BLOCK_BYTES)
    alone = too_big.nonzero().flatten().tolist()
    singles = [(b, int(q_start[b]), int(q_len[b]), int(out_start[b]), int(kv_start[b]), int(kv_len[b]))
               for b in alone]
    bucket = torch.where(work & ~too_big, (longest - 1).clamp(min=1).log2().floor().long() + 1, -1)
    chunks = []
    for key in bucket.unique().tolist():
        if key < 0:
            continue
        seqs = (bucket == key).nonzero().flatten()
        pad_q, pad_kv = int(q_len[seqs].max()), int(kv_len[seqs].max())
        step = max(1, SCORE_BLOCK_BYTES // (pad_q * pad_kv * heads_q * elem_bytes))
        for part in seqs.split(step):
            chunks.append(_Chunk(q_start[part], q_len[part], out_start[part], kv_start[part], kv_len[part],
                                 pad_q, pad_kv))
    return chunks, singles


def _heads_first(x: torch.Tensor, heads_kv: int) -> torch.Tensor:
    """[T, Hq, D] -> [Hkv, T, G, D], a view. A gather of padded rows [b, L] from it gives [Hkv, b, L, G, D], already
    a contiguous batch of [L * G, D] matrices (row i * G + g: position i, q head kv_head * G + g)."""
    rows, heads, dim = x.shape
    return x.view(rows, heads_kv, heads // heads_kv, dim).transpose(0, 1)


class _Operands:
    """Gathers q, k, v (and dO) rows of a chunk as batched matrices in the compute dtype."""

    def __init__(self, q, k, v, params: AttentionParams, dtype: torch.dtype):
        self.heads_kv, self.group = k.shape[1], q.shape[1] // k.shape[1]
        self.broadcast_q, self.dtype = params.broadcast_q, dtype
        # One contiguous heads-first copy each: gathering rows from it (index_select) is ~25% faster than gathering
        # from the strided view with advanced indexing (measured on B=4000 short sequences).
        self.q, self.k, self.v = (_heads_first(x, self.heads_kv).contiguous() for x in (q, k, v))

    def q_rows(self, chunk: _Chunk) -> torch.Tensor:
        """[Hkv * b, L * G, D]; broadcast-Q: the shared q repeated for each sequence."""
        batch, pad_q = chunk.valid_q.shape
        if self.broadcast_q:
            dense = self.q[:, None, :pad_q]  # [Hkv, 1, L, G, D]
            rows = dense.expand(-1, batch, -1, -1, -1).to(self.dtype).contiguous()
        else:
            rows = self.q.index_select(1, chunk.q_index.flatten()).to(self.dtype)
        return rows.view(self.heads_kv * batch, pad_q * self.group, -1)

    def out_rows(self, x: torch.Tensor, chunk: _Chunk) -> torch.Tensor:
        """[Hkv * b, L * G, D] of an out-row tensor (dO). reshape, not view: the gather keeps x's layout, and the
        public backward op takes a dO of any layout (a head_dim-major one cannot be viewed)."""
        batch, pad_q = chunk.valid_q.shape
        return _heads_first(x, self.heads_kv)[:, chunk.out_index].to(self.dtype).reshape(self.heads_kv * batch,
                                                                                          pad_q * self.group, -1)

    def kv_rows(self, x_hf: torch.Tensor, chunk: _Chunk) -> torch.Tensor:
        """[Hkv * b, Lk, D] of k or v."""
        batch, pad_kv = chunk.valid_kv.shape
        return x_hf.index_select(1, chunk.kv_index.flatten()).to(self.dtype).view(self.heads_kv * batch, pad_kv, -1)


def _masked_scores(ops: _Operands, chunk: _Chunk, visible, q_pad, k_pad, scale: float) -> torch.Tensor:
    """[Hkv * b, L * G, Lk] scaled scores, invisible entries -inf (masked_fill: a masked NaN or inf is dropped)."""
    s = torch.baddbmm(q_pad.new_zeros(()), q_pad, k_pad.transpose(1, 2), beta=0, alpha=scale)
    batch, pad_q = chunk.valid_q.shape
    s.view(ops.heads_kv, batch, pad_q, ops.group, -1).masked_fill_(~visible[None, :, :, None, :], float("-inf"))
    return s


def _softmax_lse(s: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(p, lse) over the last dim with ``row_lse``/``softmax_probs``' semantics in fewer passes: one fused softmax and
    two max reductions (max p = exp(max s - lse), so lse = max s - log max p). Rows without softmax mass (max s =
    -inf) give p 0, lse -inf; a NaN or +inf score gives NaN in both (softmax is NaN there, and so is max p)."""
    p = torch.softmax(s, dim=-1)
    top = s.amax(dim=-1)
    empty = top == float("-inf")
    lse = (top - p.amax(dim=-1).log()).masked_fill_(empty, float("-inf"))
    if empty.any():
        p.masked_fill_(empty[..., None], 0)
    return p, lse


def _scatter_rows(dst: torch.Tensor, index: torch.Tensor, src: torch.Tensor, chunk_valid: torch.Tensor) -> None:
    """dst [rows, Hq, D] (rows written once) <- the valid rows of src [Hkv, b, L, G, D]."""
    heads_kv, group = src.shape[0], src.shape[3]
    view = dst.view(dst.shape[0], heads_kv, group, -1)
    view[index[chunk_valid]] = src[:, chunk_valid].transpose(0, 1).to(dst.dtype)


def forward(q, k, v, q_offsets, kv_offsets, params: AttentionParams):
    heads_q, head_dim = q.shape[1], q.shape[2]
    cdt = reference._compute_dtype(q.dtype)
    rows = (kv_offsets.shape[0] - 1) * q.shape[0] if params.broadcast_q else q.shape[0]
    out = torch.zeros(rows, heads_q, head_dim, dtype=q.dtype, device=q.device)
    lse = torch.full((heads_q, rows), float("-inf"), dtype=torch.float32, device=q.device)
    chunks, singles = _plan(q, q_offsets, kv_offsets, params, torch.finfo(cdt).bits // 8)
    fused = chunks and _fused_ok(params, q, k, v)
    ops = None
    for chunk in chunks:
        if fused:
            o, lse_rows = _fused_forward_chunk(q, k, v, chunk, params)
            if o is not None:
                out.index_copy_(0, chunk.out_index[chunk.valid_q], o[chunk.valid_q].to(out.dtype))
                lse[:, chunk.out_index[chunk.valid_q]] = lse_rows[chunk.valid_q].T
                continue
        ops = ops or _Operands(q, k, v, params, cdt)
        o, lse_chunk = _forward_chunk(ops, chunk, params)
        _scatter_rows(out, chunk.out_index, o, chunk.valid_q)
        lse[:, chunk.out_index[chunk.valid_q]] = lse_chunk[:, chunk.valid_q].transpose(1, 2).reshape(heads_q, -1).float()
    reference.forward_into(out, lse, q, k, v, singles, params)
    return out, lse


def _fused_ok(params: AttentionParams, *tensors) -> bool:
    """Whether chunks may take the fused path (ATen's CPU flash attention kernel): all inputs finite (its additive
    mask turns a masked NaN/inf score into NaN where the reference drops it; one summing pass decides: a sum is
    non-finite if any element is, or on overflow, which only costs the exact path), a per-sequence q, and not float64
    (the saved lse is float32: a float64 backward recomputes P from the scores)."""
    return (not params.broadcast_q and tensors[0].dtype != torch.float64
            and all(bool(torch.isfinite(t.sum())) for t in tensors))


def _padded(x: torch.Tensor, index: torch.Tensor, heads: int) -> torch.Tensor:
    """[b, H, L, D] float32 view of the padded rows ``x[index]`` ([b, L]): one gather of whole token rows; k/v heads
    repeated to the q heads (GQA). float32 also for bf16/fp16: the kernel's reduced-precision path rounds lse off by
    more than the reference's float32 math (measured 1e-5 relative on fp16)."""
    rows = x.index_select(0, index.flatten()).float().view(*index.shape, x.shape[1], x.shape[2])
    if heads != x.shape[1]:
        rows = rows.repeat_interleave(heads // x.shape[1], dim=2)
    return rows.transpose(1, 2)


def _additive_mask(visible: torch.Tensor) -> torch.Tensor:
    """[b, 1, L, Lk] float32: 0 where visible, -inf elsewhere."""
    return torch.zeros(visible.shape).masked_fill_(~visible, float("-inf"))[:, None]


def _fused_forward_chunk(q, k, v, chunk: _Chunk, params: AttentionParams):
    """(out [b, L, Hq, D], lse [b, L, Hq]; float32) of one chunk from ATen's CPU flash kernel, or
    (None, None) where a row that sees keys got a non-finite lse (score overflow): the exact path redoes the chunk.
    The kernel gives rows that see no key out 0 and lse 0; lse is set to -inf there."""
    heads = q.shape[1]
    visible = chunk.visible(params, padding_rows_see=True)
    o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _padded(q, chunk.q_index, heads), _padded(k, chunk.kv_index, heads), _padded(v, chunk.kv_index, heads),
        attn_mask=_additive_mask(visible), scale=params.scale)
    lse = lse.transpose(1, 2)  # [b, L, Hq]
    sees = visible.any(dim=-1)[..., None]
    if not bool(torch.isfinite(lse).logical_or_(~sees).all()):
        return None, None
    return o.transpose(1, 2), lse.masked_fill(~sees, float("-inf"))


def _forward_chunk(ops: _Operands, chunk: _Chunk, params: AttentionParams):
    """(out [Hkv, b, L, G, D], lse [Hkv, b, L, G]) of one chunk, compute dtype."""
    batch, pad_q = chunk.valid_q.shape
    q_pad, k_pad, v_pad = ops.q_rows(chunk), ops.kv_rows(ops.k, chunk), ops.kv_rows(ops.v, chunk)
    visible = chunk.visible(params, padding_rows_see=True)
    p, lse = _softmax_lse(_masked_scores(ops, chunk, visible, q_pad, k_pad, params.scale))
    o = torch.bmm(p, v_pad)
    return o.view(ops.heads_kv, batch, pad_q, ops.group, -1), lse.view(ops.heads_kv, batch, pad_q, ops.group)


def _delta_and_empty(grad_out, grad_lse, out, lse, heads_kv: int):
    """([Hkv, rows, G] delta, [Hkv, rows, G] rows without softmax mass) of the exact backward. delta = rowsum(dO * O)
    - dlse, per out row: d lse / d s = p, so the lse gradient shifts delta."""
    cdt = reference._compute_dtype(out.dtype)
    heads_q = out.shape[1]
    delta = torch.einsum("rhd,rhd->hr", grad_out.to(cdt), out.to(cdt))  # [Hq, rows]
    if grad_lse is not None:
        delta = delta - grad_lse.to(cdt)
    delta_hf = delta.view(heads_kv, heads_q // heads_kv, -1).transpose(1, 2)
    empty_hf = (lse == float("-inf")).view(heads_kv, heads_q // heads_kv, -1).transpose(1, 2)
    return delta_hf, empty_hf


def backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params: AttentionParams):
    heads_kv = k.shape[1]
    cdt = reference._compute_dtype(q.dtype)
    chunks, singles = _plan(q, q_offsets, kv_offsets, params, torch.finfo(cdt).bits // 8)
    dq, dk, dv = (torch.zeros(x.shape, dtype=cdt, device=x.device) for x in (q, k, v))
    if chunks and grad_lse is None and _fused_ok(params, q, k, v, grad_out):
        for chunk in chunks:
            _fused_backward_chunk(grad_out, q, k, v, out, lse, chunk, dq, dk, dv, params)
        chunks = []
    if chunks:
        ops = _Operands(q, k, v, params, cdt)
        delta_hf, empty_hf = _delta_and_empty(grad_out, grad_lse, out, lse, heads_kv)
        for chunk in chunks:
            _backward_chunk(ops, chunk, grad_out, delta_hf, empty_hf, dq, dk, dv, params)
    reference.backward_into(dq, dk, dv, grad_out, grad_lse, q, k, v, out, lse, singles, params)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _fused_backward_chunk(grad_out, q, k, v, out, lse, chunk: _Chunk, dq, dk, dv, params: AttentionParams):
    """One chunk's gradients from ATen's CPU flash backward (no lse gradient: it has no input for one). Rows that
    see no key (padding rows too) get lse 0 and a mask hiding every key, so P = exp(-inf - 0) = 0 there."""
    heads, heads_kv = q.shape[1], k.shape[1]
    visible = chunk.visible(params)
    sees = visible.any(dim=-1)  # [b, L]
    lse_rows = lse[:, chunk.out_index].permute(1, 0, 2).masked_fill(~sees[:, None], 0)  # [b, Hq, L]
    if not bool(torch.isfinite(lse_rows).all()):  # forward score overflow (-inf/NaN lse where keys are seen): rare
        return _backward_chunk(_Operands(q, k, v, params, dq.dtype), chunk, grad_out,
                               *_delta_and_empty(grad_out, None, out, lse, heads_kv), dq, dk, dv, params)
    grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        _padded(grad_out, chunk.out_index, heads), _padded(q, chunk.q_index, heads),
        _padded(k, chunk.kv_index, heads), _padded(v, chunk.kv_index, heads), _padded(out, chunk.out_index, heads),
        lse_rows, 0.0, False, attn_mask=_additive_mask(visible), scale=params.scale)
    dq_rows, dk_rows, dv_rows = (g.transpose(1, 2) for g in grads)  # [b, L, H, D]
    dq.index_copy_(0, chunk.q_index[chunk.valid_q], dq_rows[chunk.valid_q].to(dq.dtype))
    for dst, rows in ((dk, dk_rows), (dv, dv_rows)):  # GQA: the q heads of a kv head summed
        rows = rows[chunk.valid_kv].view(-1, heads_kv, heads // heads_kv, rows.shape[-1]).sum(2)
        dst.index_copy_(0, chunk.kv_index[chunk.valid_kv], rows.to(dst.dtype))


def _backward_chunk(ops: _Operands, chunk: _Chunk, grad_out, delta_hf, empty_hf, dq, dk, dv, params):
    """Write one chunk's gradients (the reference's formulas, batched) into dq/dk/dv."""
    batch, pad_q = chunk.valid_q.shape
    pad_kv = chunk.valid_kv.shape[1]
    heads_kv, group = ops.heads_kv, ops.group
    q_pad, k_pad, v_pad = ops.q_rows(chunk), ops.kv_rows(ops.k, chunk), ops.kv_rows(ops.v, chunk)
    do_pad = ops.out_rows(grad_out, chunk)
    delta = delta_hf[:, chunk.out_index].reshape(heads_kv * batch, pad_q * group, 1)
    visible = chunk.visible(params)
    # p from the scores again (one fused softmax). No softmax mass: padding rows, rows that see no key (the mask),
    # rows whose visible scores are all -inf (the saved lse).
    p = torch.softmax(_masked_scores(ops, chunk, visible, q_pad, k_pad, params.scale), dim=-1)
    empty = empty_hf[:, chunk.out_index] | ~visible.any(dim=-1)[None, :, :, None]  # [Hkv, b, L, G]
    p.masked_fill_(empty.view(heads_kv * batch, pad_q * group, 1), 0)
    dv_pad = torch.bmm(p.transpose(1, 2), do_pad)  # [Hkv * b, Lk, D], summed over the group
    ds = torch.bmm(do_pad, v_pad.transpose(1, 2)).sub_(delta).mul_(p)  # scale: in the two matmuls below
    # dS 0 where P is 0, even for a NaN/inf dO or delta there (a row that sees no key): the reference's rule
    ds.masked_fill_(p == 0, 0)
    zero = ds.new_zeros(())
    dq_pad = torch.baddbmm(zero, ds, k_pad, beta=0, alpha=params.scale).view(heads_kv, batch, pad_q, group, -1)
    dk_pad = torch.baddbmm(zero, ds.transpose(1, 2), q_pad, beta=0, alpha=params.scale)
    _scatter_rows(dk, chunk.kv_index, dk_pad.view(heads_kv, batch, pad_kv, 1, -1), chunk.valid_kv)
    _scatter_rows(dv, chunk.kv_index, dv_pad.view(heads_kv, batch, pad_kv, 1, -1), chunk.valid_kv)
    if ops.broadcast_q:  # every sequence reads all of q: dq summed over the batch (padding rows have p = 0)
        dq += dq_pad.masked_fill(~chunk.valid_q[None, :, :, None, None], 0).sum(1).transpose(0, 1).reshape(dq.shape)
    else:
        _scatter_rows(dq, chunk.q_index, dq_pad, chunk.valid_q)


def supports(problem: Problem) -> Optional[str]:
    if problem.device_type != "cpu":
        return f"runs on CPU tensors, got {problem.device_type} (the reference backend runs anywhere)"
    return None


BACKEND = Backend(name="cpu", forward=forward, backward=backward, supports=supports, priority=5,
                  auto_devices=("cpu",))
