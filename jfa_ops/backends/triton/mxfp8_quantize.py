"""MXFP8 quantize kernel: ``x [T, H, D]`` -> (E4M3 data, E8M0 scale) for the three block shapes of
``meta_kernels.mxfp8`` (layouts there), bit-exact with the reference (``backends/reference/mxfp8.py``).

One program per 32-row tile, looping over the heads in groups (``heads_per_program``): one pass over the input,
the loop's load pipelined by Triton (async copies, two groups in flight). (1, 32) blocks take rows [32 tile, +32);
(32, 1) / (32, 32) blocks take one scale row (32 rows of one sequence), found once per program by a 64-ary search
over the offsets (sequence b owns scale rows ``offsets[b] // 32 + b ...``; programs on scale rows no sequence owns
write scale 0).
The shared exponent comes from the largest fp32 magnitude bits of the block (non-finite: bits >= inf's); data and
scale are stored through uint8 views. On the GPU the E4M3 rounding is the hardware conversion (12-13.5 SASS
instructions per element in all); the interpreter uses the exact integer rounding.

``REBASE`` modes (the TLX MXFP8 forward's operands from high-precision inputs, ``quantize_rebased_rows`` /
``quantize_rebased_v_tiles``): the same kernel re-bases its MX blocks in registers with ``mxfp8_rebase.py``'s
arithmetic (the helpers below) and writes that layout instead of the pair: bit for bit what ``rebase_rows`` /
``rebase_v_tiles`` make of ``quantize``'s output, one pass over the input (V: one program per 128-key tile of a
sequence, the tile loaded as its four (32, 1) blocks and stored transposed).
"""
from __future__ import annotations

import math
import os
from typing import Optional, Sequence, Tuple

import torch
import triton
import triton.language as tl

import meta_kernels.mxfp8 as mx
from ..base import tracing
from .common import row_strides
from .attn_fwd import broadcast_offsets
from .configs import KNOBS, interpreting
from .launch import launch, launch_planned
from .scheduling import fanout_search_steps, fanout_sequence, padded_tile, padded_tile_keys, padded_tiles

QUANT_BLOCK_R = 32  # rows per program (and per scale row of (32, 1) / (32, 32) blocks)
# configs.KNOBS.mxfp8_quant_pipelined: each program loops over head groups of QUANT_COLUMNS elements a row (heads x padded head_dim), 32 rows: 8 KB of
# bf16 per iteration, the loop's load pipelined QUANT_STAGES deep (two groups in flight: 16 KB per program). Warps
# per 128 columns: (32, 1) blocks reduce along rows, so one warp holds 32 rows x 4 columns a thread and needs no
# cross-warp reduction (sm_90 SASS per element: 13.5 instructions with 1 warp, 18 with 2, 25 with 4); the blocks
# along a row are reduced inside a thread at any width (12 per element at 4 warps, fewest registers).
# bench/NOTES.md "MXFP8 v4".
QUANT_COLUMNS = 128
QUANT_STAGES = 3
QUANT_GROUPS = 4  # head groups per program: more programs where T is small and H large (dense T32768 H16: 4128)
# V's (32, 1) kernel (plain pairs, as the attention forwards quantize V): every head in one program, no head split
# (1 << 20 groups). Default since 2026-12-04 (stop 33; bench/NOTES.md v23): V's kernel 1.005x / 1.053x / 1.058x on
# the bench's bcast / B8 / jagged batches, the forward's three quantize calls 0.999x / 1.025x / 1.026x, same bits.
# JFA_MXFP8_V_QUANT_GROUPS=0: QUANT_GROUPS as for Q and K (the old geometry); another value: that many groups.
V_QUANT_GROUPS = int(os.environ.get("JFA_MXFP8_V_QUANT_GROUPS", str(1 << 20))) or None  # read at launch
QUANT_WARPS = {"rows": 4, "cols": 1, "v_tiles": 8}  # per 128 columns: (1, 32) and (32, 32) ("rows"), (32, 1)
# ("cols"), (32, 1) re-based per 128-key tile ("v_tiles": 128 rows, the column maxima across warps)
V3_GROUPS = 1 << 20  # configs.KNOBS.mxfp8_quant_pipelined off: every head in one program
# configs.KNOBS.mxfp8_quant_v_layout "column" ((32, 1) pairs, pipelined): 4-column vectors (COL_VEC: 128 columns
# over the 32 lanes of the one warp), the copy one head group ahead (STAGES 2: 8 KB of shared memory, so that
# registers, not shared memory, bound the programs per SM), V_QUANT_GROUPS' head split unless V_COLUMN_GROUPS is set
V_COLUMN_VEC = 4
V_COLUMN_STAGES = 2
V_COLUMN_GROUPS = None


def heads_per_program(heads: int, block_d: int) -> int:
    """Heads per loop iteration of a quantize program: QUANT_COLUMNS // block_d, at least 1, at most ``heads``
    rounded up to a power of two."""
    return max(1, min(triton.next_power_of_2(heads), QUANT_COLUMNS // block_d))


def quantize_warps(block, columns: int, block_r: int = QUANT_BLOCK_R) -> int:
    """Warps of a quantize program whose iterations cover ``columns`` (heads per program x padded head_dim) of
    ``block_r`` rows."""
    kind = "rows" if tuple(block) != (32, 1) else "cols" if block_r == QUANT_BLOCK_R else "v_tiles"
    return max(1, QUANT_WARPS[kind] * columns // 128)


@triton.jit
def _shared_exponent(amax, RCEIL: tl.constexpr):
    """E8M0 exponent of blocks with absolute maxima ``amax`` (fp32, finite, >= 0), int32 in [-127, 127]:
    floor(log2 amax) - 8 from the exponent bits, + 1 for "rceil" when the significand exceeds 1.75; zero and fp32
    subnormal maxima give -127 (their exponent would be below it anyway)."""
    bits = amax.to(tl.int32, bitcast=True)
    exp_field = (bits >> 23) & 0xFF
    shared = exp_field - 127 - 8
    if RCEIL:
        shared += ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)  # 0x600000: significand 1.75
    shared = tl.where(exp_field == 0, -127, shared)
    return tl.minimum(tl.maximum(shared, -127), 127)


@triton.jit
def _encode(x, shared, bad, HW_CVT: tl.constexpr):
    """Data bits (uint8) of fp32 ``x`` under exponents ``shared`` (broadcast against x); ``bad`` (non-finite block)
    gives NaN data. HW_CVT: the GPU's fp32 -> E4M3 conversion (round to nearest even, saturating to +-448: the
    spec's clamp); ``mul.f32`` keeps fp32 subnormals, so x * 2**127 is exact for them."""
    inv_scale = ((127 - shared) << 23).to(tl.float32, bitcast=True)  # 2**-shared, exact: shared in [-127, 120]
    if HW_CVT:
        data = (x * inv_scale).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        # The interpreter: fp32 subnormal x (from bf16/fp32 inputs) never enter arithmetic (numpy may flush them):
        # x = m * 2**-149, so x * 2**-shared = m * 2**(-149 - shared), exact for shared <= -23 (the factor a normal
        # power of two); larger scales put it below 2**-10, which E4M3 rounds to 0. It was m * 2**-22 at shared ==
        # -127 only: a block of subnormals whose maximum is just above them (shared -126..-117) lost its values
        # (hypothesis, stop 19). Sign kept (-0).
        xb = x.to(tl.int32, bitcast=True)
        factor = ((-22 - shared) << 23).to(tl.float32, bitcast=True)  # 2**(-149 - shared) for shared <= -23
        tiny = tl.where(shared <= -23, (xb & 0x7FFFFF).to(tl.float32) * factor, 0.0)
        tiny = (tiny.to(tl.int32, bitcast=True) | (xb & -2147483648)).to(tl.float32, bitcast=True)
        y = tl.where((xb & 0x7F800000) == 0, tiny, x * inv_scale)
        data = _e4m3_bits(tl.minimum(tl.maximum(y, -448.0), 448.0))
    return tl.where(bad, 0x7F, data).to(tl.uint8)


@triton.jit
def _encode_packed(x, shared, bad):
    """``_encode``'s HW_CVT bits, four elements a step (one 32-bit word: element k in byte k): two paired
    conversions (``cvt`` d, a, b puts b in the low byte, as Triton's own pairs) and one ``lop3`` that lays 0x7F over
    the bytes of non-finite blocks. ``tl.where`` on the bytes cost an unpack, a select and a repack per byte (3.2 SASS
    an element on sm_90)."""
    inv_scale = ((127 - shared) << 23).to(tl.float32, bitcast=True)
    nan_bytes = tl.broadcast_to(tl.where(bad, 0xFF, 0).to(tl.uint8), x.shape)
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; .reg .b32 w; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; "
        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; mov.b32 w, {lo, hi}; lop3.b32 $0, w, $5, 0x7f7f7f7f, 0xb8; }",
        "=r,r,r,r,r,r", [x * inv_scale, nan_bytes], dtype=tl.uint8, is_pure=True, pack=4)  # 0xb8: (w & ~m) | (m & c)


@triton.jit
def _e4m3_bits(y):
    """float8_e4m3fn bits of fp32 ``y`` (|y| <= 448), rounded to nearest, ties to even, by integer arithmetic: the
    Triton interpreter's fp32 -> fp8 cast does not round to nearest, and this one gives the same bits everywhere.
    Normals (|y| >= 2**-6): keep 3 of fp32's 23 mantissa bits (RNE on the dropped 20), re-bias the exponent 127 ->
    7. Subnormals: |y| * 2**9 rounded to an integer (the add/subtract of 1.5 * 2**23 rounds it, ties to even);
    the integer is the code, and 8 is the smallest normal's code too."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a_bits = bits & 0x7FFFFFFF
    a = a_bits.to(tl.float32, bitcast=True)
    normal = ((a_bits + 0x7FFFF + ((a_bits >> 20) & 1)) >> 20) - (120 << 3)
    subnormal = ((a * 512.0 + 12582912.0) - 12582912.0).to(tl.int32)  # 12582912 = 1.5 * 2**23
    return (tl.where(a < 0.015625, subnormal, normal) | sign).to(tl.uint8)


@triton.jit
def _to_e4m3(y, HW_CVT: tl.constexpr):
    """fp32 ``y`` (|y| <= 448) -> float8e4nv, round to nearest even: the GPU's conversion instruction, or integer
    arithmetic under the interpreter (whose cast does not round to nearest)."""
    if HW_CVT:
        return y.to(tl.float8e4nv)
    return _e4m3_bits(y).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _pow2(e):
    """2.0**e for int32 ``e`` in [-127, 127], exact (2**-127 is an fp32 subnormal)."""
    return tl.where(e > -127, ((e + 127) << 23), 0x400000).to(tl.float32, bitcast=True)


@triton.jit
def _e8m0_value(bits):
    """fp32 value of E8M0 scale bits (uint8): 2**(bits - 127), NaN for 0xFF."""
    b = bits.to(tl.int32)
    return tl.where(b == 255, float("nan"), _pow2(b - 127))


@triton.jit
def _rebase_rows(values, exps, HW_CVT: tl.constexpr):
    """``values [R, C * 32]`` (fp32, exact MX values) with block exponents ``exps [R, C]`` (int32) -> (E4M3 data,
    row exponents [R]): every row re-expressed under its largest block scale (``mxfp8_attn_fwd``'s ``rebase``
    variant; ``mxfp8_rebase.py``)."""
    R: tl.constexpr = values.shape[0]
    C: tl.constexpr = exps.shape[1]
    e_max = tl.max(exps, 1)
    inv = _pow2(-tl.maximum(e_max, -126))  # 2**-e_max (e_max >= -127 never overflows: data <= 448)
    return _to_e4m3(values * inv[:, None], HW_CVT), e_max


@triton.jit
def _rebase_cols(data, exps, HW_CVT: tl.constexpr):
    """V tile ``data [NB * 32, D]`` (E4M3) with (32, 1) block exponents ``exps [NB, D]`` (int32) -> (E4M3 data,
    column exponents [D]): every column under its largest block scale in the tile."""
    NB: tl.constexpr = exps.shape[0]
    D: tl.constexpr = exps.shape[1]
    e_max = tl.max(exps, 0)
    y = _rebase_by(tl.reshape(data, (NB, 32, D)), (exps - e_max[None, :])[:, None, :], HW_CVT)
    return tl.reshape(y, (NB * 32, D)), e_max


@triton.jit
def _rebase_by(data, drop, HW_CVT: tl.constexpr):
    """E4M3 ``data`` x 2**drop (``drop`` <= 0: its block exponent minus the largest, broadcast against data),
    rounded to E4M3."""
    return _to_e4m3(data.to(tl.float32) * _pow2(tl.maximum(drop, -127)), HW_CVT)


@triton.jit
def _values_rows(data, scale_bits):
    """fp32 values of ``data [R, C * 32]`` (E4M3) with (1, 32) scale bits ``[R, C]``."""
    R: tl.constexpr = data.shape[0]
    C: tl.constexpr = scale_bits.shape[1]
    return tl.reshape(tl.reshape(data.to(tl.float32), (R, C, 32)) * _e8m0_value(scale_bits)[:, :, None], (R, C * 32))


@triton.jit
def _row_factor(e_max):
    """fp32 row factor of re-based rows with exponents ``e_max``: 2**max(e_max, -126) (``_rebase_rows`` divided by
    that: a row of 2**-127 blocks is stored x 2**126); NaN where a block's scale is NaN (e_max 128)."""
    return _e8m0_value((tl.maximum(e_max, -126) + 127).to(tl.uint8))


# what the kernel writes (REBASE): the MX pair, or the TLX MXFP8 forward's operands re-based from it in registers
# (bit for bit what ``mxfp8_rebase.rebase_rows`` / ``rebase_v_tiles`` make of the pair, without its round trip
# through memory: the bf16 input is read once and E4M3 written once)
PAIR: tl.constexpr = tl.constexpr(0)
REBASED_ROWS: tl.constexpr = tl.constexpr(1)  # (1, 32) blocks -> data under each row's largest scale + row factors
REBASED_V_TILES: tl.constexpr = tl.constexpr(2)  # (32, 1) blocks -> V^T per key tile under each column's largest
MX_VALUES: tl.constexpr = tl.constexpr(3)  # (1, 32) / (32, 32) blocks -> their MX values in DATA's dtype, no scales
P_SCALE_LOG2 = 8  # the TLX forward's P enters its FP8 dot as P * 2**8 (P <= 1: <= 256 < 448); V factors carry 2**-8
# a kernel reads module globals only as constexprs (the interpreter allows plain ones; the GPU compiler does not)
INV_P_SCALE: tl.constexpr = tl.constexpr(1.0 / (1 << P_SCALE_LOG2))


@triton.jit
def _widened(x, X_BF16_BITS: tl.constexpr):
    """(fp32 x, |x| as fp32 bits: ordered like the magnitudes, and >= inf's bits exactly where x is not finite) of
    a loaded tile; X_BF16_BITS: bf16 read as int16 bits and widened exactly (the interpreter's cast flushes
    subnormals)."""
    if X_BF16_BITS:
        bits = x.to(tl.int32) << 16
        x = bits.to(tl.float32, bitcast=True)
    else:
        x = x.to(tl.float32)
        bits = x.to(tl.int32, bitcast=True)
    return x, bits & 0x7FFFFFFF


@triton.jit
def _empty_rows(LSE, r64, r_ok, head0, rows, heads, HP: tl.constexpr, BLOCK_D: tl.constexpr):
    """The magnitude bits above which an element of a [BLOCK_R, HP * BLOCK_D] tile (rows ``r64``, heads from
    ``head0``) is dropped: inf's bits - 1 on rows whose ``LSE [heads, rows]`` is -inf (their NaN/inf elements, and
    only those: every finite input keeps its bits), the largest int32 elsewhere (nothing). lse loaded once per row
    and head ([BLOCK_R, HP]), broadcast over each head's columns."""
    h = head0 + tl.arange(0, HP)
    lse = tl.load(LSE + h.to(tl.int64)[None, :] * rows + r64[:, None], mask=r_ok[:, None] & (h < heads)[None, :],
                  other=0.0)
    lim = tl.where(lse == float("-inf"), 0x7F7FFFFF, 0x7FFFFFFF)
    return tl.reshape(tl.broadcast_to(lim[:, :, None], (lim.shape[0], HP, BLOCK_D)), (lim.shape[0], HP * BLOCK_D))


@triton.jit
def _v_tile_factor(e_max):
    """fp32 column factor of a re-based V tile with column exponents ``e_max``, over P's fixed scale 2**8."""
    return _e8m0_value((e_max + 127).to(tl.uint8)) * INV_P_SCALE


@triton.jit(do_not_specialize=["rows", "heads", "num_seqs"])
def mxfp8_quantize_kernel(X, DATA, SCALE, OFFSETS, F, rows, heads, num_seqs,
                          stride_xt, stride_xh, stride_dt, stride_dh, stride_st, stride_sh, stride_vtrow,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr,
                          ROW_BLOCKS: tl.constexpr, SQUARE: tl.constexpr, RCEIL: tl.constexpr,
                          BLOCK_R: tl.constexpr, SEARCH_STEPS: tl.constexpr, X_BF16_BITS: tl.constexpr,
                          HW_CVT: tl.constexpr, GROUPS: tl.constexpr, STAGES: tl.constexpr,
                          REBASE: tl.constexpr, HEAD_CHUNKS: tl.constexpr, COL_VEC: tl.constexpr,
                          EMPTY_ROWS: tl.constexpr, KEY_TILE: tl.constexpr = 0):
    """Program (``tile``, head split): GROUPS iterations of HEADS_PER_PROGRAM (HP) heads of one tile of BLOCK_R rows,
    each one [BLOCK_R, HP * BLOCK_D] tile (column j: head j // BLOCK_D, element j % BLOCK_D). ROW_BLOCKS False:
    (1, 32) blocks, rows [tile * BLOCK_R, +BLOCK_R). ROW_BLOCKS True: the tile's rows of one sequence in the padded
    layout (sequence b's tiles from offsets[b] // BLOCK_R + b); SQUARE: (32, 32) blocks, else (32, 1). STAGES: the
    head loop's pipelining depth. HEAD_CHUNKS > 1 ((32, 1) pairs, HP 1): an iteration takes BLOCK_D // HEAD_CHUNKS
    columns of one head (``KNOBS.mxfp8_quant_v_columns``), GROUPS iterations per program. COL_VEC > 0 ((32, 1)
    pairs, ``KNOBS.mxfp8_quant_v_layout``): the tile's loads and stores in vectors of COL_VEC columns, so that a
    warp's threads lie along the columns and each holds whole columns (the column max in-thread).
    REBASE (``PAIR``: DATA, SCALE the pair's bits): ``REBASED_ROWS`` ((1, 32)): DATA the rows re-based, F the row
    factors [H, T]; ``REBASED_V_TILES`` ((32, 1), BLOCK_R the key tile): DATA = V^T [H * D, tiles * BLOCK_R] (row
    stride stride_vtrow), F the column factors / 2**8 [tiles, H, D]; padding tiles write nothing.
    EMPTY_ROWS ((32, 32) blocks, PAIR or MX_VALUES: the MXFP8 backward's dO): F is lse [heads, rows] (fp32,
    contiguous); NaN/inf elements of rows whose lse is -inf (rows that see no key) are read as 0 (``_empty_rows``).
    KEY_TILE > 0 (``REBASED_ROWS``, ``quantize_rebased_key_tiles``): program ``tile`` takes BLOCK_R keys of tile
    ``tile // (KEY_TILE // BLOCK_R)`` of V's padded layout (OFFSETS the kv offsets) and writes the row factors in
    ``mxfp8_rebase.key_factor_tiles``' layout [tiles, H, KEY_TILE], zeros past the sequence's end."""
    tl.static_assert(BLOCK_D >= HEAD_DIM)
    tl.static_assert(BLOCK_D % 32 == 0)
    HP: tl.constexpr = HEADS_PER_PROGRAM
    NC: tl.constexpr = BLOCK_D // 32  # 32-column groups per head (padded)
    tl.static_assert(HEAD_CHUNKS == 1 or (ROW_BLOCKS and not SQUARE and REBASE == PAIR and HP == 1))
    tl.static_assert(COL_VEC == 0 or (ROW_BLOCKS and not SQUARE and REBASE == PAIR))
    COLS: tl.constexpr = HP * BLOCK_D // HEAD_CHUNKS  # columns per iteration
    tile = tl.program_id(0)
    jj = tl.arange(0, COLS)
    gg = tl.arange(0, HP * NC)  # (head, 32-column group) of the scale columns
    if ROW_BLOCKS:
        tl.static_assert(BLOCK_R == 32 or REBASE == REBASED_V_TILES)
        seq = fanout_sequence(OFFSETS, tile, num_seqs, 0, BLOCK_R, SEARCH_STEPS)
        start = tl.load(OFFSETS + seq)
        row0 = start + (tile - (start // BLOCK_R + seq)) * BLOCK_R
        # the tile's rows [row0, row0 + n) kept inside [0, rows): bad offsets (JFA_VALIDATE=deferred lets them
        # through) give garbage, never an access outside x or DATA; a no-op on good offsets (0 <= start <= row0,
        # end <= rows; a padding tile's row0 >= end: n <= 0). Two forms, each the cheaper on sm_90 for its kernels
        # (ptxas is sensitive to it, bench/NOTES.md "Stop 37"): a clamped row0 cost the default kernels 12 SASS moves
        # per iteration of V's loop, the count form cost the column layout 5 registers (188 > 184) and end = int32's
        # least when row0 is outside cost it 34
        end = tl.load(OFFSETS + seq + 1)
        r = tl.arange(0, BLOCK_R)
        if COL_VEC > 0:
            end = tl.minimum(end, rows)
            row0 = tl.minimum(tl.maximum(row0, 0), rows)
            n = end - row0
            r += row0
            r_ok = r < end
        else:  # the max before the difference: no int32 wrap
            n = tl.where((row0 >= 0) & (row0 <= rows), tl.maximum(tl.minimum(end, rows), row0) - row0, 0)
            r_ok = r < n
            r += row0
        owned = n > 0  # else a scale row no sequence owns: scale 0, no data; r_ok all False then
    elif KEY_TILE > 0:  # K's rows by key tile, their factors tiled (configs.MXFP8_TILED_KEY_FACTORS)
        tl.static_assert(REBASE == REBASED_ROWS and KEY_TILE % BLOCK_R == 0)
        key_tile = tile // (KEY_TILE // BLOCK_R)
        seq, kv_row0, len_k, n0 = padded_tile(OFFSETS, key_tile, num_seqs, KEY_TILE, SEARCH_STEPS)
        key_col = tile % (KEY_TILE // BLOCK_R) * BLOCK_R + tl.arange(0, BLOCK_R)  # within the key tile
        keys = n0 + key_col
        r_ok = padded_tile_keys(keys, n0, kv_row0, len_k, rows)  # bad offsets: nothing read
        r = kv_row0 + keys
        owned = True
    else:
        tl.static_assert(REBASE != REBASED_V_TILES)
        r = tile * BLOCK_R + tl.arange(0, BLOCK_R)
        r_ok = r < rows
        owned = True
    r64 = r.to(tl.int64)
    # Triton pipelines this loop's load (async copies into shared memory, STAGES - 1 head groups ahead): the bytes
    # in flight do not depend on where ptxas places register loads (it sank them behind the arithmetic: one tile in
    # flight per program, bench/NOTES.md "MXFP8 v4").
    # the loop runs over heads (HEAD_CHUNKS 1) or over chunks of heads, HP per iteration
    first = tl.program_id(1) * (GROUPS * HP)
    for chunk0 in tl.range(first, tl.minimum(heads * HEAD_CHUNKS, first + GROUPS * HP), HP, num_stages=STAGES):
        head0 = chunk0 // HEAD_CHUNKS
        head = head0 + jj // BLOCK_D
        if COL_VEC > 0:
            # jj % BLOCK_D, seen by Triton's axis analysis as runs of COL_VEC: its coalescing then gives a thread
            # COL_VEC columns and spreads the lanes along the columns (128 / 4: [1, 32]) rather than 16-byte vectors
            # over [4, 8] lanes, so that a thread holds all 32 rows of its columns (the column max without shuffles,
            # each column's exponent worked out once, not in 4 lanes). (jj % BLOCK_D remapped lost the runs at D64.)
            d = jj // COL_VEC % (BLOCK_D // COL_VEC) * COL_VEC + jj % COL_VEC
        else:
            d = jj % BLOCK_D
        if HEAD_CHUNKS > 1:
            d += chunk0 % HEAD_CHUNKS * COLS
        col_ok = (d < HEAD_DIM) & (head < heads)
        head64 = head.to(tl.int64)
        mask = r_ok[:, None] & col_ok[None, :]
        if COL_VEC > 0:
            # a scalar base and int32 offsets (loop-invariant at HEAD_CHUNKS 1): 32 rows of 64-bit pointers a thread
            # for the copy ahead and as many for the store took all 255 registers and spilled
            rr = tl.arange(0, BLOCK_R)[:, None]
            x_ptrs = (X + (row0.to(tl.int64) * stride_xt + head0.to(tl.int64) * stride_xh)) + (
                rr * stride_xt + (jj // BLOCK_D * stride_xh + d)[None, :])
        else:
            x_ptrs = X + r64[:, None] * stride_xt + (head64 * stride_xh + d)[None, :]
        x_in = tl.load(x_ptrs, mask=mask, other=0)
        x, a = _widened(x_in, X_BF16_BITS)
        if EMPTY_ROWS:
            tl.static_assert(SQUARE and HEAD_CHUNKS == 1 and COL_VEC == 0)
            # a row that sees no key has the constant out 0: its dO reaches no gradient, but one NaN/inf element
            # would give its 32 x 32 block a NaN scale (NaN dO for the block's rows that see keys)
            # (sm_90 SASS: ISETP, FSEL, LOP3 an element. Selecting a as well kept the mask live: 80 -> 112 registers
            # in the values kernel; the magnitude recomputed from x keeps 79)
            x = tl.where(a > _empty_rows(F, r64, r_ok, head0, rows, heads, HP, BLOCK_D), 0.0, x)
            a = x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
        g_head = head0 + gg // NC
        g_ok = (gg % NC < HEAD_DIM // 32) & (g_head < heads)
        g_off = g_head.to(tl.int64) * stride_sh + gg % NC
        if REBASE == REBASED_V_TILES:
            # (32, 1) blocks, NB per column: the tile as [32 rows, NB * C] (column j: block j // C, column j % C of
            # the head group), so that a warp holds one block's columns and a thread 16 rows of 8 contiguous ones
            # (the block maxima within a warp, 16-byte loads from the copy buffer, 16 keys per V^T row per thread)
            NB: tl.constexpr = BLOCK_R // 32
            C: tl.constexpr = HP * BLOCK_D
            key3 = tl.arange(0, 32)[:, None, None] + tl.arange(0, NB)[None, :, None] * 32  # [32, NB, 1]
            x3 = tl.load(X + (row0 + key3).to(tl.int64) * stride_xt + (head64 * stride_xh + d)[None, None, :],
                         mask=(key3 < n) & col_ok[None, None, :], other=0)
            xb, ab = _widened(tl.reshape(x3, (32, NB * C)), X_BF16_BITS)
            jb = tl.arange(0, NB * C)
            b_head = head0 + jb % C // BLOCK_D
            b_d = jb % BLOCK_D
            b_col_ok = (b_d < HEAD_DIM) & (b_head < heads)
            key = (jb // C * 32)[None, :] + tl.arange(0, 32)[:, None]  # [32, NB * C]: the key within the tile
            key_ok = key < n
            amax = tl.max(ab, 0)  # [NB * C]
            bad = amax >= 0x7F800000
            shared = _shared_exponent(amax.to(tl.float32, bitcast=True), RCEIL)
            # keys past the sequence end are 0 (a NaN block's padding rows too), as rebase_v_tiles loads them
            data = tl.where(key_ok, _encode(xb, shared[None, :], bad[None, :], HW_CVT), 0).to(tl.uint8)
            exps = tl.where(bad, 255, shared + 127) - 127
            e_max = tl.max(tl.reshape(exps, (NB, C)), 0)  # [C]
            y = _rebase_by(data.to(tl.float8e4nv, bitcast=True),
                           exps - tl.reshape(tl.broadcast_to(e_max[None, :], (NB, C)), (NB * C,)), HW_CVT)
            if owned:  # padding tiles write nothing
                tl.store(DATA + (b_head.to(tl.int64) * HEAD_DIM + b_d)[None, :] * stride_vtrow
                         + tile.to(tl.int64) * BLOCK_R + key, y.to(tl.uint8, bitcast=True), mask=b_col_ok[None, :])
                tl.store(F + (tile.to(tl.int64) * heads + head64) * HEAD_DIM + d, _v_tile_factor(e_max),
                         mask=col_ok)
        else:
            if ROW_BLOCKS and not SQUARE:  # (32, 1): one block per column
                tl.static_assert(REBASE != MX_VALUES)
                if COL_VEC > 0 and X_BF16_BITS:
                    # the max of the bf16 magnitude bits (ordered as the fp32 ones), x widened after it: the packed
                    # input (64 registers) lives across the max, not 128 fp32 values
                    amax = tl.max(x_in & 0x7FFF, 0).to(tl.int32) << 16
                    x, a = _widened(x_in, X_BF16_BITS)
                else:
                    amax = tl.max(a, 0)  # [COLS]
                bad = amax >= 0x7F800000
                shared = _shared_exponent(amax.to(tl.float32, bitcast=True), RCEIL)
                if COL_VEC > 0 and HW_CVT:
                    data = _encode_packed(x, shared[None, :], bad[None, :])
                else:
                    data = _encode(x, shared[None, :], bad[None, :], HW_CVT)
                scale_bits = tl.where(bad, 255, shared + 127).to(tl.uint8)
                s_ptr = SCALE + tile.to(tl.int64) * stride_st + head64 * stride_sh + d
                tl.store(s_ptr, tl.where(owned, scale_bits, 0).to(tl.uint8), mask=col_ok)
            else:
                # (1, 32): per row and 32-column group; (32, 32): the group's max over the 32 rows too.
                x3 = tl.reshape(x, (BLOCK_R, HP * NC, 32))
                amax = tl.max(tl.reshape(a, (BLOCK_R, HP * NC, 32)), 2)  # [BLOCK_R, HP * NC]
                if SQUARE:
                    amax_sq = tl.max(amax, 0)  # [HP * NC]
                    bad = amax_sq >= 0x7F800000
                    shared = _shared_exponent(amax_sq.to(tl.float32, bitcast=True), RCEIL)
                    data = tl.reshape(_encode(x3, shared[None, :, None], bad[None, :, None], HW_CVT),
                                      (BLOCK_R, HP * BLOCK_D))
                    scale_bits = tl.where(bad, 255, shared + 127).to(tl.uint8)
                    if REBASE == MX_VALUES:  # data x 2**(scale - 127) as the dequantize pass computes it
                        values = tl.reshape(data.to(tl.float8e4nv, bitcast=True).to(tl.float32),
                                            (BLOCK_R, HP * NC, 32)) * _e8m0_value(scale_bits)[None, :, None]
                        data = tl.reshape(values, (BLOCK_R, HP * BLOCK_D)).to(DATA.dtype.element_ty)
                    else:
                        tl.store(SCALE + tile.to(tl.int64) * stride_st + g_off,
                                 tl.where(owned, scale_bits, 0).to(tl.uint8), mask=g_ok)
                else:
                    bad = amax >= 0x7F800000
                    shared = _shared_exponent(amax.to(tl.float32, bitcast=True), RCEIL)
                    data = tl.reshape(_encode(x3, shared[:, :, None], bad[:, :, None], HW_CVT),
                                      (BLOCK_R, HP * BLOCK_D))
                    scale_bits = tl.where(bad, 255, shared + 127).to(tl.uint8)  # [BLOCK_R, HP * NC]
                    if REBASE == REBASED_ROWS:  # each (row, head) under its largest block scale
                        row_bits = tl.reshape(scale_bits, (BLOCK_R * HP, NC))
                        y, e_max = _rebase_rows(
                            _values_rows(tl.reshape(data, (BLOCK_R * HP, BLOCK_D)).to(tl.float8e4nv, bitcast=True),
                                         row_bits), row_bits.to(tl.int32) - 127, HW_CVT)
                        data = tl.reshape(y.to(tl.uint8, bitcast=True), (BLOCK_R, HP * BLOCK_D))
                        f_head = head0 + tl.arange(0, HP)
                        if KEY_TILE > 0:  # every key of the tile written: zeros where no row is
                            tl.store(F + (key_tile.to(tl.int64) * heads + f_head)[None, :] * KEY_TILE
                                     + key_col[:, None],
                                     tl.where(r_ok[:, None], tl.reshape(_row_factor(e_max), (BLOCK_R, HP)), 0.0),
                                     mask=(f_head < heads)[None, :])
                        else:
                            tl.store(F + f_head.to(tl.int64)[None, :] * rows + r64[:, None],
                                     tl.reshape(_row_factor(e_max), (BLOCK_R, HP)),
                                     mask=r_ok[:, None] & (f_head < heads)[None, :])
                    elif REBASE == MX_VALUES:
                        data = _values_rows(data.to(tl.float8e4nv, bitcast=True),
                                            scale_bits).to(DATA.dtype.element_ty)
                    else:
                        tl.store(SCALE + r64[:, None] * stride_st + g_off[None, :], scale_bits,
                                 mask=r_ok[:, None] & g_ok[None, :])
            if COL_VEC > 0:
                tl.store((DATA + (row0.to(tl.int64) * stride_dt + head0.to(tl.int64) * stride_dh)) + (
                    rr * stride_dt + (jj // BLOCK_D * stride_dh + d)[None, :]), data, mask=mask)
            else:
                tl.store(DATA + r64[:, None] * stride_dt + (head64 * stride_dh + d)[None, :], data, mask=mask)


def quantize(x: torch.Tensor, offsets: Optional[torch.Tensor], block: Sequence[int], rounding: str,
             empty_rows_lse: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(data float8_e4m3fn, scale float8_e8m0fnu) of ``x [T, H, D]``; see ``meta_kernels.mxfp8``.
    ``empty_rows_lse`` ([H, T] fp32, (32, 32) blocks: the MXFP8 backward's dO and its forward's lse): NaN/inf
    elements of the rows whose lse is -inf quantized as 0 (``EMPTY_ROWS``)."""
    rows, heads, dim = x.shape
    block_rows, block_cols = tuple(block)
    data = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(mx.scale_shape(rows, heads, dim, offsets, block), dtype=torch.float8_e8m0fnu,
                        device=x.device)
    if block_rows == 1:
        programs = -(-rows // QUANT_BLOCK_R)  # cdiv (triton.cdiv is a constexpr function: ~2 us from Python)
        offs, num_seqs = x, 1  # unused pointer
    else:
        programs = scale.shape[0]
        if offsets is None:  # one sequence
            offs = broadcast_offsets(1, rows, x.device)
        else:
            offs = offsets.to(torch.int32)
        num_seqs = offs.shape[0] - 1
    if programs == 0 or heads == 0 or num_seqs == 0:
        if scale.numel():
            scale.view(torch.uint8).zero_()  # no sequence: every scale row unowned
        return data, scale
    _launch_quantize(x, data.view(torch.uint8), scale.view(torch.uint8), offs, num_seqs, programs, block, rounding,
                     PAIR, empty_rows_lse=empty_rows_lse)
    return data, scale


def quantize_values(x: torch.Tensor, offsets: Optional[torch.Tensor], block: Sequence[int], rounding: str,
                    dtype: torch.dtype = torch.bfloat16,
                    empty_rows_lse: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x [T, H, D]``'s MXFP8 values in ``dtype`` (bf16 / fp16), (1, 32) or (32, 32) blocks: bit for bit the
    quantize pair dequantized (``mxfp8_bwd.mx_values``' two passes: E4M3 x 2**(scale - 127) in fp32, NaN for a NaN
    scale, rounded to ``dtype``) in one pass over ``x``: read once, the values written once, no pair in memory.
    ``empty_rows_lse``: as ``quantize``'s."""
    block = tuple(block)
    assert block in ((1, 32), (32, 32)), block
    rows, heads, dim = x.shape
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    if block[0] == 1:
        programs, offs, num_seqs = -(-rows // QUANT_BLOCK_R), x, 1
    else:
        offs = broadcast_offsets(1, rows, x.device) if offsets is None else offsets.to(torch.int32)
        num_seqs = offs.shape[0] - 1
        programs = rows // QUANT_BLOCK_R + num_seqs  # the pair's scale rows (mx.scale_shape)
    if rows and heads and num_seqs:
        _launch_quantize(x, out, out, offs, num_seqs, programs, block, rounding, MX_VALUES,
                         empty_rows_lse=empty_rows_lse)
    return out


def quantize_rebased_rows(x: torch.Tensor, rounding: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``mxfp8_rebase.rebase_rows(*quantize(x, None, (1, 32), rounding))`` in one pass over ``x``: (E4M3 data
    [T, H, D] under each row's largest block scale, fp32 row factors [H, T]), bit for bit."""
    rows, heads, dim = x.shape
    data = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    factors = torch.empty((heads, rows), dtype=torch.float32, device=x.device)
    if rows and heads:
        bits = data.view(torch.uint8)
        _launch_quantize(x, bits, bits, x, 1, triton.cdiv(rows, QUANT_BLOCK_R), (1, 32), rounding, REBASED_ROWS,
                         factors)
    return data, factors


def quantize_rebased_key_tiles(x: torch.Tensor, kv_offsets: torch.Tensor, block_n: int,
                               rounding: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rebased_rows`` with the factors as ``mxfp8_rebase.key_factor_tiles`` lays them out, in one launch
    (``configs.MXFP8_TILED_KEY_FACTORS``): (E4M3 data [T, H, D], fp32 [tiles, H, block_n], zeros past each
    sequence's end and in padding tiles), bit for bit what ``quantize_rebased_rows`` then ``key_factor_tiles`` give
    on every row a sequence owns (valid offsets own all T). ``kv_offsets`` int32."""
    rows, heads, dim = x.shape
    num_seqs = kv_offsets.shape[0] - 1
    tiles = padded_tiles(rows, num_seqs, block_n)
    data = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    factors = torch.empty((tiles, heads, block_n), dtype=torch.float32, device=x.device)
    if tiles and heads and num_seqs and rows:
        assert block_n % QUANT_BLOCK_R == 0, block_n
        bits = data.view(torch.uint8)
        _launch_quantize(x, bits, bits, kv_offsets, num_seqs, tiles * (block_n // QUANT_BLOCK_R), (1, 32), rounding,
                         REBASED_ROWS, factors, key_tile=block_n)
    elif factors.numel():  # no key in any tile (the forward returns before this)
        factors.zero_()
    return data, factors


def quantize_rebased_v_tiles(x: torch.Tensor, kv_offsets: torch.Tensor, block_n: int,
                             rounding: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """``mxfp8_rebase.rebase_v_tiles(*quantize(x, kv_offsets, (32, 1), rounding), kv_offsets, block_n)`` in one
    pass over ``x``: (V^T E4M3 [H * D, tiles * block_n], fp32 column factors / 2**8 [tiles, H, D]), bit for bit on
    every tile a sequence owns (padding tiles are never read: neither writes them). ``kv_offsets`` int32."""
    rows, heads, dim = x.shape
    num_seqs = kv_offsets.shape[0] - 1
    tiles = padded_tiles(rows, num_seqs, block_n)
    vt = torch.empty((heads * dim, tiles * block_n), dtype=torch.float8_e4m3fn, device=x.device)
    factors = torch.empty((tiles, heads, dim), dtype=torch.float32, device=x.device)
    if rows and heads and num_seqs:
        bits = vt.view(torch.uint8)
        _launch_quantize(x, bits, bits, kv_offsets, num_seqs, tiles, (32, 1), rounding, REBASED_V_TILES, factors,
                         block_r=block_n, stride_vtrow=vt.stride(0))
    return vt, factors


def _launch_quantize(x, data_bits, scale_bits, offs, num_seqs, programs, block, rounding, rebase, factors=None,
                     block_r=QUANT_BLOCK_R, stride_vtrow=0, empty_rows_lse=None, key_tile=0):
    """``mxfp8_quantize_kernel`` over ``programs`` row tiles of ``x`` writing ``rebase``'s outputs (``MX_VALUES``:
    ``data_bits`` the values tensor, ``scale_bits`` unused); ``empty_rows_lse``: read through F (``EMPTY_ROWS``)."""
    if x.stride(2) != 1 and x.shape[2] > 1:  # the kernel indexes head_dim with unit stride (rows, heads: any)
        x = x.contiguous()
    empty_rows = empty_rows_lse is not None
    if empty_rows:
        assert factors is None and tuple(block) == (32, 32) and empty_rows_lse.shape == (x.shape[1], x.shape[0])
        factors = empty_rows_lse.float().contiguous()  # F: the kernel reads it as [heads, rows]
    dynamic = dict(X=x.view(torch.int16) if x.dtype == torch.bfloat16 else x, DATA=data_bits, SCALE=scale_bits,
                   OFFSETS=offs, F=data_bits if factors is None else factors, rows=x.shape[0], num_seqs=num_seqs)
    if not KNOBS.mxfp8_quant_direct or tracing():  # a traced call's sizes may be symbolic: no memo key
        splits, static, options = _launch_geometry(x, data_bits, scale_bits, num_seqs, block, rounding, rebase,
                                                   block_r, stride_vtrow, empty_rows, key_tile)
        launch(mxfp8_quantize_kernel, (programs, splits), {**dynamic, **static}, **options)
        return
    # configs.KNOBS.mxfp8_quant_direct: the geometry and constexprs once per signature (everything
    # _launch_geometry reads is in the key, the module's tuning constants included: tools/mxfp8_quant_probe.py sets
    # them), the argument list bound once (launch_planned): the call's Python is the allocations and one launch
    key = (x.dtype, data_bits.dtype, x.shape[1], x.shape[2], x.stride(), data_bits.stride(), scale_bits.stride(), stride_vtrow,
           tuple(block), rounding, rebase.value, block_r, fanout_search_steps(num_seqs), factors is None,
           KNOBS.mxfp8_quant_pipelined, KNOBS.mxfp8_quant_v_columns, QUANT_STAGES, QUANT_GROUPS, V_QUANT_GROUPS,
           tuple(QUANT_WARPS.values()), interpreting(), KNOBS.mxfp8_quant_v_layout, V_COLUMN_VEC, V_COLUMN_STAGES,
           V_COLUMN_GROUPS, empty_rows, key_tile)
    geometry = _GEOMETRY.get(key)
    if geometry is None:
        if len(_GEOMETRY) >= _GEOMETRY_MAX:
            _GEOMETRY.clear()
        geometry = _GEOMETRY[key] = _launch_geometry(x, data_bits, scale_bits, num_seqs, block, rounding, rebase,
                                                     block_r, stride_vtrow, empty_rows, key_tile)
    splits, static, options = geometry
    launch_planned(mxfp8_quantize_kernel, key, (programs, splits), dynamic, lambda: static, **options)


_GEOMETRY: dict = {}
_GEOMETRY_MAX = 256  # a bound, not a tuning: the key holds no row counts


def head_groups(block, rebase) -> int:
    """Head groups per program of a pipelined quantize launch (before narrower V iterations multiply them):
    ``V_QUANT_GROUPS`` for V's plain (32, 1) pairs when set, else ``QUANT_GROUPS``."""
    plain_v = tuple(block) == (32, 1) and rebase == PAIR
    return V_QUANT_GROUPS if plain_v and V_QUANT_GROUPS else QUANT_GROUPS


def _launch_geometry(x, data_bits, scale_bits, num_seqs, block, rounding, rebase, block_r, stride_vtrow,
                     empty_rows=False, key_tile=0):
    """(head splits (the grid's second axis), the kernel's arguments that are not per call: strides, heads,
    constexprs, launch options) of a quantize launch; per call are the tensors, the rows and the sequence count."""
    rows, heads, dim = x.shape
    block_rows, block_cols = tuple(block)
    block_d = triton.next_power_of_2(dim)
    chunks, col_vec = 1, 0
    if KNOBS.mxfp8_quant_pipelined:
        per_program = heads_per_program(heads, block_d)
        groups = head_groups(block, rebase)
        columns = KNOBS.mxfp8_quant_v_columns
        if tuple(block) == (32, 1) and rebase == PAIR and 0 < columns < per_program * block_d:
            # narrower iterations, as many columns per program: per_program * block_d // columns times the groups
            assert columns >= 16 and columns & (columns - 1) == 0, f"mxfp8_quant_v_columns={columns}"
            groups = groups * per_program * block_d // columns
            per_program, chunks = max(1, columns // block_d), max(1, block_d // columns)
        warps = quantize_warps(block, per_program * block_d // chunks, block_r)
        stages = QUANT_STAGES
        stride = max(x.stride(0), x.stride(1), data_bits.stride(0), data_bits.stride(1))
        if KNOBS.mxfp8_quant_v_layout == "column" and tuple(block) == (32, 1) and rebase == PAIR and (
                stride * (block_r + per_program) + block_d < 2 ** 31):
            # whole columns a thread (its offsets within a tile in int32: rows x stride + heads x stride + column)
            col_vec, stages, groups = V_COLUMN_VEC, V_COLUMN_STAGES, V_COLUMN_GROUPS or groups
    else:  # v3's geometry, the one run on the H200: one head per iteration, every head in one program
        per_program, warps, stages, groups = 1, 4 * block_r // QUANT_BLOCK_R, 1, V3_GROUPS
    static = dict(
        heads=heads, **row_strides("x", x), **row_strides("d", data_bits), **row_strides("s", scale_bits),
        stride_vtrow=stride_vtrow,
        HEAD_DIM=dim, BLOCK_D=block_d, HEADS_PER_PROGRAM=per_program, ROW_BLOCKS=block_rows > 1,
        SQUARE=block_rows > 1 and block_cols > 1, RCEIL=rounding == "rceil",
        BLOCK_R=block_r, SEARCH_STEPS=fanout_search_steps(num_seqs), X_BF16_BITS=x.dtype == torch.bfloat16,
        HW_CVT=not interpreting(), GROUPS=groups, STAGES=stages, REBASE=rebase.value, HEAD_CHUNKS=chunks,
        COL_VEC=col_vec, EMPTY_ROWS=empty_rows, KEY_TILE=key_tile)
    return triton.cdiv(triton.cdiv(heads * chunks, per_program), groups), static, dict(num_warps=warps, num_stages=1)
