"""Non-finite inputs propagate the same way on every backend and in the float64 oracle (as in SDPA).

One batch of three sequences; only the middle one gets a NaN/inf. It is causal with L_q > L_k, so its first rows see
no key. Expected, per row of the middle sequence:
- a NaN or +inf visible score: out NaN, lse NaN (never the silent 0 of "no key");
- visible scores all -inf: out 0, lse -inf (SDPA's safe softmax);
- a row that sees no key: out 0, lse -inf, whatever the masked scores hold;
- inf in v: inf in out where the row sees it (NaN where 0 * inf: rows that do not, as in SDPA), lse unchanged.
The other sequences' outputs and gradients stay finite and match the oracle (on GPU this catches a kernel whose tile
loads reach a neighbour sequence's rows, e.g. by TMA, and multiplies their NaN by a zero probability).
"""
import math

import pytest
import torch

import jfa_ops
from jfa_ops.backends import available_backends
from jfa_ops.testing import AttentionCase, reference_attention

# Sequence 1: q rows 3..7 (i = 0..4), k/v rows 3..5 (j = 0..2); causal, bottom-right: row i sees j <= i - 2.
CASE = AttentionCase((3, 5, 2), (3, 3, 2), heads_q=2, heads_kv=1, head_dim=16, causal=True)
SEQ1_Q, SEQ1_KV = slice(3, 8), slice(3, 6)
OTHER_Q = torch.tensor([True] * 3 + [False] * 5 + [True] * 2)
OTHER_KV = torch.tensor([True] * 3 + [False] * 3 + [True] * 2)


def _poison(kind, q, k, v):
    if kind == "nan_q":  # row i=3 (sees keys 0, 1), q head 0
        q[6, 0, 5] = math.nan
    elif kind == "nan_q_row_sees_nothing":  # row i=0: out 0, lse -inf all the same
        q[3] = math.nan
    elif kind == "nan_k":  # key 1: rows 3 and 4 see it
        k[4, 0, 1] = math.nan
    elif kind == "inf_k":
        k[4, 0, 1] = math.inf
    elif kind == "scores_all_neg_inf":  # row i=2 sees only key 0, with score -inf: out 0, lse -inf
        k[3, 0, 0] = math.inf
        q[5, :, 0] = -1.0
    elif kind == "inf_v":
        v[4, 0, 1] = math.inf
    elif kind == "nan_v":
        v[4, 0, 1] = math.nan
    else:
        raise ValueError(kind)


KINDS = ["nan_q", "nan_q_row_sees_nothing", "nan_k", "inf_k", "scores_all_neg_inf", "inf_v", "nan_v"]
# (device, backend, dtype): every backend that runs on CPU in fp32 (triton under the interpreter), and triton on CUDA
# in fp32 and bf16 (bf16 takes the TMA paths on sm_90).
RUNS = [pytest.param("cpu", name, torch.float32, id=f"cpu-{name}") for name in available_backends("cpu")] + [
    pytest.param("cuda", "triton", dtype, id=f"cuda-triton-{str(dtype)[6:]}", marks=pytest.mark.gpu)
    for dtype in (torch.float32, torch.bfloat16)]
# The TMA paths under the interpreter (fp16; it emulates tensor descriptors): blocks there run into the neighbour
# sequence's rows, which the masked stages must zero (a NaN leaked through 0 * NaN on the H200 before they did).
if "triton" in available_backends("cpu"):
    RUNS.append(pytest.param("cpu", "triton", torch.float16, id="cpu-triton-tma-float16"))


def _maybe_tma(device, backend, dtype, monkeypatch):
    if device == "cpu" and backend == "triton" and dtype == torch.float16:
        from jfa_ops.backends.triton import attn_fwd

        monkeypatch.setattr(attn_fwd, "_tma_device", lambda t: True)
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy, interpreter


def _inputs(kind, device="cpu", dtype=torch.float32):
    x = CASE.replace(device=device, dtype=dtype).make_inputs(0)
    q, k, v = x.q.clone(), x.k.clone(), x.v.clone()
    _poison(kind, q, k, v)
    return x, q, k, v


def _close(dtype):
    return dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)


def _same_nonfinite_and_close(actual, expected, name, dtype):
    a, e = actual.detach().cpu().double(), expected.detach().cpu().double()
    assert torch.equal(torch.isnan(a), torch.isnan(e)), f"{name}: NaN at {torch.isnan(a).nonzero().tolist()[:6]}, " \
                                                        f"expected at {torch.isnan(e).nonzero().tolist()[:6]}"
    torch.testing.assert_close(a, e, **_close(dtype), equal_nan=True, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("device,backend,dtype", RUNS)
@pytest.mark.parametrize("kind", KINDS)
def test_forward_matches_the_oracle(device, backend, dtype, kind, monkeypatch):
    """out and lse: NaN and inf exactly where the oracle has them, the finite rest equal."""
    _maybe_tma(device, backend, dtype, monkeypatch)
    x, q, k, v = _inputs(kind, device, dtype)
    out, lse = jfa_ops.jagged_attention(q, k, v, x.q_offsets, x.kv_offsets, causal=True, return_lse=True,
                                        backend=backend)
    ref_out, ref_lse = reference_attention(q, k, v, x.q_offsets, x.kv_offsets, causal=True)
    _same_nonfinite_and_close(out, ref_out, "out", dtype)
    _same_nonfinite_and_close(lse, ref_lse, "lse", dtype)
    assert torch.equal(out[3:5], torch.zeros_like(out[3:5])) or kind in ("inf_v", "nan_v")  # rows that see no key
    assert torch.equal(lse[:, 3:5], torch.full_like(lse[:, 3:5], -math.inf))
    if kind in ("nan_q", "nan_k", "inf_k"):  # the silent-zero regression: the poisoned rows are NaN, not 0
        assert torch.isnan(out[6, 0]).all() and torch.isnan(lse[0, 6])
    if kind == "scores_all_neg_inf":
        assert torch.equal(out[5], torch.zeros_like(out[5])) and (lse[:, 5] == -math.inf).all()


@pytest.mark.parametrize("device,backend,dtype", RUNS)
@pytest.mark.parametrize("kind", KINDS)
def test_gradients_stay_in_the_poisoned_sequence(device, backend, dtype, kind, monkeypatch):
    """dq/dk/dv of the other sequences match the oracle (finite); the poisoned q row's dq is NaN."""
    _maybe_tma(device, backend, dtype, monkeypatch)
    x, q, k, v = _inputs(kind, device, dtype)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = jfa_ops.jagged_attention(q, k, v, x.q_offsets, x.kv_offsets, causal=True, return_lse=True,
                                        backend=backend)
    gen = torch.Generator().manual_seed(1)
    grad_out = torch.randn(out.shape, generator=gen).to(out)
    grad_lse = torch.randn(lse.shape, generator=gen).to(lse)
    got = torch.autograd.grad((out, lse), (q, k, v), (grad_out, grad_lse))
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out, ref_lse = reference_attention(q64, k64, v64, x.q_offsets, x.kv_offsets, causal=True)
    want = torch.autograd.grad((ref_out, ref_lse), (q64, k64, v64), (grad_out.double(), grad_lse.double()))
    for name, g, w, rows in zip(("dq", "dk", "dv"), got, want, (OTHER_Q, OTHER_KV, OTHER_KV)):
        g, w = g.cpu()[rows].double(), w.cpu()[rows]
        assert torch.isfinite(g).all(), f"{name}: non-finite outside the poisoned sequence"
        torch.testing.assert_close(g, w, **_close(dtype), msg=lambda m: f"{name}: {m}")
    if kind == "nan_q":
        assert torch.isnan(got[0][6, 0]).all()
