"""``jfa::attention`` and ``jfa::attention_backward``: op, fake, autograd, side by side.

Dynamo records each op as one node (a custom op, not ``triton_op``): the body dispatches to a backend chosen by
name, and the reference backend reads offsets on the host, which tracing cannot follow. When AOTAutograd traces the
graph, a traceable backend (triton on CUDA) is traced in place of the op, as ``triton_op`` would be, so Inductor sees
and launches its kernels (the compile path, ``JFA_COMPILE_PATH``; ``split``: a ``torch.cond`` on the row count
between the traced kernels and the opaque op, ``_split``); every other backend stays opaque. Shape rules
come from ``meta_kernels`` and are shared by the fakes and the eager checks.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
import threading
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.autograd import forward_ad
from torch.utils.flop_counter import register_flop_formula

import meta_kernels
from jfa_ops.backends import AttentionParams, Problem, registry_generation, select_backend
from jfa_ops import validation
from jfa_ops.backends.base import (_map_tensors, _memo_key, _memo_of, _Scope, _size_of, _tensors_in,
                                   _unique_tensors, hoistable, hoisting, per_trace, seeded_scope, traced)
from jfa_ops.validation import check_offset_values, validation_mode

log = logging.getLogger(__name__)


# The options both ops take after their tensors, written once (the schemas are snapshot-tested).
OPTIONS_SCHEMA = (
    "SymInt max_seqlen_q=-1, SymInt max_seqlen_kv=-1, float? scale=None, bool causal=False, SymInt window_left=-1, "
    "SymInt window_right=-1, bool broadcast_q=False, bool deterministic=False, str? backend=None"
)
NUM_OPTIONS = OPTIONS_SCHEMA.count(",") + 1


def _params(q: Tensor, k: Tensor, v: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor, max_seqlen_q=-1,
            max_seqlen_kv=-1, scale=None, causal=False, window_left=-1, window_right=-1, broadcast_q=False,
            deterministic=False, backend=None, *,
            dtypes=meta_kernels.attention.FLOAT_DTYPES) -> Tuple[AttentionParams, Optional[str]]:
    """Check the forward's inputs and options (in schema order); return them as AttentionParams, plus the backend.

    The metadata checks come before the default scale ``D ** -0.5`` (head_dim 0 is a ValueError, not a division
    by zero). ``dtypes``: q/k/v dtypes allowed (MXFP8's pre-quantized op: float8_e4m3fn).
    ``torch.use_deterministic_algorithms(True)`` counts as ``deterministic=True``: it is read when the op
    runs (eagerly, or from compiled code), so it never enters a traced graph.
    """
    meta_kernels.check_options(scale, causal, (window_left, window_right), broadcast_q, deterministic, max_seqlen_q,
                               max_seqlen_kv)
    return _check_tensors(q, k, v, q_offsets, kv_offsets, max_seqlen_q, max_seqlen_kv, scale, causal, window_left,
                          window_right, broadcast_q, deterministic, backend, dtypes=dtypes)


def _check_tensors(q: Tensor, k: Tensor, v: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor, max_seqlen_q=-1,
                   max_seqlen_kv=-1, scale=None, causal=False, window_left=-1, window_right=-1, broadcast_q=False,
                   deterministic=False, backend=None, *,
                   dtypes=meta_kernels.attention.FLOAT_DTYPES) -> Tuple[AttentionParams, Optional[str]]:
    """``_params`` for options already checked (``check_options``): the tensor checks, then ``_resolve``."""
    meta_kernels.check_attention_args(q, k, v, q_offsets, kv_offsets, (window_left, window_right), broadcast_q,
                                      dtypes)
    return _resolve(q, max_seqlen_q, max_seqlen_kv, scale, causal, window_left, window_right, broadcast_q,
                    deterministic, backend)


def _resolve(q: Tensor, max_seqlen_q=-1, max_seqlen_kv=-1, scale=None, causal=False, window_left=-1, window_right=-1,
             broadcast_q=False, deterministic=False, backend=None) -> Tuple[AttentionParams, Optional[str]]:
    """Already-checked options (in schema order) as AttentionParams, plus the backend."""
    params = AttentionParams(
        scale=q.shape[-1] ** -0.5 if scale is None else float(scale), causal=causal, window_left=window_left,
        window_right=window_right, broadcast_q=broadcast_q,
        deterministic=deterministic or torch.are_deterministic_algorithms_enabled(),
        max_seqlen_q=max_seqlen_q, max_seqlen_kv=max_seqlen_kv,
    )
    return params, backend


@torch.library.custom_op(
    "jfa::attention", mutates_args=(),
    schema=f"(Tensor q, Tensor k, Tensor v, Tensor? q_offsets, Tensor kv_offsets, {OPTIONS_SCHEMA}) -> (Tensor, Tensor)",
)
def attention(q: Tensor, k: Tensor, v: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor,
              *options) -> Tuple[Tensor, Tensor]:
    """Jagged attention. Returns (out [T_q, Hq, D], lse [Hq, T_q] float32); see ``jfa_ops.jagged_attention``."""
    key = _op_key(q, k, v, q_offsets, kv_offsets, options)
    call = _recall(_CALLS, key)
    if call is None:
        params, backend = _params(q, k, v, q_offsets, kv_offsets, *options)
        check_no_forward_ad(q, k, v)
        impl = select_backend(backend, Problem.of(q, k, params))
        call = impl, params, dataclasses.replace(params, check_offsets=True)
        _remember(_CALLS, key, call)
    else:
        check_no_forward_ad(q, k, v)
    impl, params, checked = call
    return _forward(impl, q, k, v, q_offsets, kv_offsets, params, checked)


def _forward(impl, q, k, v, q_offsets, kv_offsets, params: AttentionParams,
             checked: Optional[AttentionParams] = None) -> Tuple[Tensor, Tensor]:
    """Offset-value checks (per JFA_VALIDATE, read once for both steps), then the backend's forward."""
    mode = validation.validation_mode(q.device)
    params = _offsets_checked(impl, q, k, q_offsets, kv_offsets, params, checked, mode)
    result = impl.forward(q, k, v, q_offsets, kv_offsets, params)
    _cover(q, k, q_offsets, kv_offsets, params, mode == "async")
    return result


def _cover(q, k, q_offsets, kv_offsets, params: AttentionParams, coverable: bool) -> None:
    """After a forward whose backend checked the offsets on the device (async mode): later calls with the same
    offsets tensors need no check (``validation.covered``)."""
    if coverable and params.check_offsets:
        validation.cover(q_offsets, kv_offsets, q.shape[0], k.shape[0], params.max_seqlen_q, params.max_seqlen_kv)


def _offsets_checked(impl, q, k, q_offsets, kv_offsets, params: AttentionParams,
                     checked: Optional[AttentionParams] = None, mode: Optional[str] = None) -> AttentionParams:
    """Check offset values per JFA_VALIDATE (``mode``: the caller's ``validation_mode`` read, if it made one); the
    params the backend's forward gets: ``params`` with ``check_offsets=True`` (``checked``, when the caller has it
    already) where the backend checks them on the device itself."""
    if check_offset_values(q, k, q_offsets, kv_offsets, params.max_seqlen_q, params.max_seqlen_kv,
                           impl.checks_offsets, mode):
        return checked if checked is not None else dataclasses.replace(params, check_offsets=True)
    return params


def check_no_forward_ad(*tensors: Tensor) -> None:
    """Forward-mode AD (``torch.func.jvp``, ``torch.autograd.forward_ad``) has no formula here: raise instead of the
    zero tangents torch would give a custom op without one."""
    if forward_ad._current_level < 0:  # no dual level open: no tensor carries a tangent (the common case, ~0 cost)
        return
    if any(forward_ad.unpack_dual(t).tangent is not None for t in tensors):
        raise NotImplementedError("jfa.attention does not support forward-mode AD (torch.func.jvp, "
                                  "torch.autograd.forward_ad); use reverse mode (torch.autograd.grad, .backward())")


@attention.register_fake
def _attention_fake(q, k, v, q_offsets, kv_offsets, *options):
    params, _ = _params(q, k, v, q_offsets, kv_offsets, *options)
    out_shape, lse_shape = meta_kernels.attention_shapes(q, kv_offsets, params.broadcast_q)
    return q.new_empty(out_shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op(
    "jfa::attention_backward", mutates_args=(),
    schema=(f"(Tensor grad_out, Tensor? grad_lse, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
            f"Tensor? q_offsets, Tensor kv_offsets, {OPTIONS_SCHEMA}) -> (Tensor, Tensor, Tensor)"),
)
def attention_backward(grad_out: Tensor, grad_lse: Optional[Tensor], q: Tensor, k: Tensor, v: Tensor, out: Tensor,
                       lse: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor,
                       *options) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients (dq, dk, dv) of ``jfa::attention``; ``grad_lse`` None means lse was not used."""
    from_autograd = called_by_autograd(grad_out, q)
    key = _op_key(q, k, v, q_offsets, kv_offsets, options, (grad_out, grad_lse, out, lse))
    call = _recall(_CALLS, key)
    if call is None:
        if from_autograd:  # checked by the forward: skip the checks (and keep nothing: this call checked nothing)
            params, backend = _resolve(q, *options)
            key = None
        else:
            params, backend = _backward_params(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, options)
        call = select_backend(backend, Problem.of(q, k, params)), params
        _remember(_CALLS, key, call)
    impl, params = call
    if not from_autograd:  # offsets its forward may never have seen: checked as the forward checks them
        check_offset_values(q, k, q_offsets, kv_offsets, params.max_seqlen_q, params.max_seqlen_kv)
    return impl.backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params)


def _backward_params(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, options):
    """The forward's checks, then grad_out/out/lse/grad_lse against the forward's output shapes: the backward op
    is public, so it validates its inputs like the forward."""
    params, backend = _params(q, k, v, q_offsets, kv_offsets, *options)
    meta_kernels.check_attention_backward_args(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets,
                                               (params.window_left, params.window_right), params.broadcast_q)
    return params, backend


@attention_backward.register_fake
def _attention_backward_fake(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, *options):
    _backward_params(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, options)
    dq_shape, dk_shape, dv_shape = meta_kernels.attention_backward_shapes(q, k, v)
    return q.new_empty(dq_shape), k.new_empty(dk_shape), v.new_empty(dv_shape)


_NUM_TENSOR_INPUTS = 5  # q, k, v, q_offsets, kv_offsets: the forward's inputs before its options
_FROM_AUTOGRAD = threading.local()  # .call: (id(grad_out), id(q)) of the backward op call autograd is making


@contextlib.contextmanager
def autograd_backward_call(grad_out: Tensor, q: Tensor):
    """Inside: the backward op call on (``grad_out``, ``q``) is an autograd formula's (``_backward``): its forward
    checked the same inputs, and autograd's saved-tensor version check guarantees they are unmodified, so the op's
    body skips its checks (``called_by_autograd``). Traced calls check anyway (a compiled backward calls the op
    itself)."""
    _FROM_AUTOGRAD.call = (id(grad_out), id(q))
    try:
        yield
    finally:
        _FROM_AUTOGRAD.__dict__.pop("call", None)


def called_by_autograd(grad_out: Tensor, q: Tensor) -> bool:
    """In a backward op's body: whether ``autograd_backward_call`` marked this call (the mark is used up)."""
    return _FROM_AUTOGRAD.__dict__.pop("call", None) == (id(grad_out), id(q))


def _setup_context(ctx, inputs, output):
    q, k, v, q_offsets, kv_offsets = inputs[:_NUM_TENSOR_INPUTS]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, q_offsets, kv_offsets)
    ctx.options = inputs[_NUM_TENSOR_INPUTS:]
    ctx.set_materialize_grads(False)  # grad_lse stays None when lse is unused: the backward skips that term


def backward_grads(out: Tensor, lse: Tensor, grad_out: Optional[Tensor],
                   grad_lse: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    """(grad_out, grad_lse) as an autograd formula hands them to a backward op: grad_out contiguous (autograd may hand
    a stride-0 or transposed one), zeros when only lse was used; grad_lse 0 where lse is -inf. Why: the lse of a row
    that sees no key is a constant, so its gradient must reach no input, but the backward's delta = rowsum(dO * O) -
    grad_lse carries a NaN there into P * (dP - delta) = 0 * NaN, NaN dq and dk (a masked z-loss,
    ``where(isfinite(lse), lse ** 2, 0)``, hands 0 * -inf = NaN). One [Hq, T_q] pass, only when lse was used."""
    grad_out = torch.zeros_like(out) if grad_out is None else grad_out.contiguous()
    if grad_lse is not None:
        grad_lse = torch.where(torch.isneginf(lse), 0.0, grad_lse)
    return grad_out, grad_lse


def _backward_inputs(ctx, grad_out, grad_lse):
    """(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets) for the backward (``backward_grads``)."""
    q, k, v, out, lse, q_offsets, kv_offsets = ctx.saved_tensors
    grad_out, grad_lse = backward_grads(out, lse, grad_out, grad_lse)
    return grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets


def _backward(ctx, grad_out, grad_lse):
    grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets = _backward_inputs(ctx, grad_out, grad_lse)
    # autograd gives grad_out/grad_lse the outputs' shapes and dtypes: the public op's checks are skipped
    with autograd_backward_call(grad_out, q):
        dq, dk, dv = torch.ops.jfa.attention_backward(
            grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, *ctx.options
        )
    return (dq, dk, dv) + (None,) * (_NUM_TENSOR_INPUTS - 3 + len(ctx.options))


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


# --------------------------------------------------------------- the compile path: kernels visible to Inductor
COMPILE_PATHS = ("inductor", "opaque", "split")
# Device types whose calls a traceable backend may be traced for (a test adds "cpu" for a CPU test backend)
TRACE_DEVICES = ("cuda",)


def compile_path() -> str:
    """``JFA_COMPILE_PATH`` (read when a graph is traced): ``inductor`` (the default, unless ``triton_pin_mismatch``
    says torch cannot analyse kernels under the installed triton: then ``opaque``) traces a traceable backend's code
    into torch.compile graphs in place of the op (see ``_traced_backend``), so Inductor launches the kernels with its
    own launcher; ``opaque`` keeps the op one node whose body runs at run time, as for every other backend. Measured
    on the H200 (bench/NOTES.md v8): the 4-layer model's compiled step 10.5 ms (inductor) vs 12.5 (opaque) on small
    batches, 15.9 vs 16.6 on T=32768; a compiled forward 422 vs 499 us per call. ``split`` chooses in the graph by
    the call's size: the traced kernels below ``split_rows()`` rows, the opaque op (whose body auto-dispatches, to
    tlx on large calls) from there (``_split``); the default under the TLX install (``SPLIT_BY_DEFAULT``)."""
    path = os.environ.get("JFA_COMPILE_PATH")
    if path is None:
        return default_compile_path()
    if path not in COMPILE_PATHS:
        raise ValueError(f"JFA_COMPILE_PATH must be one of {COMPILE_PATHS}, got {path!r}")
    return path


# (torch, triton) major.minor pairs of a pin mismatch with the size-split path as the default: the TLX install (torch
# 2.11, Triton 3.8 + triton-utlx; backends.triton.ttir_compat fixes torch's kernel analysis). H200, 2026-12-04
# (bench/NOTES.md v24), the 4-layer model paired with varlen_attn's step in the same rounds: small batches split
# 0.923 vs opaque 1.038, large 1.125x vs 1.129x (a tie within the rounds' spread); under mode="reduce-overhead"
# split runs without CUDA graphs (Inductor skips graphs with a cond) where the opaque op failed ("tensors in the
# cudagraph pool not tracked as outputs"). Any other mismatch keeps the op opaque: its kernel analysis is untested.
SPLIT_BY_DEFAULT: frozenset = frozenset({("2", "11", "3", "8")})


def default_compile_path() -> str:
    """``compile_path()`` without ``JFA_COMPILE_PATH``: ``inductor``, or under a ``triton_pin_mismatch`` ``split``
    for the pairs of ``SPLIT_BY_DEFAULT`` and ``opaque`` for any other."""
    if not triton_pin_mismatch():
        return "inductor"
    return "split" if _minor(torch.__version__) + _minor(_triton_version()) in SPLIT_BY_DEFAULT else "opaque"


def _minor(version: str) -> tuple:
    return tuple(version.split("+")[0].split(".")[:2])


def _triton_version() -> str:
    import triton

    return triton.__version__


@functools.lru_cache(maxsize=None)
def triton_pin_mismatch() -> Optional[str]:
    """Why torch's analysis of user Triton kernels may not work with the installed triton, else None.

    Tracing kernels into a graph (``wrap_triton``) makes torch build each kernel's IR with the installed triton's
    compiler API. torch 2.11 (pinned to triton 3.6) under triton 3.8 (the TLX install) fails there ("Function
    argument index out of range") and Inductor then fails the whole graph (H200, 2026-12-02). So when triton's
    major.minor differs from the version torch's wheel pins, the default compile path keeps the op opaque (its body
    runs at run time: correct, a little slower); ``JFA_COMPILE_PATH=inductor`` forces tracing anyway, and for torch
    2.11 under triton 3.8 ``backends.triton.ttir_compat`` then fixes torch's analysis (compiles on CPU; the H200 run
    that would make it the default there: bench/NOTES.md "Traced path under Triton 3.8")."""
    try:
        import importlib.metadata
        import triton

        pins = [r.split("==", 1)[1].split(";")[0].strip() for r in importlib.metadata.requires("torch") or ()
                if re.match(r"(pytorch-)?triton\s*==", r)]
        installed = triton.__version__
    except Exception:  # no triton, no torch metadata: nothing to compare (no tracing without triton anyway)
        return None
    if not pins or _minor(pins[0]) == _minor(installed):
        return None
    why = (f"triton {installed} is installed but torch {torch.__version__} pins triton {pins[0]}: compiled graphs "
           f"keep jfa ops opaque, or size-split for the TLX install's pair (JFA_COMPILE_PATH=inductor forces tracing "
           f"the kernels)")
    log.warning("jfa_ops: %s", why)
    return why


def _traced_backend(q: Tensor, k: Tensor, params: AttentionParams, backend: Optional[str]):
    """The backend whose code AOTAutograd traces in place of the op, or None (the op stays opaque).

    Called only where ``_may_trace`` holds. The choice is static at trace time (``select_backend`` reads only Problem
    facts). Traced: a ``traceable`` backend (triton) on CUDA tensors with offsets checked on the device or not at all (``JFA_VALIDATE=async|off``; ``sync``
    reads them on the host, ``deferred`` keeps Python state per call), ``JFA_COMPILE_PATH=inductor``, and not while
    torch.export builds a program (it keeps the op, as for ``torch.library.triton_op``; AOTInductor traces it when
    it compiles the program). The graph then holds the kernels (``triton_kernel_wrapper`` nodes) and the aten ops
    around them, and Inductor launches them with its own launcher (CUDA-graph trees capture them too). Under
    ``split`` broadcast-Q stays opaque: its outputs have B * L_q rows, whose strides (Max(1, B * L_q)) cond rejects
    (an AOTInductor compile still traces it: ``_split`` is not used there)."""
    from torch.export._trace import custom_triton_ops_decomposition_disabled

    if custom_triton_ops_decomposition_disabled():
        return None
    if params.broadcast_q and compile_path() == "split" and not aot_compiling():
        return None
    try:
        if validation_mode(q.device) not in ("async", "off"):
            return None
        impl = select_backend(backend, Problem.of(q, k, params))
    except ValueError:  # a bad JFA_VALIDATE, a backend that cannot run the call: the opaque op raises it at run time
        return None
    return impl if impl.traceable else None


def _schema_values(op, args, kwargs) -> list:
    """The op's arguments in schema order with defaults filled (dispatch rules get them as the caller passed them)."""
    return list(args) + [kwargs.get(a.name, a.default_value) for a in op._schema.arguments[len(args):]]


def _plain(types) -> bool:
    """Only the tensor types tracing makes (no other subclass, which must see the op itself)."""
    return all(issubclass(t, (FakeTensor, FunctionalTensor)) or t is Tensor for t in types)


def _may_trace(types, q: Tensor) -> bool:
    """Whether a dispatch rule may trace a backend in place of the op: only tracing's own tensor types, CUDA tensors,
    and ``JFA_COMPILE_PATH=inductor`` (``_traced_backend`` then decides on the backend)."""
    return _plain(types) and q.device.type in TRACE_DEVICES and compile_path() in ("inductor", "split")


def _static_heads(t: Optional[Tensor]) -> Optional[Tensor]:
    """``t`` viewed with its head and head_dim sizes as plain ints (lse/grad_lse: heads first).

    Under ``torch.compile(dynamic=True)`` every size is symbolic, heads and head_dim too, but kernels need them as
    constexprs (and configs are cached by them). ``int()`` specializes them (a guard on heads and head_dim, never on
    lengths), and the view hands the backend tensors whose shapes hold those ints."""
    if t is None or not any(isinstance(d, torch.SymInt) for d in t.shape):
        return t
    if t.dim() == 3:  # [T, H, D]
        return t.view(t.shape[0], int(t.shape[1]), int(t.shape[2]))
    return t.view(int(t.shape[0]), t.shape[1])  # [H, T]


def _traced_attention(mode, op, types, args, kwargs):
    """jfa::attention under FunctionalTensorMode (AOTAutograd): trace the backend's code, or keep the op."""
    q, k, v, q_offsets, kv_offsets, *options = _schema_values(op, args, kwargs)
    may_trace = _may_trace(types, q) and not getattr(_OPAQUE, "on", False)
    if may_trace:
        with mode:
            q, k, v = (_static_heads(t) for t in (q, k, v))
    params, backend = _params(q, k, v, q_offsets, kv_offsets, *options)
    impl = _traced_backend(q, k, params, backend) if may_trace else None
    if impl is None:
        return mode.__torch_dispatch__(op, types, args, kwargs)
    with meta_kernels.deciding_checks():  # no body runs later: what the fake left open is decided now
        _params(q, k, v, q_offsets, kv_offsets, *options)
    if compile_path() == "split" and not aot_compiling():  # a package runs without Python: the kernels, every size
        with mode:
            return _split(op, (q, k, v, q_offsets, kv_offsets), options, 0, functools.partial(_traced_forward, impl),
                          mode)
    with mode, traced(mode):
        return _traced_forward(impl, q, k, v, q_offsets, kv_offsets, params=params)


def _traced_forward(impl, q, k, v, q_offsets, kv_offsets, *options, params: Optional[AttentionParams] = None):
    """The traceable backend's forward, recorded into the graph (inside ``traced()``); ``params`` None: from
    ``options`` (already checked)."""
    if params is None:
        params, _ = _resolve(q, *options)
    if aot_compiling() or _checked_in_trace(q, k, q_offsets, kv_offsets, params):
        return impl.forward(q, k, v, q_offsets, kv_offsets, params)
    return _forward(impl, q, k, v, q_offsets, kv_offsets, params)


def _traced_backward(impl, *tensors_and_options):
    """The traceable backend's backward (inside ``traced()``), its params from the (checked) options."""
    tensors, options = tensors_and_options[:9], tensors_and_options[9:]
    params, _ = _resolve(tensors[2], *options)
    return impl.backward(*tensors, params)


# --------------------------------------------------------------- the size-split compile path (JFA_COMPILE_PATH=split)
_OPAQUE = threading.local()  # .on: the split path's large branch is tracing the op: it stays one opaque node


def split_rows() -> int:
    """Rows from which the split path keeps the op opaque: the eager automatic rule's threshold, the triton
    backend's ``TMA_MIN_ROWS`` (the tlx backend from this many q or k rows, triton below:
    ``backends.tlx.auto_min_rows`` reads the same attribute; tlx itself cannot be imported without its install),
    read per trace (tests lower it)."""
    from jfa_ops.backends.triton import attn_fwd

    return attn_fwd.TMA_MIN_ROWS


def _split(op, tensors: tuple, options: tuple, q_index: int, small, scope):
    """``JFA_COMPILE_PATH=split``: ``torch.cond`` on the call's row counts, a host SymInt predicate (no device
    sync, no guard: one graph for every length): ``small(*tensors, *options)`` traced (the kernels, Inductor
    launches them) while ``max(rows_q, rows_kv) < split_rows()``, else ``op`` kept one opaque node, whose body
    chooses the backend at run time from real sizes (tlx on large calls under the TLX install).

    Called by both dispatch rules (forward and backward, under the trace's FunctionalTensorMode, below autograd),
    so the backward takes the branch of its forward by the same predicate and the cond needs no autograd of its
    own. ``tensors``: the op's tensor arguments (None where an optional one is absent); ``q_index``: q's place
    among them; ``scope``: the trace's ``per_trace`` scope. Static sizes (no SymInt): the branch is chosen while
    tracing (such graphs recompile per shape anyway). The values ``small`` derives from the offsets alone are built
    before the cond, once per graph (``base.hoisting``), and passed to the small branch as operands."""
    q, k = tensors[q_index], tensors[q_index + 1]
    rows = torch.sym_max(q.shape[0], k.shape[0])
    # The same test, written differently in the backward (``<= limit - 1``): the trace records one node per
    # expression, so an equal one would be the forward's SymBool saved for the backward, and torch 2.11's Inductor
    # takes no SymBool graph input ("Unsupported inductor graph input type: StrictLessThan"); this way the backward
    # computes its own from the sizes it gets anyway.
    pred = rows < split_rows() if q_index == 0 else rows <= split_rows() - 1
    if isinstance(pred, torch.SymBool):  # known from the sizes' ranges alone (a threshold below Dynamo's minimum
        # size of 2): a constant, which a cond would carry as a graph input (torch 2.11's Inductor takes no
        # BooleanFalse: a compiled CUDA-graph training step failed so on the H200, v24)
        from torch.fx.experimental.symbolic_shapes import statically_known_true

        if statically_known_true(pred):
            pred = True
        elif statically_known_true(torch.sym_not(pred)):
            pred = False
    if q_index != 0:
        _recompute_in_backward(pred)
    if not isinstance(pred, torch.SymBool):
        if pred:
            with traced(scope):
                return small(*tensors, *options)
        return _opaque_call(op, tensors, options)
    # What the small branch derives from the offsets alone (int32 copies, tile lists, the offset check) is built
    # here, once per graph (``per_trace`` in the trace's scope: every layer and the backward share it), by a dry
    # run of ``small`` that drops its kernel launches; the branch gets those values as operands, its memo seeded
    # with them, and launches only the kernels (traced in the branch, the values were built per layer and per
    # step: ~25 launches of a 4-layer step, the small side's cost in v23).
    calls, hoisted = [], []
    hoist = split_hoist()
    if hoist != "0":  # =0: each branch builds its own (A/B)
        if hoist == "cond":  # built behind the predicate: a large batch runs none of it (into the scope's memo)
            _build_behind(pred, scope, tensors, options, small)
        with hoisting(scope) as record:
            small(*tensors, *options)
        calls, hoisted = hoistable(record, tensors)
    n_args = len(tensors)
    operands, unpack = _cond_operands(list(tensors) + hoisted, n_args, options)

    def small_branch(*flat):
        ts, opts, to_branch = unpack(flat)
        with traced(seeded_scope(calls, to_branch)):  # contiguous: cond merges branch outputs of one layout
            return tuple(t.contiguous() for t in small(*ts[:n_args], *opts))

    def large_branch(*flat):
        ts, opts, _ = unpack(flat)
        return tuple(_opaque_call(op, ts[:n_args], opts))

    return tuple(torch.ops.higher_order.cond(pred, small_branch, large_branch, operands))


SPLIT_HOISTS = ("1", "0", "cond")


def split_hoist() -> str:
    """``JFA_SPLIT_HOIST`` (read while tracing): ``1`` (default) the split path's offset-derived values are built
    before its cond, unconditionally, once per graph; ``cond`` the same, behind the cond's predicate
    (``_build_behind``: a large batch runs no list launch and no offset check); ``0`` each small branch builds its
    own (A/B). Any other value: ``1``, as before ``cond`` existed."""
    hoist = os.environ.get("JFA_SPLIT_HOIST", "1")
    return hoist if hoist in SPLIT_HOISTS else "1"


def _cond_operands(everything: list, n_args: int, options: tuple):
    """(operands, unpack) of the tensors ``everything`` (the op's ``n_args`` tensors, then built values) and the
    op's ``options`` for a cond; ``unpack(flat)``: a branch's (tensors, options, {id(outer tensor): its branch
    tensor}) from its operands ``flat``.

    operands: one tensor per storage (cond rejects operands that share one: q_offsets is kv_offsets in
    self-attention, q/k/v views of a model's fused qkv projection, a tile list's two halves), then the symbolic
    options; ``slots``: each tensor's operand index (None: absent) and, for a view of another operand's storage,
    its (size, stride, storage offset), rebuilt in the branch with as_strided (storage offsets are absolute, in
    eager and in Inductor's lowering alike: the same elements, no copy)"""
    unique: list = []
    storages: list = []
    slots = []
    for i, t in enumerate(everything):
        if t is None:
            slots.append(None)
            continue
        storage = _storage_of(t)
        same = [j for j, u in enumerate(storages) if u == storage]
        if same and i >= n_args and unique[same[0]] is not t:
            # a built value sharing a storage (a tile list's two halves): a copy (Inductor folds it away: its
            # wrapper hands the branch views of the list), since a view's symbolic storage offset
            # (Max(1, capacity)) would be rebuilt in the branch with a call Inductor's subgraph lowering does not
            # take (``_nary_sym_max``)
            t = t.clone()
            storage, same = _storage_of(t), []
        if not same:
            unique.append(t)
            storages.append(storage)
            slots.append((len(unique) - 1, None))
        elif unique[same[0]] is t:
            slots.append((same[0], None))
        else:
            slots.append((same[0], (t.size(), t.stride(), t.storage_offset())))
    symbolic = [i for i, o in enumerate(options) if isinstance(o, torch.SymInt)]

    def unpack(flat):
        ts = [None if slot is None else flat[slot[0]] if slot[1] is None else flat[slot[0]].as_strided(*slot[1])
              for slot in slots]
        opts = list(options)
        for i, o in zip(symbolic, flat[len(unique):]):
            opts[i] = o
        return ts, opts, {id(outer): inner for outer, inner in zip(everything, ts) if outer is not None}

    return unique + [options[i] for i in symbolic], unpack


def _build_behind(pred, scope, tensors: tuple, options: tuple, small) -> None:
    """``JFA_SPLIT_HOIST=cond``: what the small path still has to build from the offsets alone (``per_trace``
    values no earlier call of the graph built: int32 copies, tile lists, the offset check) built as the outputs of
    a cond on ``pred``, into ``scope``'s memo, so that ``_split``'s dry run then finds every value built.

    Why: hoisted unconditionally, the builds (2 list launches, ~4 allocations, the check's assert kernel) ran on
    every step, on large batches too, whose opaque branch never reads them (a host-bound step on the H200, v25).

    The cond's true branch is the dry run (``hoisting``: the ``per_trace`` functions' launches kept, the offset
    check's assert inside it); its false branch is the same dry run with every launch dropped
    (``hoisting(drop_all=True)``): the same outputs, shapes, strides and dtypes by construction, values unwritten
    (read by no one: a large batch takes the op's branch), and no assert (``validation.device_flag`` asserts
    nothing there: the flag it would check was written by no kernel). Values built earlier in the graph (an
    earlier layer, the forward for the backward) are the cond's operands and seed its branches' memo.
    Outputs: one dense tensor per storage (cond takes no output that aliases another or an input, nor a slice):
    a list's two halves as the [2, capacity] tensor they are rows of (``select`` after the cond: views, no copy),
    anything else that is not its storage's dense whole a copy."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    memo = _memo_of(scope)
    # the probe: which values are still to build (every launch dropped: it leaves only dead ops in the graph)
    probe = _Scope()
    _memo_of(probe).update(memo)
    with hoisting(probe, drop_all=True, outside=scope) as record:
        small(*tensors, *options)
    probe_calls, _ = hoistable(record, tensors)
    hits = [c for c in probe_calls if _memo_key(c[0], c[1]) in memo]
    if len(hits) == len(probe_calls):
        return
    known = list(tensors) + [t for t in _unique_tensors(hits) if not any(t is u for u in tensors)]
    n_args = len(tensors)
    operands, unpack = _cond_operands(known, n_args, options)
    recipes = {}

    def build(drop_all, *flat):
        ts, opts, to_branch = unpack(flat)
        seeded = seeded_scope(hits, to_branch)
        seeded_keys = set(_memo_of(seeded))
        with hoisting(seeded, drop_all=drop_all) as inner:
            small(*ts[:n_args], *opts)
        built, _ = hoistable(inner, [t for t in ts if t is not None])
        built = [c for c in built if _memo_key(c[0], c[1]) not in seeded_keys]
        # each built tensor: ("in", i) the branch's ts[i], or ("out", j, row) output j (row: its row j[row])
        where = {id(t): ("in", i) for i, t in enumerate(ts) if t is not None}
        outputs, layout = [], []
        new = [t for t in _unique_tensors(built) if id(t) not in where]
        groups: dict = {}
        for t in new:
            groups.setdefault(_storage_of(t), []).append(t)
        for group in groups.values():
            n = group[0].shape[0] if group[0].dim() == 1 else None
            rows = len(group) > 1 and n is not None and all(
                t.dim() == 1 and t.stride(0) == 1 and statically_known_true(t.shape[0] == n)
                and statically_known_true(t.storage_offset() == r * n) for r, t in enumerate(group))
            if rows:  # a list's halves: rows of one [k, n] tensor
                outputs.append(group[0].as_strided((len(group), n), (n, 1), 0))
                for r, t in enumerate(group):
                    where[id(t)] = ("out", len(outputs) - 1, r)
                layout.append(("rows", len(group)))
                continue
            for t in group:
                whole = len(group) == 1 and t.is_contiguous() and statically_known_true(t.storage_offset() == 0) \
                    and statically_known_true(t.untyped_storage().nbytes() == t.numel() * t.element_size())
                outputs.append(t if whole else t.clone(memory_format=torch.contiguous_format))
                where[id(t)] = ("out", len(outputs) - 1, None)
                layout.append(("whole" if whole else "copy", 1))
        recipes[drop_all] = (built, where, layout)
        return tuple(outputs)

    outs = torch.ops.higher_order.cond(pred, functools.partial(build, False), functools.partial(build, True),
                                       operands)
    (built, where, layout), other = recipes[False], recipes[True][2]
    if layout != other:
        raise RuntimeError(f"jfa_ops: the split path's build branches differ ({layout} vs {other})")

    def outer(t):
        place = where[id(t)]
        if place[0] == "in":
            return known[place[1]]
        return outs[place[1]] if place[2] is None else outs[place[1]].select(0, place[2])

    for fn, args, result in built:
        args, result = _map_tensors(args, outer), _map_tensors(result, outer)
        result = _map_tensors(result, None, functools.partial(_size_or_self, _tensors_in(result)))
        memo[_memo_key(fn, args)] = (args, result)


def _size_or_self(tensors, size):
    """``size`` as a size of one of ``tensors`` (the graph's own SymInt for it), else itself."""
    try:
        return _size_of(tensors, size)
    except KeyError:
        return size


def _storage_of(t: torch.Tensor):
    """What cond compares to find aliased operands: the storage of the tensor under the trace's functional wrapper."""
    from torch._subclasses.functional_tensor import FunctionalTensor
    from torch.multiprocessing.reductions import StorageWeakRef

    if isinstance(t, FunctionalTensor):
        t = torch._from_functional_tensor(t.elem)
    return StorageWeakRef(t.untyped_storage())


def _recompute_in_backward(pred) -> None:
    """Tag the backward's predicate node of the joint graph ``MUST_RECOMPUTE``, so the partitioner computes it in
    the backward graph from the sizes instead of saving a SymBool from the forward: torch 2.11's Inductor takes no
    SymBool graph input ("Unsupported inductor graph input type: LessThan"; 2.13's does). A torch whose private
    tracing API differs leaves the node as it is (2.13 runs either way)."""
    if not isinstance(pred, torch.SymBool):
        return
    try:
        from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot
        from torch.utils.checkpoint import CheckpointPolicy

        proxy_mode = get_proxy_mode()
        if proxy_mode is None:
            return
        proxy = get_proxy_slot(pred, proxy_mode.tracer, None)
        proxy = proxy.force() if hasattr(proxy, "force") else proxy
        if proxy is not None:
            proxy.node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
    except (ImportError, AttributeError, TypeError) as e:  # a private API changed
        log.debug("jfa_ops: split predicate not tagged for recompute (%s: %s)", type(e).__name__, e)


def _opaque_call(op, tensors, options):
    """``op`` on these arguments, recorded as one node (the dispatch rules leave it to the trace)."""
    before = getattr(_OPAQUE, "on", False)
    _OPAQUE.on = True
    try:
        return op(*tensors, *options)
    finally:
        _OPAQUE.on = before


def _checked_in_trace(q: Tensor, k: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor,
                      params: AttentionParams) -> bool:
    """Whether an earlier call of this graph trace checks these offsets tensors (unmodified) against these rows and
    max_seqlen hints; else notes that this call will. Why: a model passes one offsets tensor to every layer, and
    the first layer's device assert comes before everything after it in the stream (as ``validation.covered`` in
    eager async mode): one check per graph, not one flag and ``_assert_async`` per layer."""
    seen = per_trace(_trace_coverage, q_offsets, kv_offsets, q.shape[0], k.shape[0], params.max_seqlen_q,
                     params.max_seqlen_kv, params.broadcast_q)
    checked = bool(seen)
    seen.append(True)
    return checked


def _trace_coverage(*key) -> list:
    """``_checked_in_trace``'s record for one key: empty until a call of the trace has checked it."""
    return []


def aot_compiling() -> bool:
    """Whether AOTInductor is compiling a package. It runs each kernel of the package on random inputs while it
    compiles (autotuning at compile time), so a device check of the offset values would assert there and kill the
    CUDA context: packages carry no offset-value check (docs/architecture.md); validate offsets where the batch is
    built."""
    from torch._inductor.virtualized import V

    return V.aot_compilation


def _traced_attention_backward(mode, op, types, args, kwargs):
    """jfa::attention_backward under FunctionalTensorMode: as ``_traced_attention``."""
    values = _schema_values(op, args, kwargs)
    tensors, options = values[:9], values[9:]
    may_trace = _may_trace(types, tensors[2]) and not getattr(_OPAQUE, "on", False)
    if may_trace:
        with mode:
            tensors = [_static_heads(t) for t in tensors[:7]] + tensors[7:]  # grad_out .. lse; not the offsets
    params, backend = _backward_params(*tensors, options)
    q, k = tensors[2], tensors[3]
    impl = _traced_backend(q, k, params, backend) if may_trace else None
    if impl is None:
        return mode.__torch_dispatch__(op, types, args, kwargs)
    with meta_kernels.deciding_checks():
        _backward_params(*tensors, options)
    if compile_path() == "split" and not aot_compiling():
        with mode:
            return _split(op, tuple(tensors), tuple(options), 2, functools.partial(_traced_backward, impl), mode)
    with mode, traced(mode):
        return impl.backward(*tensors, params)


attention.register_torch_dispatch(FunctionalTensorMode, _traced_attention)
attention_backward.register_torch_dispatch(FunctionalTensorMode, _traced_attention_backward)
attention.register_autograd(_backward, setup_context=_setup_context)
attention_backward.register_autograd(_double_backward, setup_context=_setup_backward_context)



# --------------------------------------------------------------- the op's lean dispatch
# JFA_OP_DISPATCH (read once, at import): "lean" (default) runs a dispatched call that records no autograd straight
# into the op's body (``_lean_autograd_kernel``); "custom_op" leaves every call on torch.library's own path (A/B).
LEAN_DISPATCH = os.environ.get("JFA_OP_DISPATCH", "lean") != "custom_op"
# A call's dispatch keys below ADInplaceOrView when nothing but the backend's kernel would run there
_DENSE_KEYSETS = tuple(torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, d)) for d in ("CPU", "CUDA"))
_any_requires_grad = getattr(torch._C, "_any_requires_grad", None) or (
    lambda *args: any(isinstance(a, Tensor) and a.requires_grad for a in args))


def _lean_autograd_kernel(op_def):
    """The op's kernel at the AutogradCPU/AutogradCUDA keys: a call that records no autograd (grad mode off, or no
    input requiring grad) on plain dense tensors runs the op's body here; every other call (recording autograd, a
    tensor subclass, a dispatch mode, functionalization, functorch, conj/neg bits: any key between autograd and the
    backend) takes torch.library's generated autograd kernel, as the op always did.

    Why: that kernel's path for such a call is the Python autograd kernel, a Python redispatch, then the backend
    wrapper (``_dynamo.disable``, an output alias check): ~45 us of a small call on CPU, against ~5 us here. A
    compiled graph that keeps the op opaque (triton 3.8: ``triton_pin_mismatch``) calls it so per layer, forward
    and backward, with grad mode off. The body and its arguments are the same; the alias check is skipped (the
    bodies return fresh tensors)."""
    if _set_eval_frame is None:
        raise ImportError("torch._C._dynamo.eval_frame.set_eval_frame")
    generated = torch._library.autograd.make_autograd_impl(op_def._opoverload, op_def)
    below_view_keys = torch._C._after_ADInplaceOrView_keyset
    body = op_def._init_fn

    def kernel(keyset, *args, **kwargs):
        if (LEAN_DISPATCH and not kwargs and (keyset & below_view_keys) in _DENSE_KEYSETS
                and not (torch.is_grad_enabled() and _any_requires_grad(*args))):
            return _run_body(body, args)
        return generated(keyset, *args, **kwargs)

    return kernel


try:  # imported once: an import statement costs ~1-2 us per call
    from torch._C._dynamo.eval_frame import set_eval_frame as _set_eval_frame
except ImportError:  # a torch without it: _lean_autograd_kernel raises, and the lean dispatch stays off
    _set_eval_frame = None


def _run_body(body, args):
    """An op body run as torch.library's backend wrapper runs it: with Dynamo's eval-frame callback off
    (``_dynamo.disable``: Dynamo never traces the body) and, under grad mode, below autograd. Without grad mode no
    op of the body can record autograd, and excluding the autograd keys made the body ~4 us slower a call on CPU
    (bench/NOTES.md "Opaque op host cost, helper host9"): the compiled graph's calls (grad mode off) skip it."""
    prior = _set_eval_frame(None)
    try:
        if not torch.is_grad_enabled():
            return body(*args)
        with torch._C._AutoDispatchBelowAutograd():
            return body(*args)
    finally:
        _set_eval_frame(prior)


def _register_lean_dispatch() -> Optional[torch.library.Library]:
    """Register ``_lean_autograd_kernel`` for both ops; where this torch lacks a private API it uses, say so once and
    leave the op on torch.library's path (slower, the same results)."""
    try:
        kernels = [(op_def, _lean_autograd_kernel(op_def)) for op_def in (attention, attention_backward)]
    except (AttributeError, ImportError, TypeError) as e:
        log.warning("jfa_ops: the op's lean dispatch is off under torch %s (%s: %s)", torch.__version__,
                    type(e).__name__, e)
        return None
    lib = torch.library.Library("jfa", "IMPL")
    for op_def, kernel in kernels:
        for key in ("AutogradCPU", "AutogradCUDA"):
            lib.impl(op_def._name, kernel, key, with_keyset=True)
    return lib


_LEAN_LIB = _register_lean_dispatch()


# JFA_OP_CALL (read at import): "dispatcher" (default) leaves ``torch.ops.jfa.<op>.default(...)`` to torch's dispatcher;
# "direct" gives both overloads a ``__call__`` that runs the op's body itself where the dispatcher would have reached
# ``_lean_autograd_kernel``'s body anyway (``_DirectCallOverload``). ``DIRECT_OP_CALL`` is read per call (A/B).
DIRECT_OP_CALL = os.environ.get("JFA_OP_CALL", "dispatcher") == "direct"
# The exact Python types of the options a direct call passes through unchanged: the dispatcher's conversion of these
# (schema order: SymInt, SymInt, float?, bool, SymInt, SymInt, bool, bool, str?) is the identity
_DIRECT_OPTION_TYPES = frozenset((int, int, scale, bool, int, int, bool, bool, backend)
                                 for scale in (float, type(None)) for backend in (str, type(None)))
# Dispatch state of a plain call made outside any mode, transform or guard (what this import ran under)
_BASE_TLS = (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())


class _DirectCallOverload(torch._ops.OpOverload):
    """``torch.ops.jfa.attention.default`` / ``attention_backward.default`` with ``JFA_OP_CALL=direct`` (their
    ``__class__``; hash, schema, ``_op`` and every registration unchanged): a call that the dispatcher would send
    straight into the op's body from ``_lean_autograd_kernel`` runs the body here, without the dispatcher's
    Python -> C++ -> Python round trip; every other call goes through ``self._op`` as before.

    Why: a compiled graph that keeps the op opaque (Triton 3.8 + TLX) calls both overloads per layer with grad
    mode off, and the round trip costs ~7-8 us of CPU per call on a 2-core box (bench/NOTES.md "Opaque op host cost,
    helper host9"). The direct path requires what makes the two equal: positional arguments only, every option of
    the exact type the dispatcher would hand the body (no SymInt, no int for the float scale), tensors of the
    plain class whose dispatch keys are exactly those of a dense CPU or CUDA tensor (so no subclass, functorch
    wrapper, functionalization, conj/neg view, sparse or meta tensor, mixed devices), the dispatch TLS of a plain
    call (no mode, transform, autocast region, inference mode, Python dispatcher), no TorchDispatchMode or
    TorchFunctionMode, grad mode off, no profiler (it records the op from the dispatcher). Off by default: it takes
    over a torch class's call, an internal API."""

    def __call__(self, /, *args, **kwargs):
        body, tensors, optional = self._jfa_direct
        if (DIRECT_OP_CALL and not kwargs and len(args) == tensors + NUM_OPTIONS and not torch.is_grad_enabled()
                and tuple(map(type, args[tensors:])) in _DIRECT_OPTION_TYPES and _dense_call(args[:tensors], optional)
                and not torch._C._autograd._profiler_enabled() and torch._C._len_torch_dispatch_stack() == 0
                and not torch._C._is_torch_function_mode_enabled()
                and (torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set())
                == _BASE_TLS):
            return _run_body(body, args)
        return self._op(*args, **kwargs)


def _dense_call(tensors, optional) -> bool:
    """Every tensor argument a plain tensor with the dispatch keys of a dense CPU or CUDA tensor, all on one device
    type (None only in the schema's optional slots)."""
    keys = None
    for i, t in enumerate(tensors):
        if t is None and i in optional:
            continue
        if type(t) is not Tensor:
            return False
        t_keys = torch._C._dispatch_keys(t)
        if keys is None:
            if t_keys not in _DENSE_TENSOR_KEYS:
                return False
            keys = t_keys
        elif t_keys != keys:
            return False
    return keys is not None


def _dense_tensor_keys(device_type: str) -> torch._C.DispatchKeySet:
    """The dispatch keys torch gives a plain dense tensor of ``device_type`` (built, so no device is needed)."""
    keys, name = torch._C.DispatchKey, device_type.upper()
    keyset = torch._C.DispatchKeySet(getattr(keys, name))
    for key in ("ADInplaceOrView", "Autograd" + name, "Autocast" + name):
        keyset = keyset.add(getattr(keys, key))
    return keyset


_DENSE_TENSOR_KEYS = tuple(map(_dense_tensor_keys, ("cpu", "cuda")))


def install_direct_call() -> None:
    """Give both overloads ``_DirectCallOverload``'s call (done at import under ``JFA_OP_CALL=direct``; idempotent);
    ``DIRECT_OP_CALL`` then switches it per call."""
    for op_def, tensors, optional in ((attention, _NUM_TENSOR_INPUTS, (3,)), (attention_backward, 9, (1, 7))):
        overload = op_def._opoverload
        overload._jfa_direct = op_def._init_fn, tensors, optional
        overload.__class__ = _DirectCallOverload


if DIRECT_OP_CALL and _LEAN_LIB is not None:  # the same private APIs as the lean dispatch
    install_direct_call()


_AUTOCAST_CASTS = (torch.float32, torch.float16, torch.bfloat16)  # the dtypes an autocast region casts (the ops' own)


def _autocast_kernel(op: torch._ops.OpOverload, device_type: str, num_inputs: int):
    """Under ``torch.autocast(device_type)``: the op's first ``num_inputs`` arguments (q, k, v), where fp32, fp16 or
    bf16, go to the autocast dtype (fp64 is left alone, as autocast does for SDPA), then the op runs with autocast
    off. ``torch.library.register_autocast`` casts to one fixed dtype; this follows the region's dtype (bf16 or fp16)
    like SDPA. Any other dtype reaches the op as given, which refuses it as outside a region. Why not torch's rule
    (every floating dtype but fp64): it cast float8 tensors too, so a pre-quantized pair's data passed without its
    scale to ``mxfp8_attention`` ran as bf16 values, its block scales silently dropped (helper review41)."""
    autocast_key = getattr(torch._C.DispatchKey, "Autocast" + torch._C._dispatch_key_for_device(device_type))

    def kernel(keyset, *args, **kwargs):
        dtype = torch.get_autocast_dtype(device_type)
        cast = [t.to(dtype) if t.dtype in _AUTOCAST_CASTS and t.device.type == device_type else t
                for t in args[:num_inputs]]
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(autocast_key)):
            return op(*cast, *args[num_inputs:], **kwargs)

    return kernel


_AUTOCAST_LIB = torch.library.Library("jfa", "IMPL")


def register_autocast(name: str, num_inputs: int = 3) -> None:
    """Give ``jfa::name`` the autocast kernel (``_autocast_kernel``) of every device type: the attention ops
    (``attention``, ``block_sparse_attention``, ``mxfp8_attention``: q, k, v) and the selection (q, k) cast alike,
    so one region gives them the same inputs as a caller who cast first. Only forward ops: their autograd records
    the casts, and the backward ops get the tensors the forward saved."""
    op = getattr(torch.ops.jfa, name).default
    for device_type in ("cpu", "cuda"):
        _AUTOCAST_LIB.impl(name, _autocast_kernel(op, device_type, num_inputs),
                           "Autocast" + torch._C._dispatch_key_for_device(device_type), with_keyset=True)


register_autocast("attention")


# --------------------------------------------------------------- the eager direct path
# JFA_EAGER_PATH (read once, at import): "direct" (default) runs eager calls of plain tensors without torch's
# custom-op dispatch; "op" sends every call through torch.ops.jfa.attention.
EAGER_DIRECT = os.environ.get("JFA_EAGER_PATH", "direct") != "op"


def eager_direct(*tensors: Optional[Tensor]) -> bool:
    """Whether an eager call may run the op's body directly instead of through ``torch.ops.jfa.attention``.

    Why: on the H200's host a torch.library custom op costs ~30 us of dispatch per call, and its autograd layer
    (torch/_library/autograd.py: default filling, redispatch, an autograd node per op) several times that; for the
    small jagged batches of recommendation models that is more than the GPU's work (bench/NOTES.md v7). The body
    is the same Python (``_params``, ``select_backend``, ``_forward``, the backend's backward), so results are
    identical. Only when nothing else must see the op: not compiling or tracing, no tensor subclass (FakeTensor,
    FunctionalTensor, DTensor, ...), no TorchDispatchMode (FlopCounterMode, fake mode, ...), no functorch transform
    (vmap, grad, jvp), no autocast region (the op's autocast kernel casts); every other call takes the op.
    """
    return (EAGER_DIRECT and not torch.compiler.is_compiling()
            and all(t is None or type(t) is Tensor for t in tensors)
            and torch._C._len_torch_dispatch_stack() == 0
            and torch._C._functorch.peek_interpreter_stack() is None
            and not torch._C._is_any_autocast_enabled())


def needs_grad(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Grad mode on and an input requiring grad: the call must record autograd."""
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def attention_direct(q: Tensor, k: Tensor, v: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor,
                     *options, fast_key: Optional[tuple] = None) -> Tuple[Tensor, Tensor]:
    """``torch.ops.jfa.attention(q, k, v, q_offsets, kv_offsets, *options)`` without the dispatcher (only where
    ``eager_direct`` holds): the op's body, and under autograd a ``torch.autograd.Function`` with the op's formula.
    For ``jagged_attention``, which has already run ``check_options`` and ``check_no_forward_ad`` on these
    arguments: only the tensor checks are left (the rest of ``_params``). ``fast_key``: the call's ``fast_key``,
    under which what this call checked and chose is kept for ``fast_call``."""
    impl, params, checked = _direct_call(q, k, v, q_offsets, kv_offsets, options)
    mode = validation.validation_mode(q.device)
    if fast_key is not None:
        if mode == "off" or (mode in validation.DEVICE_MODES and impl.checks_offsets):  # no host-side check
            # an unhashable argument (a list window) is not kept: such calls always take the full path
            _remember(_FAST, fast_key, (impl, params, None if mode == "off" else checked, mode == "async", options))
    params = _offsets_checked(impl, q, k, q_offsets, kv_offsets, params, checked, mode)
    result = _direct_forward(impl, q, k, v, q_offsets, kv_offsets, params, options)
    _cover(q, k, q_offsets, kv_offsets, params, mode == "async")
    return result


def _direct_forward(impl, q, k, v, q_offsets, kv_offsets, params, options) -> Tuple[Tensor, Tensor]:
    if needs_grad(q, k, v):
        unwrap = torch._C._functorch.unwrap_if_dead
        return _direct_apply(unwrap(q), unwrap(k), unwrap(v), None if q_offsets is None else unwrap(q_offsets),
                             unwrap(kv_offsets), impl, params, options)
    return impl.forward(q, k, v, q_offsets, kv_offsets, params)


# Memo of the direct path's metadata work: (backend, params, params with check_offsets) per call signature. Why: the
# tensor checks, the params and the backend choice are ~40% of a small eager call's host time (tools/
# host_backend_cpu.py) and depend only on what the key holds: each tensor's shape, dtype and device, the options
# (already checked by ``check_options``), the deterministic-algorithms flag, $JFA_BACKEND and the registry. A call
# that fails a check is never stored, so every bad call still raises. JFA_CALL_CACHE=0 turns it off (A/B).
CALL_CACHE = os.environ.get("JFA_CALL_CACHE", "1") != "0"
_CALLS: dict = {}
_CALLS_MAX = 256  # a bound, not a tuning: the key holds the row counts, which vary per batch


def _metadata(t: Optional[Tensor]):
    return None if t is None else (t.shape, t.dtype, t.device)


def _op_key(q, k, v, q_offsets, kv_offsets, options: tuple, more: tuple = ()) -> Optional[tuple]:
    """The memo key of an op body's call (the backward's: ``more`` = grad_out, grad_lse, out, lse), or None with
    the memo off. Why: a compiled graph that keeps the op opaque runs the body per layer and step, and its checks
    and backend choice (~50 us of a small call on CPU) read only what this key holds. As ``_direct_call``'s key,
    plus what the op's own checks read there: each option's type (``causal=1`` is not ``causal=True``) and q's
    tensor type (``Problem.traced``)."""
    if not CALL_CACHE:
        return None
    backend = options[-1] if len(options) == NUM_OPTIONS else None  # the dispatcher may leave out trailing defaults
    return ("op", type(q), _metadata(q), _metadata(k), _metadata(v), _metadata(q_offsets), _metadata(kv_offsets),
            options, tuple(map(type, options)), torch.are_deterministic_algorithms_enabled(),
            backend or os.environ.get("JFA_BACKEND"), registry_generation()) + tuple(map(_metadata, more))


# The call memos' two steps (``_CALLS``: the op bodies' and the direct path's; ``_FAST``; ``block_sparse``'s
# ``_SELECT_CALLS``): a None key is the memo off; an unhashable key (a SymInt or list option, a list window) is a miss
# and is never kept (the full path checks what is wrong with it); ``_CALLS_MAX`` entries at the most, the table
# cleared when full.
def _recall(table: dict, key: Optional[tuple]):
    """What ``_remember`` kept in ``table`` under ``key``, else None."""
    if key is None:
        return None
    try:
        return table.get(key)
    except TypeError:  # unhashable
        return None


def _remember(table: dict, key: Optional[tuple], call: tuple) -> None:
    """Keep ``call`` (made by a call that passed every check) in ``table`` under ``key``."""
    if key is None:
        return
    try:
        hash(key)
    except TypeError:  # unhashable: not kept, and the table is not cleared for it
        return
    if len(table) >= _CALLS_MAX:
        table.clear()
    table[key] = call


def _direct_call(q, k, v, q_offsets, kv_offsets, options):
    """(backend, params, params with check_offsets=True) of an eager direct call: checked and chosen once per key."""
    key = None
    if CALL_CACHE:
        key = (_metadata(q), _metadata(k), _metadata(v), _metadata(q_offsets), _metadata(kv_offsets), options,
               torch.are_deterministic_algorithms_enabled(), os.environ.get("JFA_BACKEND"), registry_generation())
    call = _recall(_CALLS, key)
    if call is None:
        params, backend = _check_tensors(q, k, v, q_offsets, kv_offsets, *options)
        impl = select_backend(backend, Problem.of(q, k, params))
        call = impl, params, dataclasses.replace(params, check_offsets=True)
        _remember(_CALLS, key, call)
    return call


# The eager fast path, ``jagged_attention``'s first step: a call whose signature an earlier call checked (options
# included) and dispatched goes straight to the backend. Why: of a small call's host time left after the backend's
# replays, most was argument checking and option handling that repeat per call (tools/host_backend_cpu.py). The key
# holds every input of those checks and choices: each tensor's shape, dtype and device, every option with its type
# (``causal=1`` is not ``causal=True``: the checks reject one), the window's element types (a list window: no key),
# the deterministic flag, $JFA_BACKEND (read only when no backend is named: a named one ignores it, and a read costs
# ~1-3 us), the validation mode (only calls whose offsets are checked on the device, or not at all, are kept: a host
# check must run per call) and the registry. Only plain tensors, outside compile, tracing, dispatch modes, functorch,
# autocast and forward AD (``eager_direct``), take it.
_FAST: dict = {}


def fast_key(q, k, v, q_offsets, kv_offsets, options: tuple) -> Optional[tuple]:
    """The fast path's key of a ``jagged_attention`` call (``options``: its other arguments, as passed), or None
    where the call must take the full path."""
    if not (CALL_CACHE and eager_direct(q, k, v, q_offsets, kv_offsets) and forward_ad._current_level < 0):
        return None
    window = options[3]
    return (q.shape, q.dtype, q.device, k.shape, k.dtype, k.device, v.shape, v.dtype, v.device, _metadata(q_offsets),
            _metadata(kv_offsets), options, tuple(map(type, options)),
            tuple(map(type, window)) if type(window) is tuple else window,
            torch.are_deterministic_algorithms_enabled(), options[-1] or os.environ.get("JFA_BACKEND"),
            validation.validation_mode(q.device), registry_generation())


def fast_call(key: tuple, q: Tensor, k: Tensor, v: Tensor, q_offsets: Optional[Tensor], kv_offsets: Tensor):
    """(out, lse) of a call whose ``fast_key`` an earlier call kept, else None (the caller takes the full path)."""
    hit = _recall(_FAST, key)  # an unhashable argument (a list window, ...): a miss, the full path checks it
    if hit is None:
        return None
    impl, params, checked, coverable, options = hit
    if checked is not None and not (coverable and validation.covered(
            q_offsets, kv_offsets, q.shape[0], k.shape[0], params.max_seqlen_q, params.max_seqlen_kv)):
        params = checked  # the backend checks this call's offsets on the device
    result = _direct_forward(impl, q, k, v, q_offsets, kv_offsets, params, options)
    _cover(q, k, q_offsets, kv_offsets, params, coverable)
    return result


class _DirectAttention(torch.autograd.Function):
    """The op's autograd formula (``_setup_context``/``_backward``) for the direct path: the backward calls the
    backend's backward with the forward's checked params; under ``create_graph`` it goes through
    ``torch.ops.jfa.attention_backward``, whose autograd raises on double backward, as the op path does."""

    @staticmethod
    def forward(ctx, q, k, v, q_offsets, kv_offsets, impl, params, options):
        out, lse = impl.forward(q, k, v, q_offsets, kv_offsets, params)  # offsets checked by attention_direct
        ctx.save_for_backward(q, k, v, out, lse, q_offsets, kv_offsets)
        ctx.impl, ctx.params, ctx.options = impl, params, options
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        if torch.is_grad_enabled():  # create_graph=True: the op's path (double backward raises there)
            dq, dk, dv = _backward(ctx, grad_out, grad_lse)[:3]
        else:
            dq, dk, dv = ctx.impl.backward(*_backward_inputs(ctx, grad_out, grad_lse), ctx.params)
        return dq, dk, dv, None, None, None, None, None  # nothing for the offsets, impl, params, options


# ``_DirectAttention.apply`` without ``torch.autograd.Function.apply``'s Python layer (~6-12 us of a small call's
# forward + backward on CPU, bench/NOTES.md "host fwd+bwd"): of what that layer does, binding defaults is for a
# ``setup_context`` (this Function has none) and the functorch routing cannot apply (``eager_direct``: no transform
# active); what is left, unwrapping dead functorch wrappers (tensors that outlived their transform), is done by the
# caller (``_direct_forward``).
_direct_apply = super(torch.autograd.Function, _DirectAttention).apply
