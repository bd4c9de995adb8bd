"""The reference backend's MXFP8 family: quantize/dequantize (vectorized PyTorch on any device, no host sync) and
MXFP8 attention forward/backward (dequantized operands, fp32 math, one sequence at a time).

The scale exponent comes from ``torch.frexp`` here (the oracle in ``jfa_ops.testing`` reads float64 bits, the
Triton kernel fp32 bits): three independent writings of one rule. Layouts: ``meta_kernels.mxfp8``.

What MXFP8 attention quantizes (``docs/architecture.md``, "MXFP8 attention"):

forward   Q, K in (1, 32) blocks (along head_dim), V in (32, 1) blocks (along each sequence's keys); scores
          s2 = Q K^T * scale / ln 2 in fp32; per row M = ceil(max s2) (an integer: a kernel's running maximum then
          differs from the final one by a power of two, which commutes with MX blocks); P = 2**(s2 - M);
          Pq = P in (1, 32) blocks along the keys ("rceil"); out = Pq V / sum(Pq); lse = (M + log2 sum P) ln 2.
backward  Q, K, dO in (32, 32) blocks, V in (1, 32) blocks (the dP contraction runs along head_dim); P from the
          forward's lse (unquantized, fp32; P = exp(min(S - lse, 0)): S from the backward's operands may exceed
          the forward's lse, and P <= 1 keeps wide-range inputs finite); dV = Pq^T dO with Pq in (32, 32) blocks; dP = dO V^T;
          dS = P (dP - delta) with delta = rowsum(dO * out) - grad_lse, quantized in (32, 32) blocks;
          dQ = scale dS K, dK = scale dS^T Q, accumulated in fp32. The gradients are those of the quantized
          computation passed straight through to the high-precision q, k, v (quantization counts as identity).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

import meta_kernels.mxfp8 as mx
from jfa_ops.backends.base import AttentionParams
from jfa_ops.backends.reference import exact  # defined before this module is imported at the package's end

_LOG2E = 1.0 / math.log(2.0)


def exact_pow2(exponent: Tensor) -> Tensor:
    """float64 2**exponent for integer exponents in [-1022, 1023], built from its bits: exact on every device
    (CUDA's float64 ``pow(2, e)``, hence ``torch.ldexp``, is off by an ulp at some e, e.g. -113: H200, torch 2.11).
    Cast to float32 it stays exact for e in [-149, 127]."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def row_block_index(rows: int, offsets: Optional[Tensor], block_rows: int, device) -> Tensor:
    """[rows] int64: the scale row of every data row (``meta_kernels.mxfp8``'s layout), computed on the device."""
    r = torch.arange(rows, device=device)
    if block_rows == 1:
        return r
    if offsets is None:
        return r // mx.MX_BLOCK
    starts = offsets.to(device=device, dtype=torch.int64)
    seq = torch.searchsorted(starts[1:], r, right=True)  # the sequence of row r
    first = starts[seq]
    # clamped to the scale rows (T // 32 + B): bad offsets (JFA_VALIDATE=deferred) index garbage, not out of range
    # (a CUDA device assert); a no-op on good offsets
    return (first // mx.MX_BLOCK + seq + (r - first) // mx.MX_BLOCK).clamp_(0, rows // block_rows + starts.numel() - 2)


def _column_blocks(t: Tensor, block_cols: int) -> Tensor:
    """[T, H, D] -> [T, H, D / block_cols, block_cols]."""
    return t.unflatten(2, (t.shape[2] // block_cols, block_cols))


@exact
def quantize(x: Tensor, offsets: Optional[Tensor], block: Sequence[int], rounding: str) -> Tuple[Tensor, Tensor]:
    """(data float8_e4m3fn [T, H, D], scale float8_e8m0fnu): see ``meta_kernels.mxfp8`` and ``jfa_ops.testing``."""
    block_rows, block_cols = block
    rows, heads, dim = x.shape
    xf = x.float()
    finite = torch.isfinite(xf)
    # Per-row partial maxima over each block's columns, then over its rows (a scatter for 32-row blocks).
    amax_rows = _column_blocks(torch.where(finite, xf.abs(), 0.0), block_cols).amax(-1)  # [T, H, D/bc]
    bad_rows = _column_blocks(~finite, block_cols).any(-1)
    scale_shape = mx.scale_shape(rows, heads, dim, offsets, block)
    index = row_block_index(rows, offsets, block_rows, x.device)
    if block_rows == 1:
        amax, bad = amax_rows, bad_rows
    else:
        idx = index[:, None, None].expand_as(amax_rows)
        amax = torch.zeros(scale_shape, dtype=torch.float32, device=x.device).scatter_reduce(
            0, idx, amax_rows, "amax")
        bad = torch.zeros(scale_shape, dtype=torch.int32, device=x.device).scatter_reduce(
            0, idx, bad_rows.int(), "amax").bool()
    mantissa, exponent = torch.frexp(amax)  # amax = mantissa * 2**exponent, mantissa in [0.5, 1)
    shared = exponent - 1 - mx.E4M3_EMAX  # floor(log2 amax) - 8
    if rounding == "rceil":
        shared = shared + (mantissa > 0.875).int()  # significand > 1.75: 448 * 2**shared would overflow
    shared = torch.where(amax > 0, shared, mx.SCALE_MIN_EXP).clamp(mx.SCALE_MIN_EXP, mx.SCALE_MAX_EXP)
    scale_bits = torch.where(bad, mx.SCALE_NAN_BITS, shared + mx.SCALE_BIAS).to(torch.uint8)

    per_row = shared[index] if block_rows > 1 else shared  # [T, H, D/bc]
    per_elem = per_row.repeat_interleave(block_cols, dim=2)
    y = (xf * exact_pow2(-per_elem).to(xf.dtype)).clamp(-mx.E4M3_MAX, mx.E4M3_MAX)  # one rounding, as ldexp
    data_bits = y.to(torch.float8_e4m3fn).view(torch.uint8)
    bad_elem = (bad[index] if block_rows > 1 else bad).repeat_interleave(block_cols, dim=2)
    data_bits = torch.where(bad_elem, 0x7F, data_bits).to(torch.uint8)  # NaN block: every element NaN
    return data_bits.view(torch.float8_e4m3fn), scale_bits.view(torch.float8_e8m0fnu)


@exact
def dequantize(data: Tensor, scale: Tensor, offsets: Optional[Tensor], block: Sequence[int],
               dtype: torch.dtype) -> Tensor:
    """data * 2**(scale bits - 127) in ``dtype`` (computed in fp32, fp64 for fp64); NaN where the scale is NaN."""
    block_rows, block_cols = block
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    bits = scale.view(torch.uint8).to(torch.int32)
    if block_rows > 1:
        bits = bits[row_block_index(data.shape[0], offsets, block_rows, data.device)]
    bits = bits.repeat_interleave(block_cols, dim=2)
    out = data.to(compute) * exact_pow2(bits - mx.SCALE_BIAS).to(compute)
    return torch.where(bits == mx.SCALE_NAN_BITS, math.nan, out).to(dtype)


def round_trip(x: Tensor, offsets: Optional[Tensor], block: Sequence[int], rounding: str) -> Tensor:
    """fp32 values of ``x`` after MXFP8 quantization."""
    return dequantize(*quantize(x, offsets, block, rounding), offsets, block, torch.float32)


def round_trip_last_axis(p: Tensor) -> Tensor:
    """fp32 ``p [..., L]`` through MXFP8 in (1, 32) blocks along the last axis (tail padded), "rceil"."""
    length = p.shape[-1]
    padded = torch.nn.functional.pad(p, (0, -length % mx.MX_BLOCK))
    flat = padded.reshape(-1, 1, padded.shape[-1])
    return round_trip(flat, None, (1, mx.MX_BLOCK), "rceil").reshape(padded.shape)[..., :length]


def round_trip_square(p: Tensor) -> Tensor:
    """fp32 ``p [H, Lq, Lk]`` through MXFP8 in 32 x 32 blocks over (Lq, Lk) from (0, 0), "rceil"."""
    heads, lq, lk = p.shape
    padded = torch.nn.functional.pad(p, (0, -lk % mx.MX_BLOCK, 0, -lq % mx.MX_BLOCK))  # [H, Lq', Lk']
    rows = padded.transpose(0, 1)  # [Lq', H, Lk']: rows blocked by 32, columns by 32
    return round_trip(rows, None, mx.GRAD_BLOCK, "rceil").transpose(0, 1)[:, :lq, :lk]


def _sequences(q_rows: int, q_offsets, kv_offsets, broadcast_q: bool):
    """(q_start, q_len, out_start, kv_start, kv_len) per sequence (reads the offsets on the host)."""
    kv = kv_offsets.tolist()
    qb = None if broadcast_q else q_offsets.tolist()
    for b in range(len(kv) - 1):
        if broadcast_q:
            yield 0, q_rows, b * q_rows, kv[b], kv[b + 1] - kv[b]
        else:
            yield qb[b], qb[b + 1] - qb[b], qb[b], kv[b], kv[b + 1] - kv[b]


def _visible(lq: int, lk: int, params: AttentionParams, device) -> Tensor:
    from jfa_ops.backends.reference import visible_mask

    mask = visible_mask(0, lq, lq, lk, params, device)
    return torch.ones(lq, lk, dtype=torch.bool, device=device) if mask is None else mask


def _scores_log2(q: Tensor, k: Tensor, group: int, visible: Tensor, scale: float) -> Tensor:
    """[Hq, Lq, Lk] fp32 scores in the log2 domain, -inf where not visible."""
    s = torch.einsum("ihd,jhd->hij", q, k.repeat_interleave(group, dim=1)) * (scale * _LOG2E)
    return s.masked_fill(~visible, -math.inf)


@exact
def attention_forward(q_mx, k_mx, v_mx, q_offsets, kv_offsets, params: AttentionParams, out_dtype: torch.dtype):
    """Forward over quantized (data, scale) pairs (q, k (1, 32); v (32, 1)): (out [T_out, Hq, D], lse fp32)."""
    q_data, k_data = q_mx[0], k_mx[0]
    qd = dequantize(*q_mx, None, mx.Q_BLOCK, torch.float32)
    kd = dequantize(*k_mx, None, mx.K_BLOCK, torch.float32)
    vd = dequantize(*v_mx, kv_offsets, mx.V_BLOCK, torch.float32)
    heads_q, dim = q_data.shape[1], q_data.shape[2]
    group = heads_q // k_data.shape[1]
    rows = (kv_offsets.shape[0] - 1) * q_data.shape[0] if params.broadcast_q else q_data.shape[0]
    out = torch.zeros(rows, heads_q, dim, dtype=out_dtype, device=q_data.device)
    lse = torch.full((heads_q, rows), -math.inf, dtype=torch.float32, device=q_data.device)
    for q0, lq, o0, k0, lk in _sequences(q_data.shape[0], q_offsets, kv_offsets, params.broadcast_q):
        if lq == 0 or lk == 0:
            continue
        visible = _visible(lq, lk, params, q_data.device)
        s2 = _scores_log2(qd[q0:q0 + lq], kd[k0:k0 + lk], group, visible, params.scale)
        row_max = s2.amax(dim=-1, keepdim=True)
        has_mass = row_max > -math.inf  # NaN rows stay NaN: row_max NaN compares False... see below
        m = torch.where(has_mass | row_max.isnan(), torch.ceil(row_max), 0.0)
        p = torch.exp2(s2 - m).masked_fill(~visible, 0.0)
        pq = round_trip_last_axis(p)
        total_q = pq.sum(-1, keepdim=True)
        o = torch.einsum("hij,jhd->ihd", pq / torch.where(total_q > 0, total_q, 1.0),
                         vd[k0:k0 + lk].repeat_interleave(group, dim=1))
        total = p.sum(-1, keepdim=True)
        # -inf only for a row without mass: a NaN total (a NaN score) keeps lse NaN, as jfa::attention's
        row_lse = torch.where((total > 0) | total.isnan(), (m + torch.log2(total)) * math.log(2.0), -math.inf)
        out[o0:o0 + lq] = o.to(out_dtype)
        lse[:, o0:o0 + lq] = row_lse.squeeze(-1)
    return out, lse


def finite_grad_out_of_rows_without_keys(grad_out: Tensor, lse: Tensor) -> Tensor:
    """``grad_out`` with its NaN/inf elements on rows that see no key (lse -inf) set to 0; finite elements and rows
    that see keys as given, so finite inputs quantize bit for bit as without it (a large finite dO there still sets
    its block's scale). What the triton quantize kernel's ``EMPTY_ROWS`` does in dO's pass."""
    return torch.where(torch.isneginf(lse).T[..., None] & ~torch.isfinite(grad_out), 0.0, grad_out)


@exact
def attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params: AttentionParams,
                       rounding: str, empty_rows: bool = True):
    """(dq, dk, dv) in the inputs' dtypes: the MXFP8 backward of the module docstring, per sequence in fp32.
    empty_rows: NaN/inf dO on rows that see no key read as 0 (``ops.mxfp8.MXFP8_BWD_EMPTY_ROWS``): such a row's out
    is the constant 0, but one NaN/inf element would give its 32 x 32 dO block a NaN scale."""
    if empty_rows:  # delta too: rowsum(NaN x 0) would be NaN, and P (dP - delta) with P = 0 NaN
        grad_out = finite_grad_out_of_rows_without_keys(grad_out, lse)
    q_grid = None if params.broadcast_q else q_offsets  # broadcast Q: one sequence of L_q rows
    out_grid = q_offsets if not params.broadcast_q else _broadcast_offsets(kv_offsets, q.shape[0])
    qd = round_trip(q, q_grid, mx.GRAD_BLOCK, rounding)
    kd = round_trip(k, kv_offsets, mx.GRAD_BLOCK, rounding)
    vd = round_trip(v, None, mx.K_BLOCK, rounding)
    dod = round_trip(grad_out, out_grid, mx.GRAD_BLOCK, rounding)
    heads_q, heads_kv = q.shape[1], k.shape[1]
    group = heads_q // heads_kv
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=q.device)
    delta_all = (grad_out.float() * out.float()).sum(-1).T  # [Hq, T_out]
    if grad_lse is not None:
        delta_all = delta_all - grad_lse
    for q0, lq, o0, k0, lk in _sequences(q.shape[0], q_offsets, kv_offsets, params.broadcast_q):
        if lq == 0 or lk == 0:
            continue
        visible = _visible(lq, lk, params, q.device)
        s2 = _scores_log2(qd[q0:q0 + lq], kd[k0:k0 + lk], group, visible, params.scale)
        row_lse = lse[:, o0:o0 + lq, None]
        # min(., 0): S from the (32, 32) operands may exceed the forward's lse (made from (1, 32) operands); P <= 1
        # keeps wide-range inputs from overflowing to inf (then 0 * inf = NaN).
        p = torch.exp2(torch.clamp(s2 - torch.where(row_lse > -math.inf, row_lse * _LOG2E, 0.0), max=0.0))
        p = p.masked_fill(~visible, 0.0)
        p = torch.where(row_lse > -math.inf, p, 0.0)
        do = dod[o0:o0 + lq]  # [Lq, Hq, D]
        dv_h = torch.einsum("hij,ihd->jhd", round_trip_square(p), do)  # [Lk, Hq, D]
        dp = torch.einsum("ihd,jhd->hij", do, vd[k0:k0 + lk].repeat_interleave(group, dim=1))
        ds = round_trip_square(p * (dp - delta_all[:, o0:o0 + lq, None]))
        k_seq = kd[k0:k0 + lk].repeat_interleave(group, dim=1)
        dq[q0:q0 + lq] += params.scale * torch.einsum("hij,jhd->ihd", ds, k_seq)
        dk_h = params.scale * torch.einsum("hij,ihd->jhd", ds, qd[q0:q0 + lq])
        dk[k0:k0 + lk] += dk_h.unflatten(1, (heads_kv, group)).sum(2)
        dv[k0:k0 + lk] += dv_h.unflatten(1, (heads_kv, group)).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _broadcast_offsets(kv_offsets: Tensor, len_q: int) -> Tensor:
    """Output-row offsets of a broadcast Q: sequence b owns rows [b L_q, (b + 1) L_q)."""
    return torch.arange(kv_offsets.shape[0], device=kv_offsets.device, dtype=torch.int64) * len_q


def quantize_inputs(quantize_fn, q, k, v, kv_offsets, rounding):
    """The forward's quantized operands: q, k in (1, 32) blocks, v in (32, 1) blocks per kv sequence."""
    return (quantize_fn(q, None, mx.Q_BLOCK, rounding), quantize_fn(k, None, mx.K_BLOCK, rounding),
            quantize_fn(v, kv_offsets, mx.V_BLOCK, rounding))
