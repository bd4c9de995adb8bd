"""torch.compile, torch.export and AOTInductor over the ops.

Recompile pitfalls (measured) that the batches below are built to avoid, in any code compiling with dynamic=True:
- Duck sizing: on the first call dynamo gives equal sizes one symbol and guards on the equality. If the first batch
  happens to have equal q and kv totals, it adds ``k.size()[0] == q.size()[0]`` and the first batch with different
  totals recompiles; the same for any accidental equality (a total equal to the head count, a max_seqlen equal to
  B+1, ...). Self-attention passes the same offsets (totals always equal, an intended equality); cross-attention
  makes the first batch's sizes all distinct.
- 0/1 specialization: a size or int that is 0 or 1 on the first call is compiled as a constant. Totals and
  max_seqlen values stay >= 2 on every call (empty sequences inside a batch are fine: they are offset values).
"""
import os
import tempfile

import pytest
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs, CompileCounterWithBackend, EagerAndRecordGraphs

import jfa_ops
from jfa_ops.testing import assert_attention_close
from tests.common import device_backend_params, head_dims_for

HQ, HKV, D = 4, 2, 16


def _offsets(lengths, device):
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), device=device)


def _batches(n, cross, device, seed=0):
    """n jagged batches: different B, totals and max lengths. The first one has all sizes distinct (see above)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        if i == 0:
            q_lengths, kv_lengths = [11, 0, 7, 3, 8], ([5, 13, 0, 2, 6] if cross else None)  # B+1=6, T 29/26
        else:
            b = 2 + i % 5
            q_lengths = torch.randint(0, 12, (b,), generator=g).tolist()
            q_lengths[i % b] = 2 + i  # max >= 2, total >= 2, growing max length
            kv_lengths = None
            if cross:
                kv_lengths = torch.randint(0, 9, (b,), generator=g).tolist()
                kv_lengths[(i + 1) % b] = 3 + i
        q_off = _offsets(q_lengths, device)
        kv_off = q_off if kv_lengths is None else _offsets(kv_lengths, device)
        kv_lengths = q_lengths if kv_lengths is None else kv_lengths
        out.append((q_off, kv_off, max(q_lengths), max(kv_lengths)))
    return out


def _tensors(q_off, kv_off, device, dtype, seed, head_dim=D):
    g = torch.Generator().manual_seed(seed)
    mk = lambda rows, h: torch.randn(rows, h, head_dim, generator=g).to(device, dtype).requires_grad_()  # noqa: E731
    return mk(int(q_off[-1]), HQ), mk(int(kv_off[-1]), HKV), mk(int(kv_off[-1]), HKV)


@pytest.mark.parametrize("device,backend", device_backend_params())
@pytest.mark.parametrize("cross", [False, True], ids=["self", "cross"])
def test_one_compile_over_many_jagged_batches(device, backend, cross):
    torch._dynamo.reset()
    dtype = torch.float32 if device == "cpu" else torch.float16

    def fn(q, k, v, q_off, kv_off, max_q, max_kv):
        out, lse = jfa_ops.jagged_attention(q, k, v, q_off, kv_off, max_q, max_kv, causal=True, window=(5, 0),
                                            return_lse=True, backend=backend)
        return out.float().sum() + lse.clamp_min(-1e4).sum() * 1e-3, out

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(fn, fullgraph=True, dynamic=True, backend=counter)
    batches = _batches(22, cross, device)
    assert len({int(b[0][-1]) for b in batches}) > 10 and len({b[2] for b in batches}) > 10
    torch._dynamo.utils.counters.clear()
    for i, (q_off, kv_off, max_q, max_kv) in enumerate(batches):
        q, k, v = _tensors(q_off, kv_off, device, dtype, seed=i, head_dim=head_dims_for(device, backend, (D,))[0])
        loss, out = compiled(q, k, v, q_off, kv_off, max_q, max_kv)
        grads = torch.autograd.grad(loss, (q, k, v))
        ref_loss, ref_out = fn(q, k, v, q_off, kv_off, max_q, max_kv)
        ref_grads = torch.autograd.grad(ref_loss, (q, k, v))
        assert torch.equal(out, ref_out)
        for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
            assert_attention_close(g, r, dtype=dtype, kind="grad", name=name)
    assert counter.frame_count == 1, f"compiled {counter.frame_count} times"
    assert sum(torch._dynamo.utils.counters["recompiles"].values()) == 0
    assert not torch._dynamo.utils.counters["graph_break"]


def test_window_as_an_argument_is_symbolic():
    """window_left/right are SymInt in the schema: a window passed into a dynamic compiled function stays symbolic
    and reaches the fake as a SymInt (regression: the fake used to reject SymInt windows)."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")

    @torch.compile(fullgraph=True, dynamic=True, backend=counter)
    def fn(q, k, v, q_off, kv_off, left):
        return jfa_ops.jagged_attention(q, k, v, q_off, kv_off, window=(left, 2))

    q_off, kv_off, _, _ = _batches(1, True, "cpu")[0]
    q, k, v = _tensors(q_off, kv_off, "cpu", torch.float32, seed=0)
    for left in (3, 4, 6, 9):
        expected = jfa_ops.jagged_attention(q, k, v, q_off, kv_off, window=(left, 2))
        assert torch.equal(fn(q, k, v, q_off, kv_off, left), expected)
    assert counter.frame_count == 1


class _Attn(torch.nn.Module):
    def forward(self, q, k, v, q_off, kv_off):
        out, lse = torch.ops.jfa.attention(q, k, v, q_off, kv_off, causal=True)
        return out * 2, lse


def _graph_inputs():
    q_off, kv_off, _, _ = _batches(1, True, "cpu")[0]
    return (*_tensors(q_off, kv_off, "cpu", torch.float32, seed=0), q_off, kv_off)


def _ops_called(graph_module) -> list:
    """The OpOverload(Packet)s a graph calls, in order."""
    return [n.target for n in graph_module.graph.nodes if n.op == "call_function"
            and isinstance(n.target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))]


def test_dynamo_graph_is_one_graph_with_the_op():
    """Structure, not node names: one graph, no graph break, the op called once with its options."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    backend = EagerAndRecordGraphs()
    torch.compile(_Attn(), backend=backend, fullgraph=True, dynamic=True)(*_graph_inputs())
    assert len(backend.graphs) == 1 and not torch._dynamo.utils.counters["graph_break"]
    (call,) = [n for n in backend.graphs[0].graph.nodes if n.target is torch.ops.jfa.attention]
    assert call.kwargs == {"causal": True}


def test_aot_graphs_call_the_forward_and_backward_ops():
    """One forward and one backward graph: the forward calls jfa::attention once, the backward
    jfa::attention_backward once (no decomposition, no second attention)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    backend = AotEagerAndRecordGraphs()
    out, lse = torch.compile(_Attn(), backend=backend, fullgraph=True, dynamic=True)(*_graph_inputs())
    (out.sum() + lse.clamp_min(0).sum()).backward()
    assert (len(backend.fw_graphs), len(backend.bw_graphs)) == (1, 1)
    assert not torch._dynamo.utils.counters["graph_break"]
    jfa_ops_in = lambda gm: [op for op in _ops_called(gm) if op.namespace == "jfa"]  # noqa: E731
    assert jfa_ops_in(backend.fw_graphs[0]) == [torch.ops.jfa.attention.default]
    assert jfa_ops_in(backend.bw_graphs[0]) == [torch.ops.jfa.attention_backward.default]


def _export():
    inputs = _graph_inputs()
    t_q, t_kv, b = torch.export.Dim("T_q", min=2), torch.export.Dim("T_kv", min=2), torch.export.Dim("B1", min=2)
    shapes = ({0: t_q}, {0: t_kv}, {0: t_kv}, {0: b}, {0: b})
    return torch.export.export(_Attn(), tuple(t.detach() for t in inputs), dynamic_shapes=shapes)


def _other_batch():
    q_off, kv_off, _, _ = _batches(3, True, "cpu", seed=5)[2]
    return tuple(t.detach() for t in _tensors(q_off, kv_off, "cpu", torch.float32, seed=1)) + (q_off, kv_off)


def test_export_runs_on_other_shapes():
    ep = _export()
    assert "torch.ops.jfa.attention.default" in ep.graph_module.code
    inputs = _other_batch()
    for got, want in zip(ep.module()(*inputs), _Attn()(*inputs)):
        assert torch.equal(got, want)


def test_aoti_compile_and_package_on_cpu():
    """AOTInductor handles the Python custom op (it calls back into Python for it through the proxy executor)."""
    ep = _export()
    with tempfile.TemporaryDirectory() as d:
        path = torch._inductor.aoti_compile_and_package(ep, package_path=os.path.join(d, "attn.pt2"))
        loaded = torch._inductor.aoti_load_package(path)
        inputs = _other_batch()
        for got, want in zip(loaded(*inputs), _Attn()(*inputs)):
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("pinned,installed,torch_version,env,path", [
    ("triton==3.6.0; platform_system == 'Linux'", "3.6.0", "2.11.0+cu130", None, "inductor"),
    ("triton==3.6.0; platform_system == 'Linux'", "3.8.0", "2.11.0+cu130", None, "split"),  # the TLX install
    ("triton==3.6.0; platform_system == 'Linux'", "3.7.1", "2.11.0+cu130", None, "opaque"),  # an untried pair
    ("triton==3.7.0; platform_system == 'Linux'", "3.8.0", "2.12.0+cu130", None, "opaque"),  # an untried pair
    ("pytorch-triton==3.6.0+git1234", "3.8.0", "2.11.0", "inductor", "inductor"),  # forced
    (None, "3.8.0", "2.13.0+cpu", None, "inductor"),  # a torch wheel that pins no triton (CPU builds): nothing to compare
])
def test_default_compile_path_under_a_triton_torch_does_not_pin(monkeypatch, pinned, installed, torch_version, env,
                                                                 path):
    """torch's kernel analysis (wrap_triton) failed under another triton minor (H200, 2026-12-02: torch 2.11 with
    triton 3.8) until ``ttir_compat``; a mismatched pair keeps the op opaque unless ``SPLIT_BY_DEFAULT`` lists it
    (the TLX install's pair, H200 v24), where the size-split path is the default."""
    import importlib.metadata

    import triton

    from jfa_ops.ops import attention

    requires = importlib.metadata.requires
    monkeypatch.setattr(importlib.metadata, "requires",
                        lambda name: ([pinned] if pinned else []) if name == "torch" else requires(name))
    monkeypatch.setattr(triton, "__version__", installed)
    monkeypatch.setattr(torch, "__version__", torch_version)
    monkeypatch.delenv("JFA_COMPILE_PATH", raising=False)
    if env:
        monkeypatch.setenv("JFA_COMPILE_PATH", env)
    attention.triton_pin_mismatch.cache_clear()
    try:
        assert attention.compile_path() == path
        assert (attention.triton_pin_mismatch() is not None) == (pinned is not None and installed != "3.6.0")
    finally:
        attention.triton_pin_mismatch.cache_clear()
