"""Autocast: under ``torch.autocast(device, dtype)`` fp32 q/k/v run in the region's dtype, like SDPA."""
import pytest
import torch

import jfa_ops
from jfa_ops.testing import AttentionCase, assert_attention_close, reference_attention


def _inputs(device):
    return AttentionCase((3, 0, 5), (4, 2, 6), heads_q=4, heads_kv=2, causal=True, device=device,
                         dtype=torch.float32).make_inputs(0, requires_grad=True)


def _check_autocast(device, dtype, backend):
    inputs = _inputs(device)
    dense = inputs.q[:4].detach()[None].transpose(1, 2)  # [1, H, L, D]
    with torch.autocast(device, dtype=dtype):
        sdpa_dtype = torch.nn.functional.scaled_dot_product_attention(dense, dense, dense).dtype
        out, lse = jfa_ops.jagged_attention(inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets,
                                            causal=True, return_lse=True, backend=backend)
    assert sdpa_dtype == dtype  # the behaviour to match
    assert out.dtype == dtype and lse.dtype == torch.float32
    # the oracle on the inputs rounded to the autocast dtype, as the op saw them
    ref_out, ref_lse = reference_attention(*(t.detach().to(dtype) for t in (inputs.q, inputs.k, inputs.v)),
                                           inputs.q_offsets, inputs.kv_offsets, causal=True)
    assert_attention_close(out, ref_out, dtype=dtype, kind="forward", name="out")
    out.float().sum().backward()  # gradients reach the fp32 leaves in fp32
    assert all(t.grad is not None and t.grad.dtype == torch.float32 for t in (inputs.q, inputs.k, inputs.v))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_autocast_casts_to_the_region_dtype(dtype):
    _check_autocast("cpu", dtype, "reference")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_autocast_casts_to_the_region_dtype(dtype):
    _check_autocast("cuda", dtype, None)


def test_fp64_and_disabled_regions_are_left_alone():
    inputs = AttentionCase((3, 4), (5, 2), dtype=torch.float64).make_inputs(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert inputs.call("reference")[0].dtype == torch.float64  # autocast never touches fp64
    inputs = _inputs("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=False):
        assert inputs.call("reference")[0].dtype == torch.float32


def test_compiled_autocast_region():
    inputs = _inputs("cpu")

    def fn(q, k, v):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return jfa_ops.jagged_attention(q, k, v, inputs.q_offsets, inputs.kv_offsets, causal=True)

    torch._dynamo.reset()
    out = torch.compile(fn, fullgraph=True, backend="aot_eager")(inputs.q, inputs.k, inputs.v)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, fn(inputs.q, inputs.k, inputs.v))


# The other op families keep their inputs' dtype under autocast (no cast, as their GPU kernels do), and the reference
# backend must compute at its own precision there: autocast reached inside its einsums (fp32 -> bf16), so the
# float64 oracle's fp32 tolerance failed. Backward inside the region too (the engine runs it under the region).
def _autocast_devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _autocast_devices())
@pytest.mark.parametrize("name,case", [
    ("jagged_gqa_causal", dict(q=(9, 0, 1, 13), kv=(11, 0, 1, 13), heads_q=4, heads_kv=2, causal=True)),
    ("broadcast_q", dict(q=(6,), kv=(9, 0, 17), broadcast_q=True, heads_q=2, heads_kv=1)),
])
def test_reference_block_sparse_exact_under_autocast(device, name, case):
    from jfa_ops.testing import BlockSparseCase, check_block_sparse_case

    attention = AttentionCase(case.pop("q"), case.pop("kv"), dtype=torch.float32, device=device, **case)
    with torch.autocast(device, dtype=torch.bfloat16):
        check_block_sparse_case(BlockSparseCase(attention, block_q=4, block_kv=4, keep_ratio=0.5), "reference",
                                seed=3)


@pytest.mark.parametrize("device", _autocast_devices())
@pytest.mark.parametrize("name", ["causal_gqa", "broadcast_q"])
def test_reference_mxfp8_exact_under_autocast(device, name):
    """Forward and backward against the float64 MXFP8 oracles with the reference's bounds (tests/ops/test_mxfp8.py)."""
    from jfa_ops.testing import reference_mxfp8_attention, reference_mxfp8_attention_backward
    from tests.ops.test_mxfp8 import ATTENTION_CASES, _oracle_opts, _rel, make_case

    q, k, v, q_off, kv_off, opts = make_case(**ATTENTION_CASES[name], seed=3)
    q, k, v = (t.to(device).requires_grad_() for t in (q, k, v))
    q_off, kv_off = (None if t is None else t.to(device) for t in (q_off, kv_off))
    g = torch.Generator().manual_seed(4)
    with torch.autocast(device, dtype=torch.bfloat16):
        out, lse = jfa_ops.mxfp8_attention(q, k, v, q_off, kv_off, return_lse=True, backend="reference", **opts)
        grad_out, grad_lse = (torch.randn(t.shape, generator=g).to(device) for t in (out, lse))
        grads = torch.autograd.grad((out, lse), (q, k, v), (grad_out, grad_lse))
    want_out, want_lse = reference_mxfp8_attention(q, k, v, q_off, kv_off, **_oracle_opts(opts))
    assert out.dtype == torch.float32
    assert _rel(out, want_out) <= 1e-5
    finite = want_lse > float("-inf")
    assert _rel(lse.cpu()[finite], want_lse[finite]) <= 1e-6
    want = reference_mxfp8_attention_backward(grad_out, grad_lse, q, k, v, out, lse, q_off, kv_off,
                                              **_oracle_opts(opts))
    for name_, got, w in zip("qkv", grads, want):
        assert _rel(got, w) <= 1e-5, f"d{name_}: {_rel(got, w)}"
