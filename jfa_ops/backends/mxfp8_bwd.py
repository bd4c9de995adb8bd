"""Host side of the TLX MXFP8 backward (design (D) of bench/NOTES.md "MXFP8 backward on Hopper, helper mxbwd, stop 26";
``tlx/mxfp8_attn_bwd.py`` runs it): the operands of the bf16 TLX backward kernel made MX-valued, in portable Triton
and PyTorch so that CPU tests run it (the interpreter) with a stand-in for the kernel.

What ``mxfp8_attention_backward_model`` (``jfa_ops.testing``, rebased_s_dp=False) computes, split between here and
the kernel (``attn_bwd.py``'s MXFP8 constexpr):

- here: Q, K, dO quantized in (32, 32) blocks (row blocks per sequence: Q's per q sequence, one sequence for a
  broadcast Q; dO's per output sequence; K's per kv sequence), V in (1, 32) blocks, by the triton quantize kernel
  (``triton.mxfp8_quantize``, bit-exact with the reference), then dequantized to bf16 (``mx_values``: one Triton
  pass, data x 2**(scale - 127) in fp32, rounded to bf16, NaN where the scale is NaN: the reference's
  ``dequantize`` bit for bit; ``KNOBS.mxfp8_bwd_one_pass``: the same bits from one quantize pass per tensor that
  writes the values, ``quantize_values``: 4 B moved an element instead of ~6.1). E4M3 x 2**e is exact in bf16 (3 significand bits, fp32's exponent range) but below
  2**-133 (bf16's subnormals: E4M3 subnormals of blocks with scales below 2**-124 lose bits; fp32 would keep them);
  an input block within a few ulp of bf16's maximum rounds up to 2**128, inf in fp32 as well (the reference's).
  fp16 inputs' MX values are all exact in bf16. delta = rowsum(dO * out) - grad_lse from the caller's
  UNQUANTIZED dO (the oracle's), passed to the kernel's delta pre-pass apart from the MX dO it walks.
- the kernel: P = exp2(min(S scale - lse, 0)) on the MX values, dV += P^T dO with P at its fixed-scale MXFP8 value,
  dP = dO V^T, dS = P (dP - delta) rounded to 32 x 32 block MXFP8 values, dK += dS^T Q, dQ += dS K, fp32
  accumulation, gradients in bf16 (cast here to the inputs' dtypes).
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
import triton
import triton.language as tl

import meta_kernels.mxfp8 as mx
from jfa_ops.backends.base import AttentionParams
from jfa_ops.backends.triton.configs import KNOBS
from jfa_ops.backends.triton.mxfp8_quantize import _e8m0_value, quantize, quantize_values
from jfa_ops.backends.triton.scheduling import binary_search_steps

VALUES_BLOCK_R = 32  # rows per program
VALUES_BLOCK_C = 256  # columns (of heads x head_dim) per program


@triton.jit(do_not_specialize=["rows", "num_seqs", "search_steps"])
def _mx_values_kernel(DATA, SCALE, OFFSETS, OUT, rows, num_seqs, search_steps, COLS: tl.constexpr,
                      SQUARE: tl.constexpr, HAS_OFFSETS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """OUT [rows, COLS] = DATA (E4M3) x 2**(SCALE bits - 127) (NaN for bits 0xFF), in OUT's dtype. SCALE [.., COLS /
    32]: (1, 32) blocks (SQUARE False: scale row = data row) or (32, 32) blocks: the scale row of data row r is
    first // 32 + b + (r - first) // 32 for its sequence b (``meta_kernels.mxfp8``'s layout; b the last sequence
    whose start OFFSETS[b] <= r, by a binary search of ``search_steps`` steps over the num_seqs starts; HAS_OFFSETS
    False: one sequence, r // 32)."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    r_ok = r < rows
    ok = r_ok[:, None] & (c < COLS)[None, :]
    r64 = r.to(tl.int64)
    if SQUARE:
        if HAS_OFFSETS:
            lo = tl.zeros_like(r)
            hi = lo + (num_seqs - 1)
            for _ in range(search_steps):  # the largest b in [0, num_seqs) with OFFSETS[b] <= r (OFFSETS[0] = 0)
                mid = (lo + hi + 1) // 2
                go = tl.load(OFFSETS + mid, mask=r_ok, other=0).to(tl.int64) <= r64
                lo = tl.where(go, mid, lo)
                hi = tl.where(go, hi, mid - 1)
            first = tl.load(OFFSETS + lo, mask=r_ok, other=0).to(tl.int64)
            srow = first // 32 + lo + (r64 - first) // 32
            # bad offsets (JFA_VALIDATE=deferred) may point past the scale rows (T // 32 + B): garbage, in bounds
            srow = tl.minimum(tl.maximum(srow, 0), rows // 32 + num_seqs - 1)
        else:
            srow = r64 // 32
    else:
        srow = r64
    data = tl.load(DATA + r64[:, None] * COLS + c[None, :], mask=ok, other=0.0)
    bits = tl.load(SCALE + srow[:, None] * (COLS // 32) + (c // 32)[None, :], mask=ok, other=127)
    y = data.to(tl.float32) * _e8m0_value(bits)  # NaN where the scale is NaN (0xFF)
    tl.store(OUT + r64[:, None] * COLS + c[None, :], y.to(OUT.dtype.element_ty), mask=ok)


def mx_values(x: torch.Tensor, offsets: Optional[torch.Tensor], block, rounding: str,
              dtype: torch.dtype = torch.bfloat16, one_pass: Optional[bool] = None,
              empty_rows_lse: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x [T, H, D]``'s MXFP8 values in ``dtype``: the triton quantize kernel's pair (block (1, 32) or (32, 32),
    row blocks per ``offsets``' sequences), dequantized by ``_mx_values_kernel``; ``one_pass`` (None:
    ``KNOBS.mxfp8_bwd_one_pass``): the same bits from one quantize pass that writes the values
    (``quantize_values``). ``empty_rows_lse``: the quantize's (dO: NaN/inf on rows whose lse is -inf read as 0)."""
    block = tuple(block)
    assert block in ((1, 32), (32, 32)), block
    if KNOBS.mxfp8_bwd_one_pass if one_pass is None else one_pass:
        return quantize_values(x, offsets, block, rounding, dtype, empty_rows_lse=empty_rows_lse)
    data, scale = quantize(x, offsets, block, rounding, empty_rows_lse=empty_rows_lse)
    rows, heads, dim = x.shape
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    if out.numel() == 0:
        return out
    square = block[0] == 32
    scale_bits = scale.view(torch.uint8)
    has_offsets = square and offsets is not None
    num_seqs = offsets.shape[0] - 1 if has_offsets else 1
    cols = heads * dim
    grid = (triton.cdiv(rows, VALUES_BLOCK_R), triton.cdiv(cols, VALUES_BLOCK_C))
    _mx_values_kernel[grid](data, scale_bits, offsets if has_offsets else scale_bits, out, rows, num_seqs,
                            binary_search_steps(num_seqs), COLS=cols, SQUARE=square, HAS_OFFSETS=has_offsets,
                            BLOCK_R=VALUES_BLOCK_R, BLOCK_C=VALUES_BLOCK_C, num_warps=4)
    return out


def broadcast_out_offsets(kv_offsets: torch.Tensor, len_q: int) -> torch.Tensor:
    """Output-row offsets of a broadcast Q: sequence b owns rows [b L_q, (b + 1) L_q) (int32)."""
    return torch.arange(kv_offsets.shape[0], device=kv_offsets.device, dtype=torch.int32) * len_q


def operands(grad_out, q, k, v, q_offsets, kv_offsets, params: AttentionParams, rounding: str,
             empty_rows_lse: Optional[torch.Tensor] = None):
    """(q, k, v, dO) MX-valued in bf16 as the MXFP8 backward reads them: Q, K, dO in (32, 32) blocks (Q per q
    sequence, or one sequence when broadcast; dO per output sequence; K per kv sequence), V in (1, 32) blocks.
    ``empty_rows_lse`` (the forward's lse): dO's NaN/inf on rows that see no key read as 0, in dO's own pass."""
    out_offsets = broadcast_out_offsets(kv_offsets, q.shape[0]) if params.broadcast_q else q_offsets
    return (mx_values(q, None if params.broadcast_q else q_offsets, mx.GRAD_BLOCK, rounding),
            mx_values(k, kv_offsets, mx.GRAD_BLOCK, rounding),
            mx_values(v, None, mx.K_BLOCK, rounding),
            mx_values(grad_out, out_offsets, mx.GRAD_BLOCK, rounding, empty_rows_lse=empty_rows_lse))


def backward(kernel_backward: Callable, grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets,
             params: AttentionParams, rounding: str,
             empty_rows: bool = True) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of ``jfa::mxfp8_attention`` in the inputs' dtypes: the MX-valued operands (``operands``) through
    ``kernel_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params, delta_grad_out=...)``
    (the TLX backward with its MXFP8 constexpr; a stand-in on CPU), whose delta pre-pass reads ``delta_grad_out``
    (the caller's unquantized dO) while its kernel walks the MX dO. ``empty_rows``: dO's NaN/inf on rows that see
    no key read as 0 (``ops.mxfp8.MXFP8_BWD_EMPTY_ROWS``)."""
    q_mx, k_mx, v_mx, do_mx = operands(grad_out, q, k, v, q_offsets, kv_offsets, params, rounding,
                                       empty_rows_lse=lse if empty_rows else None)
    dq, dk, dv = kernel_backward(do_mx, grad_lse, q_mx, k_mx, v_mx, out, lse, q_offsets, kv_offsets, params,
                                 delta_grad_out=grad_out)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
