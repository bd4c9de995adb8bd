"""Pre-tuned launch configurations: a small table, no autotuning.

Keys are static facts only (kernel, head-dim bucket, dtype, causal/window, the device's shared-memory limit,
interpreter): never sequence lengths or totals, so one compiled specialization serves every batch and no call has
to time candidates.

The entries are tuned on the H200 (227 KiB of shared memory per program); smaller budgets (99 KiB on sm_86/sm_89)
get fallbacks with fewer stages or smaller blocks. ``tests/backends/test_arch_compile.py`` compiles the entries
(``specializations.py`` lists them) for sm_80, sm_86, sm_89 and sm_90 and checks each against its budget.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Optional

import torch

# Opt-in shared memory per block (bytes) of the architectures every shipped kernel is compiled for in CI:
# sm_80 A100 163 KiB; sm_86 / sm_89 (A10G, L4, L40S, RTX 3090/4090) 99 KiB; sm_90 H100/H200 227 KiB.
SHARED_MEMORY_LIMITS = {80: 166912, 86: 101376, 89: 101376, 90: 232448}


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    block_m: int  # query rows per tile
    block_n: int  # key rows per tile
    num_warps: int
    num_stages: int  # software-pipelining depth of the inner loops
    programs_per_sm: int = 1  # persistent grid size = programs_per_sm * #SMs


@dataclasses.dataclass
class Knobs:
    """Code-path switches (not block sizes); ``devcheck --variants`` flips them to compare in the same run.
    Defaults from the H200 run in bench/NOTES.md (dense B8 H16 S4096 D128 bf16, TFLOP/s)."""
    fwd_fma_softmax: bool = True  # max over raw scores, then exp2(s * scale - m) as one FMA (scale > 0): neutral
    fwd_kv_major: bool = True  # work order kv head -> tile -> q head (common.work_item): dense fwd 439 -> 459
    # How work items reach programs (common.launch_schedule): "grid" one program per item (the hardware hands the next
    # to whichever SM frees up), "static" persistent grid with striding, "atomic" persistent grid taking the next
    # item from a device counter. Forward: grid beat static (jagged 366 -> 394; was `fwd_persistent=False`).
    fwd_schedule: str = "grid"
    bwd_schedule: str = "static"  # dK/dV and dQ passes; grid and atomic not yet measured
    bwd_fused_dq: bool = False  # dQ by fp32 atomics inside the dK/dV pass: slower here (dense 320 -> 309, jagged
    #                             275 -> 248: the dK/dV kernel already spills at 255 registers), so off
    bcast_fused_dq: bool = True  # broadcast Q, non-deterministic: fused dQ into bcast_dq_slabs fp32 slabs: 130 -> 211
    bcast_dq_slabs: int = 1  # slab p % n for program p; 1 slab (L2-resident) beat one slab per program (174)
    bwd_dq_tma: bool = True  # fused dQ atomics as TMA bulk reductions (sm_90, 16-bit, unpadded D), else red.global
    # (The warp-specialized forward, which hung on the H200, and the slower warp-specialized dQ pass live at the git
    # tag experiment/warp-specialize: bench/NOTES.md v5.)
    one_wave_unsorted: bool = True  # no sorted tile list when every work item runs at once (scheduling.one_wave)
    # torch.compile with symbolic sizes, where one wave cannot be decided from shapes without a guard: True builds the
    # sorted list (+3 launches: right for large jagged batches), False maps unsorted slots in the kernels (fewest
    # launches: right for small ones). Not yet measured on the GPU.
    traced_sorted_lists: bool = True
    # Traced graphs (symbolic sizes) order those lists with the rank kernel (one launch, exact for any size, O(n^2)
    # compares: ~0.1 ms at 16384 slots, i.e. T = 2M rows, where the attention itself takes far longer) instead of
    # torch.sort + index_select (~6 GPU ops, ~100 us of host per list in Inductor's wrapper). H200, 2026-12-01
    # (bench/NOTES.md v11): compiled overhead-case forward 492 -> 386 us, forward + backward 1905 -> 1630, the
    # issue-9 large model step 15.5 -> 14.7 ms. JFA_TRACED_RANK_TILES=0 turns it off at import.
    traced_rank_tiles: bool = os.environ.get("JFA_TRACED_RANK_TILES", "1") != "0"
    bwd_tma: bool = True  # backward Q/dO (dK/dV pass) and K/V (dQ pass) through TMA where attn_fwd.use_tma holds:
    #                       dK/dV pointer tensors cost registers at the cap (ptxas D128: 556 B spills -> see NOTES)
    # Block-sparse kernels: K/V (forward, dQ) and Q/dO (dK/dV) through TMA where attn_fwd.use_tma holds, as the dense
    # kernels. Off until measured: ptxas (Triton 3.6, sm_90, D128 bf16) spills more with it (fwd 96 B vs 8, dQ
    # 188-240 vs 0, dK/dV 620-648 vs 216-224; bench/NOTES.md "sparse v2").
    sparse_tma: bool = False
    # Causal block-sparse forward on the non-causal config's tiles (D128: BLOCK_N 128 instead of 64). Its work items
    # hold half the key tiles of a non-causal one at the same keep ratio (39 vs 38 tiles per item on the bench's
    # keep 0.5 batch, of 64 vs 128 keys), so the per-item and per-tile overhead weighs twice; H200 keep 0.5 forward
    # without the selection: 1.55x the dense causal kernel vs 1.78x non-causal (ideal 2x). ptxas sm_90: 112 B spills
    # (non-causal config: 64 B; 64-key tiles: 0). Off until measured (bench/NOTES.md "sparse v3").
    sparse_causal_fwd_wide: bool = False
    # Block-sparse dK/dV pass with 3 pipeline stages instead of the dense config's 2 (D128 16-bit): FlexAttention's
    # sm_90 backward runs the same 64 x 128 tiles with 3 stages and 8 warps; the dense kernel measured 3 stages +6% on
    # non-causal and -14% on causal batches (every causal tile there has a masked diagonal loop; the sparse kernel
    # masks only the diagonal block's tiles). Off until measured (bench/NOTES.md "sparse v4").
    sparse_dkdv_stages3: bool = False
    # Block selection: a row of <= 128 KV blocks scored and ranked in registers (no scratch row written and read
    # back, no barrier; pooled K read in 4 slices issued together): ~6 dependent global round trips per program
    # instead of ~12. Same choices (tests). Off until measured (bench/NOTES.md "sparse v4").
    sparse_select_rows: bool = False
    # Block selection v5 (helper selectfix, bench/NOTES.md "selection v5"): the pooling loads a block's whole
    # [block, D] tile per head at once (one round trip for its 32 KB instead of ~3 dependent 8 KB steps; the pools ran
    # at 2.8 TB/s, latency-bound); the select kernel scores and ranks only the KV blocks a row can see (causal and
    # window rows: the rest are -inf and never kept, so the same choices) instead of the sequence's all. The pool
    # stays off (v6's stream replaced it); the visible range is on since the H200 run of 2026-12-03 13:15 (bench/NOTES.md
    # v20: causal selection 354 -> 299 us a call on the bench's T66944 batch, non-causal +1.7%, same choices).
    sparse_pool_whole_block: bool = False
    sparse_select_visible: bool = True
    # ... and the select kernel ranks 4 Q blocks of one sequence per program (rows of <= 128 KV blocks, in
    # registers): the offsets and the head's pooled K fetched once per 4 rows, a 4x smaller grid.
    sparse_select_grouped: bool = False
    # Selection scores in fp32 with products by mul.rn (never fused into an FMA, PTX ISA: so equal blocks still score
    # equal bits wherever they sit) instead of fp64 sums of exact products: the fp64 scores cost registers (scratch
    # select 83 -> 128 on sm_90: 6 -> 4 CTAs/SM) and ~80 M f32 -> f64 conversions a bench call. On since the H200
    # run of 2026-12-03 (v20: with the visible range, selection 348 -> 314 us non-causal, 354 -> 271 causal; the ties
    # test passes on the GPU, where FMA contraction would split ties).
    sparse_select_fp32_rn: bool = True
    # Block selection (helper select30, bench/NOTES.md "Select kernel cost, helper select30, stop 30"): a select
    # program takes 4 kv heads of its Q block, a head a warp, and keeps a row's (<= 512 blocks) top ``count`` by a
    # radix select (a bitwise binary search for the count-th largest score: 32 warp-local counts) instead of every
    # pair compared (the rank loop: ~2,900 SASS instructions a warp for a row of 128 blocks; the kernel is
    # issue-bound). Same choices (ties toward the lower index). On since the H200 run of 2026-12-03 (bench/NOTES.md
    # v22: the select kernel 151 -> 63 us non-causal, 107 -> 40 causal on the bench's T66944 batch, same choices;
    # its GPU tests passed under Triton 3.6 and 3.8); ``JFA_SELECT_RADIX=0``: the pairwise rank.
    sparse_select_radix: bool = os.environ.get("JFA_SELECT_RADIX", "1") != "0"
    # Selection pool v6 (helper poolv6, bench/NOTES.md "selection pool v6"): a pooling program streams 4 kv heads of
    # its block (slot search and offsets once for 128 KB, not 32 KB), its loop pipelined by async copies with three
    # 32-row steps in flight (the v3/v4 pool keeps one ahead: 2.8 TB/s, latency-bound); Q's and K's pooling in one
    # launch (one tail, not two). Same bits (each head's sum in the same order). On since the H200 run of 2026-12-03
    # (bench/NOTES.md v18: pools 194 -> 152-154 us, selection 369 -> 328 us a call on the bench's T66944 batch).
    sparse_pool_stream: bool = True
    sparse_pool_one_launch: bool = True
    # The selection's host path (helper selshare, bench/NOTES.md "selection host path, helper selshare, stop 28"):
    # a layout per call signature (shapes, grids, launch arguments) and its launches through plans, instead of ~45
    # arguments derived and bound per launch (~50 of the backend's ~100 us of Python, CPU count). The same
    # launches with the same arguments. On since the H200 run of 2026-12-03 (v20: the eager selection's host time
    # 473-651 -> 204-245 us a call, GPU time the same); JFA_SELECT_DIRECT=0 turns it off at import (with the op
    # layer's direct path, ``ops.block_sparse.SELECT_DIRECT``).
    sparse_select_layouts: bool = os.environ.get("JFA_SELECT_DIRECT", "1") != "0"
    # Selection outputs written by the select launch alone (helper pool45, bench/NOTES.md "selection fill, helper
    # pool45, stop 45"): each select program writes its rows' -1 before their kept ids, and one program more per
    # (sequence, kv head) writes -1 / 0 over the rows past the sequence's end (81% of the bench's index: the output
    # is -1-padded everywhere by contract), instead of torch.full + torch.zeros over the whole [B, Hkv, NQB, NKB]
    # index and counts before the pools (two launches, 23 MB written on the bench's T66944 batch, ~7 us + gaps).
    # Same bits (tests). Off until measured; JFA_SELECT_FILL=1 turns it on at import.
    sparse_select_fill: bool = os.environ.get("JFA_SELECT_FILL", "0") == "1"
    # ... and the pooling skips the Q blocks whose row ranks nothing by score (it keeps all its visible blocks, only
    # its local one, or none: geometry and the keep table decide, no score does): their pooled rows are written 0,
    # not read (the bench's causal keep 0.5 / 0.25: 43 / 83 of 523 Q blocks, 23 / 44 MB of its 548 MB). The
    # streaming one-launch pooling only (the default), not broadcast Q. Same bits for finite inputs (tests); a
    # skipped row's scores are 0 instead of q . k, which only non-finite inputs (inf * 0) could turn NaN, where the
    # select kernel keeps NaN-scored blocks. On since stop 46 (H100, tools/select_profile.py, graph replay: causal
    # keep 0.25 265.8 -> 251.5 us a selection with the fill, non-causal within +0.2 us; bench/NOTES.md "Stop 46");
    # JFA_POOL_SKIP=0 turns it off at import.
    sparse_pool_skip: bool = os.environ.get("JFA_POOL_SKIP", "1") != "0"
    # ... and the pools and the select in ONE launch (helper selover46, bench/NOTES.md "Selection overlap, helper
    # selover46"): programs take work items by an atomic ticket (Q/K pools of slot p, the select items of Q slot
    # p - lag: a wave or so later), each pool item bumps its slot's done-counter (release), a select item waits on its
    # Q slot's and its sequence's K slots' counters (acquire): the latency-bound select runs beside the pools' reads
    # instead of after them. Implies sparse_select_fill (the launch writes the whole outputs); composes with
    # sparse_pool_skip; the streaming one-launch pooling and ungrouped select only (else the two launches). Same
    # bits (tests). On since stop 46 (H100, tools/select_profile.py: a selection 252.0 -> 233.1 us causal keep 0.25,
    # 279.7 -> 267.3 non-causal, against the fill alone; the ticket and counters zeroed per call since then, two
    # memsets); JFA_SELECT_OVERLAP=0 turns it off at import.
    sparse_select_overlap: bool = os.environ.get("JFA_SELECT_OVERLAP", "1") != "0"
    # ... with its positions in longest-first order (helper seltail47, bench/NOTES.md "Selection overlap tail"):
    # sequence 0 first, then the others by K slots descending (batches of < 64 sequences; else the slot order), so
    # the pools that land last belong to short sequences, whose select items (short rows) are the ones left after
    # the pools: a shorter tail than the slot order's, which ends on whatever sequence the batch ends with (the
    # bench's: 58 blocks). Same bits (tests). Off until measured; JFA_SELECT_OVERLAP_TAIL=1 turns it on at import.
    sparse_select_overlap_tail: bool = os.environ.get("JFA_SELECT_OVERLAP_TAIL", "0") == "1"
    # Block-sparse changes of helper sparse4 that return the same results with fewer launches or dependent loads
    # (bench/NOTES.md "sparse v4"): the work lists' selected-block cost read inside tile_slots_kernel (not ~8 torch
    # ops per list); both stage split points of a work item in one pass over its ids (not two); the pooling's slot ->
    # sequence by a 64-ary search (1 dependent load for <= 64 sequences, not ceil(log2 B)); the backward's transposed
    # selection in one launch (not ~12 torch ops + a 0.35 ms sort). On since the H200 run of 2026-12-01 22:47 (T66944
    # keep 0.25: backward -2.1% non-causal, -3.2% causal; forward within +-0.7%).
    sparse_list_cost_in_kernel: bool = True
    sparse_one_pass_split: bool = True
    sparse_pool_fanout: bool = True
    sparse_transpose_kernel: bool = True
    # The backward's transposed selection as marks then lists (helper transpose46, bench/NOTES.md "Transposed
    # selection, helper transpose46"): an int8 mark per (KV block, Q block) stored from each row's used ids, then per
    # KV block a prefix sum over its marks places the Q blocks (``block_sparse_bwd.transpose_selection_scatter``),
    # instead of transpose_selection_kernel's [32 x width] compare per padded Q block row (595 us a call on the
    # bench's T66944 batch, H100 profile; ~35 MB of traffic instead). Same bits for any input (tests), any width.
    # On since stop 46 (H100, `tlx_check.py sparse-bwd-ablation`: the transpose 591-651 -> 27-36 us a call, the
    # backward 1.030 / 1.064 / 1.069 / 1.104x at keep 0.5 / 0.25 / causal 0.5 / causal 0.25); JFA_TRANSPOSE_SCATTER=0
    # turns it off at import.
    sparse_transpose_scatter: bool = os.environ.get("JFA_TRANSPOSE_SCATTER", "1") != "0"
    # ... and the backward's per-item list (``block_sparse_bwd.item_list``) from one stable sort of 32-bit keys (the
    # group order's (group, +-cost) packed by the counts' bound NQB), not a 64-bit longest-first sort then a 64-bit
    # group sort (~107 us of cub radix sort passes on the bench's 8,720 items, H100 profile). Same permutation
    # (tests). On since stop 46 (H100: the radix sorts 106-116 -> 30-32 us a call on every row; the backward with
    # scatter 1.009-1.019x over scatter alone); JFA_ITEM_ONE_SORT=0 turns it off at import.
    sparse_item_one_sort: bool = os.environ.get("JFA_ITEM_ONE_SORT", "1") != "0"
    bwd_kv_major: bool = False  # dK/dV work order kv head -> key tile (neutral: dense +2%, jagged -2%), else tile-major
    # MXFP8 forward and backward: how their dots use the MX operands (mxfp8_attn_fwd.VARIANTS: dot_scaled, fp8dot,
    # rebase, bf16smem).
    # Default: bf16smem, the fast path that passed every GPU test (H200, 2026-12-01: fp8dot is wrong on sm_90 and
    # refused there; rebase missed the error bound on a broadcast-Q case); speed not yet measured (bench/NOTES.md).
    # JFA_MXFP8_VARIANT picks another at import.
    mxfp8_variant: str = os.environ.get("JFA_MXFP8_VARIANT", "bf16smem")
    # MXFP8 quantize kernel: the head loop pipelined by Triton (async copies, two head groups in flight), (32, 1) on
    # one warp, heads split over programs (bench/NOTES.md "MXFP8 v4": predicted 75-85% of HBM). On since the H200
    # probe of 2026-12-02 (NOTES v12: 48-99% of HBM vs v3's geometry 41-95%, faster in every case, bit-exact).
    # JFA_MXFP8_QUANT_PIPELINED=0 launches the same kernel with v3's geometry (one head per iteration, every head in
    # one program, 4 warps, no pipelining).
    mxfp8_quant_pipelined: bool = os.environ.get("JFA_MXFP8_QUANT_PIPELINED", "1") != "0"
    # MXFP8 quantize, host side (bench/NOTES.md "MXFP8 quantize bandwidth, helper mxquantbw, stop 27"): a call's
    # launch geometry, constexprs and bound argument list made once per signature (``launch.launch_planned``), and
    # ``jfa_ops.mxfp8_quantize``'s eager calls of plain tensors without torch's custom-op dispatch
    # (``ops.mxfp8.QUANTIZE_DIRECT``, the same env var). Why: the bench's quantize row on the 67M-element batches is
    # host-bound (three op calls at ~150-200 us of Python each against ~215 us of GPU work). Same kernel, same
    # arguments: bit-exact. Measured (bench/NOTES.md v19): three eager calls 551 -> 301 us on B8 S4096, 589 -> 293 jagged,
    # 743 -> 447 broadcast, every bit the same: on; JFA_MXFP8_QUANT_DIRECT=0 turns it off at import.
    mxfp8_quant_direct: bool = os.environ.get("JFA_MXFP8_QUANT_DIRECT", "1") != "0"
    # MXFP8 quantize, (32, 1) pairs: columns per loop iteration (0: the head group, 128 at D128; a power of two
    # >= 16 below it: that many columns of one head, the program's iterations multiplied to keep its columns).
    # Why: the (32, 1) program is one warp holding 32 rows x 128 columns (213 registers: 9 programs, 9 warps per
    # SM), latency-bound at ~0.2 instructions per clock a warp (v19: 3409 GB/s on broadcast-Q where the (1, 32)
    # kernel, 32 warps per SM, reads the same bytes at 4094); 64 columns: 125 registers, 16 warps per SM, 16.4
    # instead of 13.9 SASS per element (bench/NOTES.md "MXFP8 (32, 1) quantize bandwidth, helper quant32, stop
    # 30"). Same bits (the columns are independent blocks). Off until measured: JFA_MXFP8_QUANT_V_COLUMNS=64.
    mxfp8_quant_v_columns: int = int(os.environ.get("JFA_MXFP8_QUANT_V_COLUMNS", "0"))
    # MXFP8 quantize, (32, 1) pairs: the register layout of a tile. "" (default): Triton's, 16-byte vectors over
    # [4, 8] lanes (a thread holds 8 rows of 16 columns; the column max takes 2 shuffle steps and every lane works out
    # the exponents of its 16 columns). "column": 4-column vectors over [1, 32] lanes, so a thread holds all 32 rows
    # of its 4 columns: the max in-thread (packed 16x2 bf16 maxima), each exponent worked out once, 32-bit row
    # offsets, the encode as packed words; sm_90: 8.6 instead of 14.5 SASS per element (5.6 instead of 11.2 on the
    # integer pipe, what bounds the default), 183 instead of 213 registers (bench/NOTES.md "MXFP8 (32, 1) quantize in
    # whole columns, helper quantv36"). Same bits. Off until measured: JFA_MXFP8_QUANT_V_LAYOUT=column.
    mxfp8_quant_v_layout: str = os.environ.get("JFA_MXFP8_QUANT_V_LAYOUT", "")
    # The TLX MXFP8 backward's MX-valued bf16 operands (``mxfp8_bwd.mx_values``) in one pass per tensor: the quantize
    # kernel writes the values itself (``mxfp8_quantize.quantize_values``, REBASE=MX_VALUES: read 2 B, write 2 B an
    # element) instead of the pair then the dequantize pass (~6.1 B: 0.47 ms of the 6.83 ms dense B8 H16 S4096 D128
    # backward on the H200). Same bits (bench/NOTES.md "MXFP8 backward operands in one pass, helper mxvalues, stop
    # 28"). On since the H200 run of 2026-12-03 (v20: operands 0.466 -> 0.291 ms dense, 0.564 -> 0.290 jagged, the
    # same bits; backward 6.82 -> 6.67 ms, 4.54 -> 4.39); JFA_MXFP8_BWD_ONE_PASS=0 turns it off at import.
    mxfp8_bwd_one_pass: bool = os.environ.get("JFA_MXFP8_BWD_ONE_PASS", "1") != "0"
    # The triton MXFP8 forward's NaN rows (JFA_MXFP8_NAN_ROWS=1): a row whose visible scores include NaN/+inf (a
    # NaN/inf block of k) gets NaN out, as the README and the reference give; off, P's E4M3 rounding saturates the
    # NaN P to 448 (min(NaN, 448) = 448) and out stays finite. One select per row in the epilogue; off by default
    # until a GPU run shows no cost (bench/NOTES.md "Autograd edges ..., helper grad44").
    mxfp8_nan_rows: bool = os.environ.get("JFA_MXFP8_NAN_ROWS", "0") != "0"


def _count_knob_changes(self, name, value):
    """Every assignment to a knob bumps ``Knobs.generation``: memos of per-call work that read knobs (the forward's
    replays, ``attn_fwd.replay_key``) key on it, so a flipped knob is seen by the next call."""
    object.__setattr__(self, name, value)
    Knobs.generation += 1


Knobs.generation = 0
Knobs.__setattr__ = _count_knob_changes
KNOBS = Knobs()


@functools.lru_cache(maxsize=1)
def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (decided before triton is imported, so read once: the
    environment lookup cost ~5 us per launch)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# Tiny tiles keep the CPU interpreter fast; tests still get several KV blocks per sequence with lengths ~40.
INTERPRETER_CONFIG = KernelConfig(block_m=16, block_n=16, num_warps=1, num_stages=1, programs_per_sm=1)
INTERPRETER_NUM_SMS = 3  # an odd program count makes the persistent striding visit tiles out of order


def head_dim_bucket(head_dim: int) -> int:
    """Padded head dim inside the kernels: next power of two, at least 16 (the smallest tl.dot K)."""
    return max(16, 1 << (head_dim - 1).bit_length())


# Two budgets: the H200-tuned entries fit sm_80's 163 KiB on the pointer path (at most 163,840 B compiled for sm_80);
# below that, down to the 99 KiB of sm_86/sm_89, the entries marked "small" (sizes: compiled for sm_86, Triton 3.9).
# Fallbacks are untuned (no such GPU measured). Below 99 KiB no entry is offered and supports() declines the GPU.
_FULL_BUDGET = SHARED_MEMORY_LIMITS[80]
_SMALL_BUDGET = SHARED_MEMORY_LIMITS[86]


def _fwd(bucket: int, itemsize: int, causal: bool, shared_memory: int) -> KernelConfig:
    small = shared_memory < _FULL_BUDGET
    if itemsize == 4:  # fp32: twice the bytes per tile, ieee dots; correctness path, not a speed path
        return KernelConfig(64, 32, 4, 2) if bucket <= 128 else KernelConfig(32, 32, 4, 1)
    if bucket <= 64:
        return KernelConfig(128, 64, 4, 3, programs_per_sm=2)
    if bucket <= 128:
        # H200, dense B8 H16 S4096 D128 bf16 with TMA: 437 TFLOP/s (causal 350); causal BLOCK_N 128 gave 353 (noise).
        # small: BLOCK_N 128 needs 163,840 B, 64 needs 98,304.
        return KernelConfig(128, 128 if not (causal or small) else 64, 8, 3)
    return KernelConfig(128, 64, 8, 2) if not small else KernelConfig(64, 32, 4, 2)  # 147,456 B vs 69,632


def _dkdv(bucket: int, itemsize: int, shared_memory: int) -> KernelConfig:
    # KV-stationary: block_n keys stay in registers (k, v, dk, dv accumulators), block_m query rows stream.
    small = shared_memory < _FULL_BUDGET
    if itemsize == 4:
        if bucket <= 128:
            return KernelConfig(32, 64, 4, 1) if not small else KernelConfig(32, 32, 4, 1)  # 106,496 B vs 69,632
        return KernelConfig(16, 32, 4, 1)  # 100,352 B
    if bucket <= 64:
        return KernelConfig(64, 128, 8, 2)
    if bucket <= 128:
        # H200 D128 bf16: 3 stages 304 TFLOP/s whole-backward non-causal but 203 causal (vs 286 / 237); 128x128: 129.
        # 99 KiB: 64x128 fits (98,816 B) but not with broadcast-Q's fused dQ (+ a [64, D] fp32 tile: 131,584 B).
        return KernelConfig(64 if not small else 32, 128, 8, 2)
    return KernelConfig(32, 64, 8, 2) if not small else KernelConfig(32, 32, 4, 2)  # 102,656 B vs 67,840


def _dq(bucket: int, itemsize: int, shared_memory: int) -> KernelConfig:
    # Query-stationary: q, dO, dq accumulator in registers, keys stream.
    small = shared_memory < _FULL_BUDGET
    if itemsize == 4:
        return KernelConfig(64, 32, 4, 1) if bucket <= 128 else KernelConfig(32, 16, 4, 1)
    if bucket <= 64:
        return KernelConfig(128, 64, 8, 2)
    if bucket <= 128:
        # H200, dense B8 H16 S4096 D128 bf16, whole backward: 3 stages 320 TFLOP/s (causal 264) vs 2 stages 286 (237).
        return KernelConfig(128, 64, 8, 3 if not small else 2)  # 131,072 B vs 98,304
    return KernelConfig(64, 64, 8, 2) if not small else KernelConfig(32, 32, 4, 2)  # 139,264 B; 64x32: 102,400


@functools.lru_cache(maxsize=None)  # pure: one lookup per launch instead of the table's branches (host time)
def table_config(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool,
                 shared_memory: int) -> Optional[KernelConfig]:
    """The table's entry for a device with ``shared_memory`` bytes per block (opt-in maximum), None when even the
    smallest entry needs more. kernel: 'fwd', 'dkdv' or 'dq'."""
    if shared_memory < _SMALL_BUDGET:
        return None
    bucket, itemsize = head_dim_bucket(head_dim), dtype.itemsize
    if kernel == "fwd":
        return _fwd(bucket, itemsize, causal, shared_memory)
    if kernel == "dkdv":
        return _dkdv(bucket, itemsize, shared_memory)
    if kernel == "dq":
        return _dq(bucket, itemsize, shared_memory)
    raise ValueError(f"unknown kernel {kernel!r}")


# --------------------------------------------------------------------------------- device facts, cached per index
def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _shared_memory_limit(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).shared_memory_per_block_optin


def shared_memory_limit(device: torch.device) -> int:
    """Bytes of shared memory one program may use on this CUDA device (the opt-in maximum per block)."""
    return _shared_memory_limit(_index(device))


def get_config(kernel: str, head_dim: int, dtype: torch.dtype, causal: bool, device: torch.device) -> KernelConfig:
    """The launch config for ``device`` (INTERPRETER_CONFIG under the interpreter); see ``table_config``."""
    if interpreting():
        return INTERPRETER_CONFIG
    cfg = table_config(kernel, head_dim, dtype, causal, shared_memory_limit(device))
    if cfg is None:  # supports() refuses such devices, so only a direct call gets here
        raise RuntimeError(f"no {kernel} launch config fits the {shared_memory_limit(device)} bytes of shared "
                           f"memory per block of {device}")
    return cfg


def nvidia() -> bool:
    """A CUDA (not ROCm) build of torch: TMA and other sm_90 paths are NVIDIA hardware features (an AMD MI300
    reports capability 9.4)."""
    return torch.version.cuda is not None and torch.version.hip is None
