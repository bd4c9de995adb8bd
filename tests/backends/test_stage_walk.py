"""The block walk and masks of the TLX forward's v4 consumers (``tlx/attn_fwd._consume_tile_one_loop``), run in
Triton's CPU interpreter: TLX kernels cannot run there, so the pieces they rely on live in ``triton/common.py`` and are
checked here against the oracle's ``visible_mask``.

The v4 loop walks a tile's blocks with ``stage_block_start`` (masked lead, mask-free bulk, masked tail from
``stage_bounds``), masks the masked ones with ``key_interval_mask`` (one key interval per row) and leaves the value-row
zeroing to the tile's last block. So: every visible (row, key) of the tile's rows inside the sequence is seen exactly
once, nothing else is, blocks come in increasing order, and only the last block may run past the sequence's keys.
The block-sparse walk (SPARSE: ``selected_tile_range`` / ``selected_tile_start`` over a selection's ids) keeps the
same promises for the visible keys of the selected blocks; ``selected_walk`` (a work item's row of the selection, or
of its transpose for the key-stationary TLX backward) visits exactly the selected tiles holding a visible pair.
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from jfa_ops.backends.triton.block_sparse_fwd import (selected_tile_range, selected_tile_start,  # noqa: E402
                                                      selected_walk)
from jfa_ops.backends.triton.common import (key_interval_mask, loop_bound, stage_block_start,  # noqa: E402
                                            stage_bounds, visible, window_bounds)
from jfa_ops.testing import visible_mask  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test (the GPU runs the real kernel)")

BLOCK_M, BLOCK_N = 32, 16  # the tile of two consumer halves, and the key block
HALF = BLOCK_M // 2


@triton.jit
def _walk_kernel(Vis, Order, m0, row0, len_q, len_k, lo_off, hi_off, KEYS: tl.constexpr, HAS_LO: tl.constexpr,
                 HAS_HI: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HALF: tl.constexpr):
    """Vis[r, key] = 1 where the walk lets row row0 + r see key (0 where it masks it, untouched where no block
    covers it); Order[block] = the step j that visited it (+1 per extra visit)."""
    lead_begin, lead_end, bulk_begin, bulk_end, tail_begin, tail_end = stage_bounds(
        m0, len_q, len_k, lo_off, hi_off, HAS_LO, HAS_HI, BLOCK_M, BLOCK_N)
    n_lead = (tl.maximum(lead_end - lead_begin, 0) + BLOCK_N - 1) // BLOCK_N
    n_unmasked = n_lead + (tl.maximum(bulk_end - bulk_begin, 0) + BLOCK_N - 1) // BLOCK_N
    n_all = n_unmasked + (tl.maximum(tail_end - tail_begin, 0) + BLOCK_N - 1) // BLOCK_N
    rows = tl.arange(0, HALF)
    keys = tl.arange(0, BLOCK_N)
    for j in range(0, n_all):
        n0 = stage_block_start(j, n_lead, n_unmasked, lead_begin, bulk_begin, tail_begin, BLOCK_N)
        if (j < n_lead) | (j >= n_unmasked):
            ok = key_interval_mask(rows, keys, len_q - row0, len_k - n0, lo_off, hi_off, HAS_LO, HAS_HI)
        else:
            ok = (rows[:, None] >= 0) & (keys[None, :] >= 0)
        tl.store(Vis + rows[:, None] * KEYS + n0 + keys[None, :], ok.to(tl.int32))
        block = n0 // BLOCK_N
        tl.store(Order + block, tl.load(Order + block) + j + 1)  # 0 = never visited


def _walk(len_q, len_k, causal, window):
    has_left, window_left, has_right, right = window_bounds(causal, *window)
    keys = (len_k // BLOCK_N + 2) * BLOCK_N  # room for a block past the last key
    oracle = visible_mask(len_q, len_k, causal, window)
    for m0 in range(0, len_q, BLOCK_M):
        for half in range(2):
            row0 = m0 + half * HALF
            vis = torch.full((HALF, keys), -1, dtype=torch.int32)
            order = torch.zeros(keys // BLOCK_N, dtype=torch.int32)
            _walk_kernel[(1,)](vis, order, m0, row0, len_q, len_k, -window_left, right, KEYS=keys,
                               HAS_LO=has_left, HAS_HI=has_right, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HALF=HALF)
            yield m0, row0, vis, order, oracle


@settings(max_examples=40, deadline=None)
@given(len_q=st.integers(1, 90), len_k=st.integers(0, 90), causal=st.booleans(),
       window=st.tuples(st.integers(-1, 40), st.integers(-1, 40)))
def test_one_loop_walk_sees_exactly_the_visible_keys(len_q, len_k, causal, window):
    for m0, row0, vis, order, oracle in _walk(len_q, len_k, causal, window):
        rows = min(HALF, max(len_q - row0, 0))  # rows of this half inside the sequence
        want = torch.zeros(rows, vis.shape[1], dtype=torch.bool)
        want[:, :len_k] = oracle[row0:row0 + rows]
        seen = vis[:rows] == 1
        assert torch.equal(seen, want), f"tile {m0} rows {row0}+: walk {seen.int()} oracle {want.int()}"
        visited = order.nonzero().flatten()
        steps = order[visited]
        # each block at most once (a second visit would add j + 1 again, breaking 1, 2, 3, ...), in increasing order
        assert torch.equal(steps, torch.arange(1, len(visited) + 1, dtype=torch.int32)), f"tile {m0}: order {order}"
        past_end = [int(b) for b in visited if (int(b) + 1) * BLOCK_N > len_k]
        assert past_end in ([], [int(b) for b in visited[-1:]]), f"tile {m0}: blocks {past_end} run past the keys"


@triton.jit
def _both_masks_kernel(Out, rows_left, keys_left, lo_off, hi_off, HAS_LO: tl.constexpr, HAS_HI: tl.constexpr,
                       R: tl.constexpr, K: tl.constexpr):
    """Out = 2 * key_interval_mask + visible."""
    rows = tl.arange(0, R)
    keys = tl.arange(0, K)
    a = key_interval_mask(rows, keys, rows_left, keys_left, lo_off, hi_off, HAS_LO, HAS_HI)
    b = visible(rows[:, None], keys[None, :], rows_left, keys_left, lo_off, hi_off, HAS_LO, HAS_HI)
    tl.store(Out + rows[:, None] * K + keys[None, :], a.to(tl.int32) * 2 + b.to(tl.int32))


def test_key_interval_mask_matches_visible_inside_the_sequence():
    """The same rows/keys, blocks at several offsets against the diagonal and the sequence ends: interval ==
    ``visible`` on every row inside the sequence."""
    for rows_left, keys_left in [(16, 16), (5, 30), (40, 3), (16, -20), (-3, 9), (8, 0)]:
        for lo_off, hi_off in [(-4, 0), (-20, 7), (0, 0), (3, 5), (-1, -2)]:
            for has_lo in (False, True):
                for has_hi in (False, True):
                    out = torch.empty(16, 16, dtype=torch.int32)
                    _both_masks_kernel[(1,)](out, rows_left, keys_left, lo_off, hi_off, HAS_LO=has_lo,
                                             HAS_HI=has_hi, R=16, K=16)
                    inside = out[:max(min(rows_left, 16), 0)]
                    assert torch.equal(inside // 2, inside % 2), (rows_left, keys_left, lo_off, hi_off, has_lo, has_hi)


@triton.jit
def _sparse_walk_kernel(Vis, Order, IDS, count, m0, row0, len_q, len_k, lo_off, hi_off, KEYS: tl.constexpr,
                        HAS_LO: tl.constexpr, HAS_HI: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_KV: tl.constexpr, HALF: tl.constexpr):
    """The SPARSE walk of the TLX forward (``_selected_item`` + ``_consume_tile_one_loop``): the selected tiles
    overlapping the keys the tile sees, masked on the first one and wherever outside the mask-free bulk. Vis and
    Order as ``_walk_kernel``'s, Order per BLOCK_N tile."""
    lead_begin, _, bulk_begin, bulk_end, _, tail_end = stage_bounds(m0, len_q, len_k, lo_off, hi_off, HAS_LO, HAS_HI,
                                                                    BLOCK_M, BLOCK_N)
    first, n = selected_tile_range(IDS, count, lead_begin, tail_end, BLOCK_KV, BLOCK_N)
    rows = tl.arange(0, HALF)
    keys = tl.arange(0, BLOCK_N)
    for j in range(0, n):
        n0 = selected_tile_start(IDS, first + j, BLOCK_KV, BLOCK_N)
        if (j == 0) | (n0 < bulk_begin) | (n0 + BLOCK_N > bulk_end):
            ok = key_interval_mask(rows, keys, len_q - row0, len_k - n0, lo_off, hi_off, HAS_LO, HAS_HI)
        else:
            ok = (rows[:, None] >= 0) & (keys[None, :] >= 0)
        tl.store(Vis + rows[:, None] * KEYS + n0 + keys[None, :], ok.to(tl.int32))
        tile = n0 // BLOCK_N
        tl.store(Order + tile, tl.load(Order + tile) + j + 1)


@settings(max_examples=40, deadline=None)
@given(len_q=st.integers(1, 90), len_k=st.integers(0, 90), causal=st.booleans(),
       window=st.tuples(st.integers(-1, 40), st.integers(-1, 40)), block_kv=st.sampled_from([16, 32, 64]),
       picks=st.lists(st.booleans(), min_size=8, max_size=8), negative=st.booleans(), past_end=st.integers(0, 2))
def test_sparse_walk_sees_exactly_the_visible_selected_keys(len_q, len_k, causal, window, block_kv, picks, negative,
                                                             past_end):
    """Ascending selected ids (a -1 first and ids past the sequence last, as a broken selection could hold on the
    device): the walk sees every visible key of the selected blocks exactly once, nothing else, tiles in increasing
    order, only the last one running past the keys."""
    has_left, window_left, has_right, right = window_bounds(causal, *window)
    n_blocks = -(-len_k // block_kv)
    chosen = [b for b in range(n_blocks) if picks[b % 8]]
    ids = [-1] * negative + chosen + list(range(n_blocks + 1, n_blocks + 1 + past_end))
    ids_t = torch.tensor(ids + [0], dtype=torch.int32)  # one spare entry: an empty list still has a pointer
    keys = (n_blocks + 4) * block_kv
    oracle = visible_mask(len_q, len_k, causal, window)
    selected = torch.zeros(len_k, dtype=torch.bool)
    for b in chosen:
        selected[b * block_kv:(b + 1) * block_kv] = True
    for m0 in range(0, len_q, BLOCK_M):
        for half in range(2):
            row0 = m0 + half * HALF
            vis = torch.full((HALF, keys), -1, dtype=torch.int32)
            order = torch.zeros(keys // BLOCK_N, dtype=torch.int32)
            _sparse_walk_kernel[(1,)](vis, order, ids_t, len(ids), m0, row0, len_q, len_k, -window_left, right,
                                      KEYS=keys, HAS_LO=has_left, HAS_HI=has_right, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                                      BLOCK_KV=block_kv, HALF=HALF)
            rows = min(HALF, max(len_q - row0, 0))
            want = torch.zeros(rows, keys, dtype=torch.bool)
            want[:, :len_k] = oracle[row0:row0 + rows] & selected
            seen = vis[:rows] == 1
            assert torch.equal(seen, want), f"ids {ids} tile {m0} rows {row0}+: walk {seen.int()} want {want.int()}"
            visited = order.nonzero().flatten()
            assert torch.equal(order[visited], torch.arange(1, len(visited) + 1, dtype=torch.int32)), order
            assert all(int(t) * BLOCK_N < len_k for t in visited), f"tiles {visited} start past the keys"
            past = [int(t) for t in visited if (int(t) + 1) * BLOCK_N > len_k]
            assert past in ([], [int(t) for t in visited[-1:]]), f"tiles {past} run past the keys"


@triton.jit
def _selected_walk_kernel(S_OFF, O_OFF, INDEX, COUNT, TILES, MASKED, N_WALK, n_rows, heads, n_tiles, stride_ib,
                          stride_ih, stride_in, stride_cb, stride_ch, lo_off, hi_off, max_walk, HAS_LO: tl.constexpr,
                          HAS_HI: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_O: tl.constexpr, TILE_S: tl.constexpr,
                          TILE_O: tl.constexpr, ROW_WIDTH: tl.constexpr, PEEL: tl.constexpr = False):
    """test_selected_walk: what a TLX work item (its producer and consumers) walks: the tiles and their masked flag.
    PEEL (the TLX forward's SPARSE_PEEL): the flag from the walk's split instead, (t < n_lead) | (t >= n_unmasked)."""
    pid = tl.program_id(0)
    seq = pid // (heads * n_tiles)
    head = (pid // n_tiles) % heads
    s0 = (pid % n_tiles) * TILE_S
    len_s = tl.load(S_OFF + seq + 1) - tl.load(S_OFF + seq)
    len_o = tl.load(O_OFF + seq + 1) - tl.load(O_OFF + seq)
    lead_begin, _, bulk_begin, bulk_end, _, tail_end = stage_bounds(s0, len_s, len_o, lo_off, hi_off, HAS_LO, HAS_HI,
                                                                    TILE_S, TILE_O)
    if PEEL:
        first, n, n_lead, n_unmasked = selected_walk(INDEX, COUNT, s0 < len_s, seq, head, s0, n_rows, stride_ib,
                                                     stride_ih, stride_in, stride_cb, stride_ch, lead_begin, tail_end,
                                                     BLOCK_S, BLOCK_O, TILE_O, ROW_WIDTH, bulk_begin, bulk_end)
    else:
        first, n = selected_walk(INDEX, COUNT, s0 < len_s, seq, head, s0, n_rows, stride_ib, stride_ih, stride_in,
                                 stride_cb, stride_ch, lead_begin, tail_end, BLOCK_S, BLOCK_O, TILE_O, ROW_WIDTH)
    for t in range(0, loop_bound(n)):
        o0 = selected_tile_start(INDEX, first + t, BLOCK_O, TILE_O)
        tl.store(TILES + pid * max_walk + t, o0)
        if PEEL:
            tl.store(MASKED + pid * max_walk + t, ((t < n_lead) | (t >= n_unmasked)).to(tl.int32))
        else:
            tl.store(MASKED + pid * max_walk + t, ((o0 < bulk_begin) | (o0 + TILE_O > bulk_end)).to(tl.int32))
    tl.store(N_WALK + pid, n)


@pytest.mark.parametrize("row_width", [False, True])
@pytest.mark.parametrize("side", ["queries", "keys"])
@pytest.mark.parametrize("causal,window", [(False, (-1, -1)), (True, (-1, -1)), (False, (40, 7)), (True, (30, -1))])
def test_selected_walk(side, causal, window, row_width):
    """``selected_walk``, the TLX kernels' work per item: query tiles over the selection (the block-sparse
    forward) and key tiles over its transpose (``transposed_selection``: the block-sparse backward) visit exactly
    the other side's tiles of the blocks their block selected that hold a visible (row, key) pair, in ascending
    order, each once: unselected blocks and blocks nobody in the tile sees never; a tile not marked masked lies
    inside the sequence and every pair of it with a stationary position inside is visible. Oracle: plain loops over
    a random selection (jagged, cross lengths, empty, ids past a sequence). ``row_width`` (the TLX forward's
    WALK_AHEAD): the first ids read by the row's width instead of its count, the same walk. Query side: the walk's
    split at the mask-free bulk (``selected_walk``'s split_begin / split_end, the TLX forward's SPARSE_PEEL, helper
    peeldiag38) marks exactly the tiles the per-tile test masks, and walks the same tiles."""
    from types import SimpleNamespace

    from jfa_ops.backends.triton.block_sparse_bwd import transposed_selection

    block_q, block_kv, tile_m, tile_n = 32, 64, 16, 32  # two tiles per block on both sides, as block_q 128 / 64-row
    len_q, len_k = (70, 0, 1, 130, 64, 33), (100, 5, 0, 64, 130, 160)  # query tiles in the TLX backward
    heads, n_q_blocks, n_kv_blocks = 2, -(-max(len_q) // block_q), -(-max(len_k) // block_kv)
    gen = torch.Generator().manual_seed(11)
    selected = torch.rand((len(len_q), heads, n_q_blocks, n_kv_blocks), generator=gen) < 0.5
    count = selected.sum(-1, dtype=torch.int32)
    ids = torch.arange(n_kv_blocks, dtype=torch.int32).expand_as(selected)
    index = torch.where(selected, ids, n_kv_blocks + 1).sort(-1).values.to(torch.int32)  # ascending, padding past
    has_left, window_left, has_right, right = window_bounds(causal, *window)
    q_off, kv_off = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32) for n in (len_q, len_k))

    def visible(b, row, key):  # row i sees keys j with -window_left <= j - i - (L_k - L_q) <= right
        d = key - row - (len_k[b] - len_q[b])
        return (not has_left or d >= -window_left) and (not has_right or d <= right)

    if side == "queries":
        args = dict(S_OFF=q_off, O_OFF=kv_off, INDEX=index, COUNT=count, n_rows=n_q_blocks, lo_off=-window_left,
                    hi_off=right, HAS_LO=has_left, HAS_HI=has_right, BLOCK_S=block_q, BLOCK_O=block_kv,
                    TILE_S=2 * tile_m, TILE_O=tile_n)
        lens_s, lens_o = len_q, len_k
    else:
        params = SimpleNamespace(max_seqlen_kv=max(len_k), block_kv=block_kv)
        q_index, q_count = transposed_selection(torch.zeros((sum(len_k), heads, 8)), index, count, params)
        args = dict(S_OFF=kv_off, O_OFF=q_off, INDEX=q_index, COUNT=q_count, n_rows=q_index.shape[2], lo_off=-right,
                    hi_off=window_left, HAS_LO=has_right, HAS_HI=has_left, BLOCK_S=block_kv, BLOCK_O=block_q,
                    TILE_S=tile_n, TILE_O=tile_m)
        lens_s, lens_o = len_k, len_q
    tile_s, tile_o, block_s, block_o = args["TILE_S"], args["TILE_O"], args["BLOCK_S"], args["BLOCK_O"]
    n_tiles, max_walk = -(-max(lens_s) // tile_s), -(-max(lens_o) // tile_o)
    grid = len(len_q) * heads * n_tiles
    tiles, masked = (torch.full((grid, max_walk), -1, dtype=torch.int32) for _ in range(2))
    n_walk = torch.empty(grid, dtype=torch.int32)
    sel = args["INDEX"], args["COUNT"]
    assert sel[0].stride(2) == sel[0].shape[3], "ROW_WIDTH reads the row stride as the row's width"
    _selected_walk_kernel[(grid,)](**args, ROW_WIDTH=row_width, TILES=tiles, MASKED=masked, N_WALK=n_walk, heads=heads,
                                   n_tiles=n_tiles, stride_ib=sel[0].stride(0), stride_ih=sel[0].stride(1),
                                   stride_in=sel[0].stride(2), stride_cb=sel[1].stride(0),
                                   stride_ch=sel[1].stride(1), max_walk=max_walk)
    if side == "queries":  # the peeled forward's split (first, n the same; flags from the split)
        tiles_p, masked_p = (torch.full((grid, max_walk), -1, dtype=torch.int32) for _ in range(2))
        n_walk_p = torch.empty(grid, dtype=torch.int32)
        _selected_walk_kernel[(grid,)](**args, ROW_WIDTH=row_width, PEEL=True, TILES=tiles_p, MASKED=masked_p,
                                       N_WALK=n_walk_p, heads=heads, n_tiles=n_tiles, stride_ib=sel[0].stride(0),
                                       stride_ih=sel[0].stride(1), stride_in=sel[0].stride(2),
                                       stride_cb=sel[1].stride(0), stride_ch=sel[1].stride(1), max_walk=max_walk)
        assert torch.equal(n_walk_p, n_walk) and torch.equal(tiles_p, tiles)
        assert torch.equal(masked_p, masked), "the split masks other tiles than the per-tile test"
    for pid in range(grid):
        b, h, s0 = pid // (heads * n_tiles), (pid // n_tiles) % heads, (pid % n_tiles) * tile_s
        want = []
        for o0 in range(0, lens_o[b], tile_o):
            q_block, kv_block = (s0 // block_s, o0 // block_o) if side == "queries" else (o0 // block_o, s0 // block_s)
            pairs = [(s, o) for s in range(s0, min(s0 + tile_s, lens_s[b])) for o in range(o0, min(o0 + tile_o,
                                                                                                    lens_o[b]))]
            seen = [visible(b, *((s, o) if side == "queries" else (o, s))) for s, o in pairs]
            if selected[b, h, q_block, kv_block] and any(seen):
                want.append((o0, all(seen) and o0 + tile_o <= lens_o[b]))
        n = int(n_walk[pid])
        assert tiles[pid, :n].tolist() == [o0 for o0, _ in want], (side, b, h, s0)
        for (o0, all_seen), flag in zip(want, masked[pid, :n].tolist()):
            assert flag or all_seen, (side, b, h, s0, o0)  # unmasked: the whole tile inside, every pair visible


@triton.jit
def _tile_range_kernel(OUT, IDS, count, width, key_begin, key_end, BLOCK: tl.constexpr, TILE: tl.constexpr,
                       WIDTH: tl.constexpr):
    if WIDTH:
        first, n = selected_tile_range(IDS, count, key_begin, key_end, BLOCK, TILE, width)
    else:
        first, n = selected_tile_range(IDS, count, key_begin, key_end, BLOCK, TILE)
    tl.store(OUT, first)
    tl.store(OUT + 1, n)


@pytest.mark.parametrize("count", [0, 1, 63, 64, 65, 130, 150])
def test_selected_tile_range_with_the_row_width(count):
    """``selected_tile_range`` with ``width`` (its first IDS_CHUNK ids read by the row's width: the TLX forward's
    WALK_AHEAD) gives the count-only form's (first, n), and both the plain loops' answer, for rows of several chunks
    (ids ascending, some negative, padding past the count)."""
    block, tile, width = 32, 16, 150
    gen = torch.Generator().manual_seed(count)
    picked = sorted(torch.randperm(200, generator=gen)[:count].tolist())
    ids = torch.tensor([p - 8 for p in picked] + [10 ** 6] * (width - count), dtype=torch.int32)
    for key_begin, key_end in ((0, 6400), (160, 3000), (4096, 4100), (64, 64)):
        want_first = sum(min(max(key_begin - b * block, 0) // tile, block // tile) for b in ids[:count].tolist())
        inside = [min(max(key_end + tile - 1 - b * block, 0) // tile, block // tile) for b in ids[:count].tolist()]
        below = [min(max(key_begin - b * block, 0) // tile, block // tile) for b in ids[:count].tolist()]
        want_n = sum(max(i - b, 0) for i, b in zip(inside, below))
        for with_width in (False, True):
            out = torch.full((2,), -1, dtype=torch.int32)
            _tile_range_kernel[(1,)](out, ids, count, width, key_begin, key_end, BLOCK=block, TILE=tile,
                                     WIDTH=with_width)
            assert out.tolist() == [want_first, want_n], (count, key_begin, key_end, with_width)
