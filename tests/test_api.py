"""Behaviour of ``jfa_ops.jagged_attention`` beyond the numbers: double backward, determinism, NJT inputs,
torch.func transforms."""
import dataclasses

import pytest
import torch

import jfa_ops
from jfa_ops.backends import get_backend, register_backend, unregister_backend
from jfa_ops.testing import AttentionCase, assert_attention_close, check_attention_case, reference_attention
from tests.common import deterministic_reason, device_backend_params, dtypes_for, head_dims_for

FULL = device_backend_params()
ALL = device_backend_params(smoke=True)  # cheap single calls: interpreted backends too


def _case(device, backend, **kw):
    dtype = torch.float32 if torch.float32 in dtypes_for(device, backend) else torch.float16
    kw.setdefault("head_dim", head_dims_for(device, backend)[0])
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
                         dtype=_case(device, backend).dtype, head_dim=_case(device, backend).head_dim,
                         broadcast_q=broadcast_q, window=(2, 1))
    inputs = case.make_inputs(0, requires_grad=True)
    if deterministic_reason(device, backend, case.dtype, case.head_dim):
        with pytest.raises(ValueError, match="deterministic"):
            inputs.call(backend, deterministic=True)
        return
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
    out = jfa_ops.jagged_attention(q, k, v, causal=True, backend=backend)  # offsets default to None
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


def _column(offsets):
    """``offsets`` as a strided view (column 0 of a [B+1, 2] tensor whose other column is junk)."""
    return torch.stack([offsets, torch.full_like(offsets, 10 ** 6)], dim=1)[:, 0]


@pytest.mark.parametrize("device,backend", ALL)
@pytest.mark.parametrize("offsets_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("broadcast_q", [False, True])
def test_strided_offsets_are_read_by_value(device, backend, offsets_dtype, broadcast_q):
    """Offsets that are a strided view (a column of a [B+1, 2] tensor) give the oracle's out, lse and gradients.
    Fails if a kernel reads offsets[b] at base + b (the triton backend did for int32: NaN or other sequences' rows,
    and the MXFP8 quantize kernel wrote out of bounds)."""
    case = _case(device, backend, causal=True, window=(3, 1), offsets_dtype=offsets_dtype)
    if broadcast_q:
        case = case.replace(q_lengths=(4,), broadcast_q=True)
    inputs = case.make_inputs(1, requires_grad=True)
    strided = dataclasses.replace(inputs, q_offsets=None if broadcast_q else _column(inputs.q_offsets),
                                  kv_offsets=_column(inputs.kv_offsets))
    assert strided.kv_offsets.stride(0) == 2
    out, lse = strided.call(backend)
    ref_inputs = dataclasses.replace(inputs, **{n: getattr(inputs, n).detach().double().requires_grad_()
                                                for n in "qkv"})
    ref_out, ref_lse = ref_inputs.oracle()
    assert_attention_close(out, ref_out, dtype=case.dtype, kind="forward", name="out")
    assert_attention_close(lse, ref_lse, dtype=case.dtype, kind="lse", name="lse")
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, (inputs.q, inputs.k, inputs.v), grad_out)
    want = torch.autograd.grad(ref_out, (ref_inputs.q, ref_inputs.k, ref_inputs.v), grad_out.double())
    for name, g, w in zip("qkv", got, want):
        assert_attention_close(g, w, dtype=case.dtype, kind="grad", name=f"d{name}")


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


@pytest.fixture
def recording_backend():
    """The reference backend under the name "recording", keeping the AttentionParams of every call."""
    reference = get_backend("reference")
    calls = []

    def forward(*args):
        calls.append(("forward", args[-1]))
        return reference.forward(*args)

    def backward(*args):
        calls.append(("backward", args[-1]))
        return reference.backward(*args)

    register_backend(dataclasses.replace(reference, name="recording", forward=forward, backward=backward,
                                         priority=-1))
    yield calls
    unregister_backend("recording")


@pytest.fixture
def deterministic_algorithms():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_global_deterministic_flag_reaches_the_backend(recording_backend, deterministic_algorithms, compiled):
    """torch.use_deterministic_algorithms(True) counts as deterministic=True, forward and backward, eagerly and
    from compiled code (read when the op runs: no graph break, nothing traced)."""
    inputs = AttentionCase((5,), (4, 2, 6), heads_q=4, heads_kv=2, broadcast_q=True).make_inputs(0, requires_grad=True)

    def fn(q, k, v):
        return jfa_ops.jagged_attention(q, k, v, None, inputs.kv_offsets, broadcast_q=True, backend="recording")

    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn, fullgraph=True, backend="aot_eager")
    fn(inputs.q, inputs.k, inputs.v).sum().backward()
    assert [kind for kind, _ in recording_backend] == ["forward", "backward"]
    assert all(params.deterministic for _, params in recording_backend)
    torch.use_deterministic_algorithms(False)
    recording_backend.clear()
    fn(inputs.q, inputs.k, inputs.v).sum().backward()
    assert not any(params.deterministic for _, params in recording_backend)


@pytest.mark.parametrize("device,backend", ALL)
def test_global_deterministic_flag_gives_bitwise_reproducible_broadcast_q_gradients(device, backend,
                                                                                  deterministic_algorithms):
    case = AttentionCase((5,), (4, 2, 6), heads_q=4, heads_kv=2, device=device, dtype=_case(device, backend).dtype,
                         head_dim=_case(device, backend).head_dim, broadcast_q=True)
    inputs = case.make_inputs(0, requires_grad=True)
    if deterministic_reason(device, backend, case.dtype, case.head_dim):
        with pytest.raises(ValueError, match="deterministic"):
            inputs.call(backend)
        return
    runs = []
    for _ in range(3):
        out, _ = inputs.call(backend)
        runs.append(torch.autograd.grad(out, (inputs.q, inputs.k, inputs.v), torch.ones_like(out)))
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], run))


# torch.func: grad-style transforms raise (torch's autograd.Function rule), jvp/forward AD raises, vmap loops ----

def _func_inputs():
    inputs = AttentionCase((3, 4), (5, 2), heads_q=4, heads_kv=2, dtype=torch.float64).make_inputs(0)

    def fn(q, k, v):
        return jfa_ops.jagged_attention(q, k, v, inputs.q_offsets, inputs.kv_offsets, causal=True)

    return inputs, fn


def test_jvp_raises():
    inputs, fn = _func_inputs()
    tangents = tuple(torch.ones_like(t) for t in (inputs.q, inputs.k, inputs.v))
    with pytest.raises(NotImplementedError, match="does not support forward-mode AD"):
        torch.func.jvp(fn, (inputs.q, inputs.k, inputs.v), tangents)


def test_forward_ad_through_the_op_raises():
    inputs, _ = _func_inputs()
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level(), pytest.raises(NotImplementedError, match="does not support forward-mode AD"):
        q = fwAD.make_dual(inputs.q, torch.ones_like(inputs.q))
        torch.ops.jfa.attention(q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets)


def test_func_grad_raises_and_autograd_grad_works():
    """torch.func.grad/vjp need an autograd.Function with a functorch-ready setup_context, which torch.library's
    generated one is not: they raise (from torch). torch.autograd.grad is the way."""
    inputs, fn = _func_inputs()
    with pytest.raises(RuntimeError, match="functorch transforms"):
        torch.func.grad(lambda q: fn(q, inputs.k, inputs.v).sum())(inputs.q)
    q = inputs.q.clone().requires_grad_()
    (dq,) = torch.autograd.grad(fn(q, inputs.k, inputs.v).sum(), q)
    assert dq.shape == q.shape


@pytest.mark.filterwarnings("ignore:There is a performance drop")
def test_vmap_runs_the_op_once_per_batch_entry():
    """vmap has no batching rule: torch's fallback runs the op for each entry (slow, correct)."""
    inputs, fn = _func_inputs()
    qs, ks, vs = (torch.stack([t, 2 * t]) for t in (inputs.q, inputs.k, inputs.v))
    batched = torch.func.vmap(fn)(qs, ks, vs)
    for i in range(2):
        assert torch.equal(batched[i], fn(qs[i], ks[i], vs[i]))
