"""Checks of offset *values* (the metadata checks are in ``meta_kernels``).

Reading offset values costs a host sync on CUDA, so the mode is chosen by env ``JFA_VALIDATE``:
- ``sync``: read the offsets and raise ``ValueError`` naming the argument (always used for CPU tensors: free there).
- ``async`` (default on CUDA): checked on the device, no sync; a failure is a CUDA device assert
  (``torch._assert_async``) at the next synchronization, which kills the CUDA context (the process must restart).
  A check covers later calls with the same offsets tensors, unmodified, rows and hints on the stream (``covered``).
- ``deferred``: checked on the device, no sync; a failure sets an error flag that ``check_pending()`` raises as a
  ``ValueError``: call it at a point of your own that syncs anyway (after a training step, before logging); a
  ``sync``-mode call also raises it first. The bad call's outputs are garbage, but the context stays usable.
- ``off``: no value checks.

On the device, a backend that checks offsets itself (``Backend.checks_offsets``: the triton backend folds the check
into the kernel that already reads the offsets) gets ``AttentionParams.check_offsets=True`` and hands its flag to
``device_flag``; for the others the check is ~9 aten ops per offsets tensor here (``_device_ok``).
"""
from __future__ import annotations

import os
import weakref
from typing import List, Optional

import torch

from jfa_ops.backends.base import all_launches_dropped, capturing, stream_key

MODES = ("sync", "async", "deferred", "off")
DEVICE_MODES = ("async", "deferred")  # checked on the device
MESSAGE = ("jfa.attention: bad kv_offsets or q_offsets (first != 0, last != rows, decreasing, or a length > "
           "max_seqlen)")
_FOLD_PENDING_AT = 64  # pending flags kept before they are folded into one (one small launch per 64 calls)
_pending: List[torch.Tensor] = []  # deferred mode: device flags (nonzero = the call's offsets were valid)


def validation_mode(device: torch.device) -> str:
    if device.type == "cpu":
        return "sync"
    mode = os.environ.get("JFA_VALIDATE", "async")
    if mode not in MODES:
        raise ValueError(f"JFA_VALIDATE must be one of {MODES}, got {mode!r}")
    return mode


def device_flag(ok: torch.Tensor, mode: str, message: str = MESSAGE) -> None:
    """The result of a device-side check (a 1-element tensor, nonzero when valid): a device assert (``async``) or a
    pending error for ``check_pending`` (``deferred``). Nothing in a dry run that drops every launch
    (``backends.base.all_launches_dropped``): no kernel wrote ``ok``."""
    if all_launches_dropped():
        return
    if mode == "async":
        torch._assert_async(ok.reshape(()), message)  # any dtype: nonzero passes
        return
    _pending.append(ok.reshape(1))
    if len(_pending) >= _FOLD_PENDING_AT:
        folded = torch.stack([p.to(torch.bool) for p in _pending]).all().reshape(1)
        _pending[:] = [folded]


def check_pending() -> None:
    """Raise the ``ValueError`` of any ``JFA_VALIDATE=deferred`` call since the last check whose offsets were bad
    (syncs with the device once when there is something pending; free otherwise)."""
    if not _pending:
        return
    flags = list(_pending)
    _pending.clear()
    if not all(bool(f.to(torch.bool).all()) for f in flags):  # one sync per device (flags are tiny)
        raise ValueError(f"{MESSAGE}, or a bad selection (block_sparse_attention: a kv_block_count past its width, "
                         f"used ids not ascending): detected by JFA_VALIDATE=deferred in a call since the last check")


def check_on_host(name: str, offsets: torch.Tensor, rows: int, max_seqlen: int = -1) -> None:
    """``name``'s values (a sync on CUDA): first 0, last ``rows``, non-decreasing, no length above ``max_seqlen``
    (-1: no bound); a ``ValueError`` naming it otherwise."""
    values = offsets.tolist()
    if values[0] != 0:
        raise ValueError(f"{name}[0] must be 0, got {values[0]}")
    if values[-1] != rows:
        raise ValueError(f"{name}[-1] must equal the number of rows ({rows}), got {values[-1]}")
    lengths = [b - a for a, b in zip(values, values[1:])]
    if any(n < 0 for n in lengths):
        raise ValueError(f"{name} must be non-decreasing, got {values}")
    if max_seqlen >= 0 and lengths and max(lengths) > max_seqlen:
        raise ValueError(f"max_seqlen for {name} is {max_seqlen}, smaller than the longest sequence {max(lengths)}")


def check_same_offsets(name: str, offsets: torch.Tensor, other_name: str, other: torch.Tensor) -> None:
    """``name``'s offsets must equal ``other_name``'s (v's NJT offsets and k's: one kv batch). The same tensor passes
    free; otherwise the values are compared per ``validation_mode`` (``sync``: on the host; device modes, and any
    traced call: on the device, as ``device_flag``)."""
    if offsets is other:
        return
    if offsets.shape != other.shape:
        raise ValueError(f"{name}'s offsets must equal {other_name}'s (the same kv sequences), got shape "
                         f"{tuple(offsets.shape)} and {tuple(other.shape)}")
    mode = validation_mode(offsets.device)
    if mode == "off":
        return
    message = f"{name}'s offsets must equal {other_name}'s (the same kv sequences)"
    if mode == "sync" and not torch.compiler.is_compiling():
        if not torch.equal(offsets, other):
            raise ValueError(f"{message}, got {offsets.tolist()} and {other.tolist()}")
        return
    device_flag((offsets == other).all(), "async" if mode == "sync" else mode, f"jfa_ops: {message}")


def _device_ok(offsets: torch.Tensor, rows: int, max_seqlen: int) -> torch.Tensor:
    lengths = offsets[1:] - offsets[:-1]
    ok = (offsets[0] == 0) & (offsets[-1] == rows)
    if lengths.numel():
        ok &= lengths.min() >= 0
        if max_seqlen >= 0:
            ok &= lengths.max() <= max_seqlen
    return ok


def check_offset_values(
    q: torch.Tensor,
    k: torch.Tensor,
    q_offsets: Optional[torch.Tensor],
    kv_offsets: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    backend_checks: bool = False,
    mode: Optional[str] = None,
    kv_name: str = "kv_offsets",
) -> bool:
    """Check offset values per ``validation_mode``. Returns True when the backend must check them on the device
    itself (``backend_checks`` and a device mode): nothing was checked here then. ``mode``: ``validation_mode``'s
    answer for q's device when the caller has read it already (one environment read per call: ~1 us each).
    ``kv_name``: the name of ``kv_offsets`` in errors (the MXFP8 quantize ops' ``offsets``)."""
    if mode is None:
        mode = validation_mode(q.device)
    if mode == "off":
        return False
    if mode == "sync":
        check_pending()  # this call syncs anyway: report a deferred error first
        check_on_host(kv_name, kv_offsets, k.shape[0], max_seqlen_kv)
        if q_offsets is not None:
            check_on_host("q_offsets", q_offsets, q.shape[0], max_seqlen_q)
        elif max_seqlen_q >= 0 and q.shape[0] > max_seqlen_q:
            raise ValueError(f"max_seqlen_q ({max_seqlen_q}) is smaller than broadcast q's rows ({q.shape[0]})")
        return False
    if mode == "async" and covered(q_offsets, kv_offsets, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_kv):
        return False
    if backend_checks:
        return True  # the caller covers these offsets once the backend's forward has enqueued its check
    device_check(q_offsets, q.shape[0], max_seqlen_q, kv_offsets, k.shape[0], max_seqlen_kv, mode)
    if mode == "async":
        cover(q_offsets, kv_offsets, q.shape[0], k.shape[0], max_seqlen_q, max_seqlen_kv)
    return False


# A table of tensors seen unmodified (``_COVERED`` here, ``ops.block_sparse._SELECTIONS``): under a key, weak
# references to one tensor and an optional second one with their version counters. ``is_unmodified`` holds while the
# same tensors (not new ones at a reused id) are unchanged since ``remember_unmodified``; a full table is cleared
# (its bound is a handful of entries: the tensors a step passes). The caller's key decides what counts (the rows,
# hints and stream of a check; None: never kept) and must exclude tensors without a version counter (inference
# tensors). On the launch path: one dict lookup and a few compares, no loop.
def remember_unmodified(table: dict, max_entries: int, key: tuple, first: torch.Tensor,
                        second: Optional[torch.Tensor] = None) -> None:
    if len(table) >= max_entries:
        table.clear()
    table[key] = (weakref.ref(first), None if second is None else weakref.ref(second), first._version,
                  None if second is None else second._version)


def is_unmodified(table: dict, key: tuple, first: torch.Tensor, second: Optional[torch.Tensor] = None) -> bool:
    entry = table.get(key)
    return (entry is not None and entry[0]() is first and entry[2] == first._version
            and (second is None or (entry[1]() is second and entry[3] == second._version)))


# Offsets an async device check has covered (``cover`` records, ``covered`` asks). Why: a model passes one offsets
# tensor to every layer's attention, and a check's outcome is a function of the values, the row counts and the max_seqlen hints, so a repeat with the same
# tensors, unmodified (their version counters), against the same rows and hints, on the same stream, needs no second
# flag and assert (~10 us of host per call on the H200): the first check's device assert comes first in the stream
# and stops everything after it. Only in async mode (deferred mode keeps the context usable after a bad batch, so
# every call must keep its kernel's own guard), never during CUDA graph capture (a captured graph keeps its own check
# for the values its replays copy in), never for inference tensors (no version counter).
_COVERED: dict = {}
_COVERED_MAX = 16  # a bound: a step passes a few offsets tensors


def covered(q_offsets: Optional[torch.Tensor], kv_offsets: torch.Tensor, q_rows: int, kv_rows: int, max_seqlen_q: int,
            max_seqlen_kv: int) -> bool:
    """True when an earlier async device check (``cover``) covers these offsets for these rows and hints."""
    key = _coverage_key(q_offsets, kv_offsets, q_rows, kv_rows, max_seqlen_q, max_seqlen_kv)
    return key is not None and is_unmodified(_COVERED, key, kv_offsets, q_offsets)


def cover(q_offsets: Optional[torch.Tensor], kv_offsets: torch.Tensor, q_rows: int, kv_rows: int, max_seqlen_q: int,
          max_seqlen_kv: int) -> None:
    """Record that an async device check of these offsets, rows and hints is now enqueued on the current stream
    (call it only once the check's launches are: a call that fails before them must leave nothing covered)."""
    key = _coverage_key(q_offsets, kv_offsets, q_rows, kv_rows, max_seqlen_q, max_seqlen_kv)
    if key is not None:
        remember_unmodified(_COVERED, _COVERED_MAX, key, kv_offsets, q_offsets)


def _coverage_key(q_offsets, kv_offsets, q_rows, kv_rows, max_seqlen_q, max_seqlen_kv) -> Optional[tuple]:
    """None where no coverage applies: tensor subclasses (FakeTensors while tracing: a graph keeps its checks),
    inference tensors (no version counter), CPU tensors, a CUDA graph capture."""
    if (type(kv_offsets) is not torch.Tensor or not _on_cuda(kv_offsets) or kv_offsets.is_inference()
            or (q_offsets is not None and (type(q_offsets) is not torch.Tensor or q_offsets.is_inference()))
            or capturing(kv_offsets.device)):
        return None
    return (id(kv_offsets), id(q_offsets), q_rows, kv_rows, max_seqlen_q, max_seqlen_kv, stream_key(kv_offsets.device))


def _on_cuda(offsets: torch.Tensor) -> bool:
    return offsets.device.type == "cuda"


def device_check(q_offsets: Optional[torch.Tensor], q_rows: int, max_seqlen_q: int, kv_offsets: torch.Tensor,
                 kv_rows: int, max_seqlen_kv: int, mode: str) -> None:
    """The device check in aten ops (~9 per offsets tensor), for backends that do not fold it into a kernel and for
    calls where no kernel runs (no sequences, no rows)."""
    ok = _device_ok(kv_offsets, kv_rows, max_seqlen_kv)
    if q_offsets is not None:
        ok = ok & _device_ok(q_offsets, q_rows, max_seqlen_q)
    device_flag(ok, mode)
