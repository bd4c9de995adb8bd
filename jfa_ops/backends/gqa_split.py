"""How many parts the TLX backward splits each kv head's q-head group into (its GROUP_SPLIT), decided from shapes only.

Why (helper gqabwd, bench/NOTES.md "TLX GQA backward balance"): a dense backward work item is (key tile, kv head) and
walks every q head of the kv head's group, so GQA has group-times fewer, longer items. The persistent programs take
items by static striding from a list sorted longest first; where the longest item is a large share of one SM's mean
work, the busiest SM runs far over the mean (the bench's Hq16:Hkv2 jagged causal row: 1.54x). Splitting the group
into parts (items of group / parts heads, partial dK/dV added in fp32, ITEM_ORDER's snake) balances it, at a price:
each extra item reloads K/V and adds its partial dK/dV in fp32, the kernel's path is ~1.5% longer, and a zeroing pass
and two casts move the fp32 buffer through DRAM. Where balance is already good (dense equal lengths) it only costs.

``plan`` (helper gqarule, bench/NOTES.md "GQA split rule") predicts the busiest SM's time of the default (static
striding, one part), of the snake alone and of the split at every divisor of the group (under the snake), plus the
split's costs, and takes the fastest where it gains at least ``MIN_GAIN``. It reads shapes only (no host sync, no
offsets): the total rows, the batch size, the max_seqlen hints, the heads, the mask. A batch of one length (the
hints times B cover the rows) is modelled exactly; a jagged batch with a max_seqlen hint as one sequence of that
length and the rest of equal length (the least total work a batch with that longest sequence can have, so the
longest item's share is the largest it can be); without a hint as equal lengths (then only the snake may pay). The
cost model is ``tools/gqa_bwd_model.py``'s, calibrated on the H200 (2026-12-02: the MHA jagged T32768 causal row,
417.5 TFLOP/s; it gave the GQA 16:2 row 306 against 310 measured, the split 1.34x measured vs 1.27-1.37x predicted).
Pure Python, no torch, testable anywhere. Host cost (helpers gqaplan, gqafluid; bench/NOTES.md "plan cost", "GQA
split plan for new stand-ins"): the stand-in's tiles are closed-form ramps and atoms (``_stand_in_tiles``); with
few tile costs every program's load is swept exactly (``_step_busiest``), else a fluid model reads programs 0 and
P - 1 on a few linear pieces, each read an arithmetic series plus the staircase's phase term (``_fluid_busiest``).
Neither loops over tiles or rounds: 14-41 us for a new stand-in, against 0.1-1 ms for ``simulated_makespans``'
simulation of every round, which stays the oracle. It is memoized on the stand-in's lengths rounded to the 64 rows
its tile runs read (exact), so a call whose T moved a few rows costs ~4 us.
"""
from __future__ import annotations

import bisect
import functools
from typing import NamedTuple

BLOCK_M, BLOCK_N = 64, 128  # the backward's query block and key tile (bwd_config_v2 at D64 and D128)
PER_ITEM = 1.5  # an item's fixed cost in blocks: K/V load, epilogue (sparse_bwd_model.PER_ITEM)
PER_PART = 0.5  # a split item's extra: its partial dK/dV red-added in fp32 (2 x 64 red per consumer thread)
MASKED = 1.3  # a masked (diagonal / window edge) block's cost against a full one
SPLIT_PATH = 1.015  # the split kernel's block loop: +7 / +10 instructions of ~530 (SASS, helper gqabwd)
BLOCK_S = {64: 1.95e-6, 128: 2.60e-6}  # s per block of the busiest SM (D128: the calibration; D64 x 2.0 / 2.7)
FIXED_S_PER_ROW = 0.54e-3 / 65536  # delta pre-pass + dQ finalize at D128 (streaming; scales with head_dim)
HBM = 3.4e12  # B/s the backward's passes pull
SPLIT_DRAM = 4.0  # x the fp32 dK/dV buffer's bytes: zeroed, read and written back around the red adds, read by the
# casts (+ half written), less the default's own bf16 dK/dV store
SPLIT_LAUNCHES_S = 15e-6  # the zeroing pass and two casts: three more launches
FOLD_TILES = 0.1  # ``_fluid_profile``: a last ramp piece of fewer tiles (a ramp's bottom levels) extends the one above
STEP_LEVELS = 16  # ``_makespans``: a stand-in of up to this many tile costs takes ``_step_busiest`` (exact)
SNAKE_EXACT_RUNS = 16  # ``busiest``: runs of equal items up to which every program where the load may change is read
# the snake alone (ITEM_ORDER, no split) among the candidates: its modelled gain held on the GQA 16:2 row (1.19x
# measured, 1.23x modelled) but not on MHA (1.00x measured, 1.05x modelled); False if the GPU says it does not pay
SNAKE_ALONE = True
MIN_GAIN = 1.05  # a split (or the snake) must be predicted this much faster than the default
# the fluid model (``_fluid_busiest``) takes a plan predicted >= MIN_GAIN - FLUID_MARGIN: its busiest SM is within
# ~1-2% of the simulated one, so at MIN_GAIN itself it would miss simulated gains of 1.05-1.06 (helper gqafluid,
# bench/NOTES.md "GQA split plan for new stand-ins"); what it takes in the margin the simulation still rates >= 1.0x
FLUID_MARGIN = 0.01


class Plan(NamedTuple):
    parts: int  # GROUP_SPLIT (1: the group whole)
    snake: bool  # ITEM_ORDER's snake striding (always with parts > 1)
    gain: float  # predicted default time / this plan's time (1.0 for the default)


def divisors(n: int):
    return [d for d in range(1, n + 1) if n % d == 0]


def model_lengths(num_seqs: int, rows: int, max_seqlen: int):
    """[(length, count)] standing in for the batch (see the module doc): one length when the hint times B covers the
    rows, else one sequence of max_seqlen and the rest equal, else (no hint) all equal."""
    if num_seqs <= 0 or rows <= 0:
        return []
    if max_seqlen <= 0 or max_seqlen * num_seqs <= rows or num_seqs == 1:
        return [(-(-rows // num_seqs), num_seqs)]
    rest = rows - min(max_seqlen, rows)
    return [(min(max_seqlen, rows), 1)] + ([(-(-rest // (num_seqs - 1)), num_seqs - 1)] if rest > 0 else [])


def tile_runs(lengths, bounds, q_per_kv: float = 1.0, broadcast_rows: int = 0):
    """[(blocks walked per head, masked blocks of them, tiles)] of the key tiles of sequences ``lengths`` ([(kv
    length, count)]), most blocks first. ``bounds``: ``window_bounds``' (has_left, left, has_right, right); queries
    per key row ``q_per_kv`` (cross lengths), or ``broadcast_rows`` (broadcast Q: every sequence sees those rows)."""
    has_left, left, has_right, right = bounds
    runs = {}
    for n, count in lengths:
        nq = broadcast_rows if broadcast_rows else max(1, round(n * q_per_kv))
        for j in range(-(-n // BLOCK_N)):
            a, b = j * BLOCK_N, min(n, (j + 1) * BLOCK_N)
            if broadcast_rows:
                lo, hi = 0, nq
            else:  # queries i with -left <= key - i <= right (keys a..b-1; bottom-right aligned: self-attention 0)
                lo = max(0, a - right) if has_right else 0
                hi = min(nq, b + left) if has_left else nq
            blocks = max(0, -(-hi // BLOCK_M) - lo // BLOCK_M)
            masked = min(blocks, 2 * (has_right + has_left)) if not broadcast_rows else 0
            runs[(blocks, masked)] = runs.get((blocks, masked), 0) + count
    return sorted(((b, m, c) for (b, m), c in runs.items()), key=lambda r: -(r[0] + (MASKED - 1) * r[1]))


def _rounds_hitting(lo: int, hi: int, offset: int, programs: int, parity: int = -1) -> int:
    """Rounds k >= 0 (of parity 0 or 1; -1: any) whose item k x programs + offset lies in [lo, hi)."""
    a, b = max(0, -(-(lo - offset) // programs)), max(0, -(-(hi - offset) // programs))
    if parity < 0:
        return max(0, b - a)
    return max(0, (b + 1 - parity) // 2 - (a + 1 - parity) // 2)


def busiest(runs, heads_per_item: int, units: int, programs: int, snake: bool, split: bool) -> float:
    """Blocks of the busiest program: items tile-major (``units`` per tile, equal cost), sorted longest first, taken
    by static striding (program 0 is busiest: it takes each round's first item) or the snake (rounds alternate
    direction; see the picks below). A program's load walks
    its rounds (a bisect each) or, where runs are fewer, counts per run of equal items the rounds that hit it."""
    ends, costs, total = [], [], 0
    for b, m, c in runs:
        total += c * units
        ends.append(total)
        costs.append(heads_per_item * (b + (MASKED - 1) * m) + PER_ITEM + (PER_PART if split else 0.0))
    rounds = -(-total // programs)

    def load(even: int, odd: int) -> float:  # the program taking item k x programs + (even | odd) in round k
        if rounds <= len(runs):
            return sum(costs[bisect.bisect_right(ends, w)] for w in
                       (k * programs + (odd if k % 2 else even) for k in range(rounds)) if w < total)
        return sum(cost * (_rounds_hitting(a, b, even, programs, 0 if even != odd else -1)
                           + (_rounds_hitting(a, b, odd, programs, 1) if even != odd else 0))
                   for a, b, cost in zip([0] + ends[:-1], ends, costs))

    if not snake:
        return load(0, 0)
    # a program's load changes only where its items cross a run's end: with few runs (step profiles: full masks,
    # equal lengths) every such program is evaluated, with many (smooth profiles) the ends and quartiles
    if len(runs) <= SNAKE_EXACT_RUNS:
        picks = {0} | {e % programs for e in ends} | {(programs - e % programs) % programs for e in ends}
    else:
        picks = {0, programs // 4, programs // 2, (3 * programs) // 4, programs - 1}
    return max(load(p, programs - 1 - p) for p in picks)


def _stand_in_key(lengths, rows_q: int, rows_kv: int, broadcast_q: bool):
    """(lengths, rows_q, rows_kv) with the lengths rounded up to the rows their tile runs depend on, so that calls
    whose stand-ins differ by a few rows (jagged training: T changes every step) share ``_makespans``' memo.
    Exact, not an approximation: ``tile_runs`` reads a length n only through ceil(n / 64) where each sequence's
    queries are its keys (rows_q == rows_kv): tiles ceil(n / 128) = ceil(ceil(n / 64) / 2); a tile's visible blocks
    ceil(min(n, b + left) / 64) - lo with b = min(n, tile end), = min(ceil(n / 64), ceil((tile end + left) / 64)) - lo
    (ceil is monotone, left >= 0; lo does not read n); masked blocks from those. Broadcast Q reads n only through its
    tile count ceil(n / 128) and the query rows through ceil(rows_q / 64). Cross lengths (rows_q != rows_kv) stay
    exact (the queries per key row are a ratio)."""
    if broadcast_q and rows_q > 0:  # (no query rows: tile_runs reads the lengths as self-attention's)
        return tuple((-(-n // BLOCK_N) * BLOCK_N, c) for n, c in lengths), -(-rows_q // BLOCK_M) * BLOCK_M, 0
    if rows_q == rows_kv:
        return tuple((-(-n // BLOCK_M) * BLOCK_M, c) for n, c in lengths), 1, 1
    return tuple(lengths), rows_q, rows_kv


def _stand_in_tiles(lengths, rows_q: int, rows_kv: int, bounds: tuple, broadcast_q: bool):
    """The stand-in's key tiles as ramps [(top blocks, bottom blocks, tiles per level)] (levels 2 blocks apart) and
    atoms {blocks: tiles}, with the exact sum of their costs (blocks + masked x (MASKED - 1)). Closed forms, no loop
    over tiles: per length the visible blocks of key tile j are min(nq, 2j + 2 + left) - max(0, 2j - right) (in
    64-row blocks, ``tile_runs``' formula; the last tile apart), linear in j between the points where a term
    saturates, so each length is a few ramps (slope +-2) and atoms (slope 0); causal and full masks and broadcast Q
    take O(1) paths."""
    has_left, left, has_right, right = bounds
    sides = 0 if broadcast_q else 2 * (has_left + has_right)  # masked blocks of a tile (of >= sides blocks)
    ramps, atoms, total, tiles = [], {}, 0.0, 0
    for n, count in lengths:
        nq = rows_q if broadcast_q else max(1, round(n * rows_q / rows_kv))
        last = -(-n // BLOCK_N) - 1
        tiles += (last + 1) * count
        if broadcast_q or not (has_left or has_right):  # every tile sees all nq rows
            v = -(-nq // BLOCK_M)
            atoms[v] = atoms.get(v, 0) + (last + 1) * count
            total += v * (last + 1) * count
            continue
        if not has_left and right == 0 and nq >= n:  # causal: ceil(nq / 64) - 2j, j = 0 .. last (>= 1 or 2)
            pieces = ((-(-nq // BLOCK_M), -2, last + 1),)
        else:
            pieces = _length_pieces(n, nq, bounds, last)
        for v0, step, k in pieces:
            lo, hi = (v0, v0 + step * (k - 1)) if step > 0 else (v0 + step * (k - 1), v0)
            if step == 0 or k == 1:
                atoms[v0] = atoms.get(v0, 0) + count * k
                total += count * k * (v0 + (MASKED - 1) * min(v0, sides))
                continue
            under = range(lo, min(hi, sides - 1) + 1, 2)  # levels of fewer blocks than ``sides``: all masked
            total += count * (k * (lo + hi) / 2 + (MASKED - 1) * (sum(under) + sides * (k - len(under))))
            ramps.append((hi, lo, count))
    return ramps, atoms, total, tiles, sides


def _length_pieces(n: int, nq: int, bounds: tuple, last: int):
    """[(blocks of the first tile, step per tile, tiles)] of one length's key tiles 0 .. last (the general path of
    ``_stand_in_tiles``): the blocks, read at the tiles around each point where a term of the formula saturates (and
    at the last two), are linear between them."""
    has_left, left, has_right, right = bounds

    def blocks(j):  # tile_runs' formula for key tile j
        lo = max(0, j * BLOCK_N - right) if has_right else 0
        hi = min(nq, min(n, (j + 1) * BLOCK_N) + left) if has_left else nq
        return max(0, -(-hi // BLOCK_M) - lo // BLOCK_M)

    nqb, lb, rb = -(-nq // BLOCK_M), -(-left // BLOCK_M), -(-right // BLOCK_M)
    turns = ((rb, nqb + rb) if has_right else ()) + ((nqb - 2 - lb,) if has_left else ())  # 2 x the turning tiles
    points = sorted({0, last, max(0, last - 1)} | {j for x in turns for j in (x // 2, -(-x // 2)) if 0 < j < last})
    values = [blocks(j) for j in points]
    pieces = [(values[i], (values[i + 1] - values[i]) // (points[i + 1] - points[i]), points[i + 1] - points[i])
              for i in range(len(points) - 1)]
    return pieces + [(values[-1], 0, 1)]


def _fluid_profile(ramps, atoms, sides):
    """The stand-in's tiles sorted by cost as pieces (first tile, end tile, cost at the first, cost per tile, level
    width in tiles, drop per level, tiles from the piece's first level boundary back to its start): cost linear in
    the tile position (a ramp's level v spread evenly over blocks v - 1 .. v + 1: the staircase's line through its
    steps' midpoints; ramps that overlap summed: their levels interleave where their parities differ), atoms whole
    (width 0: no staircase)."""
    offset = (MASKED - 1) * sides  # a ramp tile's masked blocks (its few tiles under ``sides`` blocks: 0.3 x h over)
    if not ramps:  # atoms only (full masks, broadcast Q): steps
        pieces, t = [], 0
        for v in sorted(atoms, reverse=True):
            pieces.append((t, t + atoms[v], v + (MASKED - 1) * min(v, sides), 0.0, 0, 0, 0))
            t += atoms[v]
        return pieces
    edges = sorted({e for top, bottom, _ in ramps for e in (top + 1, bottom - 1)} | set(atoms), reverse=True)
    pieces, t = [], 0.0
    for upper, lower in zip(edges, edges[1:] + [None]):
        if upper in atoms:
            pieces.append((t, t + atoms[upper], upper + (MASKED - 1) * min(upper, sides), 0.0, 0, 0, 0))
            t += atoms[upper]
        if lower is None:
            continue
        by_parity = [0, 0]  # tiles per level of the ramps over (lower, upper), by their levels' parity
        for top, bottom, count in ramps:
            if top >= upper - 1 and bottom <= lower + 1:
                by_parity[top % 2] += count
        tiles = by_parity[0] + by_parity[1]
        if not tiles:
            continue
        major = by_parity[1] > by_parity[0]
        if by_parity[not major] * 4 <= by_parity[major]:  # one parity (or nearly): levels 2 blocks apart
            width, drop, lead = tiles, 2, (upper - major - 1) % 2 * tiles / 2
        else:  # both: a level every block (widths alternate; their mean), boundaries between
            width, drop, lead = tiles / 2, 1, tiles / 4
        pieces.append((t, t + tiles * (upper - lower) / 2, upper + offset, -2.0 / tiles, width, drop, lead))
        t += tiles * (upper - lower) / 2
    if len(pieces) > 2 and pieces[-1][4] and pieces[-2][4] and pieces[-1][1] - pieces[-1][0] < FOLD_TILES * t:
        pieces[-2:] = [pieces[-2][:1] + pieces[-1][1:2] + pieces[-2][2:]]  # the cheapest tiles: one piece less
    return pieces


def _frac_sum(phase: float, drift: float, n: float) -> float:
    """sum of frac(phase + k x drift), k < n (drift in (-1/2, 1/2]: the phases' drift per read, whole levels off), as
    the integral of frac over the phases the reads sweep (the reads of a staircase whose levels the rounds cross
    slowly keep one phase: the fluid line's systematic error)."""
    if n == 1 or -1e-9 < n * drift < 1e-9:
        return n * (phase % 1.0)
    lo = phase - drift / 2
    hi = lo + n * drift
    return (hi // 1 - lo // 1 + (hi % 1.0) ** 2 - (lo % 1.0) ** 2) / (2 * drift)


def _fluid_reads(pieces, units: int, programs: int, fixed: float, shifts: tuple):
    """[(cost read in even rounds, in odd rounds)] of the items kP + shift, per shift, on the fluid profile (cost per
    head; ``fixed`` per head added per item). A piece's items are read at their centres on its line, the rounds that
    read it an interval (their costs an arithmetic series, its even rounds too), plus the staircase's offset from the
    line at the reads' level phases (``_frac_sum``), even and odd rounds apart (the snake's stride 2P often nearly
    fits a level: then its reads keep one phase)."""
    out = [[0.0, 0.0] for _ in shifts]
    step = programs / units  # tiles between rounds
    for t0, t1, c0, dc, width, drop, lead in pieces:
        a, b, beta = t0 * units, t1 * units, dc * step  # a read at round k: alpha + beta k
        if width:  # the level each read lands in: phase (tiles from the boundary) / width; the line reads its middle
            one, bias = step / width, 0.5 - 0.5 / (units * width)
            drift = 2 * one % 1.0  # per 2 rounds, whole levels off
            if drift > 0.5:
                drift -= 1.0
        for shift, sums in zip(shifts, out):
            lo, hi = -((shift - a) // programs), -((shift - b) // programs)  # rounds k: a <= kP + shift < b
            if lo < 0.0:
                lo = 0.0
            if hi <= lo:
                continue
            alpha = c0 + dc * ((shift + 0.5) / units - t0) + fixed
            e_lo = -(-lo // 2)
            n, ne = hi - lo, -(-hi // 2) - e_lo  # even rounds 2i, i in [e_lo, e_lo + ne)
            even = ne * (alpha + beta * (2 * e_lo + ne - 1))
            odd = n * (alpha + beta * (2 * lo + n - 1) / 2) - even
            if width:
                phase = (shift / units - t0 + lead) / width + e_lo * drift
                if ne:
                    even += drop * (_frac_sum(phase, drift, ne) - ne * bias)
                if n > ne:
                    odd += drop * (_frac_sum(phase + (one if lo % 2 == 0 else -one), drift, n - ne)
                                   - (n - ne) * bias)
            sums[0] += even
            sums[1] += odd
    return out


def _fluid_busiest(pieces, heads_per_item: int, units: int, programs: int, split: bool):
    """(striding's busiest program, the snake's) in blocks (``busiest``'s) on the fluid profile (``_fluid_reads``),
    O(pieces): striding's program 0 (items 0, P, 2P, ...); under the snake (program p takes item kP + p when k is
    even, kP + P - 1 - p when odd) the busier of programs 0 and P - 1 (on smooth profiles ``busiest`` reads the
    quartiles too: within ~1%)."""
    fixed = (PER_ITEM + (PER_PART if split else 0.0)) / heads_per_item
    (first_even, first_odd), (last_even, last_odd) = _fluid_reads(pieces, units, programs, fixed,
                                                                  (0.0, programs - 1.0))
    return (heads_per_item * (first_even + first_odd),
            heads_per_item * max(first_even + last_odd, last_even + first_odd))


def _step_busiest(levels, heads_per_item: int, units: int, programs: int, split: bool):
    """(striding's busiest program, the snake's): ``busiest`` (every program where its load may change: exact) on a
    profile of few levels [(tile cost, tiles)], most first, in O(levels): item x costs sum_j drop_j over the level
    ends E_j > x (drop_j: the cost lost at E_j, the last to 0), so a program's load is sum_j drop_j x its reads before
    E_j = qP + r: q, and in round q (even: items qP + p, read where p < r; odd: qP + P - 1 - p, where p >= P - r) one
    more: striding's program 0 reads ceil(E_j / P); the snake's load moves by -drop_j at p = r (q even) or +drop_j at
    p = P - r (q odd), swept in order from program 0's."""
    fixed = PER_ITEM + (PER_PART if split else 0.0)
    end, striding, load, moves = 0, 0.0, 0.0, []
    for j, (cost, tiles) in enumerate(levels):
        end += tiles * units
        drop = heads_per_item * (cost - levels[j + 1][0]) if j + 1 < len(levels) else heads_per_item * cost + fixed
        rounds, part = divmod(end, programs)
        striding += drop * (rounds + (part > 0))
        load += drop * (rounds + (part > 0 and rounds % 2 == 0))
        if part:
            moves.append((part, -drop) if rounds % 2 == 0 else (programs - part, drop))
    best = load
    for _, move in sorted(moves):  # at one program the losses first: the gains' partial sums stay under the total
        load += move
        best = max(best, load)
    return striding, best


@functools.lru_cache(maxsize=4096)  # ~0.6 KB an entry; packed T32768 training: ~1,300 stand-ins in 3,000 steps
def _makespans(group: int, heads_kv: int, programs: int, lengths: tuple, rows_q: int, rows_kv: int, bounds: tuple,
               broadcast_q: bool, pairs: tuple):
    """The busiest program's blocks of the default and of each (parts, snake) in ``pairs`` on the stand-in
    ``lengths`` (``_step_busiest`` up to STEP_LEVELS tile costs, else ``_fluid_busiest``), or None where no plan
    can gain (the longest item < 5% of an SM's share).
    A candidate whose lower bound (the mean per program, the longest item) is no less than a busiest already read
    cannot be the fastest (the split's extra costs do not depend on its parts): it reads inf, unread. Memoized on
    ``_stand_in_key``'s rounded lengths: a repeat is a lookup."""
    ramps, atoms, total, tiles, sides = _stand_in_tiles(lengths, rows_q, rows_kv, bounds, broadcast_q)
    top = max(max(atoms, default=0), max((hi for hi, _, _ in ramps), default=0))  # the longest tile's blocks
    top += (MASKED - 1) * min(top, sides)
    mean, per_item = heads_kv * group * total / programs, heads_kv * tiles / programs  # blocks per program
    if not tiles or group * top + PER_ITEM < (MIN_GAIN - 1) * (mean + PER_ITEM * per_item):
        return None  # striding's busiest <= mean + the longest item: no gain
    if sum((hi - lo) // 2 + 1 for hi, lo, _ in ramps) + len(atoms) <= STEP_LEVELS:  # few levels: exact, O(levels)
        levels = dict(atoms)
        for hi, lo, count in ramps:
            for v in range(lo, hi + 1, 2):
                levels[v] = levels.get(v, 0) + count
        pieces = sorted(((v + (MASKED - 1) * min(v, sides), c) for v, c in levels.items()), reverse=True)
        busiest_of = _step_busiest
    else:
        pieces, busiest_of = _fluid_profile(ramps, atoms, sides), _fluid_busiest
    whole = busiest_of(pieces, group, heads_kv, programs, False)  # (striding, the snake): one part
    least, out = whole[0], [whole[0]]
    for parts, snake in pairs:
        fixed = PER_ITEM + (PER_PART if parts > 1 else 0.0)
        if parts == 1:
            out.append(whole[snake])
        elif max(mean + fixed * per_item * parts, group // parts * top + fixed) >= least:
            out.append(float("inf"))
        else:
            out.append(busiest_of(pieces, group // parts, heads_kv * parts, programs, True)[snake])
        least = min(least, out[-1])
    return tuple(out)


def simulated_makespans(group: int, heads_kv: int, programs: int, lengths, rows_q: int, rows_kv: int, bounds: tuple,
                        broadcast_q: bool, pairs: tuple):
    """``_makespans`` with every round simulated (``tile_runs`` + ``busiest``: 0.1-1 ms; gqarule's plan): the oracle
    the fluid model is checked against (tests/backends/test_gqa_split.py, tools/gqa_bwd_model.py --plan-agree)."""
    if broadcast_q:
        runs = tile_runs(lengths, bounds, broadcast_rows=rows_q)
    else:
        runs = tile_runs(lengths, bounds, q_per_kv=rows_q / rows_kv)
    item = [group * (b + (MASKED - 1) * m) + PER_ITEM for b, m, _ in runs]  # one part's item per tile run
    mean = heads_kv * sum(cost * c for cost, (_, _, c) in zip(item, runs)) / programs
    if not runs or item[0] < (MIN_GAIN - 1) * mean:
        return None
    return tuple(busiest(runs, group // parts, heads_kv * parts, programs, snake, parts > 1)
                 for parts, snake in ((1, False),) + pairs)


def plan(group: int, heads_kv: int, num_seqs: int, rows_q: int, rows_kv: int, max_seqlen_kv: int, head_dim: int,
         bounds: tuple, broadcast_q: bool, programs: int, candidates: tuple = None, simulate: bool = False) -> Plan:
    """The fastest predicted (parts, snake) of a dense backward call (see the module doc; each sequence's queries
    are rows_q / rows_kv of its keys, or broadcast Q's rows_q); ``candidates``: the
    (parts, snake) pairs to consider (None: the default, the snake alone, each divisor of the group > 1 with the
    snake). The default unless a candidate gains ``MIN_GAIN`` (less ``FLUID_MARGIN``). The busiest programs come
    from ``_makespans`` (14-41 us for a new stand-in, memoized on its rounded lengths); the per-call
    terms (the passes over the rows, the split's fp32 buffer) are a few multiplications. ``simulate``: every round
    simulated instead (``simulated_makespans``, unmemoized, 0.1-1 ms: the oracle, gqarule's plan, MIN_GAIN)."""
    default = Plan(1, False, 1.0)
    if group <= 1 or programs <= 0 or rows_kv <= 0 or num_seqs <= 0:
        return default
    pairs = candidates or _default_pairs(group, SNAKE_ALONE)
    lengths = model_lengths(num_seqs, rows_kv, max_seqlen_kv)
    if simulate:
        busiest_blocks = simulated_makespans(group, heads_kv, programs, lengths, rows_q, rows_kv, bounds, broadcast_q,
                                             tuple(pairs))
    else:
        busiest_blocks = _makespans(group, heads_kv, programs, *_stand_in_key(lengths, rows_q, rows_kv, broadcast_q),
                                    bounds, broadcast_q, tuple(pairs))
    if busiest_blocks is None:
        return default
    t_block = BLOCK_S.get(head_dim, BLOCK_S[128] * head_dim / 128)
    fixed = FIXED_S_PER_ROW * rows_q * head_dim / 128
    split_dram = SPLIT_DRAM * (2 * rows_kv * heads_kv * head_dim * 4) / HBM  # the fp32 dK/dV buffer's traffic

    def seconds(blocks, parts):
        t = blocks * t_block + fixed
        return t + ((SPLIT_PATH - 1) * (t - fixed) + split_dram + SPLIT_LAUNCHES_S) if parts > 1 else t

    base = seconds(busiest_blocks[0], 1)
    best = max(((base / seconds(blocks, p), p, s) for blocks, (p, s) in zip(busiest_blocks[1:], pairs)),
               default=(1.0, 1, False))
    return Plan(best[1], best[2], best[0]) if best[0] >= MIN_GAIN - (0.0 if simulate else FLUID_MARGIN) else default


@functools.lru_cache(maxsize=64)
def _default_pairs(group: int, snake_alone: bool) -> tuple:
    """(parts, snake) candidates: the snake alone (``SNAKE_ALONE``), each divisor of the group > 1 under the snake."""
    return ((1, True),) * snake_alone + tuple((d, True) for d in divisors(group)[1:])
