"""Behaviour of ``jfa_ops.jagged_attention`` beyond the numbers: double backward, determinism, NJT inputs."""
import pytest
import torch

import jfa_ops
from jfa_ops.testing import AttentionCase, assert_attention_close, check_attention_case, reference_attention
from tests.common import device_backend_params, dtypes_for

FULL = device_backend_params()
ALL = device_backend_params(smoke=True)  # cheap single calls: interpreted backends too


def _case(device, backend, **kw):
    dtype = torch.float32 if torch.float32 in dtypes_for(device, backend) else torch.float16
    return AttentionCase((3, 0, 5), (4, 2, 6), heads_q=4, heads_kv=2, device=device, dtype=dtype, **kw)


@pytest.mark.parametrize("device,backend", ALL)
def test_double_backward_raises(device, backend):
    inputs = _case(device, backend, causal=True).make_inputs(0, requires_grad=True)
    out, _ = inputs.call(backend)
    (dq,) = torch.autograd.grad(out.float().square().sum(), inputs.q, create_graph=True)
    with pytest.raises(RuntimeError, match="does not support double backward"):
        dq.sum().backward()


@pytest.mark.parametrize("device,backend", ALL)
@pytest.mark.parametrize("broadcast_q", [False, True])
def test_deterministic_gradients_are_bitwise_reproducible(device, backend, broadcast_q):
    case = AttentionCase((5,) if broadcast_q else (3, 0, 5), (4, 2, 6), heads_q=4, heads_kv=2, device=device,
                         dtype=_case(device, backend).dtype, broadcast_q=broadcast_q, window=(2, 1))
    inputs = case.make_inputs(0, requires_grad=True)
    runs = []
    for _ in range(3):
        out, lse = inputs.call(backend, deterministic=True)
        g = torch.ones_like(out)
        runs.append((out, lse) + torch.autograd.grad((out, lse), (inputs.q, inputs.k, inputs.v),
                                                     (g, torch.ones_like(lse))))
    for run in runs[1:]:
        for a, b, name in zip(runs[0], run, ("out", "lse", "dq", "dk", "dv")):
            assert torch.equal(a, b), f"{name} differs between deterministic runs"


@pytest.mark.parametrize("device,backend", ALL)
def test_return_lse_false_returns_out_only(device, backend):
    inputs = _case(device, backend).make_inputs(0)
    out = jfa_ops.jagged_attention(inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets,
                                   backend=backend)
    assert isinstance(out, torch.Tensor) and out.shape == inputs.q.shape and out.dtype == inputs.q.dtype


def _njt(values, offsets):
    return torch.nested.nested_tensor_from_jagged(values, offsets)


@pytest.mark.parametrize("device,backend", ALL)
def test_njt_inputs_match_packed_call(device, backend):
    case = _case(device, backend, causal=True)
    inputs = case.make_inputs(0, requires_grad=True)
    packed = jfa_ops.jagged_attention(inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets,
                                      causal=True, backend=backend)
    q, k, v = (_njt(t, o) for t, o in ((inputs.q, inputs.q_offsets), (inputs.k, inputs.kv_offsets),
                                       (inputs.v, inputs.kv_offsets)))
    out = jfa_ops.jagged_attention(q, k, v, None, None, causal=True, backend=backend)
    assert out.is_nested and out.layout == torch.jagged
    assert torch.equal(out.offsets(), inputs.q_offsets)
    assert torch.equal(out.values(), packed)
    # gradients flow back through the NJT to the packed values
    (dq,) = torch.autograd.grad(out.values().float().sum(), inputs.q)
    (dq_packed,) = torch.autograd.grad(packed.float().sum(), inputs.q)
    assert torch.equal(dq, dq_packed)


@pytest.mark.parametrize("device,backend", ALL)
def test_broadcast_q_with_njt_kv(device, backend):
    case = _case(device, backend)
    inputs = case.make_inputs(0)
    q = inputs.q[:4]  # dense [L_q, Hq, D]
    k, v = _njt(inputs.k, inputs.kv_offsets), _njt(inputs.v, inputs.kv_offsets)
    out = jfa_ops.jagged_attention(q, k, v, None, None, broadcast_q=True, backend=backend)
    assert out.is_nested
    assert out.offsets().tolist() == [0, 4, 8, 12]
    packed = jfa_ops.jagged_attention(q, inputs.k, inputs.v, None, inputs.kv_offsets, broadcast_q=True,
                                      backend=backend)
    assert torch.equal(out.values(), packed)
    ref, _ = reference_attention(q, inputs.k, inputs.v, None, inputs.kv_offsets, broadcast_q=True)
    assert_attention_close(out.values(), ref, dtype=case.dtype, kind="forward", name="out")


@pytest.mark.parametrize("device,backend", FULL)
def test_default_backend_choice_matches_named_backend(device, backend):
    """No backend argument: the automatic choice runs and agrees with the oracle."""
    check_attention_case(_case(device, backend, window=(1, 2)), None)


def test_scale_default_is_inverse_sqrt_head_dim():
    case = AttentionCase((3, 4), (5, 2), head_dim=32)
    inputs = case.make_inputs(0)
    default = jfa_ops.jagged_attention(inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets)
    explicit = jfa_ops.jagged_attention(inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets,
                                        scale=32 ** -0.5)
    assert torch.equal(default, explicit)


def test_no_grad_inputs_give_outputs_without_grad():
    inputs = _case("cpu", "reference").make_inputs(0)
    out, lse = inputs.call("reference")
    assert not out.requires_grad and not lse.requires_grad
