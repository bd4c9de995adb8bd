"""MXFP8 operands re-based for one FP8 wgmma per tile (the TLX MXFP8 forward's input stage for pre-quantized
pairs; portable Triton). From high-precision inputs the quantize kernel writes the same operands itself, bit for bit
(``mxfp8_quantize.quantize_rebased_rows`` / ``quantize_rebased_v_tiles``, re-exported here).

Hopper has no block-scaled MMA, so the TLX MXFP8 forward (``backends/tlx/mxfp8_attn_fwd.py``) takes operands whose
scales sit outside the dot:

- ``rebase_rows``: Q and K (1, 32) pairs -> every row re-expressed under its largest block scale: E4M3 data
  ``x * 2**-e_max`` (same [T, H, D] layout) and the row factor ``2**e_max`` as fp32 [H, T] (a head's rows
  contiguous: a kernel reads one key tile's factors as one vector).
- ``rebase_v_tiles``: V (32, 1) pairs -> per tile of ``block_n`` keys (aligned to its sequence's start, the attention
  kernels' key blocks) and per column, the data under the column's largest block scale in the tile, stored
  **transposed**, V^T ``[Hkv * D, tiles * block_n]`` (keys contiguous: the K-major B operand an FP8 wgmma needs for
  P V; Hopper's FP8 wgmma takes no transposed B from shared memory) with the tile's keys past the sequence end zero
  (so no neighbour's NaN/inf reaches P V), and the column factors ``2**e_max / 2**8`` as fp32 [tiles, Hkv, D] (the
  2**-8 undoes P's fixed scale, see the kernel). Sequence b's tiles are ``kv_offsets[b] // block_n + b + i`` (the
  MX row blocks' padded layout), so shapes depend on T and B only: no host sync.

Exact while no re-based element falls below E4M3's normal range, i.e. while a block sits within ~6 binades below the
largest of its row (Q, K) or tile column (V); further below it loses low bits (an element |x| < 2**(e_max - 6)
keeps fewer than 3 mantissa bits, |x| < 2**(e_max - 10) becomes 0): an absolute error <= 2**(e_max - 10) per
element, under 2**-18 of the row's (column's) largest value (448 * 2**e_max). On N(0, 1) data blocks differ by 1-3
binades: nothing is lost (``triton.mxfp8_attn_fwd``'s ``rebase`` variant, the same arithmetic, measured it).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .configs import interpreting
from .launch import launch
from .mxfp8_quantize import (INV_P_SCALE, P_SCALE_LOG2, _rebase_cols, _rebase_rows, _row_factor,  # noqa: F401
                             _v_tile_factor, _values_rows, quantize_rebased_rows, quantize_rebased_v_tiles)
from .scheduling import (fanout_search_steps, padded_tile, padded_tile_keys, padded_tiles,
                         rows_inside)

ROWS = 32  # rows per program of rebase_rows


@triton.jit
def _rebase_row_block(X, XS, Y, r, ok, head, stride_xt, stride_xh, stride_st, stride_sh, stride_yt, stride_yh,
                      HEAD_DIM: tl.constexpr, HW_CVT: tl.constexpr):
    """Rows ``r`` (where ``ok``) of one head: E4M3 data and their (1, 32) block scales re-based to the row's largest
    scale, the data stored to Y; returns the rows' largest scale exponents (for ``_row_factor``)."""
    DC: tl.constexpr = HEAD_DIM // 32
    d = tl.arange(0, HEAD_DIM)
    data = tl.load(X + r[:, None] * stride_xt + head * stride_xh + d[None, :], mask=ok[:, None], other=0.0)
    bits = tl.load(XS + r[:, None] * stride_st + head * stride_sh + tl.arange(0, DC)[None, :], mask=ok[:, None],
                   other=0)
    y, e_max = _rebase_rows(_values_rows(data, bits), bits.to(tl.int32) - 127, HW_CVT)
    tl.store(Y + r[:, None] * stride_yt + head * stride_yh + d[None, :], y, mask=ok[:, None])
    return e_max


@triton.jit
def rebase_rows_kernel(X, XS, Y, F, T, stride_xt, stride_xh, stride_st, stride_sh, stride_yt, stride_yh,
                       HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, HW_CVT: tl.constexpr):
    """Program (row block, head): rows [r0, r0 + ROWS) of one head re-based to their largest block scale."""
    head = tl.program_id(1).to(tl.int64)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    ok = rows < T
    e_max = _rebase_row_block(X, XS, Y, rows, ok, head, stride_xt, stride_xh, stride_st, stride_sh, stride_yt,
                              stride_yh, HEAD_DIM, HW_CVT)
    tl.store(F + head * T + rows, _row_factor(e_max), mask=ok)


@triton.jit(do_not_specialize=["rows"])
def rebase_v_tiles_kernel(V, VS, KV_OFF, VT, VF, num_seqs, num_heads, rows, stride_vtrow, stride_vt, stride_vh,
                          stride_st, stride_sh, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                          SEARCH_STEPS: tl.constexpr, HW_CVT: tl.constexpr, PERMUTED_KEYS: tl.constexpr = False):
    """Program (tile, kv head): the tile's keys re-based per column, stored transposed (module docstring).
    PERMUTED_KEYS: key k of the tile stored at column ``v_key_slot(k)`` (``p_in_v_key_order``)."""
    tile = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    seq, kv_row0, len_k, n0 = padded_tile(KV_OFF, tile, num_seqs, BLOCK_N, SEARCH_STEPS)
    # padding tiles (past a sequence's last) are never read; a sequence outside V (bad offsets) is skipped
    if (n0 >= 0) & (n0 < len_k) & rows_inside(kv_row0, len_k, rows):
        keys = n0 + tl.arange(0, BLOCK_N)
        d = tl.arange(0, HEAD_DIM)
        data = tl.load(V + (kv_row0 + keys)[:, None] * stride_vt + head * stride_vh + d[None, :],
                       mask=(keys < len_k)[:, None], other=0.0)
        blocks = n0 // 32 + tl.arange(0, BLOCK_N // 32)
        bits = tl.load(VS + (kv_row0 // 32 + seq + blocks)[:, None] * stride_st + head * stride_sh + d[None, :],
                       mask=(blocks * 32 < len_k)[:, None], other=0)  # scale bits 0: 2**-127, never the maximum
        y, e_max = _rebase_cols(data, bits.to(tl.int32) - 127, HW_CVT)  # zero rows stay zero
        if PERMUTED_KEYS:  # rows renamed to their v_key_slot columns in registers: the store stays contiguous
            y = tl.trans(p_in_v_key_order(tl.trans(y)))  # (permuted column offsets: 128 one-byte stores, stop 53)
        cols = tile.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(VT + (head * HEAD_DIM + d)[None, :] * stride_vtrow + cols[:, None], y)
        tl.store(VF + (tile * num_heads + head) * HEAD_DIM + d, _v_tile_factor(e_max))


@triton.jit
def v_key_slot(k):
    """The V^T column of key ``k`` of a tile under ``configs.MXFP8_PERMUTED_V_KEYS`` (the TLX MXFP8 forward):
    within each 16 keys, bits (j: 8, t: 4 2, e: 1) of the key to (t: 8 4, j: 2, e: 1). The column that
    ``p_in_v_key_order`` gives key k's probability."""
    return (k & ~15) | (((k >> 1) & 3) << 2) | (((k >> 3) & 1) << 1) | (k & 1)


@triton.jit
def p_in_v_key_order(p):
    """P [rows, n] with its key columns in V^T's ``v_key_slot`` order: column 32a + 16h + 4t + 2j + e of the result
    is key 32a + 16h + 8j + 2t + e. Why: Hopper's wgmma accumulator gives thread t (of a quad) keys 8j + 2t + e of
    each 16 (j, e in 0..1), where P as the A operand of an E4M3 wgmma (4 bytes a register) needs keys 4t + 0..3, so
    Triton converts P's layout with 16 SHFL.IDX + 16 SEL + 16 PRMT per block (sm_90 SASS). This reordering keeps
    every value in its thread and register (a pure renaming in the linear layouts); P V sums the same products when
    V^T's keys are stored in the same order (``rebase_v_tiles(..., permuted_keys=True)``), as does P x ones."""
    R: tl.constexpr = p.shape[0]
    N: tl.constexpr = p.shape[1]
    return tl.reshape(tl.permute(tl.reshape(p, [R, N // 32, 2, 2, 4, 2]), [0, 1, 2, 4, 3, 5]), [R, N])


@triton.jit
def _keep_first(a, b):
    return a


@triton.jit
def first_column(x):
    """One element of each row of a 2-d tensor: a reduction over its columns whose combine keeps its first operand
    (the interpreter: x[:, 0]; on the GPU each thread's first element of the row, then its own value over the
    lanes', so the column depends on the layout). For a tile whose columns are all equal, such as the TLX
    MXFP8 forward's P x ones (``configs.MXFP8_ROWSUM_ONE_COLUMN``), its row max without an instruction (sm_90
    SASS: ``tl.max``'s 18 FMNMX and 4 SHFL.BFLY a block and thread are gone; ptxas drops the dead shuffles)."""
    return tl.reduce(x, 1, _keep_first)


def v_key_slots(block_n: int) -> torch.Tensor:
    """``v_key_slot`` of keys 0..block_n-1 (int64, host): the V^T column of each key of a tile."""
    return v_key_slot.fn(torch.arange(block_n))  # the jit function's Python body on a torch tensor


def permute_v_keys(vt: torch.Tensor, block_n: int) -> torch.Tensor:
    """``rebase_v_tiles``' V^T [rows, tiles * block_n] with each tile's keys moved to their ``v_key_slots`` columns
    (what ``rebase_v_tiles(..., permuted_keys=True)`` writes): a copy."""
    bits = vt.view(torch.uint8)
    out = torch.empty_like(bits)
    out.view(bits.shape[0], -1, block_n)[:, :, v_key_slots(block_n).to(vt.device)] = \
        bits.view(bits.shape[0], -1, block_n)
    return out.view(vt.dtype)


@triton.jit(do_not_specialize=["rows"])
def key_factor_tiles_kernel(KF, KV_OFF, KFT, num_seqs, num_heads, rows, BLOCK_N: tl.constexpr,
                            SEARCH_STEPS: tl.constexpr):
    """Program (tile, kv head): the tile's key factors (``key_factor_tiles``), zeros past the sequence's end."""
    tile = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    seq, kv_row0, len_k, n0 = padded_tile(KV_OFF, tile, num_seqs, BLOCK_N, SEARCH_STEPS)
    keys = n0 + tl.arange(0, BLOCK_N)
    # a sequence outside K (bad offsets) reads nothing: its tiles zero
    factors = tl.load(KF + head * rows + kv_row0 + keys, mask=padded_tile_keys(keys, n0, kv_row0, len_k, rows),
                      other=0.0)
    tl.store(KFT + (tile * num_heads + head) * BLOCK_N + tl.arange(0, BLOCK_N), factors)


def key_factor_tiles(factors: torch.Tensor, kv_offsets: torch.Tensor, block_n: int) -> torch.Tensor:
    """K's row factors [Hkv, T] (``rebase_rows``) in V's padded tile layout (``rebase_v_tiles``): fp32 [tiles, Hkv,
    block_n], sequence b's tile i at ``kv_offsets[b] // block_n + b + i``, zeros past the sequence's end (what the
    kernel's masked load of the [Hkv, T] layout gives) and in padding tiles. Every tile's row of a head starts on a
    block_n x 4-byte boundary: a TMA box can load it (a box's inner start must be 16-byte aligned; a sequence's
    first key in [Hkv, T] need not be). ``kv_offsets`` int32 on the factors' device."""
    heads, rows = factors.shape
    num_seqs = kv_offsets.shape[0] - 1
    tiles = v_tiles(rows, num_seqs, block_n)
    out = torch.empty((tiles, heads, block_n), dtype=torch.float32, device=factors.device)
    if tiles and heads:
        launch(key_factor_tiles_kernel, (tiles, heads), dict(
            KF=factors, KV_OFF=kv_offsets, KFT=out, num_seqs=num_seqs, num_heads=heads, rows=rows, BLOCK_N=block_n,
            SEARCH_STEPS=fanout_search_steps(num_seqs)), num_warps=1, num_stages=1)
    return out


@triton.jit(do_not_specialize=["rows"])
def rebase_key_tiles_kernel(X, XS, Y, KFT, KV_OFF, num_seqs, num_heads, rows, stride_xt, stride_xh, stride_st,
                            stride_sh, stride_yt, stride_yh, HEAD_DIM: tl.constexpr, ROWS: tl.constexpr,
                            BLOCK_N: tl.constexpr, SEARCH_STEPS: tl.constexpr, HW_CVT: tl.constexpr):
    """Program (ROWS keys of a tile of V's padded layout, head): ``rebase_rows_kernel``'s rows of one sequence, the
    row factors written straight into ``key_factor_tiles``' layout, zeros past the sequence's end and in padding
    tiles (``configs.MXFP8_TILED_KEY_FACTORS``: no tiling launch). Keys masked as ``key_factor_tiles_kernel`` masks
    them (``padded_tile_keys``)."""
    CHUNKS: tl.constexpr = BLOCK_N // ROWS
    tile = tl.program_id(0) // CHUNKS
    head = tl.program_id(1).to(tl.int64)
    seq, kv_row0, len_k, n0 = padded_tile(KV_OFF, tile, num_seqs, BLOCK_N, SEARCH_STEPS)
    col = tl.program_id(0) % CHUNKS * ROWS + tl.arange(0, ROWS)  # within the tile
    keys = n0 + col
    ok = padded_tile_keys(keys, n0, kv_row0, len_k, rows)  # bad offsets: nothing read, its tiles zero
    e_max = _rebase_row_block(X, XS, Y, kv_row0 + keys, ok, head, stride_xt, stride_xh, stride_st, stride_sh,
                              stride_yt, stride_yh, HEAD_DIM, HW_CVT)
    tl.store(KFT + (tile * num_heads + head) * BLOCK_N + col, tl.where(ok, _row_factor(e_max), 0.0))


def rebase_rows(data: torch.Tensor, scale: torch.Tensor):
    """(E4M3 data [T, H, D], fp32 row factors [H, T]) of a (1, 32) pair (module docstring)."""
    rows, heads, dim = data.shape
    out = torch.empty((rows, heads, dim), dtype=data.dtype, device=data.device)
    factors = torch.empty((heads, rows), dtype=torch.float32, device=data.device)
    if rows and heads:
        bits = scale.view(torch.uint8)
        launch(rebase_rows_kernel, (triton.cdiv(rows, ROWS), heads), dict(
            X=data, XS=bits, Y=out, F=factors, T=rows, stride_xt=data.stride(0), stride_xh=data.stride(1),
            stride_st=bits.stride(0), stride_sh=bits.stride(1), stride_yt=out.stride(0), stride_yh=out.stride(1),
            HEAD_DIM=dim, ROWS=ROWS, HW_CVT=not interpreting()), num_warps=4, num_stages=1)
    return out, factors


def rebase_key_tiles(data: torch.Tensor, scale: torch.Tensor, kv_offsets: torch.Tensor, block_n: int):
    """``rebase_rows`` of K's (1, 32) pair with the factors as ``key_factor_tiles`` lays them out, in one launch:
    (E4M3 data [T, Hkv, D], fp32 [tiles, Hkv, block_n]), both bit for bit what ``rebase_rows`` then
    ``key_factor_tiles`` give, on every row a sequence owns (valid offsets own all T; a row no sequence owns is not
    written). ``kv_offsets`` int32 on the data's device."""
    rows, heads, dim = data.shape
    num_seqs = kv_offsets.shape[0] - 1
    tiles = v_tiles(rows, num_seqs, block_n)
    out = torch.empty((rows, heads, dim), dtype=data.dtype, device=data.device)
    factors = torch.empty((tiles, heads, block_n), dtype=torch.float32, device=data.device)
    if tiles and heads and not (num_seqs and rows):  # no key in any tile (the forward returns before this)
        factors.zero_()
    elif tiles and heads:
        assert block_n % ROWS == 0, block_n
        bits = scale.view(torch.uint8)
        launch(rebase_key_tiles_kernel, (tiles * (block_n // ROWS), heads), dict(
            X=data, XS=bits, Y=out, KFT=factors, KV_OFF=kv_offsets, num_seqs=num_seqs, num_heads=heads, rows=rows,
            stride_xt=data.stride(0), stride_xh=data.stride(1), stride_st=bits.stride(0), stride_sh=bits.stride(1),
            stride_yt=out.stride(0), stride_yh=out.stride(1), HEAD_DIM=dim, ROWS=ROWS, BLOCK_N=block_n,
            SEARCH_STEPS=fanout_search_steps(num_seqs), HW_CVT=not interpreting()), num_warps=4, num_stages=1)
    return out, factors


def v_tiles(total_kv: int, num_seqs: int, block_n: int) -> int:
    """Tiles of the padded layout (``rebase_v_tiles``) for T keys in B sequences."""
    return padded_tiles(total_kv, num_seqs, block_n)


def rebase_v_tiles(data: torch.Tensor, scale: torch.Tensor, kv_offsets: torch.Tensor, block_n: int,
                   permuted_keys: bool = False):
    """(V^T E4M3 [Hkv * D, tiles * block_n], fp32 column factors / 2**8 [tiles, Hkv, D]) of a (32, 1) pair
    (module docstring). ``kv_offsets`` int32 on the data's device. ``permuted_keys``: each tile's keys at their
    ``v_key_slots`` columns (``configs.MXFP8_PERMUTED_V_KEYS``' layout)."""
    rows, heads, dim = data.shape
    num_seqs = kv_offsets.shape[0] - 1
    tiles = v_tiles(rows, num_seqs, block_n)
    vt = torch.empty((heads * dim, tiles * block_n), dtype=data.dtype, device=data.device)
    factors = torch.empty((tiles, heads, dim), dtype=torch.float32, device=data.device)
    if rows and heads and num_seqs:
        bits = scale.view(torch.uint8)
        launch(rebase_v_tiles_kernel, (tiles, heads), dict(
            V=data, VS=bits, KV_OFF=kv_offsets, VT=vt, VF=factors, num_seqs=num_seqs, num_heads=heads, rows=rows,
            stride_vtrow=vt.stride(0), stride_vt=data.stride(0), stride_vh=data.stride(1),
            stride_st=bits.stride(0), stride_sh=bits.stride(1), HEAD_DIM=dim, BLOCK_N=block_n,
            SEARCH_STEPS=fanout_search_steps(num_seqs), HW_CVT=not interpreting(), PERMUTED_KEYS=permuted_keys),
            num_warps=4, num_stages=1)
    return vt, factors
