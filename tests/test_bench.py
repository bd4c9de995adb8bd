"""Small CPU tests of the bench itself: pair counting, the case generators, the oracle against FlexAttention's mask.

Run: python -m pytest tests/test_bench.py -q
"""
import dataclasses

import pytest
import torch

from bench import flops, suites
from bench.peers import FlexAttention, oracle_output, rel_error


def test_pairs_closed_form_matches_brute_force():
    flops.self_test()


def test_jagged_lengths_sum_to_total_and_clip():
    lens = suites.lognormal_lengths(8 * 4096, None, seed=suites.JAGGED_SEED)
    assert sum(lens) == 8 * 4096 and 1 <= min(lens) and max(lens) <= suites.MAX_LEN


def test_every_size_builds():
    for size, dims in (("smoke", [64]), ("quick", [128]), ("full", list(suites.HEAD_DIMS))):
        cases = suites.build_cases(suites.SUITES, dims, size)
        assert cases and len({c.name for c in cases}) == len(cases)
        assert all(c.pairs() > 0 for c in cases)


@pytest.mark.parametrize("case", suites.build_cases(["jagged", "broadcast", "gqa", "window"], [64], "smoke"),
                         ids=lambda c: c.name)
def test_flex_document_mask_matches_oracle(case):
    inp = suites.make_inputs(case, "cpu")
    prep = FlexAttention(compile_kernel=False).prepare(case, inp)
    with torch.no_grad():
        assert rel_error(prep.to_jagged(prep.fn()), oracle_output(case, inp)) < 2e-2


def test_check_catches_a_wrong_mask():
    case = suites.build_cases(["window"], [64], "smoke")[0]
    inp = suites.make_inputs(case, "cpu")
    wrong = dataclasses.replace(case, window=(case.window[0] - 1, case.window[1]))
    prep = FlexAttention(compile_kernel=False).prepare(wrong, inp)
    with torch.no_grad():
        assert rel_error(prep.to_jagged(prep.fn()), oracle_output(case, inp)) > 5e-2
