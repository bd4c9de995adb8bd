"""The selection's host path under JFA_SELECT_DIRECT (bench/NOTES.md "selection host path, helper selshare, stop
28"): the eager direct path of ``jfa_ops.select_kv_blocks`` (``ops.block_sparse.SELECT_DIRECT``: no dispatcher, a call
memo, offsets covered after a checked call) and the triton backend's layouts per call signature
(``KNOBS.sparse_select_layouts``: launches through plans). Results are checked against the float64 reference; the
layouts' launches against the launches of the path without them."""
from __future__ import annotations

import gc
import os
import weakref

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

import jfa_ops  # noqa: E402
from jfa_ops import validation  # noqa: E402
from jfa_ops.backends.base import BlockSelectParams  # noqa: E402
from jfa_ops.backends.triton import block_sparse_select, configs, launch  # noqa: E402
from jfa_ops.ops import block_sparse as ops  # noqa: E402
from tests.common import RecordOps, count_op_calls, coverage_as_on_one_cuda_stream  # noqa: E402

CUDA = torch.cuda.is_available()
LENGTHS = (40, 0, 17, 33)
OFF = torch.tensor([0, 40, 40, 57, 90], dtype=torch.int32)
OPTS = dict(block_q=16, block_kv=16, keep_ratio=0.5, causal=True)


def _inputs(device="cpu"):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(90, 4, 16, generator=gen).half().to(device)
    k = torch.randn(90, 2, 16, generator=gen).half().to(device)
    return q, k, OFF.to(device)


def _reference(q, k, off):
    off = off.cpu().clone()  # (the reference's own check would cover the caller's offsets)
    return jfa_ops.select_kv_blocks(q.cpu(), k.cpu(), off, off, 40, 40, backend="reference", **OPTS)


@pytest.fixture
def spied_selection(monkeypatch):
    """CPU offsets treated as CUDA ones for ``validation.cover`` (async mode, one stream); (the calls of
    ``torch.ops.jfa.select_kv_blocks``, each triton selection's ``check_offsets``), recorded per call."""
    monkeypatch.setattr(validation, "validation_mode", lambda device: "async")
    monkeypatch.setattr(ops, "validation_mode", lambda device: "async")
    coverage_as_on_one_cuda_stream(monkeypatch)
    op_calls = count_op_calls(monkeypatch, "select_kv_blocks")
    checks = []
    real = block_sparse_select.select_kv_blocks
    monkeypatch.setattr(block_sparse_select, "select_kv_blocks",
                        lambda *a: checks.append(a[-1].check_offsets) or real(*a))
    return op_calls, checks


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
def test_eager_selection_skips_the_dispatcher_and_covers_its_offsets(monkeypatch, spied_selection):
    """Plain tensors, eager: ``select_kv_blocks`` runs the op's body without ``torch.ops.jfa.select_kv_blocks`` and
    equals the reference; the first call checks the offsets in the backend's kernel and covers them (async mode),
    so the second call, and the sparse forward's op after it, check nothing; other offsets are checked again. Under
    a dispatch mode the call goes through the op (a mode must see it)."""
    monkeypatch.setattr(ops, "SELECT_DIRECT", True)
    q, k, off = _inputs()
    op_calls, checks = spied_selection
    want = _reference(q, k, off)
    for _ in range(2):
        got = jfa_ops.select_kv_blocks(q, k, off, off, 40, 40, backend="triton", **OPTS)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert op_calls == [] and checks == [True, False]
    assert validation.covered(off, off, 90, 90, 40, 40)
    other = off.clone()
    jfa_ops.select_kv_blocks(q, k, other, other, 40, 40, backend="triton", **OPTS)
    assert checks == [True, False, True]
    with RecordOps() as mode:
        got = jfa_ops.select_kv_blocks(q, k, off, off, 40, 40, backend="triton", **OPTS)
    assert len(op_calls) == 1 and torch.equal(got[0], want[0]) and mode.ops[0] == "jfa.select_kv_blocks.default"


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
def test_selection_op_path_checks_every_call(monkeypatch, spied_selection):
    """With JFA_SELECT_DIRECT=0 (the direct path is the default since the H200 run of 2026-12-03): every call goes
    through the op, which checks the offsets on the device each time and covers nothing."""
    monkeypatch.setattr(ops, "SELECT_DIRECT", False)
    q, k, off = _inputs()
    op_calls, checks = spied_selection
    for _ in range(2):
        jfa_ops.select_kv_blocks(q, k, off, off, 40, 40, backend="triton", **OPTS)
    assert len(op_calls) == 2 and checks == [True, True] and not validation.covered(off, off, 90, 90, 40, 40)


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
def test_eager_selection_memo_still_rejects_bad_calls(monkeypatch):
    """The direct path's memo keeps only calls that passed the checks: a bad call after a good one with the same
    tensors still raises (a wrong max_seqlen type, a bad keep ratio, another backend's refusal)."""
    monkeypatch.setattr(ops, "SELECT_DIRECT", True)
    q, k, off = _inputs()
    jfa_ops.select_kv_blocks(q, k, off, off, 40, 40, backend="triton", **OPTS)
    with pytest.raises(ValueError, match="keep_ratio"):
        jfa_ops.select_kv_blocks(q, k, off, off, 40, 40, backend="triton", **{**OPTS, "keep_ratio": 1.5})
    with pytest.raises(TypeError, match="max_seqlen_kv"):
        jfa_ops.select_kv_blocks(q, k, off, off, 40, 40.0, backend="triton", **OPTS)
    with pytest.raises(ValueError, match="head_dim"):
        jfa_ops.select_kv_blocks(q[..., :12], k[..., :12], off, off, 40, 40, backend="triton", **OPTS)


def _spied_launches(monkeypatch):
    """Every launch of the selection recorded as (kernel name, grid, plan key or None, {argument: value}) instead of
    run; layouts kept as on CUDA (``launch.replays_enabled``), a fresh memo."""
    seen = []
    monkeypatch.setattr(block_sparse_select, "launch", lambda kernel, grid, args, **options: seen.append(
        (kernel.fn.__name__, grid, None, args)))
    monkeypatch.setattr(block_sparse_select, "launch_planned", lambda kernel, key, grid, dynamic, static, **o: seen.append(
        (kernel.fn.__name__, grid, key, {**static(), **dynamic})))
    monkeypatch.setattr(block_sparse_select, "_LAYOUTS", {})
    monkeypatch.setattr(validation, "device_flag", lambda flag, mode: None)
    return seen


def _same(a, b) -> bool:
    """Launch values equal: ints and constexprs by value, tensors by shape, strides and dtype (a call allocates its
    own scratch)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.stride() == b.stride() and a.dtype == b.dtype)
    return a == b


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize("knobs", [{}, {"sparse_pool_one_launch": False},
                                   {"sparse_select_rows": True, "sparse_pool_stream": False}])
def test_selection_layout_launches_the_unkept_paths_arguments(monkeypatch, knobs, check):
    """Under ``KNOBS.sparse_select_layouts`` a call signature's layout is made once: its calls launch through plans
    (a plan key per layout and launch) with the grids and the arguments of the path without layouts (the knob off,
    or ``launch.replays_enabled()`` False: every argument derived per call, as under the interpreter or while
    traced); a flipped knob makes a new layout (``Knobs.generation`` in the key)."""
    for name, value in {"sparse_select_layouts": True, **knobs}.items():
        monkeypatch.setattr(configs.KNOBS, name, value)
    seen = _spied_launches(monkeypatch)
    q, k, off = _inputs()
    params = BlockSelectParams(block_q=16, block_kv=16, n_q_blocks=3, n_kv_blocks=3, causal=True, max_seqlen_q=40,
                               max_seqlen_kv=40, check_offsets=check)
    block_sparse_select.select_kv_blocks(q, k, off, off, params)  # (interpreted: no layout)
    unkept = list(seen)
    assert unkept and all(key is None for _, _, key, _ in unkept) and not block_sparse_select._LAYOUTS
    monkeypatch.setattr(launch, "replays_enabled", lambda: True)
    monkeypatch.setattr(configs.KNOBS, "sparse_select_layouts", False)
    seen.clear()
    block_sparse_select.select_kv_blocks(q, k, off, off, params)  # the knob off: no layout either
    assert [s[2] for s in seen] == [None] * len(unkept) and not block_sparse_select._LAYOUTS
    monkeypatch.setattr(configs.KNOBS, "sparse_select_layouts", True)
    made = []
    real_init = block_sparse_select._Layout.__init__
    monkeypatch.setattr(block_sparse_select._Layout, "__init__", lambda self, *a: made.append(1) or real_init(self, *a))
    keys = []
    for _ in range(2):
        seen.clear()
        block_sparse_select.select_kv_blocks(q, k, off, off, params)
        assert [s[:2] for s in seen] == [u[:2] for u in unkept]
        keys.append([s[2] for s in seen])
        for (_, _, _, args), (_, _, _, want) in zip(seen, unkept):
            assert args.keys() == want.keys() and all(_same(args[n], want[n]) for n in want), \
                [n for n in want if not _same(args[n], want[n])]
            assert args.get("X", q) is (q if args.get("WRITE_SEQ", True) else k)  # q, k read in place
            assert args.get("XK", k) is k
    assert made == [1] and keys[0] == keys[1] and None not in keys[0] and len(set(keys[0])) == len(keys[0])
    monkeypatch.setattr(configs.KNOBS, "sparse_pool_one_launch", not configs.KNOBS.sparse_pool_one_launch)
    seen.clear()
    block_sparse_select.select_kv_blocks(q, k, off, off, params)
    assert made == [1, 1] and len(block_sparse_select._LAYOUTS) == 2 and len(seen) != len(unkept)


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
def test_selection_layouts_are_kept_per_stream(monkeypatch):
    """A selection layout serves only calls on the stream it was made on (``base.stream_key`` in ``_layout_key``): it
    keeps shape constants (the keep table) made on that stream, which another stream could read before they are
    written (the hazard helper replay42 found for the forward replays). Fails when the stream is dropped."""
    monkeypatch.setattr(configs.KNOBS, "sparse_select_layouts", True)
    _spied_launches(monkeypatch)
    monkeypatch.setattr(launch, "replays_enabled", lambda: True)
    q, k, off = _inputs()
    params = BlockSelectParams(block_q=16, block_kv=16, n_q_blocks=3, n_kv_blocks=3, causal=True, max_seqlen_q=40,
                               max_seqlen_kv=40)
    made = []
    real_init = block_sparse_select._Layout.__init__
    monkeypatch.setattr(block_sparse_select._Layout, "__init__", lambda self, *a: made.append(1) or real_init(self, *a))
    for stream in ("a", "a", "b", "a", "b"):
        monkeypatch.setattr(block_sparse_select, "stream_key", lambda device, stream=stream: stream)
        block_sparse_select.select_kv_blocks(q, k, off, off, params)
    assert made == [1, 1] and len(block_sparse_select._LAYOUTS) == 2


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
def test_a_layout_read_by_a_graph_capture_outlives_the_caches(monkeypatch):
    """A kept layout used inside a CUDA graph capture gives the graph its keep table (and broadcast offsets) to read
    on every replay: they must stay allocated once ``launch.clear_cache()`` and the per-shape cache drop them (else
    the replays read freed memory: the class of bug helper replay42 fixed in the broadcast-Q forward replay). A layout
    made inside the capture is not kept (its tensors live in the graph's pool). Fails when the capture's layouts are
    not held."""
    monkeypatch.setattr(configs.KNOBS, "sparse_select_layouts", True)
    seen = _spied_launches(monkeypatch)
    monkeypatch.setattr(launch, "replays_enabled", lambda: True)
    monkeypatch.setattr(block_sparse_select, "_READ_BY_GRAPHS", {})
    q, k, off = _inputs()
    params = BlockSelectParams(block_q=16, block_kv=16, n_q_blocks=3, n_kv_blocks=3, causal=True, max_seqlen_q=40,
                               max_seqlen_kv=40, broadcast_q=False)
    capture = [False]
    monkeypatch.setattr(block_sparse_select, "capturing", lambda device: capture[0])
    block_sparse_select.select_kv_blocks(q, k, off, off, params)  # eager: the layout is kept
    (layout,) = block_sparse_select._LAYOUTS.values()
    keep = weakref.ref(layout.keep)
    capture[0] = True
    block_sparse_select.select_kv_blocks(q, k, off, off, params)  # captured: reads the kept layout
    capture[0] = False
    del layout
    seen.clear()  # (the spy's record holds the launches' arguments)
    launch.clear_cache()
    block_sparse_select._LAYOUTS.clear()  # (the spy's memo: clear_cache's hook holds the module's own)
    block_sparse_select._keep_table.cache_clear()
    gc.collect()
    assert keep() is not None and not block_sparse_select._LAYOUTS
    capture[0] = True  # a layout made inside a capture: neither in the memo nor held
    block_sparse_select.select_kv_blocks(q, k, off, off, params)
    assert not block_sparse_select._LAYOUTS and len(block_sparse_select._READ_BY_GRAPHS) == 1
