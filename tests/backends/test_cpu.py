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

    monkeypatch.setattr(cpu, "_forward_chunk", counting("forward_chunk", cpu._forward_chunk))
    monkeypatch.setattr(cpu, "_backward_chunk", counting("backward_chunk", cpu._backward_chunk))
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
