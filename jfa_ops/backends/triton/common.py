"""Triton helpers shared by the forward and backward kernels, and the host-side launch facts.

Vocabulary: a kernel program owns a *stationary* tile of ``BLOCK_S`` positions of one sequence (query rows for the
forward and dQ passes, key rows for dK/dV) and streams over the *other* side in blocks of ``BLOCK_O``. With
``diag = L_other - L_stationary`` (FlashAttention's bottom-right alignment), stationary position ``s`` sees other-side
position ``o`` iff ``lo_off <= o - s - diag <= hi_off``, each bound only when present, and ``0 <= o < L_other``::

    causal, L_q = 4, L_k = 6 (diag = 2)       window_left = 1, window_right = 0
      keys  0 1 2 3 4 5                         keys  0 1 2 3 4 5
    q 0     x x x . . .                       q 0     . x x . . .
    q 1     x x x x . .                       q 1     . . x x . .
    q 2     x x x x x .                       q 2     . . . x x .
    q 3     x x x x x x                       q 3     . . . . x x

Forward / dQ: ``lo_off = -window_left``, ``hi_off = min(0 if causal, window_right)``.
dK/dV (keys stationary, rows other): ``lo_off = -hi_off(forward)``, ``hi_off = window_left``.

The other side's blocks split in three *stages*: a masked leading edge, a mask-free bulk whose blocks every valid
stationary position sees entirely (no index math, no row checks), and a masked trailing edge (diagonal, window end,
partial last block). Blocks nobody sees are skipped whole.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from ..base import capturing, hoist_outside_cond, per_trace, tracing
from . import configs
from .configs import interpreting

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # 1/ln 2: exp(x) = exp2(x * LOG2E)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)  # ln 2: ln(x) = log2(x) * LN2


if interpreting():
    def loop_bound(x):
        """Interpreter workaround (triton 3.6 + numpy 2.x): its scalars are 1-element arrays, and ``range`` over a
        loaded bound calls ``int(array)``, which numpy 2 refuses. Plain Python here runs inside the interpreter."""
        return int(x.handle.data.reshape(-1)[0]) if isinstance(x, tl.tensor) else x
else:
    @triton.jit
    def loop_bound(x):
        return x


@triton.jit
def stage_bounds(s0, len_s, len_o, lo_off, hi_off, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,
                 BLOCK_S: tl.constexpr, BLOCK_O: tl.constexpr):
    """Other-side block ranges for the stationary tile [s0, s0 + BLOCK_S).

    Returns (lead_begin, lead_end, bulk_begin, bulk_end, tail_begin, tail_end): masked, mask-free, masked. Positions
    of the tile past ``len_s`` never get stored, so they do not constrain the mask-free bulk.
    """
    diag = len_o - len_s
    s_last = tl.minimum(s0 + BLOCK_S, len_s) - 1
    lo_any = s0 * 0  # first other position any valid row sees
    lo_all = s0 * 0  # from here on, every valid row sees everything (as far as the lower bound goes)
    hi_any = len_o  # one past the last position any valid row sees
    hi_all = len_o  # below this, every valid row sees everything (as far as the upper bound goes)
    if HAS_LO:
        lo_any = tl.maximum(s0 + lo_off + diag, 0)
        lo_all = tl.maximum(s_last + lo_off + diag, 0)
    if HAS_HI:
        hi_any = tl.minimum(s_last + hi_off + diag + 1, len_o)
        hi_all = tl.maximum(tl.minimum(s0 + hi_off + diag + 1, len_o), 0)
    lead_begin = (lo_any // BLOCK_O) * BLOCK_O  # operands are >= 0 here, so // is floor division
    bulk_begin = tl.maximum(((lo_all + BLOCK_O - 1) // BLOCK_O) * BLOCK_O, lead_begin)
    bulk_end = tl.maximum((hi_all // BLOCK_O) * BLOCK_O, bulk_begin)
    lead_end = tl.minimum(bulk_begin, hi_any)
    tail_begin = tl.maximum(bulk_end, lead_end)
    return lead_begin, lead_end, bulk_begin, bulk_end, tail_begin, hi_any


@triton.jit
def work_item(work, n_tiles, num_heads, group, KV_MAJOR: tl.constexpr):
    """(tile index, head) of a persistent work item. KV_MAJOR: kv head outermost, then tile, then the q heads of the
    kv head's group, so that the programs running side by side share one kv head's K/V (or Q/dO rows) through the
    L2; tiles stay longest first within each kv head. Else tile-major (all heads of a tile side by side)."""
    if KV_MAJOR:
        g = work % group
        rest = work // group
        return rest % n_tiles, (rest // n_tiles) * group + g
    else:
        return work // num_heads, work % num_heads


@triton.jit
def snake_work(pid, i, programs, SNAKE: tl.constexpr):
    """The work index of this program's i-th item: pid + i * programs, or SNAKE: every other round of ``programs``
    items taken in reverse (boustrophedon over a list sorted longest first: each program's rounds pair a long item
    with a short one)."""
    if SNAKE:
        return i * programs + tl.where((i & 1) == 0, pid, programs - 1 - pid)
    else:
        return pid + i * programs


@triton.jit
def snake_items(n_work, pid, programs, SNAKE: tl.constexpr):
    """How many items ``snake_work`` gives this program."""
    if SNAKE:
        rounds = n_work // programs
        last_col = tl.where((rounds & 1) == 0, pid, programs - 1 - pid)  # its column in the partial last round
        return rounds + (last_col < n_work - rounds * programs).to(tl.int32)
    else:
        return (n_work - pid + programs - 1) // programs


@triton.jit
def zigzag_item(work, n_tiles, num_heads, group, head_group):
    """(tile, head) of work item ``work`` when the kv heads go in groups of ``head_group`` (a divisor of them; each kv
    head with its ``group`` q heads, side by side), group after group; within a group tile by tile, the list's
    longest first in the last group and the direction alternating before it (the backward's
    ``block_sparse_bwd.zigzag_groups`` order, arithmetic here: every head of a tile costs the same). Taken by the
    snake (``snake_work``), every monotone run balances and the turns between groups are all-long or all-short; the
    ~132 items in flight read the K/V of one group's heads (L2). The TLX forward's ZIGZAG
    (``tlx.configs.FORWARD_ZIGZAG``; bench/NOTES.md "TLX forward: short causal")."""
    span = head_group * group  # q heads per group
    per_group = n_tiles * span
    hg = work // per_group
    r = work - hg * per_group
    rank = r // span
    head = hg * span + (r - rank * span)
    last = num_heads // span - 1
    tile = tl.where(((last - hg) & 1) == 0, rank, n_tiles - 1 - rank)
    return tile, head


@triton.jit
def first_work(WORK_COUNTER, ATOMIC_WORK: tl.constexpr):
    """This program's first work item: the next one from the atomic counter, else its program id."""
    if ATOMIC_WORK:
        return tl.atomic_add(WORK_COUNTER, 1, sem="relaxed")
    else:
        return tl.program_id(0)


@triton.jit
def next_work(work, WORK_COUNTER, ATOMIC_WORK: tl.constexpr):
    """This program's next work item: from the atomic counter, else work + P (program p of P takes p, p + P, ...; one
    item each when the grid has a program per item)."""
    if ATOMIC_WORK:
        return tl.atomic_add(WORK_COUNTER, 1, sem="relaxed")
    else:
        return work + tl.num_programs(0)


@triton.jit
def visible(s_pos, o_pos, len_s, len_o, lo_off, hi_off, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr):
    """Which (stationary, other) pairs attend; s_pos and o_pos broadcast against each other (2-D)."""
    rel = o_pos - s_pos - (len_o - len_s)  # offset from the pair's diagonal
    ok = (s_pos < len_s) & (o_pos < len_o)
    if HAS_LO:
        ok = ok & (rel >= lo_off)
    if HAS_HI:
        ok = ok & (rel <= hi_off)
    return ok


@triton.jit
def key_interval_mask(rows, keys, rows_left, keys_left, lo_off, hi_off, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr):
    """``visible`` for the rows inside the sequence, as one key interval per row: rows, keys are block-relative
    positions (1-D), rows_left / keys_left the rows / keys the sequence has from the block's first. Rows past the
    sequence are left unmasked (callers never store them). Two values per row (first, limit) against the key
    positions, instead of key - row per element, which LLVM hoists out of a loop as one register per element."""
    diag = keys_left - rows_left  # key k sits on row r's diagonal when k - r == diag
    limit = tl.zeros_like(rows) + keys_left
    if HAS_HI:
        limit = tl.minimum(limit, rows + (diag + hi_off + 1))
    ok = keys[None, :] < limit[:, None]
    if HAS_LO:
        ok = ok & (keys[None, :] >= (rows + (diag + lo_off))[:, None])
    return ok


@triton.jit
def stage_block_start(j, n_lead, n_unmasked, lead_begin, bulk_begin, tail_begin, BLOCK: tl.constexpr):
    """First position of block j of a tile's walk over ``stage_bounds``' masked lead (n_lead blocks), mask-free bulk
    (up to block n_unmasked) and masked tail: one loop over the three stages."""
    return tl.where(j < n_lead, lead_begin + j * BLOCK,
                    tl.where(j < n_unmasked, bulk_begin + (j - n_lead) * BLOCK, tail_begin + (j - n_unmasked) * BLOCK))


@triton.jit
def softmax_step(s, m_i, l_i, qk_scale, MASKED: tl.constexpr, FMA_SOFTMAX: tl.constexpr):
    """One online-softmax step over a [rows, keys] block of scores ``s`` (log2 domain; FMA_SOFTMAX: raw scores,
    scaled here by qk_scale > 0). Returns (p, alpha, m_new, l_new): the block's probabilities under the new running
    max, the rescale of what was accumulated under the old one, and the updated max and row sums. MASKED: rows may
    have seen no visible key yet (m = -inf)."""
    if FMA_SOFTMAX:  # qk_scale > 0: max of the raw scores, then one FMA per score (the FA tutorial's form)
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
    if MASKED:
        # A row that has seen no visible key yet keeps m = -inf; subtract 0 instead so exp2 gives 0, not NaN.
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new
    if FMA_SOFTMAX:
        p = tl.math.exp2(s * qk_scale - m_ref[:, None])
    else:
        p = tl.math.exp2(s - m_ref[:, None])
    alpha = tl.math.exp2(m_i - m_ref)  # rescale of what was accumulated under the old maximum
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new


@triton.jit
def row_source(X, row0, rows, stride_t, head, stride_h, d, TMA: tl.constexpr):
    """What the loads of one head's rows read from: the tensor descriptor X itself (TMA: loads take coordinates),
    else the [rows, BLOCK_D] pointers of rows ``row0 + rows`` of head ``head``."""
    if TMA:
        return X
    else:
        return X + (row0 + rows)[:, None] * stride_t + head * stride_h + d[None, :]


@triton.jit
def load_rows(ptrs, rows_ok, d_ok, CHECK_ROWS: tl.constexpr, PAD_D: tl.constexpr):
    """Load a [rows, BLOCK_D] tile; masks only where needed (rows past a sequence end, head-dim padding)."""
    if CHECK_ROWS:
        if PAD_D:
            x = tl.load(ptrs, mask=rows_ok[:, None] & d_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs, mask=rows_ok[:, None], other=0.0)
    else:
        if PAD_D:
            x = tl.load(ptrs, mask=d_ok[None, :], other=0.0)
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def store_rows(ptrs, x, rows_ok, d_ok, PAD_D: tl.constexpr):
    if PAD_D:
        tl.store(ptrs, x, mask=rows_ok[:, None] & d_ok[None, :])
    else:
        tl.store(ptrs, x, mask=rows_ok[:, None])


@triton.jit
def query_row0(out_row0, BROADCAST_Q: tl.constexpr):
    """Q's first row for the sequence whose output rows start at ``out_row0``: 0 for a broadcast Q (every sequence
    reads the same dense Q), else out_row0."""
    if BROADCAST_Q:
        return out_row0 * 0
    else:
        return out_row0


@triton.jit
def load_tma_pair(A, B, row_a, row_b, first, col, pos, limit, MASKED: tl.constexpr):
    """Blocks of the tensor descriptors A and B at rows ``row_a + first`` / ``row_b + first`` and column ``col`` (Q
    and dO, or K and V); MASKED: the rows whose position ``pos`` ([rows]) is not below ``limit`` zeroed: a block may
    run into the next sequence's rows, and a masked score's 0 times their NaN/inf would leak."""
    a = A.load([(row_a + first).to(tl.int32), col])
    b = B.load([(row_b + first).to(tl.int32), col])
    if MASKED:
        ok = (pos < limit)[:, None]
        a = tl.where(ok, a, tl.zeros_like(a))
        b = tl.where(ok, b, tl.zeros_like(b))
    return a, b


@triton.jit
def seq_extent(begin, end):
    """(first row as int64, length as int32) of the sequence between offsets ``begin`` and ``end``, which the caller
    loads: torch's analysis of what a kernel writes (torch.compile, ``wrap_triton``) counts a helper's result as
    derived from every argument, so a helper given the offsets pointer whose result feeds a store address would make
    the offsets "written", and Inductor would copy them before each launch (torch 2.11 fails compiling that copy)."""
    return begin.to(tl.int64), (end - begin).to(tl.int32)


# ---------------------------------------------------------------------------------------------------- host side
def alloc_output(shape, dtype, device) -> torch.Tensor:
    """Every output buffer the kernels fill comes from here (uninitialized: the kernels write every element).
    Tests replace it with a NaN-filled allocator to prove that. ``size=`` by keyword: the positional size goes through
    torch's overload resolution first (CPU, torch 2.13: 9.2 us a call vs 3.5, bench/NOTES.md launchfold)."""
    return torch.empty(size=shape, dtype=dtype, device=device)


def int32_offsets(offsets: torch.Tensor, same_as=None, checked: bool = False) -> torch.Tensor:
    """``offsets`` as the kernels read them (int32); ``same_as``: (offsets, converted) of the other side, reused when
    both sides pass one tensor. ``checked``: the call checks the offset values on the device from this copy
    (``AttentionParams.check_offsets``, the check folded into a kernel): int64 values outside int32's range then
    saturate (``saturated_int32``) instead of wrapping, so that a bad batch stays bad (2**32 + 3 wrapped to a
    valid-looking 3). While traced into a graph, a copy even when already int32 (saturated when int64: Inductor
    fuses the clamp into the conversion's kernel): torch's analysis of what a user kernel writes counts the offsets
    as written when a helper given them (``scheduling.slot_tile``) returns a value that feeds a store address, and a
    written graph input would cost a copy back after each call and keep CUDA graphs (``reduce-overhead``) off; one
    copy per offsets tensor and graph (``base.per_trace``), which every layer and the backward read."""
    if same_as is not None and same_as[0] is offsets:
        return same_as[1]
    if tracing():
        return per_trace(_int32_copy, offsets)
    if offsets.dtype == torch.int32:
        return offsets
    return saturated_int32(offsets) if checked else offsets.to(torch.int32)  # .to(copy=False): ~8 us on CPU


@hoist_outside_cond  # Inductor folds the copy of int32 offsets away in the graph, not as a cond's output
def _int32_copy(offsets: torch.Tensor) -> torch.Tensor:
    if offsets.dtype != torch.int32:  # the graph's offset check reads this copy (int32_offsets)
        offsets = offsets.clamp(INT32_MIN, INT32_MAX)
    return offsets.to(torch.int32, copy=True)


INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1
_INT32_BOUNDS: dict = {}  # device -> (INT32_MIN, INT32_MAX) as 0-dim int64 tensors there (clamp's Tensor bounds)


def saturated_int32(offsets: torch.Tensor) -> torch.Tensor:
    """int64 ``offsets`` in int32, values outside its range saturated: one launch (clamp with Tensor bounds writes
    an int32 output; its Scalar overload cannot, and clamp then ``.to`` is two). Host: ~1.6 us over ``.to`` on CPU
    (bench/NOTES.md "Hardening, helper wrap38"), only in calls that check int64 offsets on the device. Why: a
    device check that reads a wrapped copy passes values such as 2**32 + 3 (3 in int32) as valid."""
    device = offsets.device
    bounds = _INT32_BOUNDS.get(device)
    if bounds is None:
        if capturing(device):  # made there: data only on replay
            return offsets.clamp(INT32_MIN, INT32_MAX).to(torch.int32)
        bounds = _INT32_BOUNDS[device] = (torch.tensor(INT32_MIN, dtype=torch.int64, device=device),
                                          torch.tensor(INT32_MAX, dtype=torch.int64, device=device))
    return torch.clamp(offsets, *bounds, out=torch.empty_like(offsets, dtype=torch.int32))


def packed_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` ([T, H, D]) itself when each row holds its heads back to back (stride(2) == 1, stride(1) == D, rows
    not overlapping): what the kernels index (row stride free) and TMA reads, e.g. q, k, v sliced out of one fused
    projection; else a contiguous copy (expanded gradients, transposed heads)."""
    rows, heads, dim = t.shape
    if t.stride(2) == 1 and (heads == 1 or t.stride(1) == dim) and (rows == 1 or t.stride(0) >= heads * dim):
        return t
    return t.contiguous()


def packed_mx_pair(pair):
    """A pre-quantized (data, scale) pair as the MXFP8 kernels read it: data with packed rows (``packed_rows``: TMA
    views rows as [T, H*D]) and scales with unit head_dim stride (their row and head strides are free). Why: a
    pair in another layout (a permuted or sliced view) was read as if laid out so: silently wrong out."""
    data, scale = pair
    return packed_rows(data), scale if scale.stride(2) == 1 or scale.shape[2] <= 1 else scale.contiguous()


def row_strides(name: str, t: torch.Tensor) -> dict:
    """The row and head strides of a [T, H, D] tensor as the kernels name them (``stride_<name>t``,
    ``stride_<name>h``): taken from the tensor together, so one tensor's strides cannot be swapped with another's."""
    stride = t.stride()
    return {f"stride_{name}t": stride[0], f"stride_{name}h": stride[1]}


def window_bounds(causal: bool, window_left: int, window_right: int):
    """(has_left, window_left, has_right, right): forward-side visibility ``-window_left <= j - i - diag <= right``."""
    has_left = window_left >= 0
    rights = ([0] if causal else []) + ([window_right] if window_right >= 0 else [])
    return has_left, max(window_left, 0), bool(rights), (min(rights) if rights else 0)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return configs.INTERPRETER_NUM_SMS  # read per call: tests change it
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


INTERPRETER_L2_BYTES = 50 << 20  # an H100's / H200's L2, for host rules run on CPU tensors


@functools.lru_cache(maxsize=None)
def _l2_bytes(device_index: int) -> int:
    return getattr(torch.cuda.get_device_properties(device_index), "L2_cache_size", INTERPRETER_L2_BYTES)


def l2_bytes(device: torch.device) -> int:
    """The device's L2 in bytes (cached per device, as ``num_sms``); CPU tensors: ``INTERPRETER_L2_BYTES``."""
    if device.type != "cuda":
        return INTERPRETER_L2_BYTES
    return _l2_bytes(device.index if device.index is not None else torch.cuda.current_device())


SCHEDULES = ("grid", "static", "atomic")


def launch_schedule(kind: str, max_items: int, programs_per_sm: int, device: torch.device):
    """(grid size, work counter or None) for a work list of at most ``max_items`` items (the real count is on the
    device). grid: one program per item; static: min(items, programs_per_sm * SMs) programs, program p takes items
    p, p + P, ...; atomic: as many programs, each takes the next item from a zeroed device counter (one memset)."""
    if kind not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}")
    if kind == "grid":  # sym_max/sym_min: symbolic sizes (torch.compile) give a symbolic grid, not a guard
        return int_max(1, max_items), None
    programs = int_max(1, int_min(max_items, num_sms(device) * programs_per_sm))
    return programs, (torch.zeros((1,), dtype=torch.int32, device=device) if kind == "atomic" else None)


def cdiv(a, b):
    """ceil(a / b) on the host, for ints and SymInts (``triton.cdiv`` is a constexpr function: ~2 us per host call)."""
    return (a + b - 1) // b


def int_max(a, b):
    """``torch.sym_max`` (a symbolic size stays symbolic: no guard), with plain ints taking the builtin (the eager
    host path: torch.sym_max costs ~2 us per call there)."""
    if type(a) is int and type(b) is int:
        return a if a >= b else b
    return torch.sym_max(a, b)


def int_min(a, b):
    """``torch.sym_min`` with plain ints taking the builtin (as ``int_max``)."""
    if type(a) is int and type(b) is int:
        return a if a <= b else b
    return torch.sym_min(a, b)


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 products (the default would be tf32); 16-bit inputs ignore this."""
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=None)
def head_dim_consts(head_dim: int):
    from .configs import head_dim_bucket

    block_d = head_dim_bucket(head_dim)
    return dict(HEAD_DIM=head_dim, BLOCK_D=block_d, PAD_D=block_d != head_dim)  # cached: callers only read it
