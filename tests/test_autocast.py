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
