"""tools/dq_last_model.py (helper dqdiag49): the event simulation of DQ_LAST's arrivals against hand-computed
timelines (no GPU, no kernel)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

dq_last_model = pytest.importorskip("dq_last_model")


def test_two_programs_the_late_one_finalizes_every_shared_tile():
    # tb 1 us, PER_ITEM 1.5 blocks. P0 walks {a, b} then {c, d}; P1 walks {a, b, e} then {c, d}.
    # P0's first item ends at 3.5 (a, b at 1 left); P1's at 4.5 takes a, b, e to 0: 3 finalizes, 4.5 + 3 = 7.5.
    # P0's second ends at 7.0 (c, d at 1); P1's at 7.5 + 3.5 = 11.0 takes c, d to 0: 13.0. Without DQ_LAST 8.0.
    assert dq_last_model.PER_ITEM == 1.5
    a, b, c, d, e = ((0, t) for t in range(5))
    progs = [[[a, b], [c, d]], [[a, b, e], [c, d]]]
    assert dq_last_model.simulate(progs, 1.0) == (8.0, [0, 0], 0)
    assert dq_last_model.simulate(progs, 1.0, 0.0, 1.0) == (13.0, [0, 5], 3)
    # A (per item) only: 4 arrivals, none finalizing costs anything: P1 ends at 8.0 + 2 x 0.5
    assert dq_last_model.simulate(progs, 1.0, 0.5, 0.0)[0] == 9.0


def test_every_tile_head_is_finalized_once_on_a_random_schedule():
    import random

    rng = random.Random(7)
    keys = [(h, t) for h in range(3) for t in range(40)]
    progs = [[rng.sample(keys, rng.randint(1, 12)) for _ in range(rng.randint(1, 6))] for _ in range(9)]
    walked = {k for mine in progs for walk in mine for k in walk}
    end, finals, burst = dq_last_model.simulate(progs, 0.7, 0.3, 0.9)
    assert sum(finals) == len(walked)
    # each program's timeline: its blocks and items at tb, its arrivals' A, its finalizes' F
    busy = [sum((dq_last_model.PER_ITEM + len(w)) * 0.7 + 0.3 for w in mine) + f * 0.9
            for mine, f in zip(progs, finals)]
    assert end == pytest.approx(max(busy))
    assert 1 <= burst <= max(len(w) for mine in progs for w in mine)


def test_halves_without_jitter_match_the_whole_tiles_and_count_each_half_once():
    # both consumers arrive together: each (tile, head)'s two halves go to the same program, finalized in parallel
    a, b, c, d, e = ((0, t) for t in range(5))
    progs = [[[a, b], [c, d]], [[a, b, e], [c, d]]]
    assert dq_last_model.simulate_halves(progs, 1.0, 0.0, 1.0, 0.0) == (13.0, [0, 10], 3)
    import random

    rng = random.Random(3)
    keys = [(h, t) for h in range(2) for t in range(30)]
    progs = [[rng.sample(keys, rng.randint(1, 10)) for _ in range(rng.randint(1, 5))] for _ in range(7)]
    walked = {k for mine in progs for walk in mine for k in walk}
    end, finals, _ = dq_last_model.simulate_halves(progs, 0.5, 0.2, 0.8, 1.5, seed=1)
    assert sum(finals) == 2 * len(walked)
    # a program's end is at least its own items, arrivals and (per consumer, at most all of its) finalizes
    assert end >= max(sum((dq_last_model.PER_ITEM + len(w)) * 0.5 + 0.2 for w in mine) for mine in progs)


@pytest.mark.parametrize("seed", range(8))
def test_halves_with_jitter_a_program_waits_for_its_slower_consumer(seed):
    # P0 walks tile t then tile u, P1 walks t (1 block an item: an item ends 2.5 us after it starts). Each
    # consumer's arrival is jittered by the seed's draws in launch order (P0 c0, P0 c1, P1 c0, P1 c1, then P0's
    # second item's c0, c1); t's half c goes to its later arrival; P0's second item starts when both its consumers
    # are done with the first, and it finalizes both halves of u (A 0.1, F 3.0, jitter < 1 us)
    import random

    rng = random.Random(seed)
    jit = [rng.random() for _ in range(6)]
    done0 = max(2.5 + jit[c] + 0.1 + 3.0 * (jit[c] > jit[2 + c]) for c in (0, 1))
    p0_end = done0 + 2.5 + max(jit[4], jit[5]) + 0.1 + 3.0
    p1_end = max(2.5 + jit[2 + c] + 0.1 + 3.0 * (jit[2 + c] > jit[c]) for c in (0, 1))
    t, u = (0, 0), (0, 1)
    end, finals, burst = dq_last_model.simulate_halves([[[t], [u]], [[t]]], 1.0, 0.1, 3.0, 1.0, seed=seed)
    assert end == pytest.approx(max(p0_end, p1_end))
    assert finals == [sum(jit[c] > jit[2 + c] for c in (0, 1)) + 2, sum(jit[2 + c] > jit[c] for c in (0, 1))]
    assert burst == 1
