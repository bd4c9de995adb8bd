"""The compile path: under torch.compile the triton backend's kernels are traced into the graph (Inductor launches
them), every other backend stays one opaque node; AOTInductor packages carry the kernels.

CPU tests trace with FakeTensors on a fake CUDA device in a subprocess: TRITON_INTERPRET=1 (set for this pytest
process) turns ``@triton.jit`` kernels into interpreter objects that ``torch.library.wrap_triton`` cannot record, and
the GPU's facts (SM count, shared memory, compile target) are stubbed with an H100/H200's. GPU tests compile and run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import jfa_ops
from jfa_ops.testing import AttentionCase, assert_attention_close, reference_attention

pytest.importorskip("triton")

# What every subprocess script starts with: an H100's facts in place of a GPU, and the fake CUDA inputs of one
# forward and one backward call (sizes symbolic with dynamic=True: Dynamo's dynamic=True makes every size symbolic).
_FAKE_H100 = r"""
import json, os, sys
import torch
import triton
from triton.backends.compiler import GPUTarget
from jfa_ops.backends.triton import common, configs


class _H100Driver:  # only the compile target is asked for (torch's mutation analysis lowers the kernels to TTIR)
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


triton.runtime.driver.set_active(_H100Driver())
configs._shared_memory_limit = lambda index: 232448
common._num_sms = lambda index: 132

import jfa_ops  # noqa: E402
from torch._dynamo.source import ConstantSource  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv  # noqa: E402


def forward(backend):
    def forward(q, k, v, off):
        out, lse = torch.ops.jfa.attention(q, k, v, off, off, causal=True, backend=backend)
        return out, lse
    return forward


def backward(backend):
    def backward(grad_out, q, k, v, out, lse, off):
        dq, dk, dv = torch.ops.jfa.attention_backward(grad_out, None, q, k, v, out, lse, off, off, causal=True,
                                                      backend=backend)
        return dq, dk, dv
    return backward


def fake_inputs(dynamic):
    # (shape_env, mode, forward inputs, backward inputs). Autograd on fake CUDA tensors needs CUDA in torch itself,
    # so the forward and backward ops are traced apart.
    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env)

    def size(name, hint):
        if not dynamic:
            return hint
        symbol = shape_env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
        return shape_env.create_symintnode(symbol, hint=hint, source=ConstantSource(name))

    with mode:
        rows, batch1 = size("T", 29), size("B1", 6)
        # torch.compile(dynamic=True) makes heads and head_dim symbolic too (the GPU run caught it)
        heads_q, heads_kv, head_dim = size("HQ", 4), size("HKV", 2), size("D", 16)
        q, k, v = (torch.empty(rows, h, head_dim, device="cuda", dtype=torch.float16)
                   for h in (heads_q, heads_kv, heads_kv))
        off = torch.empty(batch1, device="cuda", dtype=getattr(torch, os.environ.get("TRACE_OFFSETS", "int32")))
        out, lse = torch.empty_like(q), torch.empty(heads_q, rows, device="cuda")
        grad_out = torch.empty_like(out)
    return shape_env, mode, (q, k, v, off), (grad_out, q, k, v, out, lse, off)
"""

# What the graph-tracing scripts share (this file's and test_compile_split's): ``calls``, a traced graph's kernels
# by name, ops and conds with their branches; ``Captured`` stops a trace once its graph is captured
_GRAPH_CALLS = r"""
import contextlib, os  # noqa: E401, E402
from torch._functorch.aot_autograd import aot_function  # noqa: E402
from torch._inductor.virtualized import V  # noqa: E402
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table  # noqa: E402


class Captured(Exception):
    pass


def calls(gm):
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        if "triton_kernel_wrapper" in str(n.target):
            kernel = kernel_side_table.get_kernel(n.kwargs["kernel_idx"])
            while not hasattr(kernel, "arg_names"):  # wrap_triton puts launch options in an Autotuner
                kernel = kernel.fn
            out.append("kernel:" + kernel.fn.__name__)
        elif n.target is torch.ops.higher_order.cond:  # [cond, predicate, true branch's calls, false branch's]
            out.append(["cond", str(n.args[0].meta.get("val")), calls(getattr(gm, n.args[1].target)),
                        calls(getattr(gm, n.args[2].target))])
        elif isinstance(n.target, torch._ops.OpOverload):
            out.append(str(n.target))
    return out

"""

_TRACER = _FAKE_H100 + _GRAPH_CALLS + r"""
def trace(backend, dynamic):
    shape_env, mode, forward_inputs, backward_inputs = fake_inputs(dynamic)
    graphs = []

    def capture(gm, inputs):
        graphs.append((calls(gm), len(gm.graph.output_node().args[0])))
        raise Captured  # the graph is all we want; running it needs a GPU

    guards = len(shape_env.guards)
    aot = V.set_aot_compilation(True) if os.environ.get("TRACE_AOT") == "1" else contextlib.nullcontext()
    with mode, aot:
        for fn, args in ((forward(backend), forward_inputs), (backward(backend), backward_inputs)):
            try:
                aot_function(fn, fw_compiler=capture)(*args)
            except Captured:
                pass
    # outputs: what the graph returns; more than the op's outputs means a graph input was written (copied back)
    return {"forward": graphs[0][0], "backward": graphs[1][0], "outputs": [graphs[0][1], graphs[1][1]],
            "guards": [str(g.expr) for g in shape_env.guards[guards:]]}


print(json.dumps({f"{b}-{'dynamic' if d else 'static'}": trace(b, d)
                  for b in sys.argv[1].split(",") for d in (False, True)}))
"""


def _run(script: str, *argv: str, **env) -> dict:
    """The JSON a subprocess script prints last, run without the interpreter (``env``: extra variables)."""
    child_env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "JFA_COMPILE_PATH")}
    child_env.update(env, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", script, *argv], env=child_env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _trace(backends: str, **env) -> dict:
    """{"<backend>-static|dynamic": {"forward": calls, "backward": calls, "guards": [...]}} of graphs traced with
    fake CUDA tensors by a subprocess (without the interpreter), under ``env``."""
    return _run(_TRACER, backends, **env)


# Inductor's post-grad passes on the traced graphs, with torch 2.11's replace_by_example: for a
# triton_kernel_wrapper_functional node it traces the node's decomposition (copies of the tensors the kernel writes,
# then the kernel) twice, with the node's eager_input_vals and with its meta vals, and asserts that both graphs have
# as many nodes (later torch versions trace once). Copying a tensor with symbolic sizes adds size arithmetic, and the
# two traces can disagree on it: the failure of every graph with our kernels on the H200 (torch 2.11).
# What cannot run without CUDA in torch is left out: pattern registration (it traces patterns on the device) and the
# index_select decomposition; what stays is AOTAutograd, Inductor's joint-graph passes and its post-grad passes.
_POST_GRAD = _FAKE_H100 + r"""
import inspect, textwrap  # noqa: E401, E402
import torch._inductor.compile_fx as compile_fx  # noqa: E402
import torch._inductor.fx_passes.joint_graph as joint_graph  # noqa: E402
from torch._inductor import config, pattern_matcher  # noqa: E402
from torch._inductor.fx_passes.post_grad import remove_noop_ops  # noqa: E402
from torch._inductor.virtualized import V  # noqa: E402

# torch 2.11's replace_by_example: triton_kernel_wrapper_functional takes the eager_input_vals path too
lines, first = inspect.getsourcelines(pattern_matcher.Match.replace_by_example)
source = textwrap.dedent("".join(lines))
if "triton_kernel_wrapper_functional" not in source:
    hops = "torch.ops.higher_order.auto_functionalized,\n"
    assert source.count(hops) == 1, "replace_by_example changed: update this test"
    source = source.replace(hops, "torch.ops.higher_order.triton_kernel_wrapper_functional, " + hops)
    namespace = dict(vars(pattern_matcher))
    exec(compile("\n" * (first - 1) + source, pattern_matcher.__file__, "exec"), namespace)
    pattern_matcher.Match.replace_by_example = namespace["replace_by_example"]

joint_graph.lazy_init = lambda *args, **kwargs: None
_decompositions = compile_fx.select_decomp_table
compile_fx.select_decomp_table = lambda: {op: fn for op, fn in _decompositions().items()
                                          if op is not torch.ops.aten.index_select.default}


class Compiled(Exception):
    pass


def post_grad(fn, args, mode):
    # "ok", or the error of Inductor's post-grad passes on fn's graph; the graph inputs the kernels write
    copied_inputs = []

    def inner_compile(gm, example_inputs, **kwargs):
        for node in gm.graph.nodes:
            if node.target is torch.ops.higher_order.triton_kernel_wrapper_functional:
                copied_inputs.extend(name for name in node.kwargs["tensors_to_clone"]
                                     if node.kwargs["kwargs"][name].op == "placeholder")
        with V.set_fake_mode(mode):
            remove_noop_ops(gm.graph)  # a pattern-matcher pass, on in Inductor
            compile_fx._recursive_post_grad_passes(gm, is_inference=kwargs.get("is_inference", False))
        raise Compiled

    module = torch.fx.symbolic_trace(fn)
    try:
        with config.patch(pattern_matcher=False):
            compile_fx.compile_fx(module, list(args), inner_compile=inner_compile)
    except Compiled:
        return {"result": "ok", "copied_inputs": copied_inputs}
    except Exception as e:  # noqa: BLE001 (the report is the point)
        return {"result": f"{type(e).__name__}: {e}"[:1500], "copied_inputs": copied_inputs}


out = {}
for dynamic in (False, True):
    _, mode, forward_inputs, backward_inputs = fake_inputs(dynamic)
    shapes = "dynamic" if dynamic else "static"
    out[f"forward-{shapes}"] = post_grad(forward("triton"), forward_inputs, mode)
    out[f"backward-{shapes}"] = post_grad(backward("triton"), backward_inputs, mode)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def default_graphs():
    return _trace("triton,reference", JFA_COMPILE_PATH="inductor")


def test_default_compile_path_is_inductor():
    """The default since the H200 run of 2026-12-01 17:00 (faster model steps; see compile_path)."""
    from jfa_ops.ops.attention import triton_pin_mismatch

    if triton_pin_mismatch():  # opaque by default there (tests/test_compile.py)
        pytest.skip(triton_pin_mismatch())
    graphs = _trace("triton")["triton-static"]
    assert "kernel:attn_fwd_kernel" in graphs["forward"] and "kernel:attn_bwd_dq_kernel" in graphs["backward"]


def test_aot_packages_carry_no_offset_check():
    """AOTInductor runs a package's kernels on random inputs while compiling it: the device check of the offset
    values would assert there (the H200 failure of 2026-12-01), so an AOT-compiled graph has the kernels and no
    check; a JIT-compiled one keeps it (test_triton_kernels_are_graph_nodes)."""
    graphs = _trace("triton", JFA_COMPILE_PATH="inductor", TRACE_AOT="1")["triton-static"]
    assert "kernel:attn_fwd_kernel" in graphs["forward"]
    assert "aten._assert_async.msg" not in graphs["forward"]


@pytest.mark.parametrize("shapes", ["static", "dynamic"])
def test_triton_kernels_are_graph_nodes(default_graphs, shapes):
    """The triton backend's kernels (and the aten ops around them) replace the ops in the traced graphs, so Inductor
    launches them; no jfa op is left; dynamic sizes add no guard on lengths (no recompile over them), only on heads
    and head_dim, which the kernels take as constexprs."""
    graphs = default_graphs[f"triton-{shapes}"]
    symbols = {"static": [], "dynamic": ["4", "2", "16"]}[shapes]
    assert sorted(g.split(", ")[1].rstrip(")") for g in graphs["guards"]) == sorted(symbols), graphs["guards"]
    assert all(g.startswith("Eq(") for g in graphs["guards"])
    # No input written: torch counts tensors whose values address a store as written, so the kernels read copies of
    # the offsets (a written input would be copied back after each call and keep CUDA graphs off).
    assert graphs["outputs"] == [2, 3]
    kernels = lambda calls: [c for c in calls if c.startswith("kernel:")]  # noqa: E731
    fwd, bwd = kernels(graphs["forward"]), kernels(graphs["backward"])
    lists = {"kernel:tile_slots_kernel", "kernel:rank_tiles_kernel"}  # the tile lists (dynamic sizes)
    assert fwd[-1] == "kernel:attn_fwd_kernel" and set(fwd) <= {"kernel:attn_fwd_kernel"} | lists
    assert [c for c in bwd if c not in lists] == [
        "kernel:attn_bwd_delta_kernel", "kernel:attn_bwd_dkdv_kernel", "kernel:attn_bwd_dq_kernel"]
    assert "aten.sort.stable" not in graphs["forward"] + graphs["backward"]  # ordered by the rank kernel
    assert not any(c.startswith("jfa.") for c in graphs["forward"] + graphs["backward"])
    assert "aten._assert_async.msg" in graphs["forward"]  # JFA_VALIDATE=async: the device check is in the graph
    if shapes == "static":  # one wave known from shapes: no tile list, no sort
        assert fwd == ["kernel:attn_fwd_kernel"] and "aten.sort.stable" not in graphs["forward"]


def test_int64_offsets_saturate_before_the_graphs_check():
    """int64 offsets: the int32 copy the kernels and the graph's offset check read is saturated (a clamp before the
    conversion, which Inductor fuses into one kernel), so 2**32 + 3 cannot pass the check as a valid-looking 3
    (bench/NOTES.md "Hardening, helper wrap38"); every conversion of the offsets goes through it."""
    graphs = _trace("triton", JFA_COMPILE_PATH="inductor", TRACE_OFFSETS="int64")
    for shapes in ("static", "dynamic"):
        forward = graphs[f"triton-{shapes}"]["forward"]
        assert "aten._assert_async.msg" in forward
        conversions = [n for n, call in enumerate(forward) if call.startswith("aten._to_copy")]
        assert conversions and all(forward[n - 1].startswith("aten.clamp") for n in conversions), forward


@pytest.mark.parametrize("shapes", ["static", "dynamic"])
def test_reference_stays_one_opaque_node(default_graphs, shapes):
    graphs = default_graphs[f"reference-{shapes}"]
    assert graphs["forward"] == ["jfa.attention.default"]
    assert graphs["backward"] == ["jfa.attention_backward.default"]


@pytest.mark.parametrize("env", [{"JFA_COMPILE_PATH": "opaque"}, {"JFA_VALIDATE": "sync"},
                                 {"JFA_VALIDATE": "deferred"}], ids=lambda e: "=".join(*e.items()))
def test_triton_stays_opaque_when_asked_or_when_checks_need_the_host(env):
    graphs = _trace("triton", **env)["triton-static"]
    assert graphs["forward"] == ["jfa.attention.default"]
    assert graphs["backward"] == ["jfa.attention_backward.default"]


def test_unknown_compile_path_is_an_error():
    with pytest.raises(AssertionError, match="JFA_COMPILE_PATH must be one of"):
        _trace("triton", JFA_COMPILE_PATH="fast")


def test_post_grad_passes_take_the_traced_graphs():
    """Inductor's post-grad passes run on the traced forward and backward graphs, with torch 2.11's check that
    failed on the H200 (see ``_POST_GRAD``). The cause: torch's analysis of what a kernel writes counted the offsets
    as written (a helper's result that fed a store address was loaded through the offsets pointer), so Inductor copied
    them before each launch, and the copy of a graph input with a symbolic size failed that check. With dynamic sizes
    no graph input is copied; with static ones the one-wave schedule's tile search still makes the offsets count as
    written (copies of a fixed size, which the check takes)."""
    for rank_tiles in ("0", "1"):  # the tile lists' order: torch.sort, or the rank kernel (KNOBS.traced_rank_tiles)
        graphs = _run(_POST_GRAD, JFA_COMPILE_PATH="inductor", JFA_TRACED_RANK_TILES=rank_tiles)
        assert {name: g["result"] for name, g in graphs.items()} == dict.fromkeys(graphs, "ok"), (rank_tiles, graphs)
        assert graphs["forward-dynamic"]["copied_inputs"] == [] and graphs["backward-dynamic"]["copied_inputs"] == []


def test_traced_lists_ordered_by_the_rank_kernel_when_asked():
    """KNOBS.traced_rank_tiles: graphs with symbolic sizes order their tile lists with rank_tiles_kernel (one
    launch) instead of torch.sort + index_select; no new guard on lengths."""
    graphs = _trace("triton", JFA_COMPILE_PATH="inductor", JFA_TRACED_RANK_TILES="1")["triton-dynamic"]
    for calls in (graphs["forward"], graphs["backward"]):
        assert "kernel:rank_tiles_kernel" in calls and "aten.sort.stable" not in calls, calls
    assert all(g.startswith("Eq(") for g in graphs["guards"]), graphs["guards"]


# Graphs whose symbolic sizes have upper bounds (a model that knows its largest batch:
# torch._dynamo.mark_dynamic(t, 0, min=..., max=...)): argv: the bounds on the rows T and on B + 1.
_BOUNDED = _TRACER.rsplit("print(json.dumps", 1)[0] + r"""
from torch.fx.experimental.symbolic_shapes import constrain_range  # noqa: E402

_unbounded = fake_inputs


def fake_inputs(dynamic):
    shape_env, mode, forward_inputs, backward_inputs = _unbounded(dynamic)
    q, off = forward_inputs[0], forward_inputs[3]
    constrain_range(q.shape[0], min=2, max=int(sys.argv[1]))
    constrain_range(off.shape[0], min=2, max=int(sys.argv[2]))
    return shape_env, mode, forward_inputs, backward_inputs


print(json.dumps(trace("triton", True)))
"""


@pytest.mark.parametrize("rows, batch", [(512, 9), (1 << 20, 4097)])
def test_bounded_symbolic_sizes_take_the_one_wave_path(rows, batch):
    """With upper bounds on T and B the one-wave choice holds for every size (``scheduling.one_wave``: the shape
    env's value ranges): no tile list, eager's launches (forward: attention; backward: delta, dK/dV, dQ), no new
    guard. The bench model's small batches (T <= 512, B <= 8, 4 heads) fit: capacity cdiv(512, 128) + 8 = 12 tiles
    x 4 heads = 48 items <= 132 SMs. Unbounded or large bounds keep the sorted lists."""
    graphs = _run(_BOUNDED, str(rows), str(batch), JFA_COMPILE_PATH="inductor")
    lists = ("kernel:tile_slots_kernel", "kernel:rank_tiles_kernel")
    attention = lambda calls: [c for c in calls if c.startswith("kernel:") and c not in lists]  # noqa: E731
    assert attention(graphs["forward"]) == ["kernel:attn_fwd_kernel"]
    assert attention(graphs["backward"]) == [
        "kernel:attn_bwd_delta_kernel", "kernel:attn_bwd_dkdv_kernel", "kernel:attn_bwd_dq_kernel"]
    built = [sum(c in lists for c in graphs[g]) for g in ("forward", "backward")]  # the backward traced alone: 2
    assert built == ([0, 0] if rows <= 512 else [2, 4]), built
    assert sorted(g.split(", ")[1].rstrip(")") for g in graphs["guards"]) == ["16", "2", "4"], graphs["guards"]


# Graphs of models that call attention once per layer with one offsets tensor: the "joint" function calls each layer's
# forward op, then its backward op, in one trace (as AOTAutograd's joint graph of a training step does; autograd itself
# on fake CUDA tensors needs CUDA in torch). argv: LAYERS. Each graph is traced twice: the second trace must build its
# own lists (nothing kept from the first).
_LAYERS = _TRACER.rsplit("print(json.dumps", 1)[0] + r"""
import collections, gc  # noqa: E401, E402
from jfa_ops.backends import base  # noqa: E402

LAYERS = int(sys.argv[1])


def fwd_op(q, k, v, off, causal=True, max_seqlen=-1):
    return torch.ops.jfa.attention(q, k, v, off, off, max_seqlen, max_seqlen, causal=causal, backend="triton")


def bwd_op(grad_out, q, k, v, out, lse, off, causal=True):
    return torch.ops.jfa.attention_backward(grad_out, None, q, k, v, out, lse, off, off, causal=causal,
                                            backend="triton")


def joint(grad_out, q, k, v, out, lse, off):
    grads = []
    for _ in range(LAYERS):
        out, lse = fwd_op(q, k, v, off)
        grads += bwd_op(grad_out, q, k, v, out, lse, off)
    return grads


def joint_max(grad_out, q, k, v, out, lse, off):  # max_seqlen given: the forward's list is a checked build with it
    grads = []
    for _ in range(LAYERS):
        out, lse = fwd_op(q, k, v, off, max_seqlen=12)
        grads += bwd_op(grad_out, q, k, v, out, lse, off)
    return grads


def forward_only(q, k, v, off):
    outs = []
    for _ in range(LAYERS):
        q, lse = fwd_op(q, k, v, off)
        outs.append(lse)
    return q, *outs


def distinct(grad_out, q, k, v, out, lse, off):
    # what must never share a list: another offsets tensor with the same shape, another mask, a mutated tensor
    other = off.clone()
    outs = [fwd_op(q, k, v, off), fwd_op(q, k, v, other), fwd_op(q, k, v, off, causal=False)]
    other.add_(0)
    outs.append(fwd_op(q, k, v, other))
    return [t for pair in outs for t in pair]


def counts(gm):
    found = collections.Counter(calls(gm))
    return {"tile_slots": found["kernel:tile_slots_kernel"], "rank": found["kernel:rank_tiles_kernel"],
            "int32_copies": found["aten._to_copy.default"], "asserts": found["aten._assert_async.msg"],
            "attn_fwd": found["kernel:attn_fwd_kernel"], "delta": found["kernel:attn_bwd_delta_kernel"],
            "dkdv": found["kernel:attn_bwd_dkdv_kernel"], "dq": found["kernel:attn_bwd_dq_kernel"],
            "empty": found["aten.empty.memory_format"], "calls": sum(found.values())}


out = {}
for dynamic in (False, True):
    shape_env, mode, forward_inputs, backward_inputs = fake_inputs(dynamic)
    for name, fn, args in (("joint", joint, backward_inputs), ("joint-again", joint, backward_inputs),
                           ("joint-max", joint_max, backward_inputs),
                           ("forward", forward_only, forward_inputs), ("distinct", distinct, backward_inputs)):
        def capture(gm, inputs, name=name):
            out[f"{name}-{'dynamic' if dynamic else 'static'}"] = counts(gm)
            raise Captured

        with mode:
            try:
                aot_function(fn, fw_compiler=capture)(*args)
            except Captured:
                pass
    out[f"guards-{'dynamic' if dynamic else 'static'}"] = [str(g.expr) for g in shape_env.guards]
gc.collect()
out["memos_left"] = len(getattr(base, "_MEMOS", ()))  # traces left in the memo
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def layer_graphs():
    return _run(_LAYERS, "4", JFA_COMPILE_PATH="inductor")


@pytest.mark.parametrize("shapes", ["static", "dynamic"])
def test_layers_share_offset_derived_values(layer_graphs, shapes):
    """Four layers with one offsets tensor, forward and backward in one graph: each distinct tile list (the query
    tiles of the forward and dQ, the key tiles of dK/dV: 2 with dynamic sizes; none with static ones, one wave), the
    int32 copy of the offsets and their device check are built once per graph, not per layer and again in the
    backward (issue 9: 12 tile_slots + 12 rank launches, 8 copies, 4 asserts per step before); every layer still
    launches its own attention kernels; the same with max_seqlen given (the forward's checked build serves the
    unchecked calls). A second trace of the same function builds its own, and no memo outlives its trace."""
    graphs = layer_graphs
    lists = 2 if shapes == "dynamic" else 0
    for name in ("joint", "joint-again", "joint-max"):  # max: max_seqlen given (the check's bounds)
        assert graphs[f"{name}-{shapes}"] == dict(
            tile_slots=lists, rank=lists, int32_copies=1, asserts=1, attn_fwd=4, delta=4, dkdv=4, dq=4,
            empty=graphs[f"{name}-{shapes}"]["empty"], calls=graphs[f"{name}-{shapes}"]["calls"]), name
    # no guard on lengths (no recompile over batches): only heads and head_dim, specialized as for one call
    assert {g.split(", ")[1].rstrip(")") for g in graphs[f"guards-{shapes}"]} == (
        {"4", "2", "16"} if shapes == "dynamic" else set()), graphs[f"guards-{shapes}"]
    assert all(g.startswith("Eq(") for g in graphs[f"guards-{shapes}"])
    forward = graphs[f"forward-{shapes}"]
    assert (forward["tile_slots"], forward["rank"], forward["int32_copies"], forward["asserts"],
            forward["attn_fwd"]) == (lists // 2, lists // 2, 1, 1, 4)
    assert graphs["memos_left"] == 0


@pytest.fixture(scope="module")
def one_layer_graphs():
    return _run(_LAYERS, "1", JFA_COMPILE_PATH="inductor")


@pytest.mark.parametrize("shapes", ["static", "dynamic"])
def test_each_further_layer_adds_only_its_own_launches(layer_graphs, one_layer_graphs, shapes):
    """What a compiled model pays per attention call beyond the first (the bench's per-layer columns): the graph of
    4 layers holds, per layer more than the graph of 1, the kernels eager launches for one small call (forward 1;
    backward delta, dK/dV, dQ) and their 6 outputs (out, lse; delta, dq, dk, dv), and nothing per graph again: no
    tile list, no offsets copy, no check (issue 9: a compiled model pays no more per call than eager)."""
    four, one = layer_graphs[f"joint-{shapes}"], one_layer_graphs[f"joint-{shapes}"]
    per_layer = {key: (four[key] - one[key]) / 3 for key in four if key != "calls"}
    assert per_layer == dict(tile_slots=0, rank=0, int32_copies=0, asserts=0, attn_fwd=1, delta=1, dkdv=1, dq=1,
                             empty=6), (one, four)
    # every other node a further layer adds is a view (no launch, no allocation): at most 9 (dynamic) per layer
    assert four["calls"] - one["calls"] <= 3 * (4 + 6 + 9), (one, four)


# The training graphs a compiled step runs: the joint graph of N chained calls (forward chain, then each layer's
# backward op in reverse; traced as the script above) split by AOTAutograd's min-cut partitioner into the forward and
# backward graphs (its placeholders named as AOTAutograd names them). argv: the max_seqlen the calls pass (-1: none).
_PARTITION = _TRACER.rsplit("print(json.dumps", 1)[0] + r"""
import collections  # noqa: E402
from torch._functorch.partitioners import min_cut_rematerialization_partition  # noqa: E402

MAX_SEQLEN = int(sys.argv[1])


def chain(layers):
    def joint(q, k, v, off, grad_out):
        saved = []
        for _ in range(layers):
            out, lse = torch.ops.jfa.attention(q, k, v, off, off, MAX_SEQLEN, MAX_SEQLEN, causal=True,
                                               backend="triton")
            saved.append((q, out, lse))
            q = out
        dout, dk, dv = grad_out, 0, 0
        for q_in, out, lse in reversed(saved):
            dout, dk_layer, dv_layer = torch.ops.jfa.attention_backward(
                dout, None, q_in, k, v, out, lse, off, off, MAX_SEQLEN, MAX_SEQLEN, causal=True, backend="triton")
            dk, dv = dk + dk_layer, dv + dv_layer
        return q, dout, dk, dv
    return joint


def lists(gm):
    return sum(c == "kernel:tile_slots_kernel" for c in calls(gm))


out = {}
for layers in (1, 4):
    shape_env, mode, (q, k, v, off), (grad_out, *_) = fake_inputs(True)
    graphs = []

    def capture(gm, inputs):
        graphs.append(gm)
        raise Captured

    with mode:
        try:
            aot_function(chain(layers), fw_compiler=capture)(q, k, v, off, grad_out)
        except Captured:
            pass
        joint = graphs[0]
        names = ["primals_1", "primals_2", "primals_3", "primals_4", "tangents_1"]
        for node, name in zip([n for n in joint.graph.nodes if n.op == "placeholder"], names):
            node.target = node.name = name
        joint.recompile()
        forward, backward = min_cut_rematerialization_partition(joint, None, num_fwd_outputs=1)
    out[layers] = {"forward": lists(forward), "backward": lists(backward)}
print(json.dumps(out))
"""


@pytest.mark.parametrize("max_seqlen", [-1, 12])
def test_training_graphs_build_each_list_once_at_any_depth(max_seqlen):
    """The forward graph of a training step (what the bench's compiled per-layer forward column times) builds the
    query list once however many layers it holds, and the backward graph the key list once, with or without
    max_seqlen: a list build that grew with the depth would be paid per layer (before 61acd29, max_seqlen given,
    the 4-layer forward graph held 2 builds and the 1-layer one 1)."""
    found = _run(_PARTITION, str(max_seqlen), JFA_COMPILE_PATH="inductor")
    assert found == {"1": {"forward": 1, "backward": 1}, "4": {"forward": 1, "backward": 1}}, found


def test_lists_never_shared_between_different_offsets_or_masks(layer_graphs):
    """Another offsets tensor (same shape), another mask (non-causal), and the same tensor after an in-place update
    each get their own list; the copy and the check follow the tensor (the non-causal call shares them)."""
    found = layer_graphs["distinct-dynamic"]
    assert (found["tile_slots"], found["rank"], found["int32_copies"], found["asserts"]) == (4, 4, 3, 3), found


def test_per_trace_memo_is_scoped_to_one_trace():
    """``base.per_trace``: one result per scope and equal arguments (tensors by identity and version); no memo outside
    a scope (eager) or across scopes; a call with unkeyed arguments runs and keeps its result for the calls without."""
    from jfa_ops.backends.base import per_trace, traced

    calls = []

    def build(t, n, flag=None):
        calls.append((n, flag))
        return object()

    class Scope:  # a trace's FunctionalTensorMode in real traces
        pass

    t, other = torch.zeros(3), torch.zeros(3)
    scope, scope2 = Scope(), Scope()
    assert per_trace(build, t, 1) is not per_trace(build, t, 1)  # eager: every call builds
    with traced():
        assert per_trace(build, t, 1) is not per_trace(build, t, 1)  # no scope: nothing shared
    with traced(scope):
        first = per_trace(build, t, 1)
        assert per_trace(build, t, 1) is first
        assert per_trace(build, other, 1) is not first and per_trace(build, t, 2) is not first
        checked = per_trace(build, t, 3, flag="flag")  # runs (its flag must be written) and serves the next calls
        assert per_trace(build, t, 3) is checked
        t.add_(0)  # a new version: another value as far as the memo knows
        assert per_trace(build, t, 1) is not first
    with traced(scope2):
        assert per_trace(build, t, 1) is not first
    assert calls.count((3, "flag")) == 1 and calls.count((3, None)) == 0


_INDUCTOR_SOURCE = r"""
import importlib, importlib.util, json, os, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from torch._inductor.codegen.wrapper import user_defined_triton_kernel_transitive_closure_source_code
from jfa_ops.backends.triton.specializations import arch_specializations

kernels = set(sys.argv[1].split(","))
out, directory = {}, tempfile.mkdtemp()
for s in arch_specializations(90):
    if s.kernel not in kernels or s.kernel in out:
        continue
    source = user_defined_triton_kernel_transitive_closure_source_code(getattr(importlib.import_module(s.module),
                                                                                s.kernel))
    path = os.path.join(directory, f"inductor_{s.kernel}.py")  # @triton.jit wants a file
    with open(path, "w") as f:
        f.write("import triton\nimport triton.language as tl\n\n@triton.jit\n" + source)
    spec = importlib.util.spec_from_file_location(f"inductor_{s.kernel}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        triton.compile(triton.compiler.ASTSource(fn=getattr(module, s.kernel), signature=s.signature,
                                                 constexprs=s.constexprs, attrs=s.attrs),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": s.num_warps,
                                                                  "num_stages": s.num_stages})
        out[s.kernel] = "ok"
    except Exception as e:
        out[s.kernel] = f"{type(e).__name__}: {e}"[:2000]
print(json.dumps(out))
"""

TRACED_KERNELS = ("attn_fwd_kernel", "tile_slots_kernel", "rank_tiles_kernel", "attn_bwd_delta_kernel",
                  "attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel", "attn_bwd_dq_finalize_kernel")


def test_inductor_copy_of_each_traced_kernel_compiles_for_sm90():
    """Inductor compiles a user kernel from its own copy of the source (the kernel and the ``@triton.jit`` helpers
    and constants it reaches by global name): each kernel the compiled path records must survive that copy."""
    child_env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "JFA_COMPILE_PATH")}
    child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", _INDUCTOR_SOURCE, ",".join(TRACED_KERNELS)], env=child_env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == dict.fromkeys(TRACED_KERNELS, "ok")


# Inductor's wrapper code (what a compiled call runs on the host, line by line) for a graph of chained forward calls,
# lowered on a machine without a GPU: Inductor's CUDA device queries answered with an H100's, the module's path
# printed where Inductor would load it (loading needs CUDA). argv: LAYERS, then the max_seqlen the calls pass: none,
# int (12) or symbolic (a graph input, as Dynamo makes a Python int under dynamic=True). Also
# tools/compiled_wrapper_cpu.py.
_WRAPPER = _FAKE_H100 + r"""
import torch._inductor.config as inductor_config  # noqa: E402
import torch._inductor.fx_passes.joint_graph as joint_graph  # noqa: E402
import torch.utils._triton  # noqa: E402, F401
from torch._dynamo.device_interface import get_interface_for_device  # noqa: E402
from torch._inductor import compile_fx  # noqa: E402
from torch._inductor.codecache import PyCodeCache  # noqa: E402

LAYERS, MAX_SEQLEN = int(sys.argv[1]), sys.argv[2]


class _Props:  # an H100's, as far as Inductor's CUDA codegen asks
    major, minor, multi_processor_count, name, total_memory, warp_size = 9, 0, 132, "NVIDIA H100", 80 * 2**30, 32
    max_threads_per_multi_processor, max_threads_per_block, regs_per_multiprocessor = 2048, 1024, 65536
    shared_memory_per_block_optin, shared_memory_per_multiprocessor, L2_cache_size = 232448, 233472, 50 * 2**20
    gcnArchName = ""


torch.cuda.get_device_properties = lambda *a, **k: _Props()
torch.cuda.current_device = lambda: 0
torch.cuda.device_count = lambda: 1
torch.cuda.get_device_capability = lambda *a: (9, 0)
cuda = get_interface_for_device("cuda")
for name, value in dict(get_device_properties=lambda *a, **k: _Props(), current_device=lambda: 0,
                        get_compute_capability=lambda *a: 90, is_available=lambda: True, device_count=lambda: 1,
                        get_raw_stream=lambda *a: 0).items():
    setattr(cuda, name, staticmethod(value))
cuda.Worker.get_device_properties = staticmethod(lambda *a, **k: _Props())
for module in list(sys.modules.values()):  # Triton is installed; torch's check would ask the driver
    if getattr(module, "__name__", "").startswith("torch") and getattr(module, "has_triton", None) is not None:
        module.has_triton = lambda: True
# as the post-grad script above: what cannot run without CUDA in torch is left out
joint_graph.lazy_init = lambda *args, **kwargs: None
_decompositions = compile_fx.select_decomp_table
compile_fx.select_decomp_table = lambda: {op: fn for op, fn in _decompositions().items()
                                          if op is not torch.ops.aten.index_select.default}


def written(key, path, *args, **kwargs):
    print(json.dumps({"path": path}))
    sys.exit(0)


PyCodeCache.load_by_key_path = written


def layers(q, k, v, off, max_seqlen):
    lses = []
    for _ in range(LAYERS):
        q, lse = torch.ops.jfa.attention(q, k, v, off, off, max_seqlen, max_seqlen, causal=True, backend="triton")
        lses.append(lse)
    return q, *lses


def layers_int(q, k, v, off):
    return layers(q, k, v, off, -1 if MAX_SEQLEN == "none" else 12)


shape_env, mode, forward_inputs, _ = fake_inputs(True)
if MAX_SEQLEN == "symbolic":
    max_seqlen = shape_env.create_symintnode(
        shape_env.create_symbol(12, ConstantSource("M"), dynamic_dim=DimDynamic.DYNAMIC), hint=12,
        source=ConstantSource("M"))
    traced, inputs = torch.fx.symbolic_trace(layers), [*forward_inputs, max_seqlen]
else:
    traced, inputs = torch.fx.symbolic_trace(layers_int), list(forward_inputs)
with mode, inductor_config.patch(pattern_matcher=False, fx_graph_cache=False):
    compile_fx.compile_fx(traced, inputs)
"""

WRAPPER_LINES = {"launch": r"\.run\(", "allocation": r"= empty_strided_", "view": r"reinterpret_tensor\(",
                 "input check": r"assert_size_stride\(", "input copy": r"copy_if_misaligned\(",
                 "stream": r"get_raw_stream\(", "attention launch": r"attn_fwd_kernel_\d+\.run\(",
                 "list launch": r"(tile_slots|rank_tiles)_kernel_\d+\.run\(", "assert": r"assert_async\w*\.run\("}


def inductor_wrapper(layers: int, directory: str, max_seqlen: str = "none") -> str:
    """Path of Inductor's wrapper module for ``layers`` chained forward calls (dynamic sizes; ``max_seqlen``: none,
    int or symbolic), lowered on CPU."""
    return _run(_WRAPPER, str(layers), max_seqlen, JFA_COMPILE_PATH="inductor",
                TORCHINDUCTOR_CACHE_DIR=directory)["path"]


def wrapper_lines(source: str) -> dict:
    """{kind: occurrences} in the wrapper's ``call`` (``WRAPPER_LINES``)."""
    import re
    body = source[source.index("def call(self, args):"):source.index("runner = Runner(")]
    return {kind: len(re.findall(pattern, body)) for kind, pattern in WRAPPER_LINES.items()}


@pytest.mark.parametrize("max_seqlen", ["none", "int", "symbolic"])
def test_inductor_wrapper_adds_one_launch_and_its_outputs_per_further_layer(tmp_path, max_seqlen):
    """Inductor's wrapper code (the compiled call's host work) of 4 chained forward calls holds, per call beyond the
    first, the attention launch, at most its 2 output allocations (out, lse) and the list's 2 views (TILE_SEQ,
    TILE_START); the list launches, the offsets' check (a device-assert kernel), the inputs' checks and copies are
    per graph (issue 9: a compiled model pays no more per attention call than eager), with or without max_seqlen
    (given, the first call's checked list once missed the later unchecked calls: the list was built twice)."""
    one, four = (wrapper_lines(open(inductor_wrapper(n, str(tmp_path), max_seqlen)).read()) for n in (1, 4))
    per_layer = {kind: (four[kind] - one[kind]) / 3 for kind in one}
    assert one["list launch"] == 2 and one["assert"] == 1 and one["attention launch"] == 1, one
    assert per_layer["launch"] == per_layer["attention launch"] == per_layer["stream"] == 1, (one, four)
    assert per_layer["allocation"] <= 2 and per_layer["view"] <= 2, (one, four)
    assert per_layer["input check"] == per_layer["input copy"] == per_layer["list launch"] == 0, (one, four)
    assert per_layer["assert"] == 0, (one, four)


def branch_lines(source: str) -> dict:
    """{subgraph: {kind: occurrences}} of each cond branch the wrapper module defines (``true_graph_<i>``,
    ``false_graph_<i>``: what runs on one side of a cond), counted as ``wrapper_lines`` counts ``call``."""
    import re
    bodies = re.findall(r"^def ((?:true|false)_graph_\d+)\(args\):\n(.*?)(?=^\S)", source, re.M | re.S)
    return {name: {kind: len(re.findall(pattern, body)) for kind, pattern in WRAPPER_LINES.items()}
            for name, body in bodies}


@pytest.mark.parametrize("hoist", ["1", "cond"], ids=["hoist", "hoist-cond"])
def test_split_wrapper_builds_the_lists_behind_the_predicate(tmp_path, hoist):
    """``JFA_COMPILE_PATH=split``, 4 chained forward calls: by default the lists' launches and the offsets' check
    (a device-assert kernel) run in the wrapper's ``call`` before the conds, on large batches too, which never read
    them; under ``JFA_SPLIT_HOIST=cond`` they run only in a cond branch on the same predicate (the other branch
    launches nothing and asserts nothing: at most its 2 unwritten outputs' allocations) and ``call`` itself launches
    and allocates nothing; either way each layer's small branch launches its attention kernel only."""
    source = open(_run(_WRAPPER, "4", "none", JFA_COMPILE_PATH="split", JFA_SPLIT_HOIST=hoist,
                       TORCHINDUCTOR_CACHE_DIR=str(tmp_path))["path"]).read()
    call, branches = wrapper_lines(source), branch_lines(source)
    small = [b for b in branches.values() if b["attention launch"]]
    assert len(small) == 4, branches
    for b in small:
        assert b["launch"] == b["attention launch"] == 1 and b["list launch"] == b["assert"] == 0, b
        assert b["allocation"] <= 2, b
    builds = {name: b for name, b in branches.items() if b["list launch"] or b["assert"]}
    if hoist == "1":
        assert call["list launch"] == 2 and call["assert"] == 1 and not builds, (call, builds)
        return
    assert call["launch"] == call["list launch"] == call["assert"] == call["allocation"] == 0, call
    (name, build), = builds.items()
    assert name.startswith("true_") and build["list launch"] == 2 and build["assert"] == 1, build
    nothing = branches[name.replace("true_", "false_")]
    assert nothing["launch"] == nothing["assert"] == 0 and nothing["allocation"] <= 2, nothing


# ------------------------------------------------------------------------------------------------------- GPU
def _model_inputs(seed, lengths=(11, 0, 7, 3, 8)):
    case = AttentionCase(lengths, lengths, heads_q=4, heads_kv=2, head_dim=64, device="cuda", dtype=torch.float16,
                         causal=True)
    return case.make_inputs(seed, requires_grad=True)


def _attention(q, k, v, q_off, kv_off):
    out, lse = jfa_ops.jagged_attention(q, k, v, q_off, kv_off, causal=True, return_lse=True, backend="triton")
    return out, lse


@pytest.fixture(autouse=True)
def _inductor_path(monkeypatch):
    from jfa_ops.backends.triton import ttir_compat
    from jfa_ops.ops.attention import triton_pin_mismatch

    # another triton than torch pins (the TLX install): torch's kernel analysis works there only with ttir_compat
    if triton_pin_mismatch() and not ttir_compat.needed():
        pytest.skip(triton_pin_mismatch())
    monkeypatch.setenv("JFA_COMPILE_PATH", "inductor")  # what this file tests (the default, whatever the env says)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_inductor_launches_our_kernels_gpu(mode):
    """Inductor's generated code launches attn_fwd_kernel itself; outputs and gradients match the float64 oracle."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(_attention, mode=mode, fullgraph=True, dynamic=True)
    for seed, lengths in enumerate([(11, 0, 7, 3, 8), (5, 20, 2), (33, 1, 9, 4, 4, 12)]):
        inputs = _model_inputs(seed, lengths)
        args = (inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets)
        (out, lse), codes = run_and_get_code(compiled, *args)
        if seed == 0:
            assert any("attn_fwd_kernel" in code for code in codes), "Inductor did not launch our kernel"
            assert not any("torch.ops.jfa.attention.default" in code for code in codes)
        want_out, want_lse = reference_attention(*args, causal=True)
        assert_attention_close(out, want_out, dtype=torch.float16, kind="forward", name="out")
        assert_attention_close(lse, want_lse, dtype=torch.float16, kind="lse", name="lse")
        grad = torch.randn_like(out)
        got = torch.autograd.grad(out, (inputs.q, inputs.k, inputs.v), grad)
        want = torch.autograd.grad(want_out, (inputs.q, inputs.k, inputs.v), grad.to(want_out.dtype))
        for name, g, w in zip(("dq", "dk", "dv"), got, want):
            assert_attention_close(g, w, dtype=torch.float16, kind="grad", name=name)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_compiled_model_matches_eager_and_launches_our_kernel_gpu(mode):
    """A small model (jfa_ops.nn.JaggedSelfAttention: fused QKV slices feed the kernels directly), forward and
    backward compiled and eagerly with the same weights: the same outputs and parameter gradients."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = jfa_ops.nn.JaggedSelfAttention(256, 4, 2, causal=True, backend="triton").to("cuda", torch.float16)
    compiled = torch.compile(model, mode=mode, fullgraph=True, dynamic=True)
    for seed, lengths in enumerate([(11, 0, 7, 3, 8), (40, 2, 9)]):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(sum(lengths), 256, generator=g).to("cuda", torch.float16)
        offsets = torch.tensor([0, *lengths]).cumsum(0).to("cuda")
        got, codes = run_and_get_code(compiled, x, offsets)
        if seed == 0:
            assert any("attn_fwd_kernel" in code for code in codes), "Inductor did not launch our kernel"
        want = model(x, offsets)
        assert_attention_close(got, want, dtype=torch.float16, kind="forward", name="out")
        grad = torch.randn_like(want)
        got_grads = torch.autograd.grad(got, list(model.parameters()), grad)
        want_grads = torch.autograd.grad(want, list(model.parameters()), grad)
        for (name, _), a, b in zip(model.named_parameters(), got_grads, want_grads):
            assert_attention_close(a, b, dtype=torch.float16, kind="grad", name=name)


@pytest.mark.gpu
def test_compiled_layers_build_each_tile_list_once_gpu():
    """Three layers with one offsets tensor (a stack of JaggedSelfAttention), dynamic shapes: the compiled step
    matches eager (outputs and weight gradients) over batches of varying lengths, and launches each distinct tile
    list once per step (the query tiles of the forward, which dQ reuses, and the key tiles of dK/dV: 2 tile_slots
    launches, not 3 per layer), with no recompile."""
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch.profiler import ProfilerActivity, profile

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(jfa_ops.nn.JaggedSelfAttention(256, 4, 2, causal=True, backend="triton")
                                 for _ in range(3)).to("cuda", torch.float16)

    def model(x, offsets):
        for layer in layers:
            x = x + layer(x, offsets)
        return x

    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=counter)
    for seed, lengths in enumerate([(11, 0, 7, 3, 8), (40, 2, 9), (70, 129, 1, 33)]):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(sum(lengths), 256, generator=g).to("cuda", torch.float16)
        offsets = torch.tensor([0, *lengths]).cumsum(0).to("cuda")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            got = compiled(x, offsets)
            grad = torch.randn_like(got)
            got_grads = torch.autograd.grad(got, list(layers.parameters()), grad)
            torch.cuda.synchronize()
        want = model(x, offsets)
        want_grads = torch.autograd.grad(want, list(layers.parameters()), grad)
        assert_attention_close(got, want, dtype=torch.float16, kind="forward", name="out")
        for (name, _), a, b in zip(layers.named_parameters(), got_grads, want_grads):
            assert_attention_close(a, b, dtype=torch.float16, kind="grad", name=name)
        if seed > 0:  # past the first step's compile
            launches = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
            assert sum("tile_slots_kernel" in n for n in launches) == 2, launches
            assert sum("attn_fwd_kernel" in n for n in launches) == 3
    assert counter.frame_count == 1
    assert sum(torch._dynamo.utils.counters["recompiles"].values()) == 0


@pytest.mark.gpu
def test_inductor_one_compile_over_many_batches_gpu():
    """Default mode, dynamic shapes: one graph for every batch, no recompile, no graph break."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(_attention, fullgraph=True, dynamic=True, backend=counter)
    for seed in range(12):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(0, 40, (2 + seed % 5,), generator=g).tolist()
        lengths[0] = 2 + 3 * seed
        if seed == 0:  # the first batch's sizes pairwise different (T, B+1, heads, D): no duck-sized symbol
            lengths = [11, 0, 7, 3, 8]
        inputs = _model_inputs(seed, tuple(lengths))
        args = (inputs.q, inputs.k, inputs.v, inputs.q_offsets, inputs.kv_offsets)
        out, _ = compiled(*args)
        want_out, _ = reference_attention(*args, causal=True)
        assert_attention_close(out, want_out, dtype=torch.float16, kind="forward", name="out")
    assert counter.frame_count == 1
    assert sum(torch._dynamo.utils.counters["recompiles"].values()) == 0
    assert not torch._dynamo.utils.counters["graph_break"]


@pytest.mark.gpu
@pytest.mark.parametrize("compile_path", ["inductor", "opaque"])
def test_aoti_package_runs_without_jfa_ops_gpu(compile_path, tmp_path):
    """tools/aoti_package.py: export + AOTInductor package of a model with the op, loaded and run by a process that
    never imports jfa_ops. The inductor path carries our kernels and runs there; the opaque path needs the Python op
    (a callback) and fails there, which is what the inductor path removes."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run([sys.executable, os.path.join(root, "tools", "aoti_package.py"), "--dir", str(tmp_path),
                           "--compile-path", compile_path], env=env, capture_output=True, text=True, timeout=1200)
    result = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    if "environment" in result:  # no AOTInductor package loads on this machine (the tool's op-free control)
        pytest.skip(f"AOTInductor cannot load any package here: {result['environment'][:300]}")
    assert done.returncode == 0, (result, done.stderr[-3000:])
    assert result["jfa_attention_registered"] is False and result["jfa_ops_imported"] is False
    assert result["ok"] is (compile_path == "inductor"), result
    if compile_path == "opaque":  # it failed for want of the op, not for something else
        assert "jfa" in result["error"], result
