"""The TLX backward's dQ by its last contributor (``tlx.configs.BACKWARD_DQ_LAST``, helper dqlast48): the arrival
counts (``triton.dq_last.dq_arrivals_kernel``, under the interpreter) against a brute force that knows nothing of the
kernels' bounds: a query tile's count is the number of key tiles holding a key some row of the tile sees (the
mask, per pair), block-sparse: of the KV blocks its Q block selected (the forward's selection, ids deduplicated and
kept to [0, n_kv_blocks), as the transposed selection keeps them); tiles with none get dQ zeroed, the rest left
alone. The TLX kernel's own use of the counts is checked on the GPU (``test_tlx_gpu.py``, ``dq_last``)."""
from __future__ import annotations

import random

import pytest
import torch

from jfa_ops.backends.triton import dq_last
from jfa_ops.backends.triton.block_sparse_bwd import transpose_selection
from jfa_ops.backends.triton.common import window_bounds

BLOCK_M, BLOCK_N = 64, 128


def _visible(i, j, len_q, len_k, causal, window_left, window_right):
    """The forward's mask: key j of row i (bottom-right aligned, -window_left <= j - i - (L_k - L_q) <= right)."""
    rel = j - i - (len_k - len_q)
    ok = True
    if causal:
        ok = ok and rel <= 0
    if window_right >= 0:
        ok = ok and rel <= window_right
    if window_left >= 0:
        ok = ok and rel >= -window_left
    return ok


def _brute_counts(lengths_q, lengths_k, heads_kv, group, causal, window_left, window_right, selection=None,
                  block_q=128, block_kv=128, n_kv_blocks=0):
    """{(seq, query tile start, q head): key tiles that walk it}, from pairs (and the selection's rows)."""
    want = {}
    for s, (len_q, len_k) in enumerate(zip(lengths_q, lengths_k)):
        for m0 in range(0, len_q, BLOCK_M):
            for hk in range(heads_kv):
                n = 0
                for n0 in range(0, len_k, BLOCK_N):
                    if selection is not None:
                        index, count = selection
                        row = index[s, hk, m0 // block_q, :min(int(count[s, hk, m0 // block_q]), index.shape[3])]
                        blocks = {int(b) for b in row if 0 <= int(b) < n_kv_blocks}
                        if n0 // block_kv not in blocks:
                            continue
                    n += any(_visible(i, j, len_q, len_k, causal, window_left, window_right)
                             for i in range(m0, min(m0 + BLOCK_M, len_q)) for j in range(n0, min(n0 + BLOCK_N, len_k)))
                for g in range(group):
                    want[s, m0, hk * group + g] = n
    return want


def _offsets(lengths):
    return torch.tensor([0] + list(lengths)).cumsum(0).to(torch.int32)


def _run(lengths_q, lengths_k, heads, causal=False, window_left=-1, window_right=-1, keep=None, seed=0, block_q=128,
         block_kv=128, narrow=0):
    """(counts by (seq, m0, head, half), dq after the kernel (NaN before), the brute force). ``narrow``: the
    transposed selection keeps that many KV blocks fewer than the longest sequence has (the walk reads rows <
    n_kv_blocks only)."""
    hq, hkv = heads
    q_off, kv_off = _offsets(lengths_q), _offsets(lengths_k)
    total = sum(lengths_q)
    dq = torch.full((total, hq, 16), float("nan"))
    bounds = window_bounds(causal, window_left, window_right)
    selection, brute_sel, n_kv_blocks = None, None, 0
    if keep is not None:
        rng = random.Random(seed)
        n_q_blocks = max(1, -(-max(lengths_q) // block_q))
        n_kv_blocks = max(1, -(-max(lengths_k) // block_kv))
        width = max(1, n_kv_blocks + 1)
        index = torch.full((len(lengths_q), hkv, n_q_blocks, width), -1, dtype=torch.int32)
        count = torch.zeros((len(lengths_q), hkv, n_q_blocks), dtype=torch.int32)
        for s in range(len(lengths_q)):
            for h in range(hkv):
                for b in range(n_q_blocks):
                    # ascending picks, a duplicate and an out-of-range id now and then (dropped by the transpose)
                    ids = sorted(rng.sample(range(n_kv_blocks), max(1, int(keep * n_kv_blocks))))
                    if rng.random() < 0.2:
                        ids = sorted(ids + [ids[0]])
                    if rng.random() < 0.2:
                        ids.append(n_kv_blocks + 3)
                    ids = ids[:width]
                    index[s, h, b, :len(ids)] = torch.tensor(ids, dtype=torch.int32)
                    count[s, h, b] = len(ids) - (rng.random() < 0.2 and len(ids) > 1)  # some entries past count
        n_kv_blocks -= narrow
        q_index, q_count = transpose_selection(index, count, n_kv_blocks)
        selection = (q_index, q_count, block_q, block_kv)
        brute_sel = (index, count)
    counts = dq_last.dq_arrival_counts(q_off, kv_off, total, hq, hkv, 16, dq, BLOCK_M, BLOCK_N, bounds, selection)
    want = _brute_counts(lengths_q, lengths_k, hkv, hq // hkv, causal, window_left, window_right, brute_sel, block_q,
                         block_kv, n_kv_blocks)
    got = {}
    for s in range(len(lengths_q)):
        for m0 in range(0, lengths_q[s], BLOCK_M):
            slot = int(q_off[s]) // BLOCK_M + m0 // BLOCK_M + s
            for h in range(hq):
                got[s, m0, h] = (int(counts[slot, h, 0]), int(counts[slot, h, 1]))
    return got, dq, want, q_off


CASES = [
    # (lengths_q, lengths_k, heads, causal, window_left, window_right)
    ([300, 17, 0, 1, 700, 64, 65], None, (4, 2), False, -1, -1),
    ([300, 17, 0, 1, 700, 64, 65], None, (4, 2), True, -1, -1),
    ([130, 0, 257, 1, 9], None, (2, 2), True, 70, -1),
    ([500, 3, 129], None, (3, 1), False, 100, 40),
    ([200, 40, 1], [90, 300, 0], (2, 1), True, -1, -1),  # L_q != L_k (cross lengths), a sequence with no keys
    ([0, 0, 1], None, (2, 2), True, -1, -1),
    ([400, 256, 7], None, (2, 1), True, 64, -1),  # a key tile's last row seen at a tile boundary (hi_any = 192)
    ([333, 70], None, (1, 1), False, 64, 64),
]


@pytest.mark.parametrize("case", CASES)
def test_dense_counts_equal_the_brute_force(case):
    """Dense: both halves' counters of every (query tile, q head) equal the brute force; tiles with none have dQ
    zero on their rows, the others are untouched (NaN)."""
    lengths_q, lengths_k, heads, causal, left, right = case
    got, dq, want, q_off = _run(lengths_q, lengths_k or lengths_q, heads, causal, left, right)
    assert got == {key: (n, n) for key, n in want.items()}
    _check_zeroed(dq, want, q_off, lengths_q)


@pytest.mark.parametrize("keep", [0.25, 0.5, 1.0])
@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_counts_equal_the_brute_force(keep, causal):
    """Block-sparse over random selections (GQA, jagged with empty and one-row sequences, duplicates, ids past the
    KV blocks and entries past a row's count): the counts are those of the selected KV blocks' key tiles that see
    the tile."""
    lengths = [300, 0, 17, 1, 520, 129]
    got, dq, want, q_off = _run(lengths, lengths, (4, 2), causal, keep=keep, seed=int(keep * 8) + causal)
    assert got == {key: (n, n) for key, n in want.items()}
    assert any(n == 0 for n in want.values()) or keep == 1.0
    _check_zeroed(dq, want, q_off, lengths)


def test_block_sparse_counts_with_blocks_of_several_tiles():
    """256 x 256 blocks: four query tiles per Q block, two key tiles per KV block, with a left window."""
    lengths = [700, 5, 260]
    got, dq, want, q_off = _run(lengths, lengths, (2, 1), True, window_left=300, keep=0.5, seed=3, block_q=256,
                                block_kv=256)
    assert got == {key: (n, n) for key, n in want.items()}
    _check_zeroed(dq, want, q_off, lengths)


@pytest.mark.parametrize("heads,narrow", [((6, 3), 0), ((4, 2), 2)], ids=["3 kv heads", "selection narrower"])
def test_block_sparse_counts_odd_kv_heads_and_a_narrow_selection(heads, narrow):
    """Block-sparse (helper review48's additions): 3 kv heads (the program's kv-head lanes padded to 4, masked) and
    a transposed selection of 2 KV blocks fewer than the longest sequence's (keys past it select nothing: the
    counts' ``min(cdiv(len_k, BLOCK_KV), n_kv_blocks)``, which no other case binds)."""
    lengths = [520, 0, 300, 1, 129]
    got, dq, want, q_off = _run(lengths, lengths, heads, True, keep=0.5, seed=11, narrow=narrow)
    assert got == {key: (n, n) for key, n in want.items()}
    _check_zeroed(dq, want, q_off, lengths)


def _check_zeroed(dq, want, q_off, lengths_q):
    for (s, m0, h), n in want.items():
        rows = dq[int(q_off[s]) + m0:int(q_off[s]) + min(m0 + BLOCK_M, lengths_q[s]), h]
        if n == 0:
            assert torch.equal(rows, torch.zeros_like(rows)), (s, m0, h)
        else:
            assert rows.isnan().all(), (s, m0, h)


def test_slots_are_one_to_one_and_within_the_bound():
    """Slot q_off[s] // BLOCK_M + k + s: distinct for every (sequence, tile), below dq_slots' bound."""
    rng = random.Random(5)
    for _ in range(200):
        lengths = [rng.choice([0, 1, 63, 64, 65, rng.randrange(300)]) for _ in range(rng.randrange(1, 9))]
        off = [0]
        for n in lengths:
            off.append(off[-1] + n)
        slots = [off[s] // BLOCK_M + k + s for s, n in enumerate(lengths) for k in range(-(-n // BLOCK_M))]
        assert len(set(slots)) == len(slots)
        assert all(0 <= x < dq_last.dq_slots(off[-1], len(lengths), BLOCK_M) for x in slots)


@pytest.mark.parametrize("q_lengths", [(50, 250), (-64, 164)], ids=["past the end", "before the start"])
def test_bad_offsets_zero_no_row_outside_dq(q_lengths):
    """Bad offsets (``JFA_VALIDATE=deferred`` lets them reach the kernels; the project's rule: garbage outputs, never
    an access outside the tensors, ``scheduling``'s docstring): a query sequence whose rows leave [0, T) while its
    key side is empty gets count 0 and had its "dQ rows" zeroed past T (rows 100..299 of a 100-row dq) or before
    row 0 (offsets 0, -64, 100). dq is a view into a NaN buffer with 320 rows of canary on each side: they stay NaN.
    Found by helper review48; the counts kernel now skips such a sequence (the TLX kernel's own walk skips it too:
    ``slot_tile``'s real, an empty tile list)."""
    pad, total, heads, dim = 320, 100, 2, 16
    big = torch.full((pad + total + pad, heads, dim), float("nan"))
    dq = big[pad:pad + total]
    q_off = torch.tensor([0, q_lengths[0], q_lengths[0] + q_lengths[1]], dtype=torch.int32)
    kv_off = torch.tensor([0, 100, 100], dtype=torch.int32)  # sequence 1 has no keys: its tiles count 0
    dq_last.dq_arrival_counts(q_off, kv_off, total, heads, heads, dim, dq, BLOCK_M, BLOCK_N,
                              window_bounds(False, -1, -1))
    assert big[:pad].isnan().all() and big[pad + total:].isnan().all(), "dQ rows zeroed outside dq"
