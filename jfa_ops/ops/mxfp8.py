"""The MXFP8 op family: ``jfa::mxfp8_quantize``, ``jfa::mxfp8_dequantize``, ``jfa::mxfp8_attention`` (+ its backward
op and autograd) and ``jfa::mxfp8_attention_quantized`` (pre-quantized inputs, forward only).

Same order and rules as ``ops/attention.py``: op, fake, autograd, registration at the bottom; shape rules in
``meta_kernels.mxfp8``; the body picks a backend of the family (``select_backend(..., family=...)``). The numerics
(what is quantized, in which blocks) are in ``jfa_ops/backends/reference/mxfp8.py`` and docs/architecture.md.
"""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

import torch
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

import meta_kernels
import meta_kernels.mxfp8 as mx
from jfa_ops.backends import Problem, select_backend
from jfa_ops.ops.attention import (NUM_OPTIONS, OPTIONS_SCHEMA, _attention_flops, _params, autograd_backward_call,
                                   backward_grads, called_by_autograd, check_no_forward_ad, register_autocast)
from jfa_ops.validation import check_offset_values

QUANTIZE = "mxfp8_quantize"
DEQUANTIZE = "mxfp8_dequantize"
ATTENTION = "mxfp8_attention"
# A backend's forward from the high-precision inputs, quantizing them itself (the tlx backend's quantize kernel writes
# its kernel's operand layout directly): when the backend chosen for ATTENTION implements it, it replaces
# quantize + ATTENTION's forward (same result; the backward is ATTENTION's either way).
QUANTIZING = "mxfp8_attention_quantizing"


def _x_problem(x: Tensor) -> Problem:
    """The static facts of a quantize/dequantize call (a [T, H, D] tensor) for ``supports``."""
    return Problem(x.device.type, x.dtype, x.shape[2], x.shape[1], x.shape[1], False, -1, -1, False, False,
                   device_index=x.device.index)


def _check_offsets(x: Tensor, offsets: Optional[Tensor]) -> None:
    if offsets is not None:  # the rows the offsets describe must be x's rows (JFA_VALIDATE rules)
        check_offset_values(x, x, None, offsets, -1, -1, kv_name="offsets")


# ------------------------------------------------------------------------------------------------ quantize
@torch.library.custom_op(
    "jfa::mxfp8_quantize", mutates_args=(),
    schema="(Tensor x, Tensor? offsets=None, int[] block=[1, 32], str rounding=\"rceil\", str? backend=None) "
           "-> (Tensor, Tensor)",
)
def mxfp8_quantize(x: Tensor, offsets: Optional[Tensor] = None, block: List[int] = (1, 32), rounding: str = "rceil",
                   backend: Optional[str] = None) -> Tuple[Tensor, Tensor]:
    """(data float8_e4m3fn, scale float8_e8m0fnu) of ``x [T, H, D]``; see ``jfa_ops.mxfp8_quantize``."""
    return quantize_body(x, offsets, block, rounding, backend)


# JFA_MXFP8_QUANT_DIRECT=0 turns it off (read once, at import; on since the H200 measured it, bench/NOTES.md v19): ``jfa_ops.mxfp8_quantize``'s eager calls of
# plain tensors (``attention.eager_direct``) run ``quantize_body`` without torch's custom-op dispatch (~40 us of a
# call's ~80 us of Python on a CPU count; the op has no autograd formula, so nothing else is skipped). Why: bench/
# NOTES.md "MXFP8 quantize bandwidth, helper mxquantbw, stop 27" (the bench's quantize row is host-bound).
QUANTIZE_DIRECT = os.environ.get("JFA_MXFP8_QUANT_DIRECT", "1") != "0"


def quantize_body(x: Tensor, offsets: Optional[Tensor], block, rounding: str,
                  backend: Optional[str]) -> Tuple[Tensor, Tensor]:
    """``jfa::mxfp8_quantize``'s body: the checks, the backend's choice and its quantize."""
    block = mx.check_quantize_args(x, offsets, block, rounding)
    impl = select_backend(backend, _x_problem(x), family=QUANTIZE)
    _check_offsets(x, offsets)
    return impl.family(QUANTIZE).forward(x, offsets, block, rounding)


@mxfp8_quantize.register_fake
def _quantize_fake(x, offsets=None, block=(1, 32), rounding="rceil", backend=None):
    block = mx.check_quantize_args(x, offsets, block, rounding)
    data_shape, scale_shape = mx.quantize_shapes(x, offsets, block)
    return x.new_empty(data_shape, dtype=torch.float8_e4m3fn), x.new_empty(scale_shape, dtype=torch.float8_e8m0fnu)


@torch.library.custom_op(
    "jfa::mxfp8_dequantize", mutates_args=(),
    schema="(Tensor data, Tensor scale, Tensor? offsets=None, int[] block=[1, 32], ScalarType? dtype=None, "
           "str? backend=None) -> Tensor",
)
def mxfp8_dequantize(data: Tensor, scale: Tensor, offsets: Optional[Tensor] = None, block: List[int] = (1, 32),
                     dtype: Optional[torch.dtype] = None, backend: Optional[str] = None) -> Tensor:
    """data * 2**(scale - 127) in ``dtype`` (None: float32); see ``jfa_ops.mxfp8_dequantize``."""
    dtype = torch.float32 if dtype is None else dtype
    block = mx.check_dequantize_args(data, scale, offsets, block, dtype)
    impl = select_backend(backend, _x_problem(data), family=DEQUANTIZE)
    _check_offsets(data, offsets)
    return impl.family(DEQUANTIZE).forward(data, scale, offsets, block, dtype)


@mxfp8_dequantize.register_fake
def _dequantize_fake(data, scale, offsets=None, block=(1, 32), dtype=None, backend=None):
    dtype = torch.float32 if dtype is None else dtype
    mx.check_dequantize_args(data, scale, offsets, block, dtype)
    return data.new_empty(data.shape, dtype=dtype)


# ------------------------------------------------------------------------------------------------ attention
MX_OPTIONS_SCHEMA = OPTIONS_SCHEMA + ", str rounding=\"rceil\""


def _last_option(options, default):
    """The option after ``jfa::attention``'s (the dispatcher drops trailing arguments left at their default)."""
    return options[NUM_OPTIONS] if len(options) > NUM_OPTIONS else default


def _mx_params(q, k, v, q_offsets, kv_offsets, options):
    """The options of ``jfa::attention`` (checked the same way) plus ``rounding`` (the last option)."""
    attention_options, rounding = options[:NUM_OPTIONS], _last_option(options, "rceil")
    # MXFP8's narrower dtypes in the first check, so a float64 or float8 q is not told float64 is allowed
    params, backend = _params(q, k, v, q_offsets, kv_offsets, *attention_options, dtypes=mx.QUANTIZE_DTYPES)
    mx.check_mxfp8_attention_args(q, k, v, rounding)
    return params, backend, rounding


def _quantizer(impl):
    """The selected backend's quantize kernel (the reference's when it has none)."""
    if impl.implements(QUANTIZE):
        return impl.family(QUANTIZE).forward
    from jfa_ops.backends.reference import mxfp8 as reference

    return reference.quantize


@torch.library.custom_op(
    "jfa::mxfp8_attention", mutates_args=(),
    schema=f"(Tensor q, Tensor k, Tensor v, Tensor? q_offsets, Tensor kv_offsets, {MX_OPTIONS_SCHEMA}) "
           "-> (Tensor, Tensor)",
)
def mxfp8_attention(q: Tensor, k: Tensor, v: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor,
                    *options) -> Tuple[Tensor, Tensor]:
    """MXFP8 jagged attention of high-precision q/k/v (quantized inside). Returns (out, lse) as ``jfa::attention``."""
    params, backend, rounding = _mx_params(q, k, v, q_offsets, kv_offsets, options)
    check_no_forward_ad(q, k, v)
    impl = select_backend(backend, Problem.of(q, k, params), family=ATTENTION)
    check_offset_values(q, k, q_offsets, kv_offsets, params.max_seqlen_q, params.max_seqlen_kv)
    if impl.implements(QUANTIZING):
        return impl.family(QUANTIZING).forward(q, k, v, q_offsets, kv_offsets, params, rounding)
    quantize = _quantizer(impl)
    q_mx = quantize(q, None, mx.Q_BLOCK, rounding)
    k_mx = quantize(k, None, mx.K_BLOCK, rounding)
    v_mx = quantize(v, kv_offsets, mx.V_BLOCK, rounding)
    return impl.family(ATTENTION).forward(q_mx, k_mx, v_mx, q_offsets, kv_offsets, params, q.dtype)


@mxfp8_attention.register_fake
def _mxfp8_attention_fake(q, k, v, q_offsets, kv_offsets, *options):
    params, _, _ = _mx_params(q, k, v, q_offsets, kv_offsets, options)
    out_shape, lse_shape = meta_kernels.attention_shapes(q, kv_offsets, params.broadcast_q)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op(
    "jfa::mxfp8_attention_backward", mutates_args=(),
    schema=(f"(Tensor grad_out, Tensor? grad_lse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
            f"Tensor? q_offsets, Tensor kv_offsets, {MX_OPTIONS_SCHEMA}) -> (Tensor, Tensor, Tensor)"),
)
def mxfp8_attention_backward(grad_out: Tensor, grad_lse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor,
                             out: Tensor, lse: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor,
                             *options) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv) of ``jfa::mxfp8_attention``: the MXFP8 backward, straight through the quantization."""
    from_autograd = called_by_autograd(grad_out, q)
    params, backend, rounding = _mx_backward_params(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets,
                                                    options)
    impl = select_backend(backend, Problem.of(q, k, params), family=ATTENTION)
    if not from_autograd:  # offsets its forward may never have seen: checked as the forward checks them
        check_offset_values(q, k, q_offsets, kv_offsets, params.max_seqlen_q, params.max_seqlen_kv)
    # the knob's off switch as a keyword only when off: a backend registered with the plain signature still runs
    off = {} if MXFP8_BWD_EMPTY_ROWS else {"empty_rows": False}
    return impl.family(ATTENTION).backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params,
                                           rounding, **off)


def _mx_backward_params(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, options):
    params, backend, rounding = _mx_params(q, k, v, q_offsets, kv_offsets, options)
    meta_kernels.check_attention_backward_args(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets,
                                               (params.window_left, params.window_right), params.broadcast_q)
    return params, backend, rounding


@mxfp8_attention_backward.register_fake
def _mxfp8_attention_backward_fake(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, *options):
    _mx_backward_params(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, options)
    dq_shape, dk_shape, dv_shape = meta_kernels.attention_backward_shapes(q, k, v)
    return q.new_empty(dq_shape), k.new_empty(dk_shape), v.new_empty(dv_shape)


_NUM_TENSOR_INPUTS = 5  # q, k, v, q_offsets, kv_offsets


def _setup_context(ctx, inputs, output):
    q, k, v, q_offsets, kv_offsets = inputs[:_NUM_TENSOR_INPUTS]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q_offsets, kv_offsets)
    ctx.options = inputs[_NUM_TENSOR_INPUTS:]
    ctx.set_materialize_grads(False)


# JFA_MXFP8_BWD_EMPTY_ROWS (on since stop 48: its GPU tests passed on the H100, 48 of test_backward_edges.py, and its
# probe read on/off 0.997 / 1.008; =0 turns it off; read at import, the flag at each call): the backward reads the NaN/inf
# elements of grad_out on rows that see no key (lse -inf) as 0, finite ones as given. Why: such a row's out is the
# constant 0, so its dO must reach no dq/dk (the dense backwards: dS = 0 where P = 0), but MXFP8 quantizes dO in
# 32 x 32 blocks, where one NaN/inf element gives the block a NaN scale: NaN dO on the block's other rows, which see
# keys, then NaN dq/dk for them and their sequence's keys (every MXFP8 backend and the MXFP8 oracle alike). Where:
# in dO's own quantize pass (triton/tlx: ``mxfp8_quantize`` EMPTY_ROWS, lse read once per row and head; reference:
# ``finite_grad_out_of_rows_without_keys``), so no extra pass over dO; the eager op that did it first cost 0.79 ms
# and 1.17-1.20x of the tlx backward on the H100 (bench/NOTES.md "Stop 47, call 8", "MXFP8 empty rows in dO's
# quantize pass, helper mxempty47").
MXFP8_BWD_EMPTY_ROWS = os.environ.get("JFA_MXFP8_BWD_EMPTY_ROWS", "1") != "0"


def _backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse, q_offsets, kv_offsets = ctx.saved_tensors
    grad_out, grad_lse = backward_grads(out, lse, grad_out, grad_lse)
    with autograd_backward_call(grad_out, q):
        dq, dk, dv = torch.ops.jfa.mxfp8_attention_backward(
            grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, *ctx.options)
    return (dq, dk, dv) + (None,) * (_NUM_TENSOR_INPUTS - 3 + len(ctx.options))


def _double_backward(ctx, *grads):
    raise RuntimeError("jfa.mxfp8_attention does not support double backward (gradients of its gradients)")


def _setup_backward_context(ctx, inputs, output):
    pass


# ------------------------------------------------------------------------------------------------ pre-quantized
QUANTIZED_OPTIONS_SCHEMA = OPTIONS_SCHEMA + ", ScalarType? out_dtype=None"


@torch.library.custom_op(
    "jfa::mxfp8_attention_quantized", mutates_args=(),
    schema=(f"(Tensor q_data, Tensor q_scale, Tensor k_data, Tensor k_scale, Tensor v_data, Tensor v_scale, "
            f"Tensor? q_offsets, Tensor kv_offsets, {QUANTIZED_OPTIONS_SCHEMA}) -> (Tensor, Tensor)"),
)
def mxfp8_attention_quantized(q_data: Tensor, q_scale: Tensor, k_data: Tensor, k_scale: Tensor, v_data: Tensor,
                              v_scale: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor,
                              *options) -> Tuple[Tensor, Tensor]:
    """MXFP8 attention of pre-quantized pairs: q, k in (1, 32) blocks, v in (32, 1) blocks per kv sequence (as
    ``jfa::mxfp8_quantize`` makes them). out in ``out_dtype`` (None: bfloat16); no gradients."""
    params, backend, out_dtype = _quantized_params(q_data, q_scale, k_data, k_scale, v_data, v_scale, q_offsets,
                                                   kv_offsets, options)
    impl = select_backend(backend, Problem.of(q_data, k_data, params), family=ATTENTION)
    check_offset_values(q_data, k_data, q_offsets, kv_offsets, params.max_seqlen_q, params.max_seqlen_kv)
    return impl.family(ATTENTION).forward((q_data, q_scale), (k_data, k_scale), (v_data, v_scale), q_offsets,
                                          kv_offsets, params, out_dtype)


def _quantized_params(q_data, q_scale, k_data, k_scale, v_data, v_scale, q_offsets, kv_offsets, options):
    attention_options, out_dtype = options[:NUM_OPTIONS], _last_option(options, None)
    params, backend = _params(q_data, k_data, v_data, q_offsets, kv_offsets, *attention_options,
                              dtypes=(torch.float8_e4m3fn,))
    for name, data, scale, offsets, block in (("q", q_data, q_scale, None, mx.Q_BLOCK),
                                              ("k", k_data, k_scale, None, mx.K_BLOCK),
                                              ("v", v_data, v_scale, kv_offsets, mx.V_BLOCK)):
        mx.check_mx_pair(name, data, scale, offsets, block)
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    if out_dtype not in mx.QUANTIZE_DTYPES:
        raise TypeError(f"out_dtype must be {mx.dtype_names(mx.QUANTIZE_DTYPES)}, got {out_dtype}")
    return params, backend, out_dtype


@mxfp8_attention_quantized.register_fake
def _mxfp8_attention_quantized_fake(q_data, q_scale, k_data, k_scale, v_data, v_scale, q_offsets, kv_offsets,
                                    *options):
    params, _, out_dtype = _quantized_params(q_data, q_scale, k_data, k_scale, v_data, v_scale, q_offsets,
                                             kv_offsets, options)
    out_shape, lse_shape = meta_kernels.attention_shapes(q_data, kv_offsets, params.broadcast_q)
    return q_data.new_empty(out_shape, dtype=out_dtype), q_data.new_empty(lse_shape, dtype=torch.float32)


@register_flop_formula(torch.ops.jfa.mxfp8_attention, get_raw=True)
def _mxfp8_attention_flops(q, k, v, q_offsets, kv_offsets, *options, out_val=None, **kwargs):
    """The useful FLOPs of the attention it computes (``jfa::attention``'s count; options without rounding)."""
    return _attention_flops(q, k, v, q_offsets, kv_offsets, *options[:NUM_OPTIONS],
                            **{n: x for n, x in kwargs.items() if n != "rounding"})


@register_flop_formula(torch.ops.jfa.mxfp8_attention_backward, get_raw=True)
def _mxfp8_attention_backward_flops(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, *options,
                                    out_val=None, **kwargs):
    return _attention_flops(q, k, v, q_offsets, kv_offsets, *options[:NUM_OPTIONS], backward=True,
                            **{n: x for n, x in kwargs.items() if n != "rounding"})


mxfp8_attention.register_autograd(_backward, setup_context=_setup_context)
mxfp8_attention_backward.register_autograd(_double_backward, setup_context=_setup_backward_context)
# Under torch.autocast, fp32 q/k/v go to the region's dtype before quantization, as jfa::attention's do: out is in the
# region's dtype (like jagged_attention's and SDPA's), the quantizer and backward see what a bf16/fp16 model feeds them,
# and the result is that of a caller who cast first. The pre-quantized op has nothing to cast (float8 in, out_dtype
# explicit): no kernel.
register_autocast("mxfp8_attention")
