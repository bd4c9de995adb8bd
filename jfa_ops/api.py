"""The public Python wrapper over ``torch.ops.jfa.attention``: defaults, keyword options and NJT handling."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

import meta_kernels
from jfa_ops.ops.attention import check_no_forward_ad

__all__ = ["jagged_attention"]


def _is_njt(t) -> bool:
    return isinstance(t, Tensor) and t.is_nested and t.layout == torch.jagged


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
    if not torch.compiler.is_compiling():  # functorch's jvp unwraps tangents before the op's body sees them
        check_no_forward_ad(*(t for t in (q, k, v) if isinstance(t, Tensor)))
    njt_offsets = None
    if _is_njt(q) or _is_njt(k) or _is_njt(v):
        q, k, v, q_offsets, kv_offsets, njt_offsets = _unpack_njt(q, k, v, q_offsets, kv_offsets, broadcast_q)
    for name, t in (("q", q), ("k", k), ("v", v), ("q_offsets", q_offsets), ("kv_offsets", kv_offsets)):
        if not isinstance(t, Tensor) and not (name == "q_offsets" and t is None):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    # None -> -1 ("not given"), the op's default; the op checks every option (meta_kernels.check_options) and all
    # tensor metadata, so eager and compiled calls raise the same errors.
    max_seqlen_q = -1 if max_seqlen_q is None else max_seqlen_q
    max_seqlen_kv = -1 if max_seqlen_kv is None else max_seqlen_kv
    meta_kernels.check_options(scale, causal, window, broadcast_q, deterministic, max_seqlen_q, max_seqlen_kv)
    if backend is not None and not isinstance(backend, str):
        raise TypeError(f"backend must be a str or None, got {type(backend).__name__}")
    args = (q, k, v, q_offsets, kv_offsets, max_seqlen_q, max_seqlen_kv)
    options = dict(scale=None if scale is None else float(scale), causal=causal, window_left=window[0],
                   window_right=window[1], broadcast_q=broadcast_q, deterministic=deterministic, backend=backend)
    if _records_autograd(q, k, v):
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
    return torch.compiler.is_compiling() or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                                                          or v.requires_grad))


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
    if broadcast_q:
        if q.is_nested:
            raise TypeError("q must be a dense [L_q, Hq, D] tensor with broadcast_q=True")
        out_offsets = torch.arange(0, k.offsets().shape[0], device=q.device, dtype=k.offsets().dtype) * q.shape[0]
        return q, k.values(), v.values(), None, k.offsets(), out_offsets
    if not _is_njt(q):
        raise TypeError("q must be a nested jagged tensor (layout=torch.jagged) when k and v are")
    return q.values(), k.values(), v.values(), q.offsets(), k.offsets(), q.offsets()
