"""The TLX backward's item order (``configs.BACKWARD_ITEM_ORDER``, helper sparsebwd2): the snake striding
(``common.snake_work`` / ``snake_items``, run in Triton's CPU interpreter: the TLX kernel cannot run there) gives every
work item to exactly one program, and the block-sparse per-item list (``block_sparse_bwd.item_list``) is the tile
list's (tile, kv head) pairs, each once, longest first by the item's own selected blocks, padding last. The TLX
forward's zigzag order (``configs.FORWARD_ZIGZAG``, helper tlxcausal: ``common.zigzag_item`` under the snake) gives
every (tile, head) to one program, group by group in the zigzag's directions. The dense backward's causal order
(``block_sparse_bwd.causal_item_list``, ``configs.BACKWARD_CAUSAL_ORDER``, helper tlxbwdcausal) is the tile list's
items in sections of (sequence, kv head) streams, and its device-built copy (``causal_item_list_device``) the same
list bit for bit, as is the sparse sectioned list's (``sectioned_item_list_device``). ``tools/sparse_fwd_model.py``'s
modelled orders of the block-sparse forward each take every item once."""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from jfa_ops.backends.triton.block_sparse_bwd import causal_item_list, item_list, sectioned_item_list  # noqa: E402
from jfa_ops.backends.triton.common import snake_items, snake_work, zigzag_item  # noqa: E402


@triton.jit
def _visits_kernel(VISITS, ORDER, n_work, SNAKE: tl.constexpr):
    """VISITS[w] += 1 for each item w this program takes; ORDER[pid * n_work + i] = its i-th item."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for i in range(0, snake_items(n_work, pid, programs, SNAKE)):
        work = snake_work(pid, i, programs, SNAKE)
        tl.atomic_add(VISITS + work, 1)
        tl.store(ORDER + pid * n_work + i, work)


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test (the GPU runs the real kernel)")
@pytest.mark.parametrize("snake", [False, True])
@pytest.mark.parametrize("n_work,programs", [(0, 3), (1, 3), (5, 5), (7, 3), (9, 3), (10, 4), (23, 5), (24, 6)])
def test_every_item_once(n_work, programs, snake):
    visits = torch.zeros(max(n_work, 1), dtype=torch.int32)
    order = torch.full((programs, max(n_work, 1)), -1, dtype=torch.int32)
    _visits_kernel[(programs,)](visits, order, n_work, SNAKE=snake)
    assert visits[:n_work].tolist() == [1] * n_work
    for pid in range(programs):  # each program's items: one per round, reversed every other round under SNAKE
        mine = [w for w in order[pid].tolist() if w >= 0]
        want = [r * programs + ((programs - 1 - pid) if snake and r % 2 else pid) for r in range(len(mine))]
        assert mine == want


def test_item_list_is_the_tile_lists_items_longest_first():
    gen = torch.Generator().manual_seed(0)
    heads, block_kv, n_kv_blocks = 3, 128, 4
    seq = torch.tensor([1, 0, 1, 0, -1, -1], dtype=torch.int32)  # sorted tiles, then padding (start anything)
    start = torch.tensor([0, 256, 384, 0, 999, -5], dtype=torch.int32)
    q_count = torch.randint(0, 9, (2, heads, n_kv_blocks), generator=gen, dtype=torch.int32)
    s, st, h = item_list(dict(TILE_SEQ=seq, TILE_START=start), q_count, heads, block_kv)
    assert s.dtype == st.dtype == h.dtype == torch.int32 and s.numel() == seq.numel() * heads
    pairs = sorted(zip(s.tolist(), st.tolist(), h.tolist()))
    assert pairs == sorted((a, b, c) for a, b in zip(seq.tolist(), start.tolist()) for c in range(heads))
    real = s >= 0
    assert real.tolist() == sorted(real.tolist(), reverse=True)  # padding last
    cost = [int(q_count[a, c, b // block_kv]) for a, b, c in zip(s.tolist(), st.tolist(), h.tolist()) if a >= 0]
    assert cost == sorted(cost, reverse=True)


@pytest.mark.parametrize("heads,group", [(4, 2), (8, 4), (6, 2), (6, 3), (4, 1)])
def test_group_order_list_zigzags_over_head_groups(heads, group):
    """``configs.BACKWARD_GROUP_ORDER``'s list (``item_list(..., head_group)``): the same items as the item order's,
    group-major (kv heads head // group, in order), each group monotone in the item's own blocks, the last group
    longest first and the directions alternating before it; ties in the item order's order; padding last."""
    gen = torch.Generator().manual_seed(heads * 10 + group)
    block_kv, n_kv_blocks = 128, 5
    seq = torch.tensor([1, 0, 2, 1, 0, 2, 1, -1, -1], dtype=torch.int32)
    start = torch.tensor([0, 256, 384, 128, 0, 0, 512, 7, 0], dtype=torch.int32)
    q_count = torch.randint(0, 4, (3, heads, n_kv_blocks), generator=gen, dtype=torch.int32)  # many ties
    schedule = dict(TILE_SEQ=seq, TILE_START=start)
    ordered = list(zip(*(t.tolist() for t in item_list(schedule, q_count, heads, block_kv))))
    s, st, h = item_list(schedule, q_count, heads, block_kv, head_group=group)
    assert s.dtype == st.dtype == h.dtype == torch.int32
    grouped = list(zip(s.tolist(), st.tolist(), h.tolist()))
    assert sorted(grouped) == sorted(ordered)  # every item once
    real = [a >= 0 for a, _, _ in grouped]
    assert real == sorted(real, reverse=True)  # padding last
    items = [(a, b, c) for a, b, c in grouped if a >= 0]
    groups = [c // group for _, _, c in items]
    assert groups == sorted(groups)
    last = heads // group - 1
    for g in range(last + 1):
        mine = [it for it in items if it[2] // group == g]
        cost = [int(q_count[a, c, b // block_kv]) for a, b, c in mine]
        assert cost == sorted(cost, reverse=(last - g) % 2 == 0)
        # ties keep the item order's order (stable)
        rank = {it: i for i, it in enumerate(ordered)}
        for x, y, cx, cy in zip(mine, mine[1:], cost, cost[1:]):
            if cx == cy:
                assert rank[x] < rank[y]


@pytest.mark.parametrize("heads,group", [(4, 0), (4, 2), (8, 4), (6, 2), (6, 3), (4, 1), (16, 2)])
@pytest.mark.parametrize("max_count", [0, 3, 1 << 30], ids=["no-bound", "bound", "bound-too-wide"])
def test_item_list_one_sort_is_the_same_permutation(heads, group, max_count, monkeypatch):
    """``KNOBS.sparse_item_one_sort``: the per-item list from one stable sort (32-bit keys where the counts' bound
    lets them fit, else 64-bit) equals the two sorts' list item for item, ties (many: counts 0..3, the bound) and
    padding included."""
    from jfa_ops.backends.triton import block_sparse_bwd, configs

    gen = torch.Generator().manual_seed(heads * 10 + group)
    block_kv, n_kv_blocks = 128, 5
    seq = torch.randint(-1, 3, (40,), generator=gen, dtype=torch.int32)
    start = torch.randint(0, 5 * block_kv, (40,), generator=gen, dtype=torch.int32)
    q_count = torch.randint(0, 4, (3, heads, n_kv_blocks), generator=gen, dtype=torch.int32)  # <= the bound 3
    schedule = dict(TILE_SEQ=seq, TILE_START=start)
    sorts = []
    real_sort = torch.sort
    monkeypatch.setattr(block_sparse_bwd.torch, "sort", lambda x, **kw: sorts.append(x.dtype) or real_sort(x, **kw))
    lists = []
    for one_sort in (False, True):
        monkeypatch.setattr(configs.KNOBS, "sparse_item_one_sort", one_sort)
        lists.append([t.tolist() for t in item_list(schedule, q_count, heads, block_kv, group, max_count)])
    assert lists[0] == lists[1]
    two = [torch.int64] * (2 if group else 1)
    one = [torch.int32 if not group or max_count == 3 else torch.int64]
    assert sorts == two + one, sorts


def _sectioned_items(listed, seq, start, heads, lengths, budget):
    """The checks an L2-sectioned item list shares (``causal_item_list``, ``sectioned_item_list``): int32, the tile
    list's (tile, kv head) items each once, padding last, the real items' sections in order; streams (seq, head)
    longest sequence first into sections of ``budget`` bytes (rows x 1 byte: a stream starts a new section once the
    ones before it fill the budget). Returns (the real items, section per stream, the last section)."""
    s, st, h = listed
    assert s.dtype == st.dtype == h.dtype == torch.int32 and s.numel() == seq.numel() * heads
    items = list(zip(s.tolist(), st.tolist(), h.tolist()))
    assert sorted(items) == sorted((a, b, c) for a, b in zip(seq.tolist(), start.tolist()) for c in range(heads))
    real = [a >= 0 for a, _, _ in items]
    assert real == sorted(real, reverse=True)
    streams = sorted(((a, c) for a in range(len(lengths)) for c in range(heads)), key=lambda x: -lengths[x[0]])
    section, filled = {}, 0
    for a, c in streams:
        section[(a, c)] = filled // budget
        filled += lengths[a]
    items = [it for it in items if it[0] >= 0]
    sections = [section[(a, c)] for a, _, c in items]
    assert sections == sorted(sections)
    return items, section, max(section.values())


@pytest.mark.parametrize("heads,lengths,budget", [(2, (300, 17, 700), 1 << 30), (4, (300, 17, 700), 700),
                                                  (3, (0, 5, 5, 900), 1800), (1, (40, 40), 39), (2, (9,), 100)])
def test_causal_item_list_sections_streams_longest_first(heads, lengths, budget):
    """``causal_item_list``: the tile list's (tile, kv head) items, each once, padding last; streams (seq, head)
    taken longest sequence first into sections of ``budget`` bytes (rows x 1 byte here; a stream starts a new
    section once the ones before it fill the budget), the sections in that order, each monotone in the tile list's
    position (its cost order): the last section longest first, the directions alternating before it; within a
    section and a tile, the heads in order."""
    offsets = torch.tensor((0,) + lengths).cumsum(0).to(torch.int32)
    tiles = [(s, j * 128) for s, n in enumerate(lengths) for j in range(-(-n // 128))]
    tiles.sort(key=lambda t: -(lengths[t[0]] - t[1]))  # a sorted list (causal cost), stable over (seq, start)
    seq = torch.tensor([s for s, _ in tiles] + [-1, -1], dtype=torch.int32)  # then padding
    start = torch.tensor([st for _, st in tiles] + [5, 0], dtype=torch.int32)
    listed = causal_item_list(dict(TILE_SEQ=seq, TILE_START=start), heads, offsets, 1, budget)
    items, section, last = _sectioned_items(listed, seq, start, heads, lengths, budget)
    rank = {(a, b): i for i, (a, b) in enumerate(zip(seq.tolist(), start.tolist()))}
    for g in {section[(a, c)] for a, _, c in items}:
        mine = [(rank[(a, b)], c) for a, b, c in items if section[(a, c)] == g]
        longest_first = (last - g) % 2 == 0
        assert mine == sorted(mine, key=lambda r: (r[0] if longest_first else -r[0], r[1]))


@pytest.mark.parametrize("heads,lengths,budget", [(2, (300, 17, 700), 1 << 30), (4, (300, 17, 700), 700),
                                                  (3, (0, 5, 5, 900), 1800), (1, (40, 40), 39), (2, (9,), 100),
                                                  (2, (1000, 0, 130), 50)])
@pytest.mark.parametrize("bounded", [False, True], ids=["64bit", "32bit"])
def test_sectioned_item_list_sections_streams_each_by_its_walks(heads, lengths, budget, bounded):
    """``sectioned_item_list`` (tlx SPARSE_BACKWARD_SECTIONS): the tile list's (tile, kv head) items, each once,
    padding last; streams (seq, head) longest sequence first into sections of ``budget`` bytes (rows x 1 byte), the
    sections in that order; within a section the items by their own walk (q_count of their key block and kv head),
    longest first in the last section and alternating before it, ties in the tile list's order (stable). The same
    order with the 32-bit keys (``total_rows`` and ``max_count`` given) as with the 64-bit ones."""
    gen = torch.Generator().manual_seed(sum(lengths) + heads)
    offsets = torch.tensor((0,) + lengths).cumsum(0).to(torch.int32)
    n_kv_blocks = max(1, max(-(-n // 128) for n in lengths))
    q_count = torch.randint(0, 5, (len(lengths), heads, n_kv_blocks), generator=gen, dtype=torch.int32)
    tiles = [(s, j * 128) for s, n in enumerate(lengths) for j in range(-(-n // 128))]
    tiles.sort(key=lambda t: -int(q_count[t[0], :, t[1] // 128].sum()))  # the key tile list: by the heads' sum
    seq = torch.tensor([s for s, _ in tiles] + [-1, -1], dtype=torch.int32)  # then padding
    start = torch.tensor([st for _, st in tiles] + [5, 0], dtype=torch.int32)
    extra = (sum(lengths), 4) if bounded else ()
    listed = sectioned_item_list(dict(TILE_SEQ=seq, TILE_START=start), q_count, heads, 128, offsets, 1, budget,
                                 *extra)
    items, section, last = _sectioned_items(listed, seq, start, heads, lengths, budget)
    position = {(a, b, c): i for i, (a, b, c) in enumerate(
        (a, b, c) for a, b in zip(seq.tolist(), start.tolist()) for c in range(heads))}  # the tile-major order
    for g in {section[(a, c)] for a, _, c in items}:
        mine = [it for it in items if section[(it[0], it[2])] == g]
        sign = -1 if (last - g) % 2 == 0 else 1
        assert mine == sorted(mine, key=lambda it: (sign * int(q_count[it[0], it[2], it[1] // 128]), position[it]))
    if bounded:  # the 32-bit keys: the same permutation as the 64-bit ones
        other = sectioned_item_list(dict(TILE_SEQ=seq, TILE_START=start), q_count, heads, 128, offsets, 1, budget)
        assert all(torch.equal(x, y) for x, y in zip(listed, other))


@triton.jit
def _zigzag_kernel(ITEMS, n_tiles, num_heads, group, head_group):
    """ITEMS[work] = (program, tile, head) of every item as the TLX forward's ZIGZAG takes them (snake over
    ``zigzag_item``), each program writing its own."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    n_work = n_tiles * num_heads
    for i in range(0, snake_items(n_work, pid, programs, True)):
        work = snake_work(pid, i, programs, True)
        tile, head = zigzag_item(work, n_tiles, num_heads, group, head_group)
        tl.store(ITEMS + 3 * work, pid)
        tl.store(ITEMS + 3 * work + 1, tile)
        tl.store(ITEMS + 3 * work + 2, head)


def _schedule_model():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools",
                        "fwd_schedule_model.py")
    spec = importlib.util.spec_from_file_location("fwd_schedule_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def zigzag_reference(n_tiles, heads_kv, group, head_group):
    """The order ``zigzag_item`` should give, work index by work index: kv-head groups of head_group in turn (each
    kv head's ``group`` q heads side by side), tile ranks longest first (0 first) in the last group, the direction
    alternating before it."""
    span, n_groups = head_group * group, heads_kv // head_group
    order = []
    for g in range(n_groups):
        ranks = range(n_tiles) if (n_groups - 1 - g) % 2 == 0 else reversed(range(n_tiles))
        order += [(t, g * span + j) for t in ranks for j in range(span)]
    return order


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter test (the GPU runs the real kernel)")
@pytest.mark.parametrize("n_tiles,heads_kv,group,head_group,programs", [
    (5, 4, 1, 2, 3), (5, 4, 1, 1, 4), (7, 4, 2, 2, 5), (3, 6, 1, 3, 4), (4, 2, 4, 1, 3), (6, 3, 1, 3, 2),
    (1, 2, 1, 1, 3), (9, 8, 1, 4, 7)])
def test_zigzag_items_once_each_group_by_group(n_tiles, heads_kv, group, head_group, programs):
    num_heads = heads_kv * group
    n_work = n_tiles * num_heads
    items = torch.full((n_work, 3), -1, dtype=torch.int32)
    _zigzag_kernel[(programs,)](items, n_tiles, num_heads, group, head_group)
    got = [tuple(r) for r in items[:, 1:].tolist()]
    assert got == zigzag_reference(n_tiles, heads_kv, group, head_group)
    model = _schedule_model()  # tools/fwd_schedule_model.py's copy of the order (what its balance numbers assume)
    assert [model.zigzag_item(w, n_tiles, num_heads, group, head_group) for w in range(n_work)] == got
    assert sorted(got) == [(t, h) for t in range(n_tiles) for h in range(num_heads)]  # every item once
    pids = items[:, 0].tolist()
    for w, pid in enumerate(pids):  # the snake: round r's column w % programs, reversed every other round
        r, c = divmod(w, programs)
        assert pid == (programs - 1 - c if r % 2 else c)
    for w in range(n_work - 1):  # a kv head's q heads stay within one group (they share its K/V)
        assert got[w][1] // (head_group * group) <= got[w + 1][1] // (head_group * group)


@pytest.mark.parametrize("num_seqs,length,heads,budget", [(3, 300, 2, 700), (8, 256, 4, 1 << 30), (2, 129, 3, 129),
                                                          (5, 64, 1, 100)])
def test_uniform_causal_item_list_is_the_per_call_list(num_seqs, length, heads, budget):
    """``uniform_causal_item_list`` (a causal batch of one length, made once per shape) is ``causal_item_list`` over
    the sorted key tile list ``kv_tiles`` builds for that batch, its real items (one per key tile and kv head, the
    kernel's n_work; the per-call list's padding comes after them)."""
    from jfa_ops.backends.triton.block_sparse_bwd import uniform_causal_item_list
    from jfa_ops.backends.triton.scheduling import kv_tiles

    offsets = torch.arange(num_seqs + 1, dtype=torch.int32) * length
    total = num_seqs * length
    tiles = kv_tiles(offsets, offsets, total, total, 128, 0, 0, False, True)  # causal: right 0, no left window
    per_call = causal_item_list(dict(TILE_SEQ=tiles.seq, TILE_START=tiles.start), heads, offsets, 1, budget)
    made = uniform_causal_item_list(num_seqs, length, heads, 1, budget, 128, torch.device("cpu"))
    n_work = int(tiles.count.reshape(-1)[0]) * heads
    assert all(t.numel() == n_work and t.dtype == torch.int32 for t in made)
    assert [t[:n_work].tolist() for t in per_call] == [t.tolist() for t in made]
    assert made is uniform_causal_item_list(num_seqs, length, heads, 1, budget, 128, torch.device("cpu"))  # kept



def _causal_lists(q_lens, kv_lens, heads, bytes_per_row, budget, window=(0, 0, False, True), block=128):
    """``causal_item_list`` and ``causal_item_list_device`` over the sorted key tile list of a batch (window:
    ``kv_tiles``' window_left, right, has_left, has_right)."""
    from jfa_ops.backends.triton.block_sparse_bwd import causal_item_list_device
    from jfa_ops.backends.triton.scheduling import kv_tiles

    q_off, kv_off = (torch.tensor((0,) + tuple(n)).cumsum(0).to(torch.int32) for n in (q_lens, kv_lens))
    tiles = kv_tiles(q_off, kv_off, sum(q_lens), sum(kv_lens), block, *window)
    schedule = dict(TILE_SEQ=tiles.seq, TILE_START=tiles.start)
    return (causal_item_list(schedule, heads, q_off, bytes_per_row, budget),
            causal_item_list_device(schedule, heads, q_off, sum(q_lens), bytes_per_row, budget))


def _random_layout(seed):
    import random

    rng = random.Random(seed)
    lens = [rng.choice([0, 1, 2, 127, 128, 129, rng.randrange(1, 1000)]) for _ in range(rng.choice([1, 2, 5, 40]))]
    kv = [rng.choice([0, 1, 130, rng.randrange(0, 900)]) for _ in lens] if seed % 3 == 0 else lens  # cross
    heads, row_bytes = rng.choice([1, 3, 4, 8]), rng.choice([1, 3, 1024])
    total = sum(lens) * heads * row_bytes
    budget = max(1, rng.choice([1, 7, total // 5 + 1, total + 5, 40 << 20, max(lens) * row_bytes // 2 + 1]))
    window = [(0, 0, False, True), (rng.randrange(300), 0, True, True),
              (rng.randrange(300), rng.randrange(300), True, True)][seed % 3]
    return lens, kv, heads, row_bytes, budget, window, rng.choice([64, 128])


@pytest.mark.parametrize("q_lens,kv_lens,heads,row_bytes,budget", [
    ((300, 17, 700), (300, 17, 700), 2, 1, 700), ((0, 5, 5, 900), (0, 5, 5, 900), 3, 1, 1800),
    ((40, 40), (40, 40), 1, 1, 39), ((9,), (9,), 2, 1, 100), ((1, 0, 1), (1, 0, 1), 4, 1024, 40 << 20),
    ((0, 0), (0, 0), 2, 1, 10), ((0, 300), (500, 0), 2, 1, 10),  # empty sequences; a key tile of no query rows
    ((5000, 17, 700, 3000), (5000, 17, 700, 3000), 8, 3, 2000)])  # a stream over many sections
def test_causal_item_list_device_is_the_torch_list(q_lens, kv_lens, heads, row_bytes, budget):
    """``causal_item_list_device`` (``configs.BACKWARD_CAUSAL_ORDER_JAGGED``: two launches, no sort) gives
    ``causal_item_list``'s three tensors bit for bit: the same items in the same places, padding included."""
    want, got = _causal_lists(q_lens, kv_lens, heads, row_bytes, budget)
    for a, b in zip(want, got):
        assert b.dtype == torch.int32 and b.tolist() == a.tolist()


@pytest.mark.parametrize("seed", range(12))
def test_causal_item_list_device_random_layouts(seed):
    """The same on random jagged layouts: empty sequences, length 1, lengths off the blocks, cross attention, GQA
    row bytes, causal and windows, budgets from one byte (a section per stream) to all of it."""
    lens, kv, heads, row_bytes, budget, window, block = _random_layout(seed)
    want, got = _causal_lists(lens, kv, heads, row_bytes, budget, window, block)
    for a, b in zip(want, got):
        assert b.tolist() == a.tolist(), (lens, kv, heads, row_bytes, budget, window, block)


@pytest.mark.parametrize("num_seqs,length,heads,row_bytes,budget,block", [
    (8, 4096, 16, 1024, 40 << 20, 128),  # the timing's dense B8 H16 S4096 D128 causal row (two sections)
    (3, 300, 2, 1, 700, 128), (5, 64, 1, 1, 100, 64), (4, 1000, 4, 3, 1, 128),  # a budget of one byte
    (2, 129, 3, 129, 1 << 30, 128),  # one section
    (6, 257, 8, 1024, 300 * 1024 * 8, 128)])  # sections that split a sequence's heads
def test_causal_item_list_device_one_length_is_the_hinted_default_order(num_seqs, length, heads, row_bytes, budget,
                                                                        block):
    """A one-length causal batch without the max_seqlen hints under ``configs.BACKWARD_CAUSAL_ORDER_JAGGED`` (helper
    uniformorder): the device-built list from the key tile list the backward sorts for it (``kv_tiles``: no hints, so
    padding slots) holds the items in the order the default visits the same batch given the hints (the kept list,
    ``uniform_causal_item_list``, under the same snake), the padding after them. The oracle is written from the
    tile list alone: equal streams (seq, kv head) in (seq, head) order, stream j in section j x length x row_bytes
    // budget, each section's items by tile position (longest first in the last section, directions alternating
    before it), a tile's heads in order. Not the order the default visits it without the hints (tile-major: the
    sectioned order measured 1.33-1.40x over it at S4096, bench/NOTES.md v16)."""
    from jfa_ops.backends.triton.block_sparse_bwd import causal_item_list_device, uniform_causal_item_list
    from jfa_ops.backends.triton.scheduling import capacity_of, kv_tiles

    offsets = torch.arange(num_seqs + 1, dtype=torch.int32) * length
    total = num_seqs * length
    tiles = kv_tiles(offsets, offsets, total, total, block, 0, 0, False, True)  # what the backward sorts: causal
    seq, start = tiles.seq.tolist(), tiles.start.tolist()
    assert len(seq) == capacity_of(total, block, num_seqs) and seq.count(-1) > 0  # slots past the tiles: padding
    section = [j * length * row_bytes // budget for j in range(num_seqs * heads)]
    last = section[-1]
    real = [(section[s * heads + h], p if (last - section[s * heads + h]) % 2 == 0 else -p, h, (s, st, h))
            for p, (s, st) in enumerate(zip(seq, start)) if s >= 0 for h in range(heads)]
    want = [item for *_, item in sorted(real)] + [(s, st, h) for s, st in zip(seq, start) if s < 0 for h in
                                                  range(heads)]
    got = causal_item_list_device(dict(TILE_SEQ=tiles.seq, TILE_START=tiles.start), heads, offsets, total,
                                  row_bytes, budget)
    assert list(zip(*(t.tolist() for t in got))) == want
    kept = uniform_causal_item_list(num_seqs, length, heads, row_bytes, budget, block, torch.device("cpu"))
    n_work = kept[0].numel()
    assert n_work == -(-length // block) * num_seqs * heads
    assert [t[:n_work].tolist() for t in got] == [t.tolist() for t in kept]


def test_causal_item_list_device_bench_batch_ops(monkeypatch):
    """The bench's jagged T32768 causal batch (27 lognormal sequences up to 8192, 16 kv heads, D128 bf16 rows, the
    40 MiB budget): the same list, made with one allocation, two views and two launches (the torch list: 59 aten
    ops; counted with the launches stubbed, since the interpreter's own tensor work would count too)."""
    from tests.common import RecordOps

    from bench.suites import JAGGED_SEED, lognormal_lengths
    from jfa_ops.backends.triton import block_sparse_bwd
    from jfa_ops.backends.triton.scheduling import kv_tiles

    lens = lognormal_lengths(32768, None, seed=JAGGED_SEED)
    offsets = torch.tensor([0] + list(lens)).cumsum(0).to(torch.int32)
    tiles = kv_tiles(offsets, offsets, 32768, 32768, 128, 0, 0, False, True)
    schedule = dict(TILE_SEQ=tiles.seq, TILE_START=tiles.start)
    args = (schedule, 16, offsets, 1024, 40 << 20)
    got = block_sparse_bwd.causal_item_list_device(schedule, 16, offsets, 32768, 1024, 40 << 20)
    assert [b.tolist() for b in got] == [a.tolist() for a in causal_item_list(*args)]

    with RecordOps() as before:
        causal_item_list(*args)
    launched = []
    monkeypatch.setattr(block_sparse_bwd, "launch_planned", lambda kernel, *a, **k: launched.append(kernel.__name__))
    with RecordOps() as after:
        block_sparse_bwd.causal_item_list_device(schedule, 16, offsets, 32768, 1024, 40 << 20)
    assert len(before.ops) == 59 and "aten.sort.stable" in before.ops  # what it replaces (a count, not a rule)
    assert after.ops == ["aten.empty.memory_format", "aten.as_strided.default", "aten.unbind.int"]
    assert launched == ["causal_streams_kernel", "causal_items_kernel"]


def _sectioned_lists(lens, heads, block, row_bytes, budget, bounds, pad, seed, device="cpu"):
    """``sectioned_item_list`` and ``sectioned_item_list_device`` over a key tile list as ``kv_tiles`` gives one
    (sorted by the heads' summed walks, longest first, stable; ``pad`` padding tiles after it), random walks up to
    4 and ``bounds`` (sectioned_item_list's total_rows, max_count: () for none), on ``device``."""
    from jfa_ops.backends.triton.block_sparse_bwd import sectioned_item_list_device

    gen = torch.Generator().manual_seed(seed)
    offsets = torch.tensor([0] + list(lens)).cumsum(0).to(torch.int32)
    n_kv_blocks = max([1] + [-(-n // block) for n in lens])
    q_count = torch.randint(0, 5, (len(lens), heads, n_kv_blocks), generator=gen, dtype=torch.int32)
    tiles = [(s, j * block) for s, n in enumerate(lens) for j in range(-(-n // block))]
    tiles.sort(key=lambda t: -int(q_count[t[0], :, t[1] // block].sum()))
    seq = torch.tensor([s for s, _ in tiles] + [-1] * pad, dtype=torch.int32)
    start = torch.tensor([st for _, st in tiles] + [0] * pad, dtype=torch.int32)
    seq, start, q_count, offsets = (t.to(device) for t in (seq, start, q_count, offsets))
    args = (dict(TILE_SEQ=seq, TILE_START=start), q_count, heads, block, offsets, row_bytes, budget, *bounds)
    return sectioned_item_list(*args), sectioned_item_list_device(*args)


def random_sectioned_case(heads, budget, seed):
    """``_sectioned_lists``' arguments for a random jagged batch: lengths 0, 1 and off the blocks, padding tiles or
    none, a budget of one byte ("stream": a section per stream), a fifth of the bytes ("some") or all ("all": one
    section), and per seed the 64-bit keys (no bounds), the 32-bit ones, or bounds that clamp the sections."""
    import random

    rng = random.Random(seed * 100 + heads)
    lens = [rng.choice([0, 1, 2, 127, 128, 129, rng.randrange(1, 1000)]) for _ in range(rng.choice([1, 2, 5, 20]))]
    block, row_bytes = rng.choice([64, 128]), rng.choice([1, 3, 1024])
    total = sum(lens) * heads * row_bytes
    budget = {"stream": 1, "some": max(1, total // 5), "all": total + 1}[budget]
    bounds = [(), (sum(lens), 4), (max(1, sum(lens) // 3), 4)][seed % 3]
    return lens, heads, block, row_bytes, budget, bounds, rng.choice([0, 1, 3]), seed


@pytest.mark.parametrize("steps", ["shipped", "small"])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("budget", ["stream", "some", "all"])
@pytest.mark.parametrize("heads", [1, 2, 3, 16])
def test_sectioned_item_list_device_is_the_torch_list(heads, budget, seed, steps, monkeypatch):
    """``sectioned_item_list_device`` (``configs.SPARSE_BACKWARD_SECTIONS_DEVICE``: two launches, no sort) gives
    ``sectioned_item_list``'s three tensors bit for bit on random jagged batches: lengths 0, 1 and off the blocks,
    padding tiles or none, budgets of one byte (a section per stream), a few sections, or all of it (one section),
    and the 64-bit keys (no bounds), the 32-bit ones (bounds), and bounds that clamp the sections (offsets past
    ``total_rows``: the torch list's clamp is the spec there too). "small": the kernels' programs and steps shrunk
    (items 4 x 8 keys, items 4 x 2 sequences), so that every case takes many steps before and after its own."""
    from jfa_ops.backends.triton import block_sparse_bwd

    if steps == "small":
        for name, value in (("SECTION_PLACES_BLOCK", 4), ("SECTION_PLACES_CHUNK", 8), ("SECTION_KEYS_BLOCK", 4),
                            ("SECTION_KEYS_CHUNK", 2)):
            monkeypatch.setattr(block_sparse_bwd, name, value)
    case = random_sectioned_case(heads, budget, seed)
    want, got = _sectioned_lists(*case)
    for a, b in zip(want, got):
        assert b.dtype == torch.int32 and torch.equal(a, b), case


@pytest.mark.parametrize("lens,pad", [((), 0), ((0, 0, 0), 0), ((0,), 2)], ids=["no-seqs", "no-tiles", "padding"])
def test_sectioned_item_list_device_empty_and_padding_only(lens, pad):
    """No sequences, or sequences without key tiles: empty int32 tensors as the torch list gives; a list of
    padding tiles only: the padding in list order."""
    for heads in (1, 3):
        want, got = _sectioned_lists(lens, heads, 128, 1, 100, (max(1, sum(lens)), 4), pad, 0)
        for a, b in zip(want, got):
            assert b.dtype == torch.int32 and b.shape == a.shape == (pad * heads,) and torch.equal(a, b)


def test_sectioned_item_list_device_bench_batch_ops(monkeypatch):
    """The bench's sparse batch (T65536 of lognormal lengths in whole 128-blocks, 16 kv heads, D128 bf16 rows, the
    40 MiB budget; the key tile list of ``kv_tiles`` sorted by the selection's walks): the same list, made with one
    allocation, two views and two launches (the torch list's ops counted beside it, with the launches stubbed,
    since the interpreter's own tensor work would count too)."""
    from tests.common import RecordOps

    from bench.suites import JAGGED_SEED, LOGNORMAL_MU, SPARSE_MAX_LEN, lognormal_lengths
    from jfa_ops.backends.triton import block_sparse_bwd
    from jfa_ops.backends.triton.block_sparse_fwd import selected_cost_args
    from jfa_ops.backends.triton.scheduling import kv_tiles

    lens = [-(-n // 128) * 128 for n in lognormal_lengths(65536, None, seed=JAGGED_SEED, max_len=SPARSE_MAX_LEN,
                                                           mu=LOGNORMAL_MU + 1.0)]
    total, heads, n_kv_blocks = sum(lens), 16, SPARSE_MAX_LEN // 128
    offsets = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    gen = torch.Generator().manual_seed(0)
    q_count = torch.randint(0, n_kv_blocks + 1, (len(lens), heads, n_kv_blocks), generator=gen, dtype=torch.int32)
    tiles = kv_tiles(offsets, offsets, total, total, 128, 0, 0, False, False, **selected_cost_args(q_count, 128))
    args = (dict(TILE_SEQ=tiles.seq, TILE_START=tiles.start), q_count, heads, 128, offsets, 1024, 40 << 20, total,
            n_kv_blocks)
    got = block_sparse_bwd.sectioned_item_list_device(*args)
    assert all(torch.equal(a, b) for a, b in zip(sectioned_item_list(*args), got))

    with RecordOps() as before:
        sectioned_item_list(*args)
    launched = []
    monkeypatch.setattr(block_sparse_bwd, "launch_planned", lambda kernel, *a, **k: launched.append(kernel.__name__))
    with RecordOps() as after:
        block_sparse_bwd.sectioned_item_list_device(*args)
    assert len(before.ops) == 67 and before.ops.count("aten.sort.stable") == 2  # what it replaces (a count, not a rule)
    assert after.ops == ["aten.empty.memory_format", "aten.as_strided.default", "aten.unbind.int"]
    assert launched == ["section_keys_kernel", "section_places_kernel"]


def test_sectioned_item_list_device_hands_long_lists_to_the_torch_list(monkeypatch):
    """Past ``SECTIONS_DEVICE_MAX_ITEMS`` items the device list launches nothing (its places kernel's items x items
    compares would outgrow the torch list's sorts) and returns the torch list; at the bound it launches."""
    from jfa_ops.backends.triton import block_sparse_bwd

    lens = [384, 128, 256]
    offsets = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    seq = torch.tensor([0, 0, 0, 1, 2, 2], dtype=torch.int32)
    start = torch.tensor([0, 128, 256, 0, 0, 128], dtype=torch.int32)
    q_count = torch.randint(0, 4, (3, 2, 3), dtype=torch.int32)
    args = (dict(TILE_SEQ=seq, TILE_START=start), q_count, 2, 128, offsets, 1024, 1 << 20, sum(lens), 3)
    launched = []
    monkeypatch.setattr(block_sparse_bwd, "launch_planned", lambda kernel, *a, **k: launched.append(kernel.__name__))
    monkeypatch.setattr(block_sparse_bwd, "SECTIONS_DEVICE_MAX_ITEMS", 11)  # 12 items
    got = block_sparse_bwd.sectioned_item_list_device(*args)
    assert launched == [] and all(torch.equal(a, b) for a, b in zip(sectioned_item_list(*args), got))
    monkeypatch.setattr(block_sparse_bwd, "SECTIONS_DEVICE_MAX_ITEMS", 12)
    block_sparse_bwd.sectioned_item_list_device(*args)
    assert launched == ["section_keys_kernel", "section_places_kernel"]


def test_sparse_forward_model_plans_take_every_item_once():
    """``tools/sparse_fwd_model.py`` (helper sparsefwd: the balance and L2 numbers behind
    ``configs.SPARSE_FORWARD_ZIGZAG``): every order it models gives each (sequence, head, Q block) with its walk to
    exactly one program, the walks are the op's budget (``ceil(keep x visible)``, the local block included,
    ascending), and the masked count is the first block plus the causal diagonal."""
    import importlib.util
    import math

    tools = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "tools")
    spec = importlib.util.spec_from_file_location("sparse_fwd_model", os.path.join(tools, "sparse_fwd_model.py"))
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)  # it finds fwd_schedule_model beside itself
    lens, heads = (640, 128, 1280, 256, 384), 4
    for causal in (False, True):
        sel = model.selection(lens, heads, 0.5, causal, seed=3)
        want = {(s, h, i) for s, n in enumerate(lens) for h in range(heads) for i in range(n // 128)}
        for s, per_head in enumerate(sel):
            for rows in per_head:
                for i, walk in enumerate(rows):
                    visible = i + 1 if causal else len(rows)
                    assert walk == sorted(set(walk)) and i in walk and len(walk) == math.ceil(0.5 * visible)
                    assert max(walk) < visible and model.masked_blocks(walk, i, causal) == min(len(walk), 1 + causal)
        for name, programs in model.orders(sel, heads, causal).items():
            got = [(s, h, i) for mine in programs for s, h, i, _ in mine]
            assert len(got) == len(want) and set(got) == want, name
            assert all(w == sel[s][h][i] for mine in programs for s, h, i, w in mine), name
