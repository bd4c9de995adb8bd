"""``jfa::attention`` and ``jfa::attention_backward``: op, fake, autograd, side by side.

The ops are opaque to torch.compile (a custom op per family, not ``triton_op``): the body dispatches to a backend
chosen by name, and the reference backend reads offsets on the host, which tracing cannot follow. Shape rules come
from ``meta_kernels`` and are shared by the fakes and the eager checks.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

import meta_kernels
from jfa_ops.backends import AttentionParams, Problem, select_backend
from jfa_ops.validation import check_offset_values


def _params(q, max_seqlen_q, max_seqlen_kv, scale, causal, window_left, window_right, broadcast_q, deterministic):
    return AttentionParams(
        scale=q.shape[-1] ** -0.5 if scale is None else float(scale), causal=causal, window_left=window_left,
        window_right=window_right, broadcast_q=broadcast_q, deterministic=deterministic,
        max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
    )


@torch.library.custom_op("jfa::attention", mutates_args=())
def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_offsets: Optional[Tensor],
    kv_offsets: Tensor,
    max_seqlen_q: int = -1,
    max_seqlen_kv: int = -1,
    scale: Optional[float] = None,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    broadcast_q: bool = False,
    deterministic: bool = False,
    backend: Optional[str] = None,
) -> Tuple[Tensor, Tensor]:
    """Jagged attention. Returns (out [T_q, Hq, D], lse [Hq, T_q] float32); see ``jfa_ops.jagged_attention``."""
    meta_kernels.check_attention_args(q, k, v, q_offsets, kv_offsets, (window_left, window_right), broadcast_q)
    check_offset_values(q, k, q_offsets, kv_offsets, max_seqlen_q, max_seqlen_kv)
    params = _params(q, max_seqlen_q, max_seqlen_kv, scale, causal, window_left, window_right, broadcast_q,
                     deterministic)
    impl = select_backend(backend, Problem.of(q, k, params))
    return impl.forward(q, k, v, q_offsets, kv_offsets, params)


@attention.register_fake
def _attention_fake(q, k, v, q_offsets, kv_offsets, max_seqlen_q=-1, max_seqlen_kv=-1, scale=None, causal=False,
                    window_left=-1, window_right=-1, broadcast_q=False, deterministic=False, backend=None):
    meta_kernels.check_attention_args(q, k, v, q_offsets, kv_offsets, (window_left, window_right), broadcast_q)
    out_shape, lse_shape = meta_kernels.attention_shapes(q, kv_offsets, broadcast_q)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("jfa::attention_backward", mutates_args=())
def attention_backward(
    grad_out: Tensor,
    grad_lse: Optional[Tensor],
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    q_offsets: Optional[Tensor],
    kv_offsets: Tensor,
    max_seqlen_q: int = -1,
    max_seqlen_kv: int = -1,
    scale: Optional[float] = None,
    causal: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    broadcast_q: bool = False,
    deterministic: bool = False,
    backend: Optional[str] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv) of ``jfa::attention``; ``grad_lse`` None means lse was not used."""
    params = _params(q, max_seqlen_q, max_seqlen_kv, scale, causal, window_left, window_right, broadcast_q,
                     deterministic)
    impl = select_backend(backend, Problem.of(q, k, params))
    return impl.backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params)


@attention_backward.register_fake
def _attention_backward_fake(grad_out, grad_lse, q, k, v, out, lse, *args, **kwargs):
    dq_shape, dk_shape, dv_shape = meta_kernels.attention_backward_shapes(q, k, v)
    return q.new_empty(dq_shape), k.new_empty(dk_shape), v.new_empty(dv_shape)


# Both ops take the same options (max_seqlen_q ... backend) after their tensors; the forward has 5 tensors.
_NUM_TENSOR_INPUTS = 5  # q, k, v, q_offsets, kv_offsets


def _setup_context(ctx, inputs, output):
    q, k, v, q_offsets, kv_offsets = inputs[:_NUM_TENSOR_INPUTS]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q_offsets, kv_offsets)
    ctx.options = inputs[_NUM_TENSOR_INPUTS:]
    ctx.set_materialize_grads(False)  # grad_lse stays None when lse is unused: the backward skips that term


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, q_offsets, kv_offsets = ctx.saved_tensors
    if grad_out is None:  # only lse was used
        grad_out = torch.zeros_like(out)
    dq, dk, dv = torch.ops.jfa.attention_backward(
        grad_out.contiguous(), grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, *ctx.options
    )
    return (dq, dk, dv) + (None,) * (len(ctx.options) + 2)


def _double_backward(ctx, *grads):
    raise RuntimeError("jfa.attention does not support double backward (gradients of its gradients)")


def _setup_backward_context(ctx, inputs, output):
    pass


def _lengths(offsets: Optional[Tensor], rows: int, batch: int):
    """Per-sequence lengths for FLOP counting; FakeTensors have no values, so count every row as one sequence."""
    if offsets is None:
        return [rows] * batch
    if isinstance(offsets, torch._subclasses.FakeTensor):
        return None
    return offsets.diff().tolist()


@register_flop_formula(torch.ops.jfa.attention, get_raw=True)
def _attention_flops(q, k, v, q_offsets, kv_offsets, max_seqlen_q=-1, max_seqlen_kv=-1, scale=None, causal=False,
                     window_left=-1, window_right=-1, broadcast_q=False, *args, out_val=None, backward=False, **kw):
    """Exact useful FLOPs from the offsets (eager FlopCounterMode reads them; under fake tensors: a dense bound)."""
    batch = kv_offsets.shape[0] - 1
    q_lengths = _lengths(q_offsets, q.shape[0], batch)
    kv_lengths = _lengths(kv_offsets, k.shape[0], batch)
    if q_lengths is None or kv_lengths is None:  # no values: bound by a single sequence of all rows
        q_lengths, kv_lengths = [q.shape[0] * (batch if broadcast_q else 1)], [k.shape[0]]
    return meta_kernels.attention_flops(q_lengths, kv_lengths, q.shape[1], q.shape[2], causal,
                                        (window_left, window_right), backward=backward)


@register_flop_formula(torch.ops.jfa.attention_backward, get_raw=True)
def _attention_backward_flops(grad_out, grad_lse, q, k, v, out, lse, *args, out_val=None, **kwargs):
    return _attention_flops(q, k, v, *args, backward=True, **kwargs)


attention.register_autograd(_backward, setup_context=_setup_context)
attention_backward.register_autograd(_double_backward, setup_context=_setup_backward_context)
