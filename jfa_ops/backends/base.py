"""What every backend implements: the attention family's functions, plus any other op families in ``families``.

A backend is two plain functions over already-validated inputs (see ``meta_kernels.attention``) plus a
``supports`` predicate. Shapes legend: ``T_q``/``T_kv`` total rows, ``B`` sequences, ``Hq``/``Hkv`` heads,
``D`` head_dim, ``L_q`` broadcast-Q rows.

forward(q, k, v, q_offsets, kv_offsets, params) -> (out, lse)
    q          [T_q, Hq, D]   (broadcast_q: [L_q, Hq, D], q_offsets is None)
    k, v       [T_kv, Hkv, D]
    offsets    [B+1] int32/int64 prefix sums, on q's device
    out        [T_q, Hq, D]   (broadcast_q: [B*L_q, Hq, D]), q's dtype
    lse        [Hq, T_q]      (broadcast_q: [Hq, B*L_q]), float32, natural log, -inf on rows with no visible key

backward(grad_out, grad_lse, q, k, v, out, lse, q_offsets, kv_offsets, params) -> (dq, dk, dv)
    grad_lse may be None (lse unused). dq has q's shape (broadcast_q: summed over the batch).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import os
import threading
import weakref
from typing import Callable, Mapping, Optional, Tuple

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor


@dataclasses.dataclass(frozen=True)
class AttentionParams:
    """The non-tensor arguments of ``jfa::attention``, resolved (scale is a float, windows are ints)."""

    scale: float
    causal: bool = False
    window_left: int = -1  # -1: unbounded
    window_right: int = -1
    broadcast_q: bool = False
    deterministic: bool = False
    max_seqlen_q: int = -1  # -1: not given; a backend that needs it derives it from the offsets
    max_seqlen_kv: int = -1
    # The backend checks the offset values on the device itself and hands its flag to
    # jfa_ops.validation.device_flag (only for backends with checks_offsets, in JFA_VALIDATE=async|deferred).
    check_offsets: bool = False


@dataclasses.dataclass(frozen=True)
class BlockSparseParams(AttentionParams):
    """``jfa::block_sparse_attention``'s options: the attention options plus the selection's block sizes."""

    block_q: int = 128
    block_kv: int = 128


@dataclasses.dataclass(frozen=True)
class BlockSelectParams:
    """The non-tensor arguments of ``jfa::select_kv_blocks``, resolved. ``top_k`` -1: keep ``ceil(keep_ratio *
    visible)`` blocks, else ``min(top_k, visible)``. ``n_q_blocks``/``n_kv_blocks``: the output's static sizes."""

    block_q: int
    block_kv: int
    n_q_blocks: int
    n_kv_blocks: int
    keep_ratio: float = 0.5
    top_k: int = -1
    causal: bool = False
    window_left: int = -1
    window_right: int = -1
    broadcast_q: bool = False
    always_local: bool = True
    max_seqlen_q: int = -1
    max_seqlen_kv: int = -1
    # The backend checks the offset values on the device itself (as AttentionParams.check_offsets).
    check_offsets: bool = False


@dataclasses.dataclass(frozen=True)
class Problem:
    """Static facts a backend's ``supports`` decides on (never tensor values: no host sync)."""

    device_type: str
    dtype: torch.dtype
    head_dim: int
    num_heads_q: int
    num_heads_kv: int
    causal: bool
    window_left: int
    window_right: int
    broadcast_q: bool
    deterministic: bool
    device_index: Optional[int] = None  # CUDA: which GPU (its shared memory decides configs); None: the current one
    # Block-sparse family: the Q/KV block sizes of the selection (0: not a block-sparse call).
    block_q: int = 0
    block_kv: int = 0
    # Sizes, for the automatic choice's size rules (``Backend.auto_supports``): the rows of q and k (T_q or L_q,
    # T_kv) where they are plain ints; None where they are not known: symbolic (torch.compile with dynamic sizes,
    # where reading them would add a guard) or a Problem made by hand.
    rows_q: Optional[int] = None
    rows_kv: Optional[int] = None
    # True: the call is being traced into a graph (torch.compile, export: FakeTensor/FunctionalTensor inputs), so
    # the choice is baked into code that runs later (under dynamic sizes, for every size).
    traced: bool = False

    @staticmethod
    def of(q: torch.Tensor, k: torch.Tensor, params: AttentionParams) -> "Problem":
        rows_q, rows_kv = q.shape[0], k.shape[0]
        return Problem(
            device_type=q.device.type, dtype=q.dtype, head_dim=q.shape[-1], num_heads_q=q.shape[1],
            num_heads_kv=k.shape[1], causal=params.causal, window_left=params.window_left,
            window_right=params.window_right, broadcast_q=params.broadcast_q, deterministic=params.deterministic,
            device_index=q.device.index, block_q=getattr(params, "block_q", 0),
            block_kv=getattr(params, "block_kv", 0), rows_q=rows_q if type(rows_q) is int else None,
            rows_kv=rows_kv if type(rows_kv) is int else None,
            traced=type(q) is not torch.Tensor and isinstance(q, (FakeTensor, FunctionalTensor)),
        )


@dataclasses.dataclass(frozen=True)
class FamilyImpl:
    """One op family's functions in a backend (e.g. ``block_sparse``). ``backward`` None: the family has none (or
    the backend does not implement it); ``supports`` None: the backend's own ``supports`` decides."""

    forward: Callable
    backward: Optional[Callable] = None
    supports: Optional[Callable[[Problem], Optional[str]]] = None
    # automatic choice ranks the backend by this for the family (None: the backend's priority); e.g. a new kernel
    # of a backend that leads elsewhere stays behind another backend's until it has been checked
    priority: Optional[int] = None
    # the automatic choice's rule for this family (as ``Backend.auto_supports``; None: no rule, not the backend's)
    auto_supports: Optional[Callable[[Problem], Optional[str]]] = None


ATTENTION = "attention"  # the family of Backend.forward/backward/supports themselves


@dataclasses.dataclass(frozen=True)
class Backend:
    """A named implementation. ``supports(problem)`` returns None when it can run the problem, else the reason.

    ``forward``/``backward``/``supports`` are the ``attention`` family; other families (``block_sparse``, ...) are
    entries of ``families``, each answering ``supports`` for itself (or through the backend's).
    """

    name: str
    forward: Callable
    backward: Callable
    supports: Callable[[Problem], Optional[str]]
    priority: int = 0  # automatic choice takes the highest-priority backend that supports the problem
    # device types where automatic choice may pick it (None: any). The triton backend runs on CPU under
    # TRITON_INTERPRET=1 when asked by name, but is never picked there automatically.
    auto_devices: Optional[Tuple[str, ...]] = None
    # True: forward checks the offset values on the device when AttentionParams.check_offsets says so (folded into a
    # kernel that reads them anyway); False: jfa_ops.validation checks them before the call.
    checks_offsets: bool = False
    # True: its attention forward/backward can be traced into a torch.compile graph on CUDA (only aten ops and kernel launches
    # through ``launch`` under ``traced()``, no host reads of device data); see ``jfa_ops.ops.attention`` (compile path).
    traceable: bool = False
    # The automatic choice only (a named request ignores it), attention family (others: ``FamilyImpl.auto_supports``):
    # None when the automatic choice may take this backend for a problem it supports, else why it passes it over (a
    # call it runs, but another backend runs better: the tlx backend's size rule). Shapes only, as ``supports``.
    auto_supports: Optional[Callable[[Problem], Optional[str]]] = None
    families: Mapping[str, FamilyImpl] = dataclasses.field(default_factory=dict, hash=False)

    def implements(self, family: str) -> bool:
        return family == ATTENTION or family in self.families

    def family(self, family: str) -> FamilyImpl:
        """The functions of ``family`` (``attention``: this backend's own forward/backward/supports)."""
        if family == ATTENTION:
            return FamilyImpl(self.forward, self.backward, self.supports, auto_supports=self.auto_supports)
        if family not in self.families:
            raise ValueError(f"backend {self.name!r} does not implement the {family!r} op family "
                             f"(it implements: {sorted({ATTENTION, *self.families})})")
        impl = self.families[family]
        return impl if impl.supports is not None else dataclasses.replace(impl, supports=self.supports)

    def family_priority(self, family: str) -> int:
        """The automatic choice's rank of this backend for ``family`` (its own ``priority`` unless the family's
        ``FamilyImpl.priority`` says otherwise)."""
        impl = self.families.get(family)
        return self.priority if impl is None or impl.priority is None else impl.priority

    def family_supports(self, family: str, problem: Problem) -> Optional[str]:
        """None when this backend can run ``problem`` of ``family``, else why not."""
        if not self.implements(family):
            return f"it does not implement the {family!r} op family"
        return self.family(family).supports(problem)


_TRACE = threading.local()  # .on: a traceable backend's code is being traced into a graph (see traced()); .memo
# Per graph trace (keyed by the trace's FunctionalTensorMode, gone with it): what ``per_trace`` built (see there).
_MEMOS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def traced(scope: object = None):
    """Inside: a traceable backend's forward/backward runs on FakeTensors/FunctionalTensors to be recorded into a
    torch.compile graph, so it launches kernels through ``torch.library.wrap_triton`` (graph nodes that Inductor
    launches itself), caches nothing per shape, and leaves the current device to the graph's code. ``scope``: the
    graph trace this call belongs to (its FunctionalTensorMode: one per traced graph, forward and backward of a
    joint graph together); calls of one scope share ``per_trace``'s memo, None shares nothing."""
    before = getattr(_TRACE, "on", False), getattr(_TRACE, "memo", None)
    _TRACE.on = True
    _TRACE.memo = None if scope is None else _memo_of(scope)
    try:
        yield
    finally:
        _TRACE.on, _TRACE.memo = before


def tracing() -> bool:
    return getattr(_TRACE, "on", False)


def capturing(device: torch.device) -> bool:
    """Whether a CUDA graph capture is recording ``device``'s current stream. Device values made now hold data only
    when the graph replays, so they must not be kept for later calls; values kept from earlier calls must not enter
    the graph, whose every replay would read their memory, also after the caches let go of it."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def stream_key(device: torch.device):
    """The current CUDA stream of ``device`` as a cache key (None off CUDA). Device values kept across calls
    (``scheduling.shape_constant``'s, a forward replay's, a selection layout's) are keyed by it: a stream orders the
    work that made them only before its own later work, so another stream could read them before they are written
    (helper replay42: a shape's first call on a busy stream, then the same shape on another stream); so is
    ``validation``'s memo of offsets checked on the device (a check on one stream covers that stream's calls)."""
    if device.type != "cuda":
        return None
    return torch._C._cuda_getCurrentRawStream(torch.cuda.current_device() if device.index is None else device.index)


def per_trace(fn: Callable, *args, **unkeyed):
    """``fn(*args, **unkeyed)``, once per graph trace for equal ``args``; outside a trace scope (eager, or
    ``traced()`` without one) every call runs ``fn``, except that eager calls of a ``reusable_in_eager`` function
    reuse a recent result for the same live tensors (``_reused_in_eager``).

    Why: a model passes one offsets tensor to every layer, and each traced call derived the same values from it
    again (int32 copies, tile lists of two launches each, offset checks), per layer and again in the backward:
    graph nodes that Inductor runs on every step (issue 9: 24 list launches per step of the 4-layer model). Inductor
    does not merge them (each kernel node is distinct to it), so the trace does, where the values are made.

    ``fn``: a module-level function whose result depends only on its arguments (the values of the tensors among
    them) and is only read by the graph. ``args`` are compared by value, tensors by identity and version (a mutated
    tensor: no hit; the entry holds its tensors, so no id is reused while it lives), SymInts by their expression
    (one expression is one value within a trace). ``unkeyed``: arguments that leave the result as it is, e.g. a
    flag an offset check writes beside it: a call with any runs ``fn`` (its side effect must happen) and keeps its
    result for the calls without."""
    memo = getattr(_TRACE, "memo", None)
    if memo is None:
        if fn in _EAGER_REUSABLE and not tracing():
            return _reused_in_eager(fn, args, unkeyed)
        return fn(*args, **unkeyed)
    key = _memo_key(fn, args)
    outside = getattr(_TRACE, "outside", None) if fn in _OUTSIDE_COND else None
    hit = None if unkeyed else memo.get(key)
    if hit is None and outside is not None:  # built in the graph itself, not behind the cond (hoist_outside_cond)
        hit = None if unkeyed else outside.get(key)
        if hit is None:
            before = _TRACE.drop_all
            _TRACE.depth, _TRACE.drop_all = getattr(_TRACE, "depth", 0) + 1, False
            try:
                hit = outside[key] = (args, fn(*args, **unkeyed))
            finally:
                _TRACE.depth, _TRACE.drop_all = _TRACE.depth - 1, before
        memo[key] = hit
    if hit is None:
        _TRACE.depth = getattr(_TRACE, "depth", 0) + 1  # launches in here are the value's own (see hoisting)
        try:
            hit = memo[key] = (args, fn(*args, **unkeyed))
        finally:
            _TRACE.depth -= 1
    record = getattr(_TRACE, "record", None)
    if record is not None:
        record.append((fn, args, hit[1]))
    return hit[1]


# Eager reuse of ``per_trace`` values across calls (``reusable_in_eager``). Why: outside a trace every call built its
# lists again, and a compiled graph that keeps the op opaque (the TLX install) calls it once per layer, forward and
# backward, with one offsets tensor: on the model suite's large batch 8 list builds a step (2 launches and 4
# allocations each) where 2 give the same values, and that step was host-bound on the H200 (bench/NOTES.md v25).
# JFA_EAGER_REUSE=0 turns it off (A/B).
EAGER_REUSE = os.environ.get("JFA_EAGER_REUSE", "1") != "0"
EAGER_REUSE_DEVICES = ("cuda",)  # tests add "cpu" (the interpreter's tensors; numpy views could skip the version)
EAGER_REUSE_ENTRIES = 16  # per thread: a step's few lists (forward, dK/dV, dQ) and the next batch's
_EAGER_REUSABLE: set = set()
_EAGER = threading.local()  # .memo: OrderedDict key -> (weak refs to the key's tensors, result); per thread, as the
# autograd engine runs CUDA backwards on its own thread


def reusable_in_eager(fn: Callable) -> Callable:
    """Mark ``fn`` (a ``per_trace`` function) as reusable across eager calls too: a call with the same arguments
    (tensors: the same live tensor at the same version) on the same device returns the kept result while it is
    among the thread's last ``EAGER_REUSE_ENTRIES`` results. Only for values that kernels only read."""
    _EAGER_REUSABLE.add(fn)
    return fn


def _reused_in_eager(fn, args, unkeyed):
    tensors = _tensors_in(args)
    if not (EAGER_REUSE and tensors) or tensors[0].device.type not in EAGER_REUSE_DEVICES or \
            any(t.is_inference() for t in tensors):  # inference tensors keep no version: a write would not show
        return fn(*args, **unkeyed)
    device = tensors[0].device
    if device.type == "cuda" and torch.cuda.current_stream(device) != torch.cuda.default_stream(device):
        # Only on the default stream: CUDA-graph trees warm up and record on their own stream, into their pool,
        # where a tensor kept past the call breaks the graph ("tensors in the cudagraph pool not tracked as
        # outputs"); and a value made on one stream must not be read unsynchronised on another.
        return fn(*args, **unkeyed)
    memo = getattr(_EAGER, "memo", None)
    if memo is None:
        memo = _EAGER.memo = collections.OrderedDict()
    key = (_memo_key(fn, args), device)
    entry = None if unkeyed else memo.get(key)
    if entry is not None and all(ref() is t for ref, t in zip(entry[0], tensors)):  # the same tensors, alive
        memo.move_to_end(key)
        return entry[1]
    result = fn(*args, **unkeyed)
    memo[key] = ([weakref.ref(t) for t in tensors], result)
    memo.move_to_end(key)
    while len(memo) > EAGER_REUSE_ENTRIES:
        memo.popitem(last=False)
    return result


def clear_eager_reuse() -> None:
    """Forget this thread's eager reuse entries (tests)."""
    _EAGER.memo = None


_OUTSIDE_COND: set = set()


def hoist_outside_cond(fn: Callable) -> Callable:
    """Mark ``fn`` (a ``per_trace`` function) as built in the graph itself where the split path builds the rest
    behind its predicate (``JFA_SPLIT_HOIST=cond``, ``hoisting``'s ``outside``): a value Inductor makes for free
    there (a copy it folds away: the int32 offsets of int32 offsets), which a cond output, never an alias of an
    input, would make a copy kernel and an allocation on both sides."""
    _OUTSIDE_COND.add(fn)
    return fn


@contextlib.contextmanager
def hoisting(scope: object, drop_all: bool = False, outside: object = None):
    """A dry run of a traceable backend's call in ``scope`` (``traced(scope)``) that keeps only what ``per_trace``
    builds: yields the list of its ``(fn, args, result)`` calls in order, hits included; kernel launches outside a
    ``per_trace`` function are dropped (``launch_dropped``), and the rest of the call's ops are left unused, for
    the graph's dead-code pass. Why: the size-split compile path (``ops.attention._split``) builds the offset-derived
    values (int32 copies, tile lists, the offset check) once per graph, before its cond, and hands them to the
    branch that launches the kernels (``seeded_scope``): traced inside the branch they were built per layer.

    ``drop_all``: every launch is dropped, inside ``per_trace`` functions too (``all_launches_dropped``): the values
    keep their shapes, strides and dtypes, unwritten (``JFA_SPLIT_HOIST=cond``: the build's branch for large
    batches, which never read them; and its probe for what is still to build). ``outside``: the graph's own scope,
    where the probe builds the ``hoist_outside_cond`` functions' values, for real (launches kept)."""
    record: list = []
    before = (getattr(_TRACE, "record", None), getattr(_TRACE, "depth", 0), getattr(_TRACE, "drop_all", False),
              getattr(_TRACE, "outside", None))
    with traced(scope):
        _TRACE.record, _TRACE.depth, _TRACE.drop_all = record, 0, drop_all
        _TRACE.outside = None if outside is None else _memo_of(outside)
        try:
            yield record
        finally:
            _TRACE.record, _TRACE.depth, _TRACE.drop_all, _TRACE.outside = before


def launch_dropped() -> bool:
    """Inside ``hoisting``'s dry run and not inside a ``per_trace`` function (or anywhere in a ``drop_all`` dry
    run): a traced launch records nothing."""
    return getattr(_TRACE, "record", None) is not None and (
        getattr(_TRACE, "depth", 0) == 0 or getattr(_TRACE, "drop_all", False))


def all_launches_dropped() -> bool:
    """Inside a ``hoisting(..., drop_all=True)`` dry run: no launch is recorded, so a flag a check kernel would
    write holds nothing (``validation.device_flag`` asserts none)."""
    return getattr(_TRACE, "record", None) is not None and getattr(_TRACE, "drop_all", False)


def hoistable(record: list, inputs) -> Tuple[list, list]:
    """``hoisting``'s record reduced to the calls a branch can be given: those whose tensor arguments are
    ``inputs`` (the call's tensors) or results of earlier such calls (a value of a dropped launch is not: the branch
    builds that one itself). Returns (calls, each once; their result tensors, each once)."""
    known = {id(t) for t in inputs if isinstance(t, torch.Tensor)}
    calls, tensors, seen = [], [], set()
    for fn, args, result in record:
        key = _memo_key(fn, args)
        if key in seen or not all(id(t) in known for t in _tensors_in(args)):
            continue
        seen.add(key)
        calls.append((fn, args, result))
        for t in _tensors_in(result):
            if id(t) not in known:
                known.add(id(t))
                tensors.append(t)
    return calls, tensors


def seeded_scope(calls: list, to_branch: Mapping[int, torch.Tensor]) -> object:
    """A new ``per_trace`` scope whose memo already holds ``calls`` (from ``hoistable``) with every tensor, in the
    arguments and the results, replaced by ``to_branch[id(tensor)]`` (the branch's operand for it): in the branch,
    ``per_trace`` returns the values built before the cond instead of building them again."""
    scope = _Scope()
    memo = _memo_of(scope)
    swap = lambda t: to_branch[id(t)]  # noqa: E731
    for fn, args, result in calls:
        args = _map_tensors(args, swap)
        result = _map_tensors(result, swap)
        try:  # a size in the result (a list's capacity) as the branch's own: one of its tensors' sizes
            result = _map_tensors(result, None, functools.partial(_size_of, _tensors_in(result)))
        except KeyError:  # none: the branch builds this one itself
            continue
        memo[_memo_key(fn, args)] = (args, result)
    return scope


def _size_of(tensors, size: torch.SymInt) -> torch.SymInt:
    """The size of one of ``tensors`` (a branch's operands) that is ``size`` (an outer graph's SymInt): a branch
    must not use the outer graph's SymInts (its tracer would rebuild them from their expressions, with calls that
    Inductor's subgraph lowering does not take, e.g. ``_nary_sym_max``)."""
    for t in tensors:
        for d in t.shape:
            if isinstance(d, torch.SymInt) and d.node.expr == size.node.expr:
                return d
    raise KeyError(size)


class _Scope:
    """A ``per_trace`` scope of its own (weak-referenceable)."""


def _memo_of(scope: object) -> dict:
    """``scope``'s ``per_trace`` memo (made empty on first use)."""
    return _MEMOS.setdefault(scope, {})


def _unique_tensors(calls: list) -> list:
    """The tensors in ``calls``' ``(fn, args, result)``, arguments and results, each once (by identity), in order."""
    found, seen = [], set()
    for _, args, result in calls:
        for t in _tensors_in((args, result)):
            if id(t) not in seen:
                seen.add(id(t))
                found.append(t)
    return found


def _tensors_in(value) -> list:
    """The tensors in ``value`` (``_map_tensors``' walk, in order). A flat tuple or list of tensors and plain
    scalars (the reusable functions' arguments: offsets, lists and ints) is read without the walk: its per-argument
    type tests were ~1/3 of a large call's kept launch on the CPU count (tools/host_backend_cpu.py; bench/NOTES.md
    "kept launches past one wave")."""
    if type(value) in (tuple, list):
        found = []
        for a in value:
            if isinstance(a, torch.Tensor):
                found.append(a)
            elif type(a) not in _SCALARS:
                break
        else:
            return found
    found = []
    _map_tensors(value, lambda t: found.append(t) or t)
    return found


_SCALARS = frozenset((int, float, bool, str, type(None)))


def _map_tensors(value, fn, symint=None):
    """``value`` with each tensor ``t`` in it (in tuples, lists, dicts and dataclasses, nested) replaced by
    ``fn(t)`` (None: kept) and each SymInt ``s`` by ``symint(s)`` (None: kept); a value where nothing changes is
    returned as it is (a list stays the same list)."""
    if isinstance(value, torch.Tensor):
        return value if fn is None else fn(value)
    if isinstance(value, torch.SymInt):
        return value if symint is None else symint(value)
    if isinstance(value, (tuple, list)):
        mapped = [_map_tensors(v, fn, symint) for v in value]
        if all(m is v for m, v in zip(mapped, value)):
            return value
        return type(value)(*mapped) if hasattr(value, "_fields") else type(value)(mapped)
    if isinstance(value, dict):
        mapped = {k: _map_tensors(v, fn, symint) for k, v in value.items()}
        return value if all(mapped[k] is v for k, v in value.items()) else mapped
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
        mapped = {k: _map_tensors(v, fn, symint) for k, v in fields.items()}
        return value if all(mapped[k] is v for k, v in fields.items()) else dataclasses.replace(value, **mapped)
    return value


def _memo_key(fn, args) -> tuple:
    """``per_trace``'s memo key of ``fn(*args)``."""
    return fn, tuple(map(_value_key, args))


def _value_key(value):
    if isinstance(value, torch.Tensor):
        return "tensor", id(value), value._version
    if isinstance(value, torch.SymInt):
        return "SymInt", value.node.expr
    if isinstance(value, (tuple, list)):
        return type(value), tuple(map(_value_key, value))
    return value


def unit_stride(offsets: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``offsets`` with unit stride (a copy only where it has another; None stays None). Why: kernels read
    ``offsets[b]`` at ``base + b``, so a strided view (a column of a [B + 1, 2] tensor) gave them other values:
    garbage rows, and out-of-bounds writes in the MXFP8 quantize kernel. (int64 offsets were safe by luck: their
    int32 copy is contiguous.) Called at each entry of the kernel backends (triton 8, tlx 7), not once: the registry
    could wrap every family's functions with a table of where their offsets are, but that wrapper is one more
    Python frame a call (+0.3 us on CPU, on the kernel backends' host path), and the op layer has no single entry
    either (op bodies, the eager direct, fast and select/quantize direct paths, traced graphs); nor does the int32
    conversion (int32 offsets reach several launches as given). bench/NOTES.md "Hardening, helper wrap38"."""
    if offsets is None or offsets.stride(0) == 1 or offsets.shape[0] <= 1:
        return offsets
    return offsets.contiguous()


def unit_stride_pair(q_offsets: Optional[torch.Tensor], kv_offsets: torch.Tensor):
    """``unit_stride`` of both sides, one tensor for both when the caller passed one (self-attention)."""
    q = unit_stride(q_offsets)
    return q, q if kv_offsets is q_offsets else unit_stride(kv_offsets)


def device_guard(device: torch.device):
    """A context that makes ``device`` the current CUDA device: Triton launches on the current device, not on its
    arguments' (tensors on cuda:1 while cuda:0 is current would run on the wrong GPU). It switches only when the
    index differs, so the common case costs one device query and no context switch. Nothing while tracing (the
    compiled graph guards the device of its own launches)."""
    if device.type != "cuda" or device.index is None or tracing() or device.index == torch.cuda.current_device():
        return NO_SWITCH
    return torch.cuda.device(device.index)


# What device_guard returns where it switches nothing: one shared context (a nullcontext is reusable and re-entrant),
# so ``on_device`` can skip the ``with`` on a tiny call's host path (~0.5-1 us a call, bench/NOTES.md "tiny-call
# backend host floor")
NO_SWITCH = contextlib.nullcontext()


def on_device(device: torch.device, fn, *args):
    """``fn(*args)`` with ``device`` current (``device_guard``'s rule), entering no context where nothing switches."""
    guard = device_guard(device)
    if guard is NO_SWITCH:
        return fn(*args)
    with guard:
        return fn(*args)
