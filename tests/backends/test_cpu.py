"""The ``cpu`` backend: the reference's math batched over length buckets. Against the float64 oracle; the random
property suites (tests/test_properties.py) run it too, as every backend available on CPU."""
import math

import pytest
import torch

import jfa_ops
from jfa_ops.backends import AttentionParams, Problem, cpu, reference, select_backend
from jfa_ops.testing import AttentionCase, check_attention_case, check_backend


def test_check_backend_fp32_with_opcheck():
    summary = check_backend("cpu", dtypes=(torch.float32,), examples=15)
    assert summary["passed"] and not summary["unsupported"]


def test_check_backend_other_dtypes():
    summary = check_backend("cpu", dtypes=(torch.float64, torch.float16, torch.bfloat16), examples=15, opcheck=False)
    assert summary["passed"] and not summary["unsupported"]


def _spy(monkeypatch):
    """Count the batched chunk calls and the sequences sent to the reference's per-sequence loop."""
    calls = {"forward_chunk": 0, "backward_chunk": 0, "reference_sequences": 0}

    def counting(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    def counting_sequences(fn):
        def wrapper(*args):
            sequences = list(args[-2])
            calls["reference_sequences"] += len(sequences)
            return fn(*args[:-2], sequences, args[-1])
        return wrapper

    for path in ("", "_fused"):  # the fused (ATen flash) and exact chunk paths count the same
        monkeypatch.setattr(cpu, f"{path}_forward_chunk",
                            counting("forward_chunk", getattr(cpu, f"{path}_forward_chunk")))
        monkeypatch.setattr(cpu, f"{path}_backward_chunk",
                            counting("backward_chunk", getattr(cpu, f"{path}_backward_chunk")))
    monkeypatch.setattr(reference, "forward_into", counting_sequences(reference.forward_into))
    monkeypatch.setattr(reference, "backward_into", counting_sequences(reference.backward_into))
    return calls


@pytest.mark.parametrize("broadcast_q", [False, True])
def test_batches_by_bucket_not_by_sequence(monkeypatch, broadcast_q):
    """300 sequences of lengths 0..64: one batched call per power-of-two length bucket, none per sequence."""
    gen = torch.Generator().manual_seed(0)
    kv_lengths = tuple(torch.randint(0, 65, (300,), generator=gen).tolist())
    q_lengths = (5,) if broadcast_q else kv_lengths
    case = AttentionCase(q_lengths, kv_lengths, heads_q=4, heads_kv=2, causal=True, broadcast_q=broadcast_q)
    longest = [max(q_lengths[0] if broadcast_q else q, kv) for q, kv in zip(q_lengths * 300, kv_lengths)
               if kv > 0]
    buckets = {max(1, math.ceil(math.log2(n))) for n in longest}  # (2^(k-1), 2^k], lengths 1 and 2 share one
    calls = _spy(monkeypatch)
    check_attention_case(case, "cpu", grads=("both",))
    assert calls == {"forward_chunk": len(buckets), "backward_chunk": len(buckets), "reference_sequences": 0}


def test_chunks_and_oversized_sequences(monkeypatch):
    """A small score budget: buckets split into chunks, sequences over the budget take the reference's loop;
    results still match the oracle (every feature at once: GQA, causal window, cross lengths, empties)."""
    monkeypatch.setattr(cpu, "SCORE_BLOCK_BYTES", 4 * 4 * 8 * 8)  # 4 heads x 8 x 8 fp32 scores
    case = AttentionCase((3, 0, 9, 1, 2, 8, 6), (4, 3, 11, 1, 0, 7, 6), heads_q=4, heads_kv=2, causal=True,
                         window=(4, 1))
    calls = _spy(monkeypatch)
    check_attention_case(case, "cpu", grads=("both",))
    assert calls["reference_sequences"] == 2  # 9x11 exceeds the budget: once forward, once backward
    # buckets (by the longer side): 1x1 | 3x4 | 8x7 and 6x6, padded to 8x7 each: one per chunk. Empties: none.
    assert calls["forward_chunk"] == calls["backward_chunk"] == 4


def test_automatic_choice_on_cpu():
    params = AttentionParams(scale=0.125)
    q = torch.zeros(3, 2, 64)
    assert select_backend(None, Problem.of(q, q, params)).name == "cpu"
    assert select_backend("reference", Problem.of(q, q, params)).name == "reference"
    assert cpu.supports(Problem("cuda", torch.float16, 64, 2, 2, False, -1, -1, False, False)) is not None
    assert cpu.BACKEND.auto_devices == ("cpu",) and cpu.BACKEND.priority > reference.BACKEND.priority


def test_same_as_reference_on_a_large_batch():
    """B=500 lognormal lengths, GQA, causal, fp32: the bucketed forward equals the per-sequence reference."""
    gen = torch.Generator().manual_seed(1)
    lengths = tuple(torch.empty(500).log_normal_(3.0, 0.8, generator=gen).long().clamp(0, 200).tolist())
    case = AttentionCase(lengths, lengths, heads_q=4, heads_kv=1, head_dim=32, causal=True)
    x = case.make_inputs(0)
    outs = [jfa_ops.jagged_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True, return_lse=True,
                                     backend=name) for name in ("cpu", "reference")]
    torch.testing.assert_close(outs[0], outs[1], rtol=2e-5, atol=2e-6)


# Every masking feature at once: GQA, cross lengths with L_q > L_k (causal bottom-right: first rows see no key),
# a window, an empty sequence and padding within each bucket.
FEATURES = [
    AttentionCase((7, 3, 0, 12, 5), (4, 6, 3, 9, 5), heads_q=4, heads_kv=2, causal=True),
    AttentionCase((7, 3, 1, 12, 5), (4, 6, 3, 9, 0), heads_q=4, heads_kv=1, window=(3, 2)),
    AttentionCase((6, 9, 2), (8, 3, 2), heads_q=2, heads_kv=2, causal=True, window=(2, 0)),
]


def _paths(monkeypatch):
    """Count the fused (ATen flash) and exact chunk calls."""
    calls = {"_fused_forward_chunk": 0, "_fused_backward_chunk": 0, "_forward_chunk": 0, "_backward_chunk": 0}

    def counting(name):
        fn = getattr(cpu, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name in calls:
        monkeypatch.setattr(cpu, name, counting(name))
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", FEATURES)
def test_fused_path_matches_the_oracle(monkeypatch, case, dtype):
    """Finite inputs take the fused path (gradient through out only: the lse gradient takes the exact path); rows
    that see no key give out 0, lse -inf and zero gradients (the kernel itself gives lse 0 there)."""
    calls = _paths(monkeypatch)
    check_attention_case(case.replace(dtype=dtype), "cpu", grads=("out",))
    assert calls["_fused_forward_chunk"] > 0 and calls["_fused_backward_chunk"] > 0
    assert calls["_forward_chunk"] == calls["_backward_chunk"] == 0


@pytest.mark.parametrize("case", FEATURES)
def test_exact_path_matches_the_oracle(monkeypatch, case):
    """The exact path (non-finite inputs, broadcast-Q, float64, lse gradients) on the same finite cases, forced."""
    monkeypatch.setattr(cpu, "_fused_ok", lambda *args: False)
    calls = _paths(monkeypatch)
    check_attention_case(case, "cpu")
    assert calls["_fused_forward_chunk"] == calls["_fused_backward_chunk"] == 0


def test_lse_gradient_and_broadcast_q_take_the_exact_path(monkeypatch):
    calls = _paths(monkeypatch)
    check_attention_case(FEATURES[0], "cpu", grads=("lse",))
    assert calls["_fused_forward_chunk"] > 0 and calls["_fused_backward_chunk"] == 0 and calls["_backward_chunk"] > 0
    calls = _paths(monkeypatch)
    check_attention_case(AttentionCase((5,), (4, 7, 0, 3), heads_q=4, heads_kv=2, causal=True, broadcast_q=True),
                         "cpu", grads=("out",))
    assert calls["_fused_forward_chunk"] == 0 and calls["_forward_chunk"] > 0


@pytest.mark.parametrize("poison", ["nan_q_sees_nothing", "score_overflow"])
def test_nonfinite_scores_take_the_exact_path(monkeypatch, poison):
    """A NaN query row that sees no key gives out 0, lse -inf (the fused kernel's additive mask would give NaN:
    NaN + -inf); finite inputs whose scores overflow to inf give NaN as in the reference (the fused chunk sees a
    non-finite lse and hands the chunk over)."""
    case = AttentionCase((4, 3), (2, 3), heads_q=2, heads_kv=1, head_dim=8, causal=True)  # rows 0, 1 see nothing
    x = case.make_inputs(0)
    q, k, v = x.q.clone(), x.k.clone(), x.v.clone()
    if poison == "nan_q_sees_nothing":
        q[0] = math.nan
    else:
        q[5], k[3] = 1e30, 1e30  # sequence 1, row 1 and key 1: score +inf
    calls = _paths(monkeypatch)
    got = jfa_ops.jagged_attention(q, k, v, x.q_offsets, x.kv_offsets, causal=True, return_lse=True, backend="cpu")
    want = jfa_ops.jagged_attention(q, k, v, x.q_offsets, x.kv_offsets, causal=True, return_lse=True,
                                    backend="reference")
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, equal_nan=True)
    assert calls["_forward_chunk"] > 0
    if poison == "score_overflow":
        assert got[0][5].isnan().all()
        grads = []
        for backend in ("cpu", "reference"):  # the fused backward also hands the chunk over (NaN saved lse)
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = jfa_ops.jagged_attention(*leaves, x.q_offsets, x.kv_offsets, causal=True, backend=backend)
            grads.append(torch.autograd.grad(out, leaves, torch.ones_like(out)))
        for a, e in zip(*grads):
            torch.testing.assert_close(a, e, equal_nan=True)
        assert calls["_backward_chunk"] > 0
    else:
        assert torch.equal(got[0][0], torch.zeros_like(got[0][0])) and (got[1][:, 0] == -math.inf).all()


@pytest.mark.parametrize("with_grad_lse", [False, True])
def test_backward_op_takes_any_layout_of_grad_out(with_grad_lse):
    """The public ``jfa::attention_backward`` op given grad_out/out/lse in other memory layouts (head_dim-major,
    heads-major, lse [T, H]-major) returns the contiguous call's gradients. Fails if a chunk gather ``view``s rows
    of a non-contiguous tensor (it raised for a head_dim-major grad_out on the exact path, taken with grad_lse)."""
    case = AttentionCase((5, 0, 9), (7, 3, 8), heads_q=4, heads_kv=2, causal=True)
    x = case.make_inputs(3)
    out, lse = torch.ops.jfa.attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=True, backend="cpu")
    grad_out, grad_lse = torch.randn_like(out), torch.randn_like(lse) if with_grad_lse else None

    def relaid(t, order):  # the same values in the memory order ``order``
        return t.permute(order).contiguous().permute([order.index(i) for i in range(t.dim())])

    def grads(grad_out, out, lse, grad_lse):
        return torch.ops.jfa.attention_backward(grad_out, grad_lse, x.q, x.k, x.v, out, lse, x.q_offsets,
                                                x.kv_offsets, causal=True, backend="cpu")

    want = grads(grad_out, out, lse, grad_lse)
    got = grads(relaid(grad_out, [2, 0, 1]), relaid(out, [1, 0, 2]), relaid(lse, [1, 0]),
                None if grad_lse is None else relaid(grad_lse, [1, 0]))
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6, msg=f"d{name}")
