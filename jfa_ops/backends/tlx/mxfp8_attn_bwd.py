"""The MXFP8 backward on Hopper, design (D) (bench/NOTES.md "MXFP8 backward design (D), helper mxbwdd, stop 27"):
the bf16 TLX backward (``attn_bwd.py``) with its MXFP8 constexpr, fed MX-valued bf16 operands and delta from the
unquantized dO (``jfa_ops.backends.mxfp8_bwd``: the host side, portable and CPU-tested). Its arithmetic is
``jfa_ops.testing.mxfp8_attention_backward_model(..., rebased_s_dp=False)``: the MXFP8 oracle's but for dV's P below
2**-14 (P at one fixed scale), and the bf16 MMAs sum in fp32 products that are exact.

On by default since its GPU check (``configs.MXFP8_BACKWARD``; env JFA_TLX_MXFP8_BWD=0: off): ``backward_reason``
says which calls it runs; the others (and every call while off) take the triton MXFP8 backward.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..base import AttentionParams, device_guard
from . import configs

_DTYPES = (torch.float16, torch.bfloat16)


def backward_reason(q: torch.Tensor, k: torch.Tensor, params: AttentionParams) -> Optional[str]:
    """None when the TLX MXFP8 backward runs the call, else why the triton MXFP8 backward does: fp16/bf16 inputs
    (fp32 gradients keep triton's fp32 outputs: the TLX kernel writes bf16), the v2 backward's head dims (64, 128),
    not deterministic (the TLX backward adds dQ by TMA reduce-adds)."""
    if q.dtype not in _DTYPES:
        return f"dtype {q.dtype}: the TLX MXFP8 backward takes fp16/bf16 inputs (its kernel writes bf16 gradients)"
    if configs.bwd_config_v2(q.shape[-1]) is None:
        return f"head_dim {q.shape[-1]}: the TLX backward runs head_dim 64 and 128"
    if params.deterministic:
        return "deterministic=True: the TLX backward adds dQ by TMA reduce-adds"
    if k.shape[1] <= 0 or q.shape[1] % k.shape[1] != 0:
        return f"num_heads_q {q.shape[1]} must be a multiple of num_heads_kv {k.shape[1]}"
    return None


def _kernel_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params, delta_grad_out):
    """The TLX backward with MXFP8 on, in the default configs' variant (``tlx.backward``'s switches), with no
    timing ablation, KV_EARLY, PEEL and STORE_TMA off (none compiled with MXFP8)."""
    from .attn_bwd import attention_backward

    options = dict(configs.backward_options(q.shape[-1], k.shape[1]), ablate=0, kv_early=False,
                   peel=False, store_tma=False)
    return attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params, **options,
                              mxfp8=True, delta_grad_out=delta_grad_out)


def attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params: AttentionParams,
                       rounding: str, empty_rows: bool = True):
    """(dq, dk, dv) of ``jfa::mxfp8_attention`` in the inputs' dtypes (``backward_reason`` held)."""
    from .. import mxfp8_bwd

    with device_guard(q.device):
        return mxfp8_bwd.backward(_kernel_backward, grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets,
                                  params, rounding, empty_rows=empty_rows)
