"""The tlx backend on an sm_90 GPU (skipped without one, or without TLX): every feature case of
``jfa_ops.testing.FEATURE_MATRIX`` at the head dims tlx runs, forward from a NaN-poisoned allocator and gradients
(the backward is the triton backend's, fed tlx's out/lse), value/key rows of a neighbour sequence full of NaN/inf,
and routing of what tlx declines. The whole GPU suite also runs tlx wherever it parametrizes over
``available_backends("cuda")``.
"""
import math

import pytest
import torch

from jfa_ops.backends import unavailable_reason
from jfa_ops.testing import (FEATURE_MATRIX, AttentionCase, check_attention_case,
                             check_backend_writes_every_row, reference_attention)

pytestmark = pytest.mark.gpu


def _tlx_or_skip(case: AttentionCase) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    reason = unavailable_reason("tlx", case.problem())
    if reason is not None:
        pytest.skip(f"tlx: {reason}")


CASES = [pytest.param(name, d, dtype, id=f"{name}-d{d}-{str(dtype)[6:]}")
         for name in FEATURE_MATRIX for d, dtype in ((64, torch.float16), (128, torch.bfloat16), (256, torch.bfloat16))
         if name != "head_dim_256" or d == 256]


@pytest.mark.parametrize("name,head_dim,dtype", CASES)
def test_forward_writes_every_row(name, head_dim, dtype):
    case = FEATURE_MATRIX[name].replace(device="cuda", dtype=dtype, head_dim=head_dim)
    _tlx_or_skip(case)
    check_backend_writes_every_row("tlx", case)


@pytest.mark.parametrize("name,head_dim,dtype", [c for c in CASES if c.values[1] == 128])
def test_forward_and_gradients_match_the_oracle(name, head_dim, dtype):
    case = FEATURE_MATRIX[name].replace(device="cuda", dtype=dtype, head_dim=head_dim)
    _tlx_or_skip(case)
    check_attention_case(case, "tlx")


@pytest.mark.parametrize("causal", [False, True])
def test_blocks_reaching_into_a_poisoned_neighbour_stay_finite(causal):
    """Sequence 1's keys are +inf and its values NaN; the 128-row TMA blocks of sequence 0 read them (the kernel
    must mask the keys and zero the values: p = 0 times NaN is NaN)."""
    case = AttentionCase((100, 37, 50), (90, 37, 77), heads_q=4, heads_kv=2, head_dim=128, dtype=torch.bfloat16,
                         device="cuda", causal=causal)
    _tlx_or_skip(case)
    x = case.make_inputs(0)
    x.k[90:127] = math.inf
    x.v[90:127] = math.nan
    out, lse = x.call("tlx")
    ref_out, ref_lse = reference_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=causal)
    keep = torch.ones(187, dtype=torch.bool, device="cuda")
    keep[100:137] = False
    assert torch.isfinite(out[keep]).all()
    torch.testing.assert_close(out[keep].double(), ref_out[keep].double(), rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(lse[:, keep].double(), ref_lse[:, keep].double(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("head_dim,dtype", [(72, torch.bfloat16), (32, torch.float16), (128, torch.float32)])
def test_declined_problems_route_elsewhere(head_dim, dtype):
    case = AttentionCase((37, 0, 130), (50, 3, 129), heads_q=4, heads_kv=2, head_dim=head_dim, dtype=dtype,
                         device="cuda")
    if not torch.cuda.is_available() or unavailable_reason("tlx") is not None:
        pytest.skip("no GPU or no TLX")
    assert unavailable_reason("tlx", case.problem()) is not None
    check_attention_case(case, None, grads=("both",))
