"""The automatic choice of the tlx backend for the dense op (issue 10), on CPU: a faked sm_90 GPU with TLX present.

The tlx module is loaded fresh per test under the ``JFA_TLX_AUTO`` value asked for (it reads the switch at import),
with only what its ``supports`` reads from the machine stubbed: the plugin's presence, the TLX import, the CUDA build
and the GPU's capability. Its BACKEND is then registered beside the real triton and reference backends, so the real
registry decides: small calls (rows below the triton backend's TMA_MIN_ROWS) and traced ones stay on triton, large
ones take tlx, what tlx declines (deterministic, head dims) goes to triton, ``backend="tlx"`` runs any call it
supports, and the choice reads no symbolic size (no guard, so no recompile over lengths).
"""
from __future__ import annotations

import importlib
import importlib.machinery
import logging
import sys
import types

import pytest
import torch

import jfa_ops.backends as backends
from jfa_ops.backends import AttentionParams, Problem, explain_choice, select_backend

pytest.importorskip("triton")

ROWS = 4096  # the triton backend's TMA_MIN_ROWS outside the tests (conftest lowers it to 0 for the kernel tests)


@pytest.fixture
def sm90(monkeypatch):
    """load(mode): the tlx module imported under JFA_TLX_AUTO=mode (None: unset) on a faked sm_90 GPU, registered
    with triton and reference as the only backends; sys.modules is restored afterwards."""
    from jfa_ops.backends import reference
    from jfa_ops.backends import triton as triton_backend
    from jfa_ops.backends.triton import attn_fwd

    monkeypatch.delenv("JFA_BACKEND", raising=False)
    monkeypatch.setattr(attn_fwd, "TMA_MIN_ROWS", ROWS)
    monkeypatch.setattr(torch.version, "cuda", torch.version.cuda or "12.8")
    monkeypatch.setattr(triton_backend, "_device_reason", lambda *args: None)  # shared memory of an H100/H200
    names = lambda: {n for n in sys.modules if n == "utlx_plugin" or n.startswith("jfa_ops.backends.tlx")}  # noqa
    before = {n: sys.modules[n] for n in names()}
    had_attribute = hasattr(backends, "tlx")
    attribute = getattr(backends, "tlx", None)

    def load(mode=None):
        if mode is None:
            monkeypatch.delenv("JFA_TLX_AUTO", raising=False)
        else:
            monkeypatch.setenv("JFA_TLX_AUTO", mode)
        for name in names() - {"utlx_plugin"}:
            del sys.modules[name]
        if importlib.util.find_spec("utlx_plugin") is None:  # only its presence is looked up at import
            plugin = types.ModuleType("utlx_plugin")
            plugin.__spec__ = importlib.machinery.ModuleSpec("utlx_plugin", None)
            sys.modules["utlx_plugin"] = plugin
        tlx = importlib.import_module("jfa_ops.backends.tlx")
        monkeypatch.setattr(tlx, "_import_reason", lambda: None)
        monkeypatch.setattr(tlx, "_capability", lambda index: (9, 0))
        monkeypatch.setattr(backends, "_REGISTRY", {b.name: b for b in (tlx.BACKEND, triton_backend.BACKEND,
                                                                         reference.BACKEND)})
        monkeypatch.setattr(backends, "_IMPORT_ERRORS", {})
        monkeypatch.setattr(backends, "_BUILTIN_MODULES", {})
        monkeypatch.setattr(backends, "_TLX_CHECKED", set())
        return tlx

    yield load
    for name in names():
        del sys.modules[name]
    sys.modules.update(before)
    if had_attribute:
        backends.tlx = attribute
    elif hasattr(backends, "tlx"):
        del backends.tlx


def _problem(rows_q=ROWS, rows_kv=ROWS, **kw):
    base = dict(device_type="cuda", dtype=torch.bfloat16, head_dim=128, num_heads_q=8, num_heads_kv=8, causal=True,
                window_left=-1, window_right=-1, broadcast_q=False, deterministic=False, device_index=0)
    return Problem(**{**base, **kw}, rows_q=rows_q, rows_kv=rows_kv)


def _chosen(problem):
    return select_backend(None, problem).name


def test_small_calls_stay_on_triton_large_ones_take_tlx(sm90):
    """The bench's small call (B4 lengths <= 64: 256 rows) and anything below TMA_MIN_ROWS rows of both q and k run
    on triton (its pointer path builds no descriptor; tlx's three per call cost more host time than the GPU work);
    from TMA_MIN_ROWS rows of q or k on, tlx. Broadcast Q: few query rows, many keys, is large."""
    sm90()
    assert _chosen(_problem(256, 256)) == "triton"
    assert _chosen(_problem(ROWS - 1, ROWS - 1)) == "triton"
    assert _chosen(_problem(ROWS, ROWS)) == "tlx"
    assert _chosen(_problem(65536, 65536, causal=False)) == "tlx"
    assert _chosen(_problem(128, 8 * ROWS, broadcast_q=True)) == "tlx"
    assert _chosen(_problem(ROWS, 64)) == "tlx"
    assert "small call (q 256 and k 256 rows" in explain_choice(_problem(256, 256))
    assert explain_choice(_problem(ROWS, ROWS)) == "tlx"


def test_block_sparse_takes_the_same_size_rule(sm90, monkeypatch):
    """The block-sparse forward and backward: a small call's host path is the same story (three TMA descriptors per
    tlx forward, none on triton's below TMA_MIN_ROWS; CPU count with launches stubbed, bench/NOTES.md "automatic
    choice": forward 38.0 vs 26.8 us); JFA_TLX_SPARSE's priority decides above it, as before."""
    tlx = sm90()
    sparse = dict(block_q=128, block_kv=128)
    assert select_backend(None, _problem(256, 256, **sparse), family="block_sparse").name == "triton"
    assert select_backend(None, _problem(**sparse), family="block_sparse").name == "tlx"
    assert "small call" in explain_choice(_problem(256, 256, **sparse), family="block_sparse")
    assert select_backend("tlx", _problem(256, 256, **sparse), family="block_sparse").name == "tlx"
    # the selection stage and MXFP8 families have no rule: as their priorities say
    assert tlx.BACKEND.families["select_kv_blocks"].auto_supports is None
    assert tlx.BACKEND.families["mxfp8_attention"].auto_supports is None


def test_threshold_follows_the_triton_backends_tma_rows(sm90, monkeypatch):
    """One threshold: where triton takes descriptors itself, tlx's host cost is matched."""
    from jfa_ops.backends.triton import attn_fwd

    sm90()
    monkeypatch.setattr(attn_fwd, "TMA_MIN_ROWS", 1024)
    assert (_chosen(_problem(1023, 1023)), _chosen(_problem(1024, 1024))) == ("triton", "tlx")


def test_what_tlx_declines_goes_to_triton_at_any_size(sm90):
    tlx = sm90()
    for problem in (_problem(deterministic=True), _problem(head_dim=96), _problem(head_dim=32),
                    _problem(dtype=torch.float32), _problem(device_index=1)):
        if problem.device_index == 1:  # another GPU: not sm_90
            tlx._capability = lambda index: (9, 0) if index == 0 else (8, 0)
        assert _chosen(problem) == "triton", problem
        assert "passed over: tlx: " in explain_choice(problem)


def test_sizes_unknown_stay_on_triton(sm90):
    """A Problem made by hand (no rows) or with symbolic sizes: the rule takes tlx from known sizes only."""
    sm90()
    assert _chosen(_problem(None, None)) == "triton"
    assert "row counts are not known" in explain_choice(_problem(ROWS, None))


def test_by_name_tlx_runs_small_and_traced_calls(sm90, monkeypatch):
    sm90()
    for problem in (_problem(64, 64), _problem(None, None), Problem(**{**vars(_problem()), "traced": True})):
        assert select_backend("tlx", problem).name == "tlx"
    monkeypatch.setenv("JFA_BACKEND", "tlx")
    assert _chosen(_problem(64, 64)) == "tlx"


def test_env_switch(sm90):
    """JFA_TLX_AUTO: unset or 1 the size rule; 0 only by name (triton at every size); always every call tlx runs
    (the GPU suite's coverage setting)."""
    for mode in (None, "1"):
        tlx = sm90(mode)
        assert tlx.AUTO_SELECT and (_chosen(_problem(64, 64)), _chosen(_problem())) == ("triton", "tlx")
    tlx = sm90("0")
    assert not tlx.AUTO_SELECT and (_chosen(_problem(64, 64)), _chosen(_problem())) == ("triton", "triton")
    assert select_backend("tlx", _problem(64, 64)).name == "tlx"
    sm90("always")
    traced = Problem(**{**vars(_problem(64, 64)), "traced": True})
    assert (_chosen(_problem(64, 64)), _chosen(traced), _chosen(_problem(None, None))) == ("tlx",) * 3


def test_passed_over_is_logged_once_at_debug(sm90, caplog, monkeypatch):
    sm90()
    monkeypatch.setattr(backends, "_EXPLAINED", set())
    with caplog.at_level(logging.DEBUG, logger="jfa_ops"):
        for _ in range(3):
            _chosen(_problem(256, 256))
        _chosen(_problem())
    messages = [r.getMessage() for r in caplog.records if r.name == "jfa_ops"]
    assert len(messages) == 1 and "passed over 'tlx'" in messages[0] and "small call" in messages[0], messages


def _fake_cuda(shape_env, *sizes):
    """q, k: FakeTensors on CUDA (no GPU needed) with these row counts (ints, or SymInts of ``shape_env``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(shape_env=shape_env)
    with mode:
        return mode, [torch.empty(rows, 8, 128, device="cuda", dtype=torch.bfloat16) for rows in sizes]


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_traced_calls_choose_triton_without_a_guard(sm90, dynamic):
    """Under torch.compile / export (FakeTensor or FunctionalTensor inputs) the automatic choice keeps triton, which
    traces into the graph (tlx would stay an opaque op; a static-size rule would flip the backend when torch.compile
    recompiles with dynamic sizes), and reads no symbolic size: the shape env gains no guard, so lengths cause no
    recompile. Eager tensors of the same sizes (on the faked GPU) take tlx."""
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    sm90()
    shape_env = ShapeEnv()
    sizes = [65536, 65536]
    if dynamic:
        sizes = [shape_env.create_symintnode(shape_env.create_symbol(n, ConstantSource(f"T{i}"),
                                                                     dynamic_dim=DimDynamic.DYNAMIC), hint=n)
                 for i, n in enumerate(sizes)]
    mode, (q, k) = _fake_cuda(shape_env, *sizes)
    params = AttentionParams(scale=0.1, causal=True)
    with mode:
        problem = Problem.of(q, k, params)
        assert problem.traced and (problem.rows_q is None) == dynamic
        assert _chosen(problem) == "triton" and "traced call" in explain_choice(problem)
        with FunctionalTensorMode():
            fq, fk = FunctionalTensor.to_functional(q), FunctionalTensor.to_functional(k)
            assert _chosen(Problem.of(fq, fk, params)) == "triton"
    assert shape_env.guards == []
    eager = Problem.of(torch.empty(65536, 8, 128), torch.empty(65536, 8, 128), params)
    assert not eager.traced and (eager.rows_q, eager.rows_kv) == (65536, 65536)
    assert _chosen(Problem(**{**vars(eager), "device_type": "cuda", "device_index": 0, "dtype": torch.bfloat16})) \
        == "tlx"


def test_eager_choice_is_kept_per_signature(sm90, monkeypatch):
    """The eager direct path chooses once per call signature (shapes in the key), so the size rule costs nothing
    per call: a second call of the same shapes does not ask the registry again."""
    from jfa_ops.ops import attention as ops

    sm90()
    calls = []
    real = ops.select_backend
    monkeypatch.setattr(ops, "select_backend", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    monkeypatch.setattr(ops, "_CALLS", {})
    monkeypatch.setattr(ops, "CALL_CACHE", True)
    monkeypatch.setenv("JFA_BACKEND", "reference")  # CPU tensors: the call itself runs on the reference
    q = torch.randn(16, 2, 16)
    off = torch.tensor([0, 9, 16], dtype=torch.int32)
    for _ in range(3):
        ops._direct_call(q, q, q, off, off, ())
    assert len(calls) == 1


# The compile path end to end (a subprocess, as tests/test_compile_inductor.py traces: fake CUDA tensors, an H100's
# facts): the op traced by AOTAutograd with the automatic choice, tlx present on a faked sm_90 and TMA_MIN_ROWS 0 (so
# the size rule alone would take tlx at the trace's sizes).
_AUTO_PRELUDE = r"""
import importlib.machinery, importlib.util, types  # noqa: E401, E402
if importlib.util.find_spec("utlx_plugin") is None:  # only its presence is looked up at import
    plugin = types.ModuleType("utlx_plugin")
    plugin.__spec__ = importlib.machinery.ModuleSpec("utlx_plugin", None)
    sys.modules["utlx_plugin"] = plugin
torch.version.cuda = torch.version.cuda or "12.8"
torch.cuda.current_device = lambda: 0
import jfa_ops.backends as backends  # noqa: E402
import jfa_ops.backends.tlx as tlx  # noqa: E402
from jfa_ops.backends.triton import attn_fwd  # noqa: E402
tlx._import_reason = lambda: None
tlx._capability = lambda index: (9, 0)
tlx.fwd_config = lambda head_dim: tlx.configs.fwd_config(128)  # the fake inputs' head_dim 16 stands for 128
backends._IMPORT_ERRORS.pop("tlx", None)
backends.register_backend(tlx.BACKEND, replace=True)
attn_fwd.TMA_MIN_ROWS = 0
assert backends.select_backend(None, backends.Problem("cuda", torch.float16, 16, 4, 2, True, -1, -1, False, False,
                                                      device_index=0, rows_q=29, rows_kv=29)).name == "tlx"
"""


@pytest.mark.parametrize("mode", ["1", "always"])
def test_compiled_graphs_trace_triton_under_the_automatic_choice(mode):
    """Default: the graphs hold the triton kernels (no jfa op left) for static and dynamic sizes, and the only guards
    are the heads/head_dim specializations every traced graph has (none on lengths: no recompile over batches).
    JFA_TLX_AUTO=always: tlx is chosen and stays the opaque op."""
    from tests import test_compile_inductor as compiled

    tracer = compiled._TRACER[len(compiled._FAKE_H100):]
    graphs = compiled._run(compiled._FAKE_H100 + _AUTO_PRELUDE + tracer, "", JFA_COMPILE_PATH="inductor",
                           JFA_TLX_AUTO=mode)
    for shapes, symbols in (("static", []), ("dynamic", ["4", "2", "16"])):
        traced = graphs[f"-{shapes}"]
        if mode == "always":
            assert traced["forward"] == ["jfa.attention.default"], traced
            assert traced["backward"] == ["jfa.attention_backward.default"], traced
            continue
        assert not any(c.startswith("jfa.") for c in traced["forward"] + traced["backward"]), traced
        assert "kernel:attn_fwd_kernel" in traced["forward"] and "kernel:attn_bwd_dq_kernel" in traced["backward"]
        assert sorted(g.split(", ")[1].rstrip(")") for g in traced["guards"]) == sorted(symbols), traced["guards"]
