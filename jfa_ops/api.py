"""The public Python wrappers over the ``jfa`` ops (``torch.ops.jfa.attention``, the block-sparse family):
defaults, keyword options and NJT handling."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

import meta_kernels
import meta_kernels.mxfp8
from jfa_ops.ops.attention import (attention_direct, check_no_forward_ad, eager_direct, fast_call, fast_key,
                                   needs_grad)
from jfa_ops.ops import block_sparse as block_sparse_ops
from jfa_ops.ops import mxfp8 as mxfp8_ops
from jfa_ops import validation

__all__ = ["jagged_attention", "select_kv_blocks", "block_sparse_attention", "sparse_attention", "mxfp8_quantize",
           "mxfp8_dequantize", "mxfp8_attention"]


def _is_njt(t) -> bool:
    return isinstance(t, Tensor) and t.is_nested and t.layout == torch.jagged


def _check_tensors(*named, optional: Tuple[str, ...] = ()) -> None:
    """A TypeError naming the first (name, value) pair whose value is not a tensor (None allowed for the names in
    ``optional``): the dispatcher's own schema error is a RuntimeError."""
    for name, t in named:
        if not isinstance(t, Tensor) and not (t is None and name in optional):
            raise TypeError(f"{name} must be a torch.Tensor{' or None' if name in optional else ''}, got "
                            f"{type(t).__name__}")


def _check_backend(backend) -> None:
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None, got {type(backend).__name__}")


def _check_dtype(name: str, dtype, optional: bool = False) -> None:
    if not isinstance(dtype, torch.dtype) and not (optional and dtype is None):
        raise TypeError(f"{name} must be a torch.dtype{' or None' if optional else ''}, got {type(dtype).__name__}")


def jagged_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_offsets: Optional[Tensor] = None,
    kv_offsets: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    *,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Sequence[int] = (-1, -1),
    broadcast_q: bool = False,
    return_lse: bool = False,
    deterministic: bool = False,
    backend: Optional[str] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Attention over a batch of sequences of different lengths, packed without padding.

    Shapes (``T_q``/``T_kv`` total rows, ``B`` sequences, ``Hq``/``Hkv`` heads, ``D`` head_dim in 8..256 step 8)::

        q           [T_q, Hq, D]    (broadcast_q=True: one dense [L_q, Hq, D] shared by all sequences)
        k, v        [T_kv, Hkv, D]  Hq % Hkv == 0; q head h reads kv head h // (Hq // Hkv)
        q_offsets   [B+1] int32/int64 prefix sums of the q lengths (None with broadcast_q=True)
        kv_offsets  [B+1] int32/int64 prefix sums of the kv lengths
        returns out [T_q, Hq, D]    (broadcast_q: [B*L_q, Hq, D], row b*L_q + i)
                lse [Hq, T_q] float32, natural log (with return_lse=True)

    Mask, per sequence with lengths (Lq, Lk), bottom-right aligned (FlashAttention's convention), d = i + Lk - Lq::

        causal:          key j visible iff j <= d
        window (l, r):   key j visible iff d - l <= j <= d + r   (-1: unbounded on that side)

            Lq=3, Lk=5, causal        window=(1, 0)
            q0: x x x . .             . x x . .
            q1: x x x x .             . . x x .
            q2: x x x x x             . . . x x

    A row that sees no key (empty kv sequence, fully masked) gives out 0, lse -inf and zero gradients.

    ``max_seqlen_*`` are optional hints: None (or -1) never syncs (the built-in backends don't need them); given ints
    are SymInts under ``torch.compile(dynamic=True)``, so changing them never recompiles. ``scale`` defaults to
    ``D ** -0.5``. ``deterministic=True`` makes gradients bitwise reproducible. ``backend`` picks a registered backend
    by name (else env ``JFA_BACKEND``, else the fastest that supports the call).

    q, k, v may also be ``torch.nested`` jagged tensors (``layout=torch.jagged``, shape ``[B, j, H, D]``); offsets
    are then taken from them (leave the offsets None) and ``out`` is a nested tensor too. NJTs with holes
    (``torch.nested.narrow``) and SDPA's ``[B, H, j, D]`` layout are rejected with a ``ValueError``.

    Under ``torch.autocast``, fp32 q/k/v run in the region's dtype (like SDPA). ``torch.use_deterministic_algorithms``
    implies ``deterministic=True``. Forward-mode AD (``torch.func.jvp``) raises ``NotImplementedError``.

    Example::

        >>> q = torch.randn(7, 4, 64); k = v = torch.randn(9, 2, 64)
        >>> q_off = torch.tensor([0, 3, 7]); kv_off = torch.tensor([0, 5, 9])
        >>> jagged_attention(q, k, v, q_off, kv_off, causal=True).shape
        torch.Size([7, 4, 64])
    """
    key = fast_key(q, k, v, q_offsets, kv_offsets,
                   (max_seqlen_q, max_seqlen_kv, scale, window, causal, broadcast_q, deterministic, backend))
    if key is not None:  # a signature checked and dispatched before: straight to the backend
        result = fast_call(key, q, k, v, q_offsets, kv_offsets)
        if result is not None:
            return result if return_lse else result[0]
    if not torch.compiler.is_compiling():  # functorch's jvp unwraps tangents before the op's body sees them
        check_no_forward_ad(*(t for t in (q, k, v) if isinstance(t, Tensor)))
    njt_offsets = None
    if _is_njt(q) or _is_njt(k) or _is_njt(v):
        q, k, v, q_offsets, kv_offsets, njt_offsets = _unpack_njt(q, k, v, q_offsets, kv_offsets, broadcast_q)
    _check_tensors(("q", q), ("k", k), ("v", v), ("q_offsets", q_offsets), ("kv_offsets", kv_offsets),
                   optional=("q_offsets",))
    # None -> -1 ("not given"), the op's default; the op checks every option (meta_kernels.check_options) and all
    # tensor metadata, so eager and compiled calls raise the same errors.
    max_seqlen_q = -1 if max_seqlen_q is None else max_seqlen_q
    max_seqlen_kv = -1 if max_seqlen_kv is None else max_seqlen_kv
    meta_kernels.check_options(scale, causal, window, broadcast_q, deterministic, max_seqlen_q, max_seqlen_kv)
    _check_backend(backend)
    args = (q, k, v, q_offsets, kv_offsets, max_seqlen_q, max_seqlen_kv)
    options = dict(scale=None if scale is None else float(scale), causal=causal, window_left=window[0],
                   window_right=window[1], broadcast_q=broadcast_q, deterministic=deterministic, backend=backend)
    if eager_direct(q, k, v, q_offsets, kv_offsets):  # eager, plain tensors: the op's body without the dispatcher
        out, lse = attention_direct(*args, *options.values(), fast_key=key if njt_offsets is None else None)
    elif _records_autograd(q, k, v):
        out, lse = torch.ops.jfa.attention.default(*args, **options)
    else:  # inference: skip the custom op's autograd kernel (a Python layer that would only redispatch)
        with torch._C._AutoDispatchBelowAutograd():
            out, lse = torch.ops.jfa.attention.default(*args, **options)
    if njt_offsets is not None:
        out = torch.nested.nested_tensor_from_jagged(out, njt_offsets)
    return (out, lse) if return_lse else out


def _records_autograd(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """True when the call must go through the op's autograd kernel: grad mode on and an input requiring grad, or
    inside torch.compile (dynamo traces the op as is)."""
    return torch.compiler.is_compiling() or needs_grad(q, k, v)


def check_njt_layout(name: str, t: Tensor, layout: str = "[B, j, H, D]") -> None:
    """An NJT input must have ``layout`` (ragged dim 1) and be packed without holes: its values() are then exactly
    the rows its offsets() describe."""
    if t.dim() != layout.count(",") + 1 or t._ragged_idx != 1:
        raise ValueError(
            f"{name} must be a nested jagged tensor laid out {layout} (ragged dim 1), got {t.dim()}-D with ragged "
            f"dim {t._ragged_idx} (an SDPA-layout [B, H, j, D] tensor needs .transpose(1, 2) first)")
    if t._lengths is not None:
        raise ValueError(
            f"{name} is a nested jagged tensor with holes (lengths set, e.g. by torch.nested.narrow): its values() "
            f"hold rows that are not part of the sequences; call {name}.contiguous() first, or pass the packed rows "
            "and offsets")


def _unpack_njt(q, k, v, q_offsets, kv_offsets, broadcast_q):
    """NJT inputs -> (values, offsets). Returns the offsets the output NJT is built on."""
    if q_offsets is not None or kv_offsets is not None:
        raise ValueError("q_offsets and kv_offsets must be None when q/k/v are nested (NJT) tensors")
    if not (_is_njt(k) and _is_njt(v)):
        raise TypeError("k and v must both be nested jagged tensors (layout=torch.jagged) when any input is")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if _is_njt(t):
            check_njt_layout(name, t)
    if v.shape[1] != k.shape[1] and v.device == k.device:  # one ragged dim (nested int): one offsets tensor
        validation.check_same_offsets("v", v.offsets(), "k", k.offsets())  # (another device: the op's check)
    if broadcast_q:
        if q.is_nested:
            raise TypeError("q must be a dense [L_q, Hq, D] tensor with broadcast_q=True")
        out_offsets = torch.arange(0, k.offsets().shape[0], device=q.device, dtype=k.offsets().dtype) * q.shape[0]
        return q, k.values(), v.values(), None, k.offsets(), out_offsets
    if not _is_njt(q):
        raise TypeError("q must be a nested jagged tensor (layout=torch.jagged) when k and v are")
    return q.values(), k.values(), v.values(), q.offsets(), k.offsets(), q.offsets()


# ---------------------------------------------------------------------------------------------------------------
# The block-sparse family: selection (stage 1), attention over the selection (stage 2), both in one call
# ---------------------------------------------------------------------------------------------------------------

def _unpack_njt_sparse(q, k, v, q_offsets, kv_offsets, broadcast_q):
    """NJT (or dense) inputs -> (q, k, v, q_offsets, kv_offsets, offsets of an NJT output or None)."""
    if _is_njt(q) or _is_njt(k) or (v is not None and _is_njt(v)):
        return _unpack_njt(q, k, k if v is None else v, q_offsets, kv_offsets, broadcast_q)
    return q, k, v, q_offsets, kv_offsets, None


def _sizing_max_seqlen(name: str, given, t) -> int:
    """A max_seqlen that sizes the selection: the given one, else an NJT input's own (when it knows it)."""
    if given is None and _is_njt(t):
        given = t._maybe_max_seqlen
    if given is None:
        raise ValueError(f"{name} is required: it sizes the selection (pass the longest sequence's length as a Python "
                         f"int; under torch.compile(dynamic=True) it is a SymInt, so changing it never recompiles)")
    return given


def select_kv_blocks(
    q: Tensor,
    k: Tensor,
    q_offsets: Optional[Tensor] = None,
    kv_offsets: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    *,
    block_q: int = 128,
    block_kv: int = 128,
    keep_ratio: float = 0.5,
    top_k: Optional[int] = None,
    causal: bool = False,
    window: Sequence[int] = (-1, -1),
    broadcast_q: bool = False,
    always_local: bool = True,
    backend: Optional[str] = None,
) -> Tuple[Tensor, Tensor]:
    """Stage 1 of block-sparse attention: pick, per (sequence, kv head, Q block), the KV blocks to attend to.

    Each sequence's rows are cut into Q blocks of ``block_q`` rows and KV blocks of ``block_kv`` rows (the last block
    of a sequence may be shorter). Each block is mean-pooled (over its real rows; a Q block also over the query heads
    of the kv head's group, so GQA selects once per kv head), and Q block i scores KV block j by ``pooled_q_i .
    pooled_k_j``. Among the KV blocks *visible* to Q block i (some query of i sees some key of j under
    ``causal``/``window``, same bottom-right convention as ``jagged_attention``), it keeps the
    ``ceil(keep_ratio * visible)`` best (``top_k``: ``min(top_k, visible)``); ties go to the lower block index.
    ``always_local`` keeps the block holding the diagonal key of block i's last row first (it counts toward the
    budget)::

        causal, 5 blocks each side, keep_ratio 0.5: Q block i sees KV blocks 0..i and keeps ceil(0.5 * (i + 1)),
        the diagonal one (x) first, then the best scored (s)
          kv block  0 1 2 3 4
          q 0       x . . . .     1 visible, keeps 1
          q 1       . x . . .     2 visible, keeps 1
          q 2       s . x . .     3 visible, keeps 2
          q 3       . s . x .     4 visible, keeps 2
          q 4       s . s . x     5 visible, keeps 3

    Returns ``(kv_block_index [B, Hkv, NQB, NKB] int32, kv_block_count [B, Hkv, NQB] int32)``: the kept ids
    ascending, then -1; ``NQB = ceil(max_seqlen_q / block_q)`` (broadcast_q: ``ceil(L_q / block_q)``), ``NKB =
    ceil(max_seqlen_kv / block_kv)``. Q blocks past a sequence's end have count 0. The shapes depend only on the
    input shapes and ``max_seqlen_q``/``max_seqlen_kv``, which are therefore **required** (Python ints, SymInts under
    ``torch.compile(dynamic=True)``: changing them never recompiles; an NJT input supplies them itself). They are
    checked against the offsets like ``jagged_attention``'s hints. No host sync on CUDA.

    Not differentiable: the outputs are integer ids (no gradient flows through the choice of blocks). Under
    ``torch.autocast``, fp32 q/k are scored in the region's dtype, as ``block_sparse_attention`` then attends over them.

    Example::

        >>> q = torch.randn(300, 4, 64); k = torch.randn(300, 2, 64); off = torch.tensor([0, 100, 300])
        >>> index, count = select_kv_blocks(q, k, off, off, 200, 200, block_q=64, block_kv=64, causal=True)
        >>> index.shape, count.shape
        (torch.Size([2, 2, 4, 4]), torch.Size([2, 2, 4]))
    """
    max_seqlen_q = -1 if broadcast_q and max_seqlen_q is None else _sizing_max_seqlen("max_seqlen_q", max_seqlen_q, q)
    max_seqlen_kv = _sizing_max_seqlen("max_seqlen_kv", max_seqlen_kv, k)
    q, k, _, q_offsets, kv_offsets, _ = _unpack_njt_sparse(q, k, None, q_offsets, kv_offsets, broadcast_q)
    _check_tensors(("q", q), ("k", k), ("q_offsets", q_offsets), ("kv_offsets", kv_offsets), optional=("q_offsets",))
    _check_backend(backend)
    top_k = -1 if top_k is None else top_k
    meta_kernels.check_select_options(block_q, block_kv, keep_ratio, top_k, causal, window, broadcast_q, always_local,
                                      max_seqlen_q, max_seqlen_kv)
    if block_sparse_ops.SELECT_DIRECT and eager_direct(q, k, q_offsets, kv_offsets):  # the body, no dispatcher
        return block_sparse_ops.select_body(q, k, q_offsets, kv_offsets, max_seqlen_q, max_seqlen_kv, block_q,
                                            block_kv, float(keep_ratio), top_k, causal, window[0], window[1],
                                            broadcast_q, always_local, backend, memo=True)
    return torch.ops.jfa.select_kv_blocks(
        q, k, q_offsets, kv_offsets, max_seqlen_q, max_seqlen_kv, block_q=block_q,
        block_kv=block_kv, keep_ratio=float(keep_ratio), top_k=top_k, causal=causal,
        window_left=window[0], window_right=window[1], broadcast_q=broadcast_q, always_local=always_local,
        backend=backend)


def block_sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_offsets: Optional[Tensor],
    kv_offsets: Optional[Tensor],
    kv_block_index: Tensor,
    kv_block_count: Tensor,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    *,
    block_q: int = 128,
    block_kv: int = 128,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Sequence[int] = (-1, -1),
    broadcast_q: bool = False,
    return_lse: bool = False,
    deterministic: bool = False,
    backend: Optional[str] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Stage 2: ``jagged_attention`` restricted to the KV blocks ``select_kv_blocks`` chose.

    Query r (Q block ``r // block_q`` of its sequence) sees key c iff c's KV block ``c // block_kv`` is among the
    first ``kv_block_count[b, h_kv, r // block_q]`` ids of ``kv_block_index[b, h_kv, r // block_q]`` *and* the
    causal/window mask lets it (q head h reads kv head ``h // (Hq // Hkv)``). Everything else is the contract of
    ``jagged_attention`` (shapes, broadcast-Q, GQA, lse, rows that see nothing: out 0 / lse -inf, deterministic,
    NJT in and out, fp32 q/k/v in the region's dtype under ``torch.autocast``); ``block_q``/``block_kv`` must be the
    selection's, and each row's used ids ascending, as ``select_kv_blocks`` returns them (the GPU kernels rely on the
    order to skip masks). ``JFA_VALIDATE=sync`` checks the index's values; the device modes check counts within its
    width and the order on the device, except for an unmodified ``select_kv_blocks`` output (ids past a sequence's
    blocks are then skipped). Differentiable in q, k, v.
    """
    if not torch.compiler.is_compiling():
        check_no_forward_ad(*(t for t in (q, k, v) if isinstance(t, Tensor)))
    q, k, v, q_offsets, kv_offsets, njt_offsets = _unpack_njt_sparse(q, k, v, q_offsets, kv_offsets, broadcast_q)
    _check_tensors(("q", q), ("k", k), ("v", v), ("q_offsets", q_offsets), ("kv_offsets", kv_offsets),
                   ("kv_block_index", kv_block_index), ("kv_block_count", kv_block_count), optional=("q_offsets",))
    max_seqlen_q = -1 if max_seqlen_q is None else max_seqlen_q
    max_seqlen_kv = -1 if max_seqlen_kv is None else max_seqlen_kv
    meta_kernels.check_options(scale, causal, window, broadcast_q, deterministic, max_seqlen_q, max_seqlen_kv)
    meta_kernels.check_block_sizes(block_q, block_kv)
    _check_backend(backend)
    out, lse = torch.ops.jfa.block_sparse_attention(
        q, k, v, q_offsets, kv_offsets, kv_block_index, kv_block_count, block_q, block_kv, max_seqlen_q,
        max_seqlen_kv, scale=None if scale is None else float(scale), causal=causal, window_left=window[0],
        window_right=window[1], broadcast_q=broadcast_q, deterministic=deterministic, backend=backend,
    )
    if njt_offsets is not None:
        out = torch.nested.nested_tensor_from_jagged(out, njt_offsets)
    return (out, lse) if return_lse else out


def sparse_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_offsets: Optional[Tensor] = None,
    kv_offsets: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    *,
    keep_ratio: float = 0.5,
    top_k: Optional[int] = None,
    block_q: int = 128,
    block_kv: int = 128,
    always_local: bool = True,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Sequence[int] = (-1, -1),
    broadcast_q: bool = False,
    return_lse: bool = False,
    deterministic: bool = False,
    backend: Optional[str] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Both stages in one call: ``select_kv_blocks`` (no gradient) then ``block_sparse_attention`` over its choice.

    ``max_seqlen_q``/``max_seqlen_kv`` are required (they size the selection; ``max_seqlen_q`` not with
    ``broadcast_q``), see ``select_kv_blocks``. ``keep_ratio=1.0`` keeps every visible block: the result is
    ``jagged_attention``'s. ``backend`` names the backend of both stages.

    Example::

        >>> q = k = v = torch.randn(300, 2, 64); off = torch.tensor([0, 100, 300])
        >>> sparse_attention(q, k, v, off, off, 200, 200, keep_ratio=0.5, block_q=64, block_kv=64).shape
        torch.Size([300, 2, 64])
    """
    if not torch.compiler.is_compiling():
        check_no_forward_ad(*(t for t in (q, k, v) if isinstance(t, Tensor)))
    max_seqlen_q = None if broadcast_q and max_seqlen_q is None else _sizing_max_seqlen("max_seqlen_q", max_seqlen_q, q)
    max_seqlen_kv = _sizing_max_seqlen("max_seqlen_kv", max_seqlen_kv, k)
    q, k, v, q_offsets, kv_offsets, njt_offsets = _unpack_njt_sparse(q, k, v, q_offsets, kv_offsets, broadcast_q)
    index, count = select_kv_blocks(
        q.detach(), k.detach(), q_offsets, kv_offsets, max_seqlen_q, max_seqlen_kv, block_q=block_q,
        block_kv=block_kv, keep_ratio=keep_ratio, top_k=top_k, causal=causal, window=window,
        broadcast_q=broadcast_q, always_local=always_local, backend=backend)
    result = block_sparse_attention(
        q, k, v, q_offsets, kv_offsets, index, count, max_seqlen_q, max_seqlen_kv, block_q=block_q,
        block_kv=block_kv, scale=scale, causal=causal, window=window, broadcast_q=broadcast_q, return_lse=return_lse,
        deterministic=deterministic, backend=backend)
    if njt_offsets is None:
        return result
    out = torch.nested.nested_tensor_from_jagged(result[0] if return_lse else result, njt_offsets)
    return (out, result[1]) if return_lse else out


def mxfp8_quantize(x: Tensor, offsets: Optional[Tensor] = None, *, block: Sequence[int] = (1, 32),
                   rounding: str = "rceil", backend: Optional[str] = None) -> Tuple[Tensor, Tensor]:
    """MXFP8 (OCP Microscaling v1.0) quantization of ``x [T, H, D]`` (fp16/bf16/fp32, ``D`` a multiple of 32).

    Returns ``(data, scale)``: ``data [T, H, D]`` float8_e4m3fn, ``scale`` float8_e8m0fnu (value
    ``2 ** (bits - 127)``, 0xFF = NaN), one per block of 32 elements; ``x ~ data * scale``::

        block=(1, 32)   along head_dim                   scale [T, H, D/32]
        block=(32, 1)   along each sequence's rows        scale [T//32 + B, H, D]
        block=(32, 32)  32 rows x 32 columns              scale [T//32 + B, H, D/32]

    Row blocks never straddle sequences (``offsets [B+1]``; None: one sequence): sequence b's blocks are the scale
    rows ``offsets[b] // 32 + b + i``, its last block padded with zeros (``meta_kernels.mxfp8``). ``rounding``:
    ``"rceil"`` (the smallest scale with amax / scale <= 448, never saturates) or ``"floor"`` (the spec's
    ``floor(log2(amax)) - 8``; elements above 448 * scale saturate to +-448). A zero block gets scale 2**-127; a
    block with inf/NaN gets scale NaN and NaN elements. ``x`` may be a ``[B, j, H, D]`` NJT (offsets from it).

    Example::

        >>> data, scale = mxfp8_quantize(torch.randn(10, 2, 64))
        >>> data.dtype, scale.shape
        (torch.float8_e4m3fn, torch.Size([10, 2, 2]))
    """
    if _is_njt(x):
        if offsets is not None:
            raise ValueError("offsets must be None when x is a nested (NJT) tensor")
        check_njt_layout("x", x)
        x, offsets = x.values(), x.offsets()
    _check_tensors(("x", x), ("offsets", offsets), optional=("offsets",))
    _check_backend(backend)
    block = meta_kernels.mxfp8.check_block(block)
    if mxfp8_ops.QUANTIZE_DIRECT and eager_direct(x, offsets):  # eager, plain tensors: the body, no dispatcher
        return mxfp8_ops.quantize_body(x, offsets, list(block), rounding, backend)
    return torch.ops.jfa.mxfp8_quantize(x, offsets, list(block), rounding, backend)


def mxfp8_dequantize(data: Tensor, scale: Tensor, offsets: Optional[Tensor] = None, *,
                     block: Sequence[int] = (1, 32), dtype: torch.dtype = torch.float32,
                     backend: Optional[str] = None) -> Tensor:
    """``data * scale`` in ``dtype`` (NaN where the scale is NaN): the inverse of ``mxfp8_quantize`` up to its
    rounding. ``offsets`` and ``block`` as given to ``mxfp8_quantize``."""
    _check_tensors(("data", data), ("scale", scale), ("offsets", offsets), optional=("offsets",))
    _check_dtype("dtype", dtype)
    _check_backend(backend)
    block = meta_kernels.mxfp8.check_block(block)
    return torch.ops.jfa.mxfp8_dequantize(data, scale, offsets, list(block), dtype, backend)


MXPair = Tuple[Tensor, Tensor]


def mxfp8_attention(
    q: Union[Tensor, MXPair],
    k: Union[Tensor, MXPair],
    v: Union[Tensor, MXPair],
    q_offsets: Optional[Tensor] = None,
    kv_offsets: Optional[Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    *,
    scale: Optional[float] = None,
    causal: bool = False,
    window: Sequence[int] = (-1, -1),
    broadcast_q: bool = False,
    return_lse: bool = False,
    deterministic: bool = False,
    rounding: str = "rceil",
    out_dtype: Optional[torch.dtype] = None,
    backend: Optional[str] = None,
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """``jagged_attention`` in MXFP8: same shapes, masks, broadcast-Q, GQA, lse and NJT rules; head_dim a multiple
    of 32.

    q, k, v are either fp16/bf16/fp32 tensors (quantized inside: Q, K in (1, 32) blocks, V in (32, 1) blocks per kv
    sequence, with ``rounding``; differentiable, gradients straight through the quantization, computed by the MXFP8
    backward) or pre-quantized ``(data, scale)`` pairs from ``mxfp8_quantize`` with those blocks (V with
    ``kv_offsets``), then ``out`` is ``out_dtype`` (default bfloat16), there are no gradients and ``rounding`` stays at
    its default (the pairs were rounded by ``mxfp8_quantize``). P is quantized
    along the keys in (1, 32) blocks; docs/architecture.md ("MXFP8 attention") says exactly what is quantized.
    Under ``torch.autocast``, fp32 q/k/v are cast to the region's dtype before they are quantized (out in that dtype,
    as ``jagged_attention``'s); pre-quantized pairs are left as they are.

    Example::

        >>> q = torch.randn(7, 4, 64); k = v = torch.randn(9, 2, 64)
        >>> q_off = torch.tensor([0, 3, 7]); kv_off = torch.tensor([0, 5, 9])
        >>> mxfp8_attention(q, k, v, q_off, kv_off, causal=True).shape
        torch.Size([7, 4, 64])
    """
    quantized = [isinstance(t, (tuple, list)) for t in (q, k, v)]
    if any(quantized) and not all(quantized):
        raise TypeError("q, k and v must all be tensors, or all (data, scale) pairs")
    njt_offsets = None
    if not any(quantized) and (_is_njt(q) or _is_njt(k) or _is_njt(v)):
        q, k, v, q_offsets, kv_offsets, njt_offsets = _unpack_njt(q, k, v, q_offsets, kv_offsets, broadcast_q)
    if not torch.compiler.is_compiling() and not any(quantized):
        check_no_forward_ad(*(t for t in (q, k, v) if isinstance(t, Tensor)))
    max_seqlen_q = -1 if max_seqlen_q is None else max_seqlen_q
    max_seqlen_kv = -1 if max_seqlen_kv is None else max_seqlen_kv
    meta_kernels.check_options(scale, causal, window, broadcast_q, deterministic, max_seqlen_q, max_seqlen_kv)
    _check_backend(backend)
    meta_kernels.mxfp8.check_rounding(rounding)
    _check_tensors(("q_offsets", q_offsets), ("kv_offsets", kv_offsets), optional=("q_offsets",))
    options = dict(scale=None if scale is None else float(scale), causal=causal, window_left=window[0],
                   window_right=window[1], broadcast_q=broadcast_q, deterministic=deterministic, backend=backend)
    if any(quantized):
        for name, pair in (("q", q), ("k", k), ("v", v)):
            if len(pair) != 2:
                raise TypeError(f"{name} must be a (data, scale) pair, got {len(pair)} items")
            _check_tensors((f"{name}_data", pair[0]), (f"{name}_scale", pair[1]))
        _check_dtype("out_dtype", out_dtype, optional=True)
        if rounding != "rceil":  # the default: a pair's rounding was mxfp8_quantize's, this one would be ignored
            raise ValueError(f"rounding is only for q/k/v tensors quantized inside (pre-quantized pairs were "
                             f"rounded by mxfp8_quantize), got {rounding!r}")
        out, lse = torch.ops.jfa.mxfp8_attention_quantized(
            q[0], q[1], k[0], k[1], v[0], v[1], q_offsets, kv_offsets, max_seqlen_q, max_seqlen_kv, **options,
            out_dtype=out_dtype)
    else:
        _check_tensors(("q", q), ("k", k), ("v", v))
        if out_dtype is not None:
            raise ValueError("out_dtype is only for pre-quantized inputs (out has q's dtype otherwise)")
        out, lse = torch.ops.jfa.mxfp8_attention(q, k, v, q_offsets, kv_offsets, max_seqlen_q, max_seqlen_kv,
                                                 **options, rounding=rounding)
    if njt_offsets is not None:
        out = torch.nested.nested_tensor_from_jagged(out, njt_offsets)
    return (out, lse) if return_lse else out
