"""The reference backend, called directly (no op, no validation): every row written, chunking, masks, precision."""
import pytest
import torch
from expecttest import TestCase
from hypothesis import given
from hypothesis import strategies as st

from jfa_ops.backends import AttentionParams, Problem, reference
from jfa_ops.testing import FEATURE_MATRIX, AttentionCase, check_attention_case, check_backend_writes_every_row
from jfa_ops.testing import _visible as oracle_visible

DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case_name", list(FEATURE_MATRIX))
def test_every_row_written(case_name, dtype):
    """forward after the allocator is poisoned with NaN: rows that see no key are exactly 0 with lse -inf."""
    check_backend_writes_every_row("reference", FEATURE_MATRIX[case_name].replace(dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_row_chunking(monkeypatch, dtype):
    """A score-block budget of a few rows splits every sequence into chunks: results as with one block."""
    case = AttentionCase((9, 0, 13), (11, 5, 7), heads_q=4, heads_kv=2, dtype=dtype, causal=True, window=(4, 1))
    x = case.make_inputs(0)
    params = AttentionParams(scale=0.25, causal=True, window_left=4, window_right=1)
    whole = reference.forward(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, params)
    monkeypatch.setattr(reference, "SCORE_BLOCK_BYTES", 3 * 11 * 4 * dtype.itemsize)  # 3 rows of the longest kv
    assert list(reference._row_chunks(13, 11, 4, dtype.itemsize)) == [(0, 3), (3, 6), (6, 9), (9, 12), (12, 13)]
    chunked = reference.forward(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, params)
    torch.testing.assert_close(chunked, whole)  # einsum blocking differs with the row count: not bitwise
    check_attention_case(case, "reference")


class TestMaskDiagram(TestCase):
    def test_docstring_diagram(self):
        """The mask diagram of jagged_attention's docstring (Lq=3, Lk=5)."""
        def draw(**kw):
            m = reference.visible_mask(0, 3, 3, 5, AttentionParams(scale=1.0, **kw), "cpu")
            return "\n".join(" ".join("x" if b else "." for b in row) for row in m.tolist())

        self.assertExpectedInline(draw(causal=True), """\
x x x . .
x x x x .
x x x x x""")
        self.assertExpectedInline(draw(window_left=1, window_right=0), """\
. x x . .
. . x x .
. . . x x""")


@given(q_rows=st.integers(0, 12), kv_rows=st.integers(0, 12), causal=st.booleans(),
       left=st.integers(-1, 5), right=st.integers(-1, 5), data=st.data())
def test_mask_matches_the_oracle_mask(q_rows, kv_rows, causal, left, right, data):
    r0 = data.draw(st.integers(0, q_rows))
    r1 = data.draw(st.integers(r0, q_rows))
    params = AttentionParams(scale=1.0, causal=causal, window_left=left, window_right=right)
    mask = reference.visible_mask(r0, r1, q_rows, kv_rows, params, "cpu")
    want = oracle_visible(q_rows, kv_rows, causal, (left, right))[r0:r1]
    assert torch.equal(want, torch.ones_like(want) if mask is None else mask)


def test_float64_gradients_are_float64_exact():
    """The saved lse is float32; the backward recomputes it for float64 inputs (regression: grads were ~1e-7)."""
    check_attention_case(FEATURE_MATRIX["causal"].replace(dtype=torch.float64, heads_q=4, heads_kv=2), "reference")


def test_grad_lse_none_equals_zero_grad_lse():
    x = FEATURE_MATRIX["gqa"].make_inputs(0)
    params = AttentionParams(scale=0.25)
    out, lse = reference.forward(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, params)
    do = torch.randn_like(out)
    args = (x.q, x.k, x.v, out, lse, x.q_offsets, x.kv_offsets, params)
    for a, b in zip(reference.backward(do, None, *args), reference.backward(do, torch.zeros_like(lse), *args)):
        assert torch.equal(a, b)


def test_supports_everything():
    for device, dtype in (("cpu", torch.float64), ("cuda", torch.bfloat16), ("meta", torch.float16)):
        assert reference.supports(Problem(device, dtype, 256, 8, 1, True, 3, 0, True, True)) is None
