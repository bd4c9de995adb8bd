"""``jfa_ops.testing``: the oracle, the comparison, the strategies and ``check_backend`` itself."""
import math
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import find, given
from hypothesis import strategies as st

import meta_kernels
from jfa_ops import validation
from jfa_ops.backends import Backend, reference, register_backend, unregister_backend
from jfa_ops.testing import (FEATURE_MATRIX, LSE_TOLERANCE, TOLERANCES, AttentionCase, assert_attention_close,
                             attention_cases, check_backend, jagged_lengths, reference_attention, row_visibility,
                             tolerance)


# ---- the oracle ------------------------------------------------------------------------------------------------

def test_oracle_by_hand():
    """One query, two keys: scores 1*2*s and 0, s = 1/sqrt(8)."""
    q = torch.zeros(1, 1, 8, dtype=torch.float64)
    q[0, 0, 0] = 1.0
    k = torch.zeros(2, 1, 8, dtype=torch.float64)
    k[0, 0, 0] = 2.0
    v = torch.zeros(2, 1, 8, dtype=torch.float64)
    v[0, 0, 1], v[1, 0, 1] = 3.0, -1.0
    offsets_q, offsets_kv = torch.tensor([0, 1]), torch.tensor([0, 2])
    out, lse = reference_attention(q, k, v, offsets_q, offsets_kv)
    s = 2 / math.sqrt(8)
    p0 = math.exp(s) / (math.exp(s) + 1)
    assert out[0, 0, 1].item() == pytest.approx(3 * p0 - (1 - p0), rel=1e-14)
    assert lse[0, 0].item() == pytest.approx(math.log(math.exp(s) + 1), rel=1e-14)
    # causal with Lq=1, Lk=2: bottom-right aligned, the query sees both keys; window (0, 0) only the last
    assert torch.equal(reference_attention(q, k, v, offsets_q, offsets_kv, causal=True)[0], out)
    out_w, lse_w = reference_attention(q, k, v, offsets_q, offsets_kv, window=(0, 0))
    assert out_w[0, 0, 1].item() == -1.0 and lse_w[0, 0].item() == 0.0


@pytest.mark.parametrize("lq,lk,causal,window", [(5, 5, False, (-1, -1)), (5, 5, True, (-1, -1)),
                                                 (3, 6, True, (-1, -1)), (4, 7, False, (2, 1)),
                                                 (6, 6, True, (2, -1))])
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (3, 1)])
def test_oracle_matches_sdpa_on_dense_batches(lq, lk, causal, window, heads):
    """Equal lengths: the jagged oracle equals F.scaled_dot_product_attention with the bottom-right mask."""
    b, (hq, hkv), d = 3, heads, 16
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b * lq, hq, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b * lk, hkv, d, generator=g, dtype=torch.float64) for _ in range(2))
    out, lse = reference_attention(q, k, v, torch.arange(b + 1) * lq, torch.arange(b + 1) * lk, causal=causal,
                                   window=window)
    # The mask is built here from the README's rule on purpose, not with testing.visible_mask: this test checks the
    # oracle (mask included) against SDPA, so it must not share the oracle's code.
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    diag = i + lk - lq
    mask = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        mask &= j <= diag
    if window[0] >= 0:
        mask &= j >= diag - window[0]
    if window[1] >= 0:
        mask &= j <= diag + window[1]
    dense = lambda t, n: t.unflatten(0, (b, n)).transpose(1, 2)  # noqa: E731  [B, H, L, D]
    want = F.scaled_dot_product_attention(dense(q, lq), dense(k, lk), dense(v, lk), attn_mask=mask,
                                          enable_gqa=hq != hkv)
    torch.testing.assert_close(dense(out, lq), want, rtol=1e-12, atol=1e-12)
    scores = dense(q, lq) @ dense(k, lk).repeat_interleave(hq // hkv, 1).transpose(-1, -2) / math.sqrt(d)
    want_lse = scores.masked_fill(~mask, -math.inf).logsumexp(-1)  # [B, H, Lq]
    torch.testing.assert_close(lse, want_lse.permute(1, 0, 2).flatten(1), rtol=1e-12, atol=1e-12)


def test_oracle_rows_without_keys_are_zero_with_zero_grads():
    case = AttentionCase((4, 3), (2, 0), causal=True, dtype=torch.float64)  # seq 0: rows 0, 1 see nothing
    x = case.make_inputs(0, requires_grad=True)
    out, lse = x.oracle()
    out_sees, q_sees, kv_seen = x.visibility()
    assert out_sees.tolist() == [False, False, True, True, False, False, False] == q_sees.tolist()
    assert kv_seen.tolist() == [True, True]
    assert torch.equal(out[~out_sees], torch.zeros_like(out[~out_sees]))
    assert torch.isinf(lse[:, ~out_sees]).all() and torch.isfinite(lse[:, out_sees]).all()
    grads = torch.autograd.grad((out, lse.clamp_min(-1e9)), (x.q, x.k, x.v), (torch.ones_like(out),
                                                                               torch.ones_like(lse)))
    assert not any(torch.isnan(g).any() for g in grads)
    assert torch.equal(grads[0][~q_sees], torch.zeros_like(grads[0][~q_sees]))


def test_row_visibility_broadcast_q():
    out_sees, q_sees, kv_seen = row_visibility(3, None, torch.tensor([0, 1, 1, 4]), causal=True, broadcast_q=True)
    # Lk=1: only the last query row sees the key; Lk=0: nothing; Lk=3: every row
    assert out_sees.tolist() == [False, False, True] + [False] * 3 + [True] * 3
    assert q_sees.tolist() == [True, True, True] and kv_seen.tolist() == [True] * 4


# ---- the comparison --------------------------------------------------------------------------------------------

def test_tolerance_table():
    assert TOLERANCES == {torch.float64: (1e-10, 1e-10), torch.float32: (1e-5, 1e-4),
                          torch.float16: (2e-3, 5e-3), torch.bfloat16: (1e-2, 2e-2)}
    assert tolerance(torch.bfloat16, "grad") == 2e-2
    with pytest.raises(ValueError, match="kind must be"):
        tolerance(torch.float32, "other")


@pytest.mark.parametrize("dtype", list(TOLERANCES))
def test_lse_tolerance_is_one_for_every_dtype(dtype):
    """lse is float32 from fp32 scores whatever the inputs: 1e-5, not the output's 1e-2 of bf16."""
    assert tolerance(dtype, "lse") == LSE_TOLERANCE == 1e-5
    lse = torch.randn(2, 30, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 3.0
    with pytest.raises(AssertionError, match=r"lse: relative error norm .* > 1e-05 \(torch.bfloat16, lse\)"):
        assert_attention_close(lse + 1e-3, lse, dtype=torch.bfloat16, kind="lse", name="lse")


def test_kind_is_explicit_not_derived_from_the_name():
    """A tensor named like a gradient is compared at the kind given (the name used to pick the tolerance)."""
    expected = torch.ones(10, dtype=torch.float64)
    actual = expected * (1 + 4e-3)  # between the fp16 forward (2e-3) and grad (5e-3) tolerances
    assert_attention_close(actual, expected, dtype=torch.float16, kind="grad", name="out")
    with pytest.raises(AssertionError, match=r"dq: relative error norm .* \(torch.float16, forward\)"):
        assert_attention_close(actual, expected, dtype=torch.float16, kind="forward", name="dq")
    with pytest.raises(TypeError, match="kind"):
        assert_attention_close(actual, expected, dtype=torch.float16, name="dq")


@pytest.mark.parametrize("dtype", list(TOLERANCES))
def test_relative_error_norm_threshold(dtype):
    expected = torch.randn(50, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    direction = torch.randn(50, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    direction *= expected.norm() / direction.norm()
    tol = tolerance(dtype, "forward")
    assert_attention_close(expected + 0.9 * tol * direction, expected, dtype=dtype, kind="forward", name="out")
    with pytest.raises(AssertionError, match=r"out: relative error norm .* > "):
        assert_attention_close(expected + 1.1 * tol * direction, expected, dtype=dtype, kind="forward", name="out")


def test_nan_never_passes():
    x = torch.zeros(4, 2, dtype=torch.float64)
    y = x.clone()
    y[2, 1] = math.nan
    with pytest.raises(AssertionError, match=r"dq: 1 NaN of 8, first at index \(2, 1\)"):
        assert_attention_close(y, x, dtype=torch.bfloat16, kind="grad", name="dq")


def test_infinities_must_match():
    lse = torch.tensor([[0.5, -math.inf, 1.0]], dtype=torch.float64)
    assert_attention_close(lse.float(), lse, dtype=torch.float32, kind="lse", name="lse")
    with pytest.raises(AssertionError, match="infinities differ"):
        assert_attention_close(torch.tensor([[0.5, -1e30, 1.0]]), lse, dtype=torch.float32, kind="lse", name="lse")
    with pytest.raises(AssertionError, match="infinities differ"):
        assert_attention_close(torch.tensor([[0.5, -math.inf, -math.inf]]), lse, dtype=torch.float32, kind="lse",
                               name="lse")


def test_zero_rows_must_be_exactly_zero():
    expected = torch.zeros(3, 2, 4, dtype=torch.float64)
    expected[0] = 1.0
    actual = expected.clone()
    actual[2, 1, 3] = 1e-30  # invisible to any relative norm
    assert_attention_close(actual, expected, dtype=torch.float32, kind="forward", name="out")
    with pytest.raises(AssertionError, match=r"out: 1 rows should be exactly 0 .* rows \[2\]"):
        assert_attention_close(actual, expected, dtype=torch.float32, kind="forward", name="out",
                               zero_rows=torch.tensor([False, True, True]))


def test_shape_mismatch_fails():
    with pytest.raises(AssertionError, match=r"shape \(2, 3\), expected \(3, 2\)"):
        assert_attention_close(torch.zeros(2, 3), torch.zeros(3, 2), dtype=torch.float32, kind="forward", name="out")


# ---- strategies and cases --------------------------------------------------------------------------------------

@given(case=attention_cases(dtypes=(torch.float32, torch.float16), max_total=20), seed=st.integers(0, 100))
def test_generated_cases_are_valid_inputs(case, seed):
    x = case.make_inputs(seed)
    meta_kernels.check_attention_args(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, case.window, case.broadcast_q)
    validation.check_offset_values(x.q, x.k, x.q_offsets, x.kv_offsets, -1 if x.kwargs["max_seqlen_q"] is None
                                   else x.kwargs["max_seqlen_q"], -1 if x.kwargs["max_seqlen_kv"] is None
                                   else x.kwargs["max_seqlen_kv"])
    assert sum(case.kv_lengths) <= 20 and (case.broadcast_q or sum(case.q_lengths) <= 20)
    assert x.q.dtype == case.dtype and x.kv_offsets.dtype == case.offsets_dtype
    assert (x.q_offsets is None) == case.broadcast_q


@given(st.data())
def test_jagged_lengths_respect_max_total(data):
    lengths = data.draw(jagged_lengths(min_batch=2, max_batch=6, max_len=30, max_total=25))
    assert 2 <= len(lengths) <= 6 and sum(lengths) <= 25 and min(lengths) >= 0


@pytest.mark.parametrize("feature", ["empty sequence", "length 1", "skew", "empty kv, non-empty q", "broadcast_q",
                                     "gqa", "window", "causal", "lq != lk", "large head_dim", "int32 offsets"])
def test_strategy_reaches_every_feature(feature):
    predicate = {
        "empty sequence": lambda c: 0 in c.kv_lengths and sum(c.kv_lengths) > 0,
        "length 1": lambda c: 1 in c.q_lengths,
        "skew": lambda c: len(c.kv_lengths) >= 3 and max(c.kv_lengths) >= 15 and sorted(c.kv_lengths)[1] <= 3,
        "empty kv, non-empty q": lambda c: sum(c.kv_lengths) == 0 and sum(c.q_lengths) > 0,
        "broadcast_q": lambda c: c.broadcast_q and len(c.kv_lengths) >= 2,
        "gqa": lambda c: c.heads_q > c.heads_kv > 1,
        "window": lambda c: c.window[0] >= 0 and c.window[1] >= 0,
        "causal": lambda c: c.causal,
        "lq != lk": lambda c: not c.broadcast_q and c.q_lengths != c.kv_lengths and sum(c.kv_lengths) > 0,
        "large head_dim": lambda c: c.head_dim > 128,
        "int32 offsets": lambda c: c.offsets_dtype == torch.int32,
    }[feature]
    find(attention_cases(), predicate)


def test_make_inputs_is_reproducible():
    case = FEATURE_MATRIX["gqa"]
    a, b, c = case.make_inputs(3), case.make_inputs(3), case.make_inputs(4)
    assert torch.equal(a.q, b.q) and torch.equal(a.v, b.v) and not torch.equal(a.q, c.q)
    d = case.make_inputs(torch.Generator().manual_seed(3))
    assert torch.equal(a.k, d.k)


def test_case_validation():
    with pytest.raises(ValueError, match="broadcast_q, q_lengths must be"):
        AttentionCase((2, 3), (2, 3), broadcast_q=True)
    with pytest.raises(ValueError, match="same length B"):
        AttentionCase((2,), (2, 3))


# ---- check_backend ---------------------------------------------------------------------------------------------

SMALL = {n: FEATURE_MATRIX[n] for n in ("jagged_empty_len1", "causal_lq_gt_lk", "broadcast_q_causal_gqa")}


def test_check_backend_passes_on_reference():
    summary = check_backend("reference", dtypes=(torch.float32, torch.bfloat16), examples=5)
    assert len(summary["passed"]) == 2 * len(FEATURE_MATRIX) and summary["unsupported"] == []
    assert summary["random"] == 5 and summary["cases_run"] == 2 * len(FEATURE_MATRIX) + 5


def test_check_backend_fails_when_it_runs_nothing():
    """A backend that supports nothing (or a check given nothing to run) is not a pass."""
    backend = Backend("supports_nothing", forward=reference.forward, backward=reference.backward,
                      supports=lambda p: "nothing", priority=-100)
    register_backend(backend)
    try:
        with pytest.raises(AssertionError, match=r"check_backend\('supports_nothing'.* ran no case: 2 matrix cases "
                                                 r"unsupported"):
            check_backend("supports_nothing", cases={n: FEATURE_MATRIX[n] for n in ("dense", "window")},
                          examples=3, opcheck=False)
    finally:
        unregister_backend("supports_nothing")
    with pytest.raises(AssertionError, match="ran no case"):
        check_backend("reference", cases={}, examples=0)


def _forward_scaled(*args):
    out, lse = reference.forward(*args)
    return out * 1.001, lse


def _forward_stale_rows(*args):
    out, lse = reference.forward(*args)
    return torch.where(torch.isinf(lse).T[..., None], torch.full_like(out, 7.0), out), lse


def _backward_ignores_grad_lse(grad_out, grad_lse, *args):
    return reference.backward(grad_out, None, *args)


def _forward_wrong_dtype(*args):
    out, lse = reference.forward(*args)
    return out.double(), lse


BROKEN = {
    "scaled_out": (dict(forward=_forward_scaled), r"out: relative error norm"),
    "stale_rows": (dict(forward=_forward_stale_rows), r"rows should be exactly 0"),
    "ignores_grad_lse": (dict(backward=_backward_ignores_grad_lse), r"dq \(grad through lse\): relative error norm"),
    "wrong_dtype": (dict(forward=_forward_wrong_dtype), r"opcheck: .*\n.*(dtype|Dtypes)"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_check_backend_reports_broken_backends(name):
    changes, pattern = BROKEN[name]
    backend = Backend(f"broken_{name}", **{"forward": reference.forward, "backward": reference.backward, **changes},
                      supports=lambda p: None, priority=-100)
    register_backend(backend)
    try:
        with pytest.raises(AssertionError, match=r"check_backend\('broken_" + name) as info:
            check_backend(backend.name, cases=SMALL, examples=3, opcheck=name == "wrong_dtype")
        assert re.search(pattern, str(info.value)), str(info.value)
    finally:
        unregister_backend(backend.name)


def test_check_backend_skips_and_lists_unsupported_cases():
    backend = Backend("no_windows", forward=reference.forward, backward=reference.backward,
                      supports=lambda p: "no windows" if p.window_left != -1 or p.window_right != -1 else None,
                      priority=-100)
    register_backend(backend)
    try:
        summary = check_backend("no_windows", cases={n: FEATURE_MATRIX[n] for n in ("dense", "window")},
                                examples=3, opcheck=False)
    finally:
        unregister_backend("no_windows")
    assert len(summary["passed"]) == 1 and summary["cases_run"] == 1 + summary["random"]
    assert summary["unsupported"] == [f"[window] {FEATURE_MATRIX['window']}: no windows"]


def test_check_backend_shrinks_random_failures():
    """A bug only the random cases hit (more than one q head) is reported with hypothesis's shrunk case."""
    def forward(q, *args):
        out, lse = reference.forward(q, *args)
        return (out * 1.01 if q.shape[1] > 1 else out), lse

    register_backend(Backend("many_heads_bug", forward=forward, backward=reference.backward,
                             supports=lambda p: None, priority=-100))
    try:
        with pytest.raises(AssertionError, match=r"\[random, shrunk\] oracle: q_lengths=.* heads=2/(1|2) ") as info:
            check_backend("many_heads_bug", cases={}, examples=40)
        assert "relative error norm" in str(info.value)
    finally:
        unregister_backend("many_heads_bug")
