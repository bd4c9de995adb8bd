"""Shape rules and argument checks of ``jfa::attention`` and ``jfa::attention_backward``.

Legend: ``T_q``/``T_kv`` total rows of the jagged Q and KV, ``B`` sequences, ``Hq``/``Hkv`` heads, ``D`` head_dim,
``L_q`` rows of the dense broadcast Q.

    q   [T_q, Hq, D]    jagged by q_offsets [B+1]      (broadcast_q: [L_q, Hq, D], q_offsets None)
    k,v [T_kv, Hkv, D]  jagged by kv_offsets [B+1]
    out [T_q, Hq, D]                                   (broadcast_q: [B*L_q, Hq, D], row b*L_q + i)
    lse [Hq, T_q] float32                              (broadcast_q: [Hq, B*L_q])

Only metadata is read here (shapes, dtypes, devices), so these checks run the same in eager mode, on FakeTensors
under torch.compile and on the meta device. Checks of offset *values* live in ``jfa_ops.validation``.

Symbolic sizes (``torch.compile(dynamic=True)``): a check raises only when it is known to fail without adding a
guard; otherwise it is left to the op's eager body, which runs the same checks on concrete sizes when the compiled
code runs. That way compiled code raises the same ``ValueError`` with the same concrete values as eager code (an
error raised while tracing would reach the user wrapped in a ``TorchRuntimeError``, with symbols for values).
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Optional, Sequence

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

SUPPORTED_HEAD_DIMS = tuple(range(8, 257, 8))
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
OFFSET_DTYPES = (torch.int32, torch.int64)
FLOAT32_MAX = torch.finfo(torch.float32).max


def dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    """"float16, bfloat16 or float32": the allowed dtypes as an error message lists them."""
    names = [str(d).replace("torch.", "") for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


_DECIDE = threading.local()  # .on: symbolic checks are decided with a guard (see deciding_checks)


@contextlib.contextmanager
def deciding_checks():
    """Inside: a symbolic check that cannot be decided without a guard is decided with one (a recompile for sizes
    that break it, whose trace raises). For code traced in place of the op (the compiled path): no op body runs
    later to make the checks the fake leaves open."""
    before = getattr(_DECIDE, "on", False)
    _DECIDE.on = True
    try:
        yield
    finally:
        _DECIDE.on = before


def _fails(bad) -> bool:
    """Whether the condition ``bad`` holds: a plain bool as is; a symbolic one only if known without a guard (with
    one inside ``deciding_checks``)."""
    if torch.compiler.is_dynamo_compiling():
        return False  # Dynamo shows a SymBool as a bool (the public wrapper): the op's fake and body decide
    if isinstance(bad, torch.SymBool):
        return bool(bad) if getattr(_DECIDE, "on", False) else statically_known_true(bad)
    return bool(bad)


def _check_offsets(name: str, offsets: torch.Tensor, device: torch.device, owner: str = "q") -> None:
    """``owner``: the tensor whose device the offsets must share, as errors name it."""
    if not isinstance(offsets, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(offsets).__name__}")
    if offsets.dtype not in OFFSET_DTYPES:
        raise TypeError(f"{name} must be int32 or int64, got {offsets.dtype}")
    if offsets.dim() != 1:
        raise ValueError(f"{name} must be 1-D [B+1], got shape {tuple(offsets.shape)}")
    if _fails(offsets.shape[0] < 1):
        raise ValueError(f"{name} must have at least one element (B+1 >= 1), got shape {tuple(offsets.shape)}")
    if offsets.device != device:
        raise ValueError(f"{name} must be on {owner}'s device {device}, got {offsets.device}")


def check_attention_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_offsets: Optional[torch.Tensor],
    kv_offsets: torch.Tensor,
    window: Sequence[int],
    broadcast_q: bool,
    dtypes: Sequence[torch.dtype] = FLOAT_DTYPES,
) -> None:
    """Raise ``TypeError``/``ValueError`` naming the argument for any malformed metadata. ``dtypes``: the allowed
    input dtypes (MXFP8 attention's pre-quantized op passes float8_e4m3fn)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dtypes:
            raise TypeError(f"{name} must be {dtype_names(dtypes)}, got {t.dtype}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [rows, heads, head_dim], got shape {tuple(t.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
    if any(_fails(a != b) for a, b in zip(k.shape, v.shape)):
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    head_dim = q.shape[2]
    if _fails(k.shape[2] != head_dim):
        raise ValueError(f"k's head_dim {k.shape[2]} must equal q's head_dim {head_dim}")
    if _fails((head_dim < 8) | (head_dim > 256) | (head_dim % 8 != 0)):
        raise ValueError(f"head_dim must be a multiple of 8 from 8 to 256, got {head_dim}")
    heads_q, heads_kv = q.shape[1], k.shape[1]
    if _fails(heads_kv < 1) or _fails(heads_q < 1) or _fails(heads_q % heads_kv != 0):
        raise ValueError(f"q heads ({heads_q}) must be a positive multiple of k/v heads ({heads_kv}) (GQA/MQA)")

    _check_offsets("kv_offsets", kv_offsets, q.device)
    if broadcast_q:
        if q_offsets is not None:
            raise ValueError("q_offsets must be None with broadcast_q=True (q is one dense [L_q, Hq, D] block)")
    else:
        if q_offsets is None:
            raise ValueError("q_offsets is required unless broadcast_q=True")
        _check_offsets("q_offsets", q_offsets, q.device)
        if _fails(q_offsets.shape[0] != kv_offsets.shape[0]):
            raise ValueError(
                f"q_offsets and kv_offsets must both be [B+1], got {q_offsets.shape[0]} and {kv_offsets.shape[0]}"
            )

    check_window(window)


def _is_int(value) -> bool:
    # SymInt: the schema types these as SymInt, so an int that is an argument of a torch.compile(dynamic=True)
    # function arrives symbolic.
    return isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)


def check_window(window: Sequence[int]) -> None:
    """window = (left, right): ints >= 0, or -1 for unbounded on that side."""
    if not (isinstance(window, (tuple, list)) and len(window) == 2 and all(_is_int(w) for w in window)):
        raise TypeError(f"window must be a pair of ints (left, right), got {window!r}")
    if any(_fails(w < -1) for w in window):
        raise ValueError(f"window entries must be >= 0, or -1 for unbounded, got {tuple(window)}")


def check_options(scale, causal, window: Sequence[int], broadcast_q, deterministic, max_seqlen_q,
                  max_seqlen_kv) -> None:
    """The non-tensor options of both ops: types (the wrapper takes any Python object) and values."""
    for name, flag in (("causal", causal), ("broadcast_q", broadcast_q), ("deterministic", deterministic)):
        if not isinstance(flag, bool):  # bool("False") is True: never convert
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__} {flag!r}")
    if scale is not None:
        if not isinstance(scale, (float, int)) or isinstance(scale, bool):
            raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
        if not math.isfinite(scale):
            raise ValueError(f"scale must be finite, got {scale}")
        if abs(scale) > FLOAT32_MAX:  # every backend scales float32 scores: inf there, NaN out
            raise ValueError(f"scale must be finite, got {scale} (past float32's range, in which scores are scaled)")
    check_window(window)
    for name, value in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_kv", max_seqlen_kv)):
        if not _is_int(value):
            raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
        if _fails(value < -1):
            raise ValueError(f"{name} must be >= 0, or -1 (None in the wrapper) for not given, got {value}")


def check_attention_backward_args(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets,
                                  window: Sequence[int], broadcast_q: bool) -> None:
    """out, lse and their gradients against the forward's output shapes (run after ``check_attention_args``)."""
    out_shape, lse_shape = attention_shapes(q, kv_offsets, broadcast_q)
    expected = {"out": (out, out_shape, q.dtype), "grad_out": (grad_out, out_shape, q.dtype),
                "lse": (lse, lse_shape, torch.float32), "grad_lse": (grad_lse, lse_shape, torch.float32)}
    for name, (t, shape, dtype) in expected.items():
        if t is None and name == "grad_lse":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise TypeError(f"{name} must be {dtype}, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}, got {t.device}")
        if t.dim() != len(shape) or any(_fails(a != b) for a, b in zip(t.shape, shape)):
            raise ValueError(f"{name} must have shape {tuple(shape)} (from q and the offsets), got {tuple(t.shape)}")


def attention_shapes(q: torch.Tensor, kv_offsets: torch.Tensor, broadcast_q: bool):
    """(out shape, lse shape) of the forward op."""
    heads_q, head_dim = q.shape[1], q.shape[2]
    rows = (kv_offsets.shape[0] - 1) * q.shape[0] if broadcast_q else q.shape[0]
    return (rows, heads_q, head_dim), (heads_q, rows)


def attention_backward_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """(dq, dk, dv) shapes: each gradient has its input's shape (broadcast-Q dq is summed over the batch)."""
    return tuple(q.shape), tuple(k.shape), tuple(v.shape)


def visible_pairs(q_lengths: Sequence[int], kv_lengths: Sequence[int], causal: bool, window: Sequence[int]) -> int:
    """Exact number of visible (query, key) pairs over all sequences (per head), for FLOP counting.

    Row i of a sequence sees keys lo..hi with d = i + Lk - Lq: lo = max(0, d - left), hi = min(Lk - 1, d if causal,
    d + right), each bound only where it applies.
    """
    left, right = window
    total = 0
    for lq, lk in zip(q_lengths, kv_lengths):
        if lq <= 0 or lk <= 0:
            continue
        d = torch.arange(lq, dtype=torch.int64) + (lk - lq)
        hi = torch.full_like(d, lk - 1)
        if causal:
            hi = torch.minimum(hi, d)
        if right >= 0:
            hi = torch.minimum(hi, d + right)
        lo = (d - left).clamp(min=0) if left >= 0 else torch.zeros_like(d)
        total += int((hi - lo + 1).clamp(min=0).sum())
    return total


def attention_flops(q_lengths, kv_lengths, heads_q: int, head_dim: int, causal: bool, window, backward: bool = False):
    """Useful FLOPs: 4*D per visible pair per q head forward (QK^T and PV), 2.5x that backward."""
    forward = 4 * head_dim * heads_q * visible_pairs(q_lengths, kv_lengths, causal, window)
    return int(forward * 2.5) if backward else forward
