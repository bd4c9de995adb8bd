"""The size-split compile path (``JFA_COMPILE_PATH=split``): one graph for every length, ``torch.cond`` on the row
count between the traced kernels (small calls) and the opaque op (large calls, whose body auto-dispatches: tlx
under the TLX install), forward and backward.

CPU: a pure-torch traceable test backend (``tests/split_dense_backend.py``) stands in for the triton kernels, so the
compiled graphs run (``aot_eager``-style: AOTAutograd, then the graphs eagerly) and are checked against the float64
oracle on both sides of a threshold lowered to CPU sizes; the triton backend's own split graphs are traced with fake
CUDA tensors in a subprocess (as tests/test_compile_inductor.py does).
"""
from __future__ import annotations

import functools
import itertools
import operator
import shutil

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import aot_module_simplified
from torch._functorch.partitioners import min_cut_rematerialization_partition

import jfa_ops
from jfa_ops import validation
from jfa_ops.backends import register_backend, unregister_backend
from jfa_ops.ops import attention as attention_module
from jfa_ops.testing import assert_attention_close, reference_attention
from tests import split_dense_backend as dense

pytest.importorskip("triton")
from jfa_ops.backends.triton import attn_fwd  # noqa: E402

THRESHOLD = 40  # rows: the split point these tests set (attn_fwd.TMA_MIN_ROWS, the eager rule's)


@pytest.fixture
def split(monkeypatch):
    """The split path on CPU tensors with the test backend, a CPU-sized threshold, offsets unchecked (CPU
    validation is host-side, which a traced call cannot do); Dynamo's caches cleared before and after."""
    monkeypatch.setenv("JFA_COMPILE_PATH", "split")
    monkeypatch.setattr(attention_module, "TRACE_DEVICES", ("cuda", "cpu"))
    unchecked = lambda device: "off"  # noqa: E731
    monkeypatch.setattr(validation, "validation_mode", unchecked)
    monkeypatch.setattr(attention_module, "validation_mode", unchecked)
    monkeypatch.setattr(attn_fwd, "TMA_MIN_ROWS", THRESHOLD)
    register_backend(dense.BACKEND, replace=True)
    dense.CALLS.update(forward=0, backward=0)
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    unregister_backend(dense.BACKEND.name)


@pytest.fixture(params=["1", "cond"], ids=["hoist", "hoist-cond"])
def hoist(request, monkeypatch):
    """``JFA_SPLIT_HOIST``: the offset-derived values built before the conds unconditionally (``1``, the default) or
    behind the split's predicate (``cond``: a cond of their own, whose false branch builds nothing)."""
    monkeypatch.setenv("JFA_SPLIT_HOIST", request.param)
    return request.param


def _split_conds(conds, op):
    """(the layers' conds: the large branch ``[op]``; the build conds: the rest, ``JFA_SPLIT_HOIST=cond``'s)."""
    layer = [c for c in conds if c[1] == [op]]
    return layer, [c for c in conds if c[1] != [op]]


class Capture:
    """A torch.compile backend: AOTAutograd with the forward and backward graphs kept (then run eagerly)."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        def keep(kind):
            def compiler(graph, inputs):
                self.graphs.append((kind, graph))
                return make_boxed_func(graph)
            return compiler
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                                     partition_fn=functools.partial(min_cut_rematerialization_partition,
                                                                    compiler="inductor"))  # as Inductor partitions

    def calls(self, kind):
        """[(top-level calls, [(true-branch calls, false-branch calls) per cond])] of each ``kind`` graph."""
        return [_calls(g) for k, g in self.graphs if k == kind]


def _targets(gm) -> list:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]


def _calls(gm):
    conds = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]
    return _targets(gm), [tuple(_targets(getattr(gm, n.args[i].target)) for i in (1, 2)) for n in conds]


def _model(layers: int):
    def model(q, k, v, offsets, max_seqlen=-1):
        for _ in range(layers):  # each layer's output feeds the next (as q), offsets shared, as in a model
            out, lse = torch.ops.jfa.attention(q, k, v, offsets, offsets, max_seqlen, max_seqlen, causal=True,
                                               backend=dense.BACKEND.name)
            q = out + lse.transpose(0, 1).unsqueeze(-1)
        return q
    return model


def _batch(lengths, seed, heads=(4, 2), head_dim=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    rows = sum(lengths)
    offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    q = torch.randn(rows, heads[0], head_dim, generator=g, dtype=dtype)
    k, v = (torch.randn(rows, heads[1], head_dim, generator=g, dtype=dtype) for _ in range(2))
    return q, k, v, offsets


def _oracle(q, k, v, offsets, layers):
    q = q.double()
    for _ in range(layers):
        out, lse = reference_attention(q, k, v, offsets, offsets, causal=True)
        q = out + lse.transpose(0, 1).unsqueeze(-1)
    return q


# Lengths on both sides of THRESHOLD, back and forth: small, large, small, large (no 0/1-sized dims: Dynamo
# specializes those)
BATCHES = [[5, 7], [30, 31], [3, 4, 2], [20, 9, 15], [11, 12]]


def test_one_graph_with_both_branches_forward_and_backward(split, hoist):
    capture = Capture()
    counted = CompileCounterWithBackend(capture)
    compiled = torch.compile(_model(2), backend=counted, dynamic=True)
    q, k, v, offsets = _batch(BATCHES[0], 0)
    q.requires_grad_(True)
    compiled(q, k, v, offsets).sum().backward()
    assert counted.frame_count == 1 and not counters["graph_break"], dict(counters["graph_break"])
    (fwd_top, fwd_conds), = capture.calls("forward")
    (bwd_top, bwd_conds), = capture.calls("backward")
    # one cond per layer, in each graph, and under JFA_SPLIT_HOIST=cond one more in the forward that builds the
    # offset-derived values (the backward gets them from the forward); no jfa op outside them
    fwd_conds, fwd_builds = _split_conds(fwd_conds, "jfa.attention.default")
    bwd_conds, bwd_builds = _split_conds(bwd_conds, "jfa.attention_backward.default")
    assert len(fwd_conds) == 2 and len(bwd_conds) == 2
    assert len(fwd_builds) == (hoist == "cond") and not bwd_builds, (fwd_builds, bwd_builds)
    assert fwd_top.count("cond") == 2 + len(fwd_builds) and bwd_top.count("cond") == 2
    for build in fwd_builds:  # both sides build the same values (the test backend's are pure torch: no launch)
        assert all("aten.searchsorted.Tensor" in b and not any(c.startswith("jfa.") for c in b) for b in build)
    assert not any(c.startswith("jfa.") for c in fwd_top + bwd_top)
    # the backward computes its own predicate from the sizes: no SymBool saved for it (torch 2.11's Inductor takes
    # no SymBool graph input)
    backward, = [g for k, g in capture.graphs if k == "backward"]
    inputs = [n.meta.get("val") for n in backward.graph.nodes if n.op == "placeholder"]
    assert not any(isinstance(i, torch.SymBool) for i in inputs), inputs
    for (small, large), op in [(c, "jfa.attention.default") for c in fwd_conds] + [
            (c, "jfa.attention_backward.default") for c in bwd_conds]:
        assert large == [op]  # the large branch: the op, opaque (its body chooses the backend at run time)
        assert "aten.einsum.default" in small or "aten.bmm.default" in small, small  # traced: the backend's code
        assert not any(c.startswith("jfa.") for c in small)


@pytest.mark.parametrize("layers, max_seqlen", [(1, False), (2, True)])
def test_lengths_across_the_threshold_run_one_graph_and_match_the_oracle(split, hoist, layers, max_seqlen):
    """Every batch through one compiled graph (no recompile), results and gradients within the fp32 tolerances of
    the float64 oracle; the large branch (the opaque op: its body runs at run time, counted by the test backend)
    runs exactly for the batches of THRESHOLD rows or more. ``max_seqlen``: passed as an int (a SymInt in the
    graph: a cond operand of its own)."""
    counted = CompileCounterWithBackend(Capture())
    compiled = torch.compile(_model(layers), backend=counted, dynamic=True)
    for seed, lengths in enumerate(BATCHES):
        q, k, v, offsets = _batch(lengths, seed)
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        before = dict(dense.CALLS)
        out = compiled(q, k, v, offsets, max(lengths)) if max_seqlen else compiled(q, k, v, offsets)
        grad = torch.randn_like(out)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
        large = sum(lengths) >= THRESHOLD
        assert dense.CALLS == {"forward": before["forward"] + layers * large,
                               "backward": before["backward"] + layers * large}, (lengths, before, dense.CALLS)
        expected = _oracle(q, k, v, offsets, layers)
        ref_grads = torch.autograd.grad(expected, (q, k, v), grad.double())
        assert_attention_close(out, expected, dtype=torch.float32, kind="forward", name=f"out {lengths}")
        for name, actual, ref in zip("qkv", (dq, dk, dv), ref_grads):
            assert_attention_close(actual, ref, dtype=torch.float32, kind="grad", name=f"d{name} {lengths}")
    assert counted.frame_count == 1, "lengths across the threshold recompiled"
    assert not counters["graph_break"]


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="Inductor on CPU needs a C++ compiler")
def test_inductor_lowers_and_runs_the_split_graphs_on_cpu(split, hoist):
    """Inductor itself (CPU code, the op a fallback kernel in the large branch, the forward's predicate saved for the
    backward): one graph over lengths crossing the threshold, both branches run, the oracle's results."""
    counted = CompileCounterWithBackend("inductor")
    compiled = torch.compile(_model(2), backend=counted, dynamic=True)
    for seed, lengths in enumerate(BATCHES[:3]):
        q, k, v, offsets = _batch(lengths, seed)
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        before = dense.CALLS["backward"]
        out = compiled(q, k, v, offsets)
        grad = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), grad)
        assert dense.CALLS["backward"] - before == 2 * (sum(lengths) >= THRESHOLD)
        expected = _oracle(q, k, v, offsets, 2)
        assert_attention_close(out, expected, dtype=torch.float32, kind="forward", name=f"out {lengths}")
        for name, actual, ref in zip("qkv", grads, torch.autograd.grad(expected, (q, k, v), grad.double())):
            assert_attention_close(actual, ref, dtype=torch.float32, kind="grad", name=f"d{name} {lengths}")
    assert counted.frame_count == 1 and not counters["graph_break"]


@pytest.mark.parametrize("backend", ["aot", "inductor"])
def test_q_k_v_views_of_one_projection(split, hoist, backend):
    """q, k and v as views of one fused projection (what a model's qkv linear gives, and the bench's model): the
    cond operands share a storage, which cond rejects ("might be aliasing the input", the H200 model run of
    2026-12-04); one graph across the threshold, the oracle's results and gradients."""
    if backend == "inductor" and shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("Inductor on CPU needs a C++ compiler")
    heads, head_dim = 2, 16

    g = torch.Generator().manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(8, 3 * heads * head_dim, generator=g))

    def model(x, offsets):  # the weight a parameter, as in a model (Dynamo keeps its shape static)
        q, k, v = (x @ weight).unflatten(-1, (3, heads, head_dim)).unbind(1)  # views of one [T, 3 H D] tensor
        out, _ = torch.ops.jfa.attention(q, k, v, offsets, offsets, causal=True, backend=dense.BACKEND.name)
        return out

    counted = CompileCounterWithBackend(Capture() if backend == "aot" else "inductor")
    compiled = torch.compile(model, backend=counted, dynamic=True)
    for lengths in BATCHES[:4]:
        offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        x = torch.randn(sum(lengths), 8, generator=g, requires_grad=True)
        out = compiled(x, offsets)
        grad = torch.randn_like(out)
        grads = torch.autograd.grad(out, (x, weight), grad)
        q, k, v = (x.double() @ weight.double()).unflatten(-1, (3, heads, head_dim)).unbind(1)
        expected, _ = reference_attention(q, k, v, offsets, offsets, causal=True)
        assert_attention_close(out, expected, dtype=torch.float32, kind="forward", name=f"out {lengths}")
        for name, actual, ref in zip(("x", "weight"), grads,
                                     torch.autograd.grad(expected, (x, weight), grad.double())):
            assert_attention_close(actual, ref, dtype=torch.float32, kind="grad", name=f"d{name} {lengths}")
    assert counted.frame_count == 1 and not counters["graph_break"]


def test_static_sizes_choose_the_branch_while_tracing(split):
    """Without symbolic sizes (each shape compiles its own graph anyway) the branch is chosen when tracing: no
    cond, the kernels below the threshold, the op from there."""
    for lengths, expected in (([5, 7], "traced"), ([30, 31], "opaque")):
        torch._dynamo.reset()
        capture = Capture()
        q, k, v, offsets = _batch(lengths, 0)
        q.requires_grad_(True)
        torch.compile(_model(1), backend=capture, dynamic=False)(q, k, v, offsets).sum().backward()
        (top, conds), = capture.calls("forward")
        assert not conds
        assert ("jfa.attention.default" in top) == (expected == "opaque"), top


def test_the_threshold_is_the_eager_rules(split):
    """One source: the split point is the triton backend's TMA_MIN_ROWS, which the tlx automatic rule reads too
    (``auto_min_rows``; the tlx module itself needs its install, so its source is checked)."""
    import inspect
    import pathlib

    assert attention_module.split_rows() == THRESHOLD
    source = (pathlib.Path(jfa_ops.__file__).parent / "backends" / "tlx" / "__init__.py").read_text()
    assert "min_rows = auto_min_rows()" in source
    assert "return _triton_attn_fwd().TMA_MIN_ROWS" in source
    assert "attn_fwd.TMA_MIN_ROWS" in inspect.getsource(attention_module.split_rows)


def test_other_paths_take_no_cond(split, monkeypatch):
    """``inductor`` traces the backend for every size, ``opaque`` keeps the op: neither has a cond."""
    for path, op_kept in (("inductor", False), ("opaque", True)):
        monkeypatch.setenv("JFA_COMPILE_PATH", path)
        torch._dynamo.reset()
        capture = Capture()
        q, k, v, offsets = _batch([30, 31], 0)
        q.requires_grad_(True)
        torch.compile(_model(1), backend=capture, dynamic=True)(q, k, v, offsets).sum().backward()
        (top, conds), = capture.calls("forward")
        assert not conds and ("jfa.attention.default" in top) == op_kept, (path, top)


# The triton backend's split graphs, traced with fake CUDA tensors (no GPU, no interpreter) in a subprocess
# (after test_compile_inductor's _FAKE_H100 and _GRAPH_CALLS)
_SPLIT_TRACER = r"""
result = {}
for dynamic in (False, True):
    shape_env, mode, forward_inputs, backward_inputs = fake_inputs(dynamic)
    guards = len(shape_env.guards)
    graphs = []

    def capture(gm, inputs):
        graphs.append(calls(gm))
        raise Captured

    aot = V.set_aot_compilation(True) if os.environ.get("TRACE_AOT") == "1" else contextlib.nullcontext()
    with mode, aot:
        for fn, args in ((forward(None), forward_inputs), (backward(None), backward_inputs)):
            try:
                aot_function(fn, fw_compiler=capture)(*args)
            except Captured:
                pass
    result["dynamic" if dynamic else "static"] = {
        "forward": graphs[0], "backward": graphs[1], "guards": [str(g.expr) for g in shape_env.guards[guards:]]}
print(json.dumps(result))
"""


@pytest.mark.parametrize("hoist", ["1", "cond"], ids=["hoist", "hoist-cond"])
def test_triton_split_graphs_hold_the_kernels_and_the_op(hoist):
    """The triton backend under ``split`` (backend=None, the automatic choice; fake CUDA sizes T=29 < 4096):
    dynamic sizes give one cond per op on ``T < 4096`` whose small branch holds the triton kernels and whose large
    branch holds the op; no guard on the lengths (only heads and head_dim, as on the inductor path); static sizes
    of a small call trace the kernels with no cond. The tile lists' launches and the offset check (forward) are
    outside the conds by default; under ``JFA_SPLIT_HOIST=cond`` in a cond of their own on the same predicate,
    before the op's, whose true branch launches them and whose false branch launches nothing and asserts nothing
    (its values unwritten: a large batch reads none), and nothing of them is left outside a cond."""
    from tests.test_compile_inductor import _FAKE_H100, _GRAPH_CALLS, _run

    graphs = _run(_FAKE_H100 + _GRAPH_CALLS + _SPLIT_TRACER, JFA_COMPILE_PATH="split", JFA_SPLIT_HOIST=hoist)
    dynamic = graphs["dynamic"]
    assert all(g.startswith("Eq(") and "T" not in g for g in dynamic["guards"]), dynamic["guards"]
    for kind, op, last_kernel in (("forward", "jfa.attention.default", "kernel:attn_fwd_kernel"),
                                  ("backward", "jfa.attention_backward.default", "kernel:attn_bwd_dq_kernel")):
        top = [c for c in dynamic[kind] if not isinstance(c, list)]
        conds, builds = _split_conds([c[2:] for c in dynamic[kind] if isinstance(c, list)], op)
        assert len(conds) == 1 and not any(c.startswith("jfa.") for c in top)
        preds = [c[1] for c in dynamic[kind] if isinstance(c, list)]
        assert all(p.endswith(("< 4096", "<= 4095")) for p in preds), preds  # the backward writes it apart
        assert len(set(preds)) == 1  # the build's cond: the op's predicate
        small, large = conds[0]
        assert large == [op]
        kernels = [c for c in small if c.startswith("kernel:")]
        assert kernels and kernels[-1] == last_kernel and not any(c.startswith("jfa.") for c in small), small
        lists = ["kernel:tile_slots_kernel", "kernel:rank_tiles_kernel"]
        assert not any(k in small for k in lists) and "aten._assert_async.msg" not in small, small
        checked = kind == "forward"  # the forward checks the offsets (its list build's flag)
        if hoist == "1":
            assert not builds and all(k in top for k in lists), top
            assert ("aten._assert_async.msg" in top) == checked, top
            continue
        (build, nothing), = builds
        assert dynamic[kind].index(["cond", preds[0], build, nothing]) < dynamic[kind].index(
            ["cond", preds[0], small, large])
        assert not any(c.startswith("kernel:") or c == "aten._assert_async.msg" for c in top), top
        assert all(k in build for k in lists) and ("aten._assert_async.msg" in build) == checked, build
        assert not any(c.startswith(("kernel:", "jfa.")) or c == "aten._assert_async.msg" for c in nothing), nothing
    static = graphs["static"]
    assert not any(isinstance(c, list) for c in static["forward"] + static["backward"])
    assert "kernel:attn_fwd_kernel" in static["forward"] and "jfa.attention.default" not in static["forward"]


def test_aot_packages_take_the_kernels_for_every_size():
    """AOTInductor packages run without Python, so under ``split`` an AOT compile traces the kernels with no cond
    (as ``inductor``): no opaque op to call back."""
    from tests.test_compile_inductor import _FAKE_H100, _GRAPH_CALLS, _run

    graphs = _run(_FAKE_H100 + _GRAPH_CALLS + _SPLIT_TRACER, JFA_COMPILE_PATH="split", TRACE_AOT="1")["dynamic"]
    assert not any(isinstance(c, list) for c in graphs["forward"] + graphs["backward"])
    assert "kernel:attn_fwd_kernel" in graphs["forward"] and "jfa.attention.default" not in graphs["forward"]
    assert "kernel:attn_bwd_dq_kernel" in graphs["backward"]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_split_on_the_gpu_one_graph_across_the_threshold(monkeypatch, mode):
    """The automatic choice under ``split`` on the GPU (triton traced below 4096 rows, the op above: tlx under the
    TLX install): one Inductor graph over batches on both sides, forward and gradients within bf16 tolerances of the
    float64 oracle; under CUDA-graph trees too (``reduce-overhead``: the cond's branches replay or run as Inductor
    decides, with the same results)."""
    monkeypatch.setenv("JFA_COMPILE_PATH", "split")
    monkeypatch.setattr(attn_fwd, "TMA_MIN_ROWS", 4096)  # the library's (conftest lowers it for the other tests)
    torch._dynamo.reset()
    counters.clear()

    def model(q, k, v, offsets):
        out, lse = torch.ops.jfa.attention(q, k, v, offsets, offsets, causal=True)
        return out

    compiled = torch.compile(model, dynamic=True, mode=None if mode == "default" else mode)  # inductor
    # the first batch's offsets size (5) equal to no other dim: Dynamo gives equal sizes one symbol (duck sizing), and
    # the heads' guard (4 query heads, static for the kernels) would pin offsets of size 4 with them: [100, 300, 50]
    # recompiled on the H200 (2026-12-04), a trait of this test's graph inputs (a model's heads are ints)
    for seed, lengths in enumerate([[100, 300, 50, 20], [3000, 2500], [7, 900], [4096]]):
        q, k, v, offsets = (t.cuda() for t in _batch(lengths, seed, heads=(4, 2), head_dim=64, dtype=torch.bfloat16))
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        out = compiled(q, k, v, offsets)
        grad = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), grad)
        expected, _ = reference_attention(q, k, v, offsets, offsets, causal=True)
        assert_attention_close(out, expected, dtype=torch.bfloat16, kind="forward", name=f"out {lengths}")
        for name, actual, ref in zip("qkv", grads, torch.autograd.grad(expected, (q, k, v), grad.double())):
            assert_attention_close(actual, ref, dtype=torch.bfloat16, kind="grad", name=f"d{name} {lengths}")
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == 1 and not counters["graph_break"], (graphs, counters["graph_break"])
    print(f"split {mode}: cudagraph skips {dict(counters['inductor']).get('cudagraph_skips', 0)}")  # for the notes
    torch._dynamo.reset()


def test_offset_derived_values_are_built_once_before_the_conds(split, hoist):
    """What the small branch derives from the offsets alone (here the test backend's row positions, a ``per_trace``
    value as the triton backend's int32 copies, tile lists and offset check are) is built once in the graph, before
    the conds, and reaches every layer's small branch as an operand: no branch builds it, and the dry run that found
    it leaves no attention work behind in the graph. Under ``JFA_SPLIT_HOIST=cond`` it is built by a cond of its
    own, before the layers' (none outside it)."""
    capture = Capture()
    compiled = torch.compile(_model(3), backend=capture, dynamic=True)
    q, k, v, offsets = _batch(BATCHES[0], 0)
    q.requires_grad_(True)
    compiled(q, k, v, offsets).sum().backward()
    for kind, built in (("forward", 1), ("backward", 0)):  # the backward gets the forward's (saved or recomputed)
        (top, conds), = capture.calls(kind)
        conds, builds = _split_conds(conds, f"jfa.{'attention' if kind == 'forward' else 'attention_backward'}"
                                            ".default")
        assert len(builds) == (built if hoist == "cond" else 0), (kind, builds)
        outside = 0 if hoist == "cond" else built
        assert len(conds) == 3 and top.count("aten.searchsorted.Tensor") <= outside, (kind, top)
        assert "aten.bmm.default" not in top, (kind, top)  # the dry run's attention ops are dead code, removed
        for small, _ in conds:
            assert "aten.bmm.default" in small and "aten.searchsorted.Tensor" not in small, (kind, small)
        for branch in (b for build in builds for b in build):  # the build's dry run: no attention work either
            assert branch.count("aten.searchsorted.Tensor") == 1 and "aten.bmm.default" not in branch, branch
    (top, _), = capture.calls("forward")
    if hoist == "cond":
        assert "aten.searchsorted.Tensor" not in top and top.count("cond") == 4, top
        return
    assert top.count("aten.searchsorted.Tensor") == 1 and top.index("aten.searchsorted.Tensor") < top.index("cond")


class _Traced(Exception):
    pass


def test_broadcast_q_stays_opaque(split):
    """Broadcast-Q outputs have B * L_q rows, whose symbolic strides (Max(1, B * L_q)) torch.cond rejects (opcheck's
    dynamic AOT test on the H200, 2026-12-04): under ``split`` the op stays one opaque node, forward and backward,
    no cond."""
    graphs = []

    def capture(gm, example_inputs):
        def keep(kind):
            def compiler(graph, inputs):
                graphs.append((kind, _calls(graph)))
                raise _Traced
            return compiler
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep("forward"), bw_compiler=keep("backward"))

    def model(q, k, v, offsets):
        out, _ = torch.ops.jfa.attention(q, k, v, None, offsets, causal=True, broadcast_q=True,
                                         backend=dense.BACKEND.name)
        return out

    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 4, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(21, 2, 16, generator=g) for _ in range(2))
    offsets = torch.tensor([0, 5, 12, 21], dtype=torch.int32)
    with pytest.raises(Exception) as raised:  # the capture stops at the traced forward graph
        torch.compile(model, backend=capture, dynamic=True)(q, k, v, offsets)
    assert isinstance(raised.value, _Traced) or isinstance(raised.value.__cause__, _Traced) or "_Traced" in str(
        raised.value), raised.value
    (kind, (top, conds)), = graphs
    assert kind == "forward" and not conds and "jfa.attention.default" in top, top


def test_a_predicate_known_from_the_size_ranges_takes_no_cond(split, monkeypatch):
    """A threshold that every dynamic size is past (Dynamo's sizes are >= 2, so ``rows < 2`` is known False) chooses
    while tracing, with no guard and no cond: a cond on a constant carried it as a graph input of the backward, which
    torch 2.11's Inductor rejects ("Unsupported inductor graph input type: BooleanFalse", H200, 2026-12-04, a
    compiled CUDA-graph training step with the test suite's lowered threshold)."""
    monkeypatch.setattr(attn_fwd, "TMA_MIN_ROWS", 2)
    capture = Capture()
    counted = CompileCounterWithBackend(capture)
    compiled = torch.compile(_model(1), backend=counted, dynamic=True)
    for seed, lengths in enumerate(BATCHES[:2]):
        q, k, v, offsets = _batch(lengths, seed)
        q.requires_grad_(True)
        compiled(q, k, v, offsets).sum().backward()
    assert counted.frame_count == 1
    for kind in ("forward", "backward"):
        for top, conds in capture.calls(kind):
            assert not conds and any(c.startswith("jfa.") for c in top), (kind, top)
