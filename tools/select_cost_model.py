"""The select kernel's cost on the H200, modeled from sm_90 SASS counts (bench/NOTES.md "Select kernel cost, helper
select30, stop 30"): `python tools/select_cost_model.py` (CPU; no GPU, no compile: the counts below are triton 3.9's).

Per variant, SASS instructions a warp executes for one Q block row of one kv head as a function of the row's scored
blocks n (the visible range where the variant takes it; ch = ceil(n / 32) steps of 32 blocks), the
shuffles among them, the dependent global round trips, and the CTAs of 4 warps an SM holds (registers). Time:

    T = ((I - S) / IPC + S) / (132 SMs x 1.98 GHz) + L x RT / (132 x CTAs per SM)

I, S: warp-instructions and SHFL per SM (SHFL runs at 32 lanes a clock per SM: a quarter of the issue rate), RT:
round trips. IPC (per SM, of 4) and L (us a round trip) are fitted by least squares to the three measured kernels
(H200 v20/v21: default 150 us non-causal, 120 causal; `sparse_select_rows` 320); the grouped rows kernel is the
check out of the fit.
"""
from __future__ import annotations

import math

import numpy as np

from bench.suites import sparse_cases

SMS, CLOCK_MHZ, WARPS = 132, 1980, 4


def _chunks(n):
    return math.ceil(n / 32)


# name: (instructions a warp, SHFL a warp, dependent round trips) per Q block row and kv head, as a function of the
# blocks n the row scores; CTAs per SM (registers); whether it takes the visible range. Counts: `block_select_kernel`'s
# sm_90 SASS (loop bodies: score step 203-215, rank step 721; the grouped rows loop 5,124 a row + 333 a program of 4
# rows; the radix kernel 1,033 a program of 4 kv heads + 43 a head + 212 a score step).
VARIANTS = {
    "default": (lambda n: (252 + (203 + 721) * _chunks(n), 29 * _chunks(n), 3 + 2 * _chunks(n)), 6, True),
    "sparse_select_rows": (lambda n: (4592, 1012, 4), 5, False),
    "rows+grouped": (lambda n: (5124 + 333 / 4, 1012, 2.5), 3, False),
    "sparse_select_radix": (lambda n: ((1033 + 4 * 43) / 4 + 212 * _chunks(n), 3 + 24 * _chunks(n), 1 + _chunks(n)),
                            9, True),
}
MEASURED = {("default", False): 150.0, ("default", True): 120.0, ("sparse_select_rows", False): 320.0}


def _row_lengths(case):
    """Blocks each Q row of the batch scores (all its sequence's; causal with the visible range: blocks 0..i)."""
    for length in case.kv_lens:
        n = length // case.block
        for i in range(n):
            yield n, i + 1


def features(case, variant):
    per_row, ctas, visible = VARIANTS[variant]
    heads = case.num_heads_kv
    inst = shfl = trips = 0.0
    for n, causal_n in _row_lengths(case):
        i, s, r = per_row(causal_n if case.causal and visible else n)
        inst, shfl, trips = inst + WARPS * i * heads, shfl + WARPS * s * heads, trips + r * heads
    issue = np.array([(inst - shfl) / (SMS * CLOCK_MHZ), trips / (SMS * ctas)])
    return issue, shfl / (SMS * CLOCK_MHZ)


def main():
    cases = {c.causal: c for c in sparse_cases([128], "quick")}
    rows, rhs = [], []
    for (variant, causal), us in MEASURED.items():
        x, shfl_us = features(cases[causal], variant)
        rows.append(x)
        rhs.append(us - shfl_us)
    (inv_ipc, latency), *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    print(f"fit: IPC {1 / inv_ipc:.2f} per SM, {latency:.2f} us a dependent round trip")
    for variant in VARIANTS:
        for causal in (False, True):
            x, shfl_us = features(cases[causal], variant)
            issue, wait = x[0] * inv_ipc, x[1] * latency
            measured = MEASURED.get((variant, causal), "-")
            print(f"{variant:20s} {'causal' if causal else 'full':6s} issue {issue:5.0f} + shfl {shfl_us:4.0f} + "
                  f"latency {wait:3.0f} = {issue + shfl_us + wait:4.0f} us  (measured {measured})")


if __name__ == "__main__":
    main()
