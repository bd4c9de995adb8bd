"""Property tests against the float64 per-sequence oracle (``jfa_ops.testing.reference_attention``).

hypothesis draws the case (lengths with empties and skew, heads, GQA ratio, head_dim, dtype, causal, window,
broadcast-Q, scale, offsets dtype) and a fresh seed for the tensor values; ``check_attention_case`` compares out,
lse and the gradients through out, through lse and through both, with dtype-aware relative-error-norm tolerances,
and checks that rows which see no key are exactly 0 (lse -inf, zero gradients, never NaN).
"""
import dataclasses
import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import jfa_ops
import meta_kernels
from jfa_ops import backends
from jfa_ops.testing import FEATURE_MATRIX, AttentionCase, attention_cases, check_attention_case
from tests.common import device_backend_params, dtypes_for, head_dims_for, is_interpreted

FULL = device_backend_params()
SMOKE = [p for p in device_backend_params(smoke=True) if is_interpreted(*p.values)]
seeds = st.integers(0, 2**31 - 1)


def _check(case, backend, seed):
    assume(case.unsupported_reason(backend) is None)
    check_attention_case(case, backend, seed=seed)


@pytest.mark.parametrize("device,backend", FULL)
@given(data=st.data(), seed=seeds)
def test_matches_oracle(device, backend, data, seed):
    every = tuple(sorted({8, 16, 24, 32, 64, *meta_kernels.SUPPORTED_HEAD_DIMS}))
    runs = head_dims_for(device, backend, every)  # a backend with few head dims (tlx) draws only those it runs
    case = data.draw(attention_cases(devices=(device,), dtypes=dtypes_for(device, backend),
                                     head_dims=None if runs == every else runs), label="case")
    _check(case, backend, seed)


@pytest.mark.parametrize("device,backend", FULL)
@given(data=st.data(), seed=seeds)
def test_many_heads_and_gqa_ratios(device, backend, data, seed):
    case = data.draw(attention_cases(devices=(device,), dtypes=dtypes_for(device, backend), max_total=12,
                                     max_heads_kv=8, max_group=8,
                                     head_dims=head_dims_for(device, backend, (8, 24))), label="case")
    _check(case, backend, seed)


@pytest.mark.parametrize("device,backend", FULL)
@given(data=st.data(), seed=seeds)
def test_masks_with_long_sequences(device, backend, data, seed):
    """Causal and windows over lengths up to 70 (several blocks of any kernel tile), GQA, cross lengths."""
    case = data.draw(attention_cases(devices=(device,), dtypes=dtypes_for(device, backend), max_total=150,
                                     max_batch=3, max_len=70,
                                     head_dims=head_dims_for(device, backend), window=True), label="case")
    _check(case, backend, seed)


@pytest.mark.parametrize("device,backend", SMOKE)
@settings(max_examples=4)
@given(data=st.data(), seed=seeds)
def test_interpreted_backend_smoke(device, backend, data, seed):
    """Backends that only run under an interpreter on CPU (triton): a few small fp16 cases."""
    case = data.draw(attention_cases(devices=(device,), dtypes=(torch.float16,), max_total=24, max_batch=3,
                                     head_dims=(16, 32)), label="case")
    _check(case, backend, seed)


@pytest.mark.parametrize("device,backend", FULL)
@pytest.mark.parametrize("head_dim", meta_kernels.SUPPORTED_HEAD_DIMS)
def test_every_head_dim(device, backend, head_dim):
    case = AttentionCase((3, 0, 5), (4, 2, 6), heads_q=2, heads_kv=1, head_dim=head_dim, device=device,
                         dtype=dtypes_for(device, backend)[-1], causal=head_dim % 16 == 0)
    if case.unsupported_reason(backend):
        pytest.skip(case.unsupported_reason(backend))
    check_attention_case(case, backend, seed=head_dim)


@pytest.mark.parametrize("device,backend", FULL)
@pytest.mark.parametrize("broadcast_q", [False, True])
def test_empty_kv_with_nonempty_q(device, backend, broadcast_q):
    """KV all empty: out exactly 0, lse -inf, zero gradients, never NaN (checked directly, not via the oracle)."""
    head_dim = head_dims_for(device, backend)[0]
    case = AttentionCase((3,) if broadcast_q else (3, 4), (0, 0), broadcast_q=broadcast_q, device=device,
                         dtype=dtypes_for(device, backend)[-1], head_dim=head_dim)
    inputs = case.make_inputs(0, requires_grad=True)
    out, lse = inputs.call(backend)
    assert out.shape == (6 if broadcast_q else 7, 2, head_dim) and lse.shape == (2, out.shape[0])
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, torch.full_like(lse, -math.inf))
    grads = torch.autograd.grad((out, lse), (inputs.q, inputs.k, inputs.v),
                                (torch.randn_like(out), torch.randn_like(lse)))
    assert torch.equal(grads[0], torch.zeros_like(inputs.q))
    assert grads[1].shape == (0, 2, head_dim) and grads[2].shape == (0, 2, head_dim)


FLOAT64 = [p for p in FULL if torch.float64 in dtypes_for(*p.values)]
GRADCHECK_CASES = {
    "jagged_gqa_causal": AttentionCase((2, 0, 3, 1), (3, 1, 2, 0), heads_q=2, heads_kv=1, head_dim=8, causal=True),
    "window_cross": AttentionCase((3, 2), (4, 5), head_dim=8, window=(1, 1), heads_q=1, heads_kv=1),
    "broadcast_q": AttentionCase((2,), (3, 0, 2), head_dim=8, heads_q=2, heads_kv=2, broadcast_q=True),
}


@pytest.mark.parametrize("device,backend", FLOAT64)
@pytest.mark.parametrize("name", list(GRADCHECK_CASES))
def test_gradcheck_float64(device, backend, name):
    case = GRADCHECK_CASES[name].replace(dtype=torch.float64, device=device)
    inputs = case.make_inputs(0, requires_grad=True)

    def out_only(q, k, v):
        return jfa_ops.jagged_attention(q, k, v, inputs.q_offsets, inputs.kv_offsets, **inputs.kwargs,
                                        backend=backend)

    torch.autograd.gradcheck(out_only, (inputs.q, inputs.k, inputs.v))

    def lse_only(q, k, v):
        _, lse = jfa_ops.jagged_attention(q, k, v, inputs.q_offsets, inputs.kv_offsets, **inputs.kwargs,
                                          backend=backend, return_lse=True)
        return torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))

    # lse is float32 even for float64 inputs: a finite difference with eps 1e-6 would be all rounding noise
    # (~0.1); eps 1e-3 keeps it at ~1e-4, inside atol 1e-3.
    torch.autograd.gradcheck(lse_only, (inputs.q, inputs.k, inputs.v), eps=1e-3, atol=1e-3, rtol=1e-3)


def _record_forward_calls(monkeypatch, device):
    """Wrap every backend available on ``device`` so its forward appends its name to the returned list."""
    ran = []
    for name in jfa_ops.available_backends(device):
        backend = backends.get_backend(name)

        def forward(*args, _backend=backend):
            ran.append(_backend.name)
            return _backend.forward(*args)

        monkeypatch.setitem(backends._REGISTRY, name, dataclasses.replace(backend, forward=forward))
    return ran


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("case_name", ["jagged_empty_len1", "causal_window", "broadcast_q_causal_gqa"])
def test_automatic_choice(device, dtype, case_name, monkeypatch):
    """With no backend named, a CUDA call runs the triton backend (not the slow, syncing reference); a CPU call runs
    whatever the registry picks, never the interpreter."""
    monkeypatch.delenv("JFA_BACKEND", raising=False)
    case = FEATURE_MATRIX[case_name].replace(device=device, dtype=dtype)
    ran = _record_forward_calls(monkeypatch, device)
    case.make_inputs(0).call(backend=None)
    if device == "cuda":
        assert ran == ["triton"]
    else:
        assert ran == [backends.select_backend(None, case.problem()).name] and ran != ["triton"]
