"""The tlx backend's kept launches (issue 9/10: a small call's host cost): the forward's replays (``tlx.attn_fwd``:
``triton.attn_fwd._Replay`` with descriptors) and the backward's recipes (``tlx.attn_bwd._Recipe``), on CPU.

TLX kernels run only on an sm_90 GPU, so every launch here is stubbed (``gpu``): the first launch of a plan
"compiles" a stand-in, later ones go through the plans; each launch is recorded (kernel, grid, every argument). A
kept launch must launch exactly what the full path launches for the same call (same kernels and arguments: the GPU
test ``test_tlx_gpu.py::test_kept_launches_match_the_full_path`` checks the outputs bit for bit), and a call that
differs from the kept signature in anything the key holds must launch what its own full path launches (a key
missing that element would launch the first signature's plan: these tests fail then).

TLX needs triton 3.8 + triton-utlx: without them in this process, ``test_under_tlx`` runs this file in a subprocess
with ``JFA_TLX_SITE`` (or ``.ci-tlx``) first on the path, as ``test_tlx_compile.py`` does; skipped without either.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
import types

import pytest
import torch

from tests.backends.test_tlx_gpu import SPARSE_KV_EARLY_CASES  # the GPU sections twin's cases (no TLX import)
from tests.common import comparable_launch_values

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = os.environ.get("JFA_TLX_SITE") or os.path.join(ROOT, ".ci-tlx")

try:
    import triton.language.extra.tlx  # noqa: F401
    HAVE_TLX = True
except Exception:  # stock triton (the test environment's): the subprocess runs these tests
    HAVE_TLX = False


@pytest.mark.skipif(HAVE_TLX or not os.path.isdir(os.path.join(SITE, "utlx_plugin")),
                    reason="TLX imports here (the tests below run), or no TLX install to run them under")
def test_under_tlx():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join((SITE, ROOT)), TRITON_INTERPRET="0")
    code = ("import _utlx_autoregister, sys, pytest; "
            f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', {os.path.abspath(__file__)!r}]))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "1 skipped" in result.stdout.splitlines()[-1], result.stdout[-2000:]


needs_tlx = pytest.mark.skipif(not HAVE_TLX, reason="TLX does not import here (test_under_tlx runs these)")

if HAVE_TLX:
    from jfa_ops.backends import tlx
    from jfa_ops.backends.base import AttentionParams
    from jfa_ops.backends.tlx import attn_bwd, attn_fwd
    from jfa_ops.backends.tlx import configs as tlx_configs
    from jfa_ops.backends.triton import attn_bwd as triton_bwd
    from jfa_ops.backends.triton import attn_fwd as triton_fwd
    from jfa_ops.backends.triton import configs, launch
    from jfa_ops.backends.triton.configs import KNOBS

HEADS, HEAD_DIM = (8, 8), 128


class _Compiled:  # a CompiledKernel stand-in
    def __init__(self, kernel):
        self.kernel = kernel


@pytest.fixture
def gpu(monkeypatch):
    """The GPU launch path on CPU tensors with every launch recorded as (kernel name, grid, argument values), and
    how kept launches answered: ("replay" | "recipe", result or None)."""
    runs, answers = [], []

    def first_launch(kernel, grid, values, spec, options, device):
        runs.append((kernel.fn.__name__, grid, values, options))
        return _Compiled(kernel)

    monkeypatch.setattr(launch, "interpreting", lambda: False)
    monkeypatch.setattr(launch, "_launch_bound", first_launch)
    monkeypatch.setattr(launch, "_run", lambda compiled, grid, values, device: runs.append(
        (compiled.kernel.fn.__name__, grid, values, None)))
    for name in ("_PLANS", "_COMPILED", "_INFO"):
        monkeypatch.setattr(launch, name, {})
    monkeypatch.setattr(launch, "VERIFY", False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 132)  # an H200's: small batches fit one wave
    attn_fwd._REPLAYS.clear()  # none made for another test's stand-ins (cleared in place: launch.CLEAR_HOOKS)
    attn_bwd._RECIPES.clear()
    replay_run, recipe_run = triton_fwd._Replay.run, attn_bwd._Recipe.run

    def replay_spy(self, *args):
        answers.append(("replay", replay_run(self, *args)))
        return answers[-1][1]

    def recipe_spy(self, *args):
        answers.append(("recipe", recipe_run(self, *args)))
        return answers[-1][1]

    monkeypatch.setattr(triton_fwd._Replay, "run", replay_spy)
    monkeypatch.setattr(attn_bwd._Recipe, "run", recipe_spy)
    yield runs, answers
    attn_fwd._REPLAYS.clear()
    attn_bwd._RECIPES.clear()


def _inputs(lengths, dtype=torch.bfloat16, fused=False, offsets_dtype=torch.int32, seed=0):
    g = torch.Generator().manual_seed(seed)
    total, (hq, hkv) = sum(lengths), HEADS
    if fused:  # q, k, v slices of one [T, Hq + 2 Hkv, D] projection (row stride (Hq + 2 Hkv) D)
        qkv = torch.randn(total, hq + 2 * hkv, HEAD_DIM, generator=g).to(dtype)
        q, k, v = qkv.split([hq, hkv, hkv], dim=1)
    else:
        q, k, v = (torch.randn(total, h, HEAD_DIM, generator=g).to(dtype) for h in (hq, hkv, hkv))
    offsets = torch.tensor([0] + list(lengths)).cumsum(0).to(offsets_dtype)
    return q, k, v, offsets


def _launches(runs, inputs):
    return [(name, tuple(grid), comparable_launch_values(values, inputs)) for name, grid, values, _ in runs]


def _forward(q, k, v, offsets, params):
    return tlx.forward(q, k, v, offsets, offsets, params)


def _backward(q, k, v, offsets, params, grad_out, grad_lse=None):
    out = torch.randn(q.shape, generator=torch.Generator().manual_seed(7)).to(q.dtype)
    lse = torch.randn(q.shape[1], q.shape[0])
    args = (grad_out, grad_lse, q, k, v, out, lse, offsets, offsets)
    return args, tlx.backward(*args, params)


def _full(monkeypatch, fn):
    """fn() with replays and recipes off (launch.REPLAYS_ENABLED): every decision made from the call's arguments."""
    monkeypatch.setattr(launch, "REPLAYS_ENABLED", False)
    try:
        return fn()
    finally:
        monkeypatch.setattr(launch, "REPLAYS_ENABLED", True)


def _params(**options):
    return AttentionParams(scale=HEAD_DIM ** -0.5, **options)


@needs_tlx
def test_forward_replay_launches_what_the_full_path_launches(gpu, monkeypatch):
    """A repeat of a forward signature is served by its replay (one launch, descriptors over the call's q, k, v),
    and launches exactly what the full path launches for that call; launch counters count it."""
    runs, answers = gpu
    params = _params(causal=True)
    _forward(*_inputs([64, 17, 40, 5]), params)  # makes the replay
    inputs = _inputs([64, 17, 40, 5], seed=1)  # same signature, other tensors
    runs.clear()
    before = launch.LAUNCHES.copy()
    _forward(*inputs, params)
    assert [kind for kind, result in answers] == ["replay"] and answers[0][1] is not None
    by_replay = _launches(runs, inputs)
    assert launch.LAUNCHES - before == {"attn_fwd_tlx_kernel": 1}
    runs.clear()
    _full(monkeypatch, lambda: _forward(*inputs, params))
    assert _launches(runs, inputs) == by_replay
    assert [v[0] for v in by_replay[0][2][:3]] == ["descriptor"] * 3  # q, k, v through TMA


@needs_tlx
def test_backward_recipe_launches_what_the_full_path_launches(gpu, monkeypatch):
    """A backward signature's recipe serves batches of other lengths and launches exactly what the full path
    launches (delta, the TLX kernel with five descriptors, dQ finalize), launch counters included."""
    runs, answers = gpu
    params = _params(causal=True)
    for seed, lengths in enumerate(([64, 17, 40, 5], [30, 1, 64], [64, 17, 40, 5])):
        q, k, v, offsets = _inputs(lengths, seed=seed)
        grad_out = torch.randn_like(q)
        runs.clear()
        before = launch.LAUNCHES.copy()
        args, _ = _backward(q, k, v, offsets, params, grad_out)
        by_recipe, counted = _launches(runs, args), launch.LAUNCHES - before
        runs.clear()
        _full(monkeypatch, lambda: tlx.backward(*args, params))
        assert _launches(runs, args) == by_recipe
        assert counted == {"attn_bwd_delta_kernel": 1, "attn_bwd_tlx_kernel": 1, "attn_bwd_dq_finalize_kernel": 1}
    assert [kind for kind, _ in answers] == ["recipe", "recipe"] and all(r is not None for _, r in answers)


@needs_tlx
def test_backward_recipe_derives_again_only_when_the_sizes_change(gpu, monkeypatch):
    """A recipe keeps what it derived from its last call's sizes (slots, programs, search steps): a repeat of those
    sizes derives nothing again; other row counts (same batch size), batch sizes or SM counts are derived again, and
    every call launches what the full path launches (a memo keyed without the rows or the SM count fails here)."""
    runs, answers = gpu
    derived, derive = [], attn_bwd._Recipe._sized
    monkeypatch.setattr(attn_bwd._Recipe, "_sized", lambda self, *sizes: derived.append(sizes) or derive(self, *sizes))
    params = _params(causal=True)
    batches = ([64, 17, 40, 5], [64, 17, 40, 5], [300, 300, 300, 300], [30, 1, 64])  # 8, 8, 16, 4 key tiles
    for seed, lengths in enumerate(((64, 17, 40, 5),) + batches):
        q, k, v, offsets = _inputs(list(lengths), seed=seed)
        runs.clear()
        args, _ = _backward(q, k, v, offsets, params, torch.randn_like(q))
        by_kept = _launches(runs, args)
        runs.clear()
        _full(monkeypatch, lambda: tlx.backward(*args, params))
        assert _launches(runs, args) == by_kept
    assert derived == [(4, 126), (4, 1200), (3, 95)]
    assert [kind for kind, _ in answers] == ["recipe"] * 4 and all(r is not None for _, r in answers)
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)  # the last sizes no longer fit one wave
    _backward(q, k, v, offsets, params, torch.randn_like(q))
    assert answers[-1] == ("recipe", None)


@needs_tlx
def test_backward_recipe_serves_a_gqa_split_in_one_wave(gpu, monkeypatch):
    """A GQA split whose parts still fit one wave (8 key tile slots x 2 kv heads x 4 parts = 64 items on 132 SMs) is
    served by the one-wave recipe, which launches what the full path launches: the parts'
    grid and fp32 dK/dV slabs, dK/dV returned in k's dtype."""
    runs, answers = gpu
    monkeypatch.setitem(globals(), "HEADS", (8, 2))
    monkeypatch.setattr(tlx_configs, "BACKWARD_GQA_SPLIT", 16)
    params = _params(causal=True)
    names = attn_bwd.attn_bwd_tlx_kernel.arg_names
    for seed, lengths in enumerate(([64, 17, 40, 5], [30, 1, 64, 31])):
        q, k, v, offsets = _inputs(lengths, seed=seed)
        runs.clear()
        args, (_, dk, dv) = _backward(q, k, v, offsets, params, torch.randn_like(q))
        (launched,) = [dict(zip(names, r[2])) for r in runs if r[0] == "attn_bwd_tlx_kernel"]
        assert launched["GROUP_SPLIT"] == 4 and launched["TILES_FROM_OFFSETS"] and runs[1][1] == (64,)
        assert launched["DV"].data_ptr() - launched["DK"].data_ptr() == k.numel() * 4
        assert dk.dtype == dv.dtype == k.dtype
        by_kept = _launches(runs, args)
        runs.clear()
        _full(monkeypatch, lambda: tlx.backward(*args, params))
        assert _launches(runs, args) == by_kept
    assert [kind for kind, result in answers] == ["recipe"] and answers[0][1] is not None


@needs_tlx
@pytest.mark.parametrize("case", ["broadcast Q", "checked offsets", "one offsets tensor, int64"])
def test_forward_replay_other_call_kinds(gpu, monkeypatch, case):
    """Broadcast Q (the replay keeps the per-shape output offsets), offsets checked on the device (no replay: the
    full path checks them after its launch), int64 offsets passed once for both sides (converted once per call):
    each repeat launches what the full path launches."""
    runs, answers = gpu
    monkeypatch.setattr("jfa_ops.validation.device_check", lambda *args: None)
    q, k, v, offsets = _inputs([64, 17, 40, 5], offsets_dtype=torch.int64 if "int64" in case else torch.int32)
    params = _params(causal=False, broadcast_q=True) if case == "broadcast Q" else _params(
        causal=True, check_offsets=case == "checked offsets")
    if case == "broadcast Q":
        q = q[:40]
    call = (lambda: tlx.forward(q, k, v, None, offsets, params)) if case == "broadcast Q" else (
        lambda: tlx.forward(q, k, v, offsets, offsets, params))
    call()
    runs.clear()
    call()
    by_kept = _launches(runs, (q, k, v, offsets))
    assert [kind for kind, _ in answers] == ([] if case == "checked offsets" else ["replay"])
    assert all(result is not None for _, result in answers)
    runs.clear()
    _full(monkeypatch, call)
    assert _launches(runs, (q, k, v, offsets)) == by_kept


# What differs in the second call (``_inputs``/params arguments), or a switch set before it
FORWARD_CHANGES = {
    "lengths": dict(lengths=[30, 1, 64, 9]),  # the replay's ints (rows, slots) are constants of its shapes
    "batch size": dict(lengths=[64, 17, 40]),
    "dtype": dict(dtype=torch.float16),
    "row stride": dict(fused=True),
    "offsets dtype": dict(offsets_dtype=torch.int64),
    "causal": dict(causal=False),
    "window": dict(causal=False, window_left=7, window_right=3),
    "scale": dict(scale=0.3),
    "max_seqlen hints": dict(max_seqlen_q=64, max_seqlen_kv=64),  # fwd_choices' "uniform" (here not: lengths vary)
    "uniform batch": dict(lengths=[32, 32, 32, 32], max_seqlen_q=32, max_seqlen_kv=32),
    "PIPELINE": dict(switch=("PIPELINE", True)),
    "KV_MAJOR": dict(switch=("KV_MAJOR", True)),
    "ONE_LOOP": dict(switch=("ONE_LOOP", False)),
    "FORWARD_ZIGZAG": dict(switch=("FORWARD_ZIGZAG", True)),
    "FORWARD_HEAD_GROUP": dict(switch=("FORWARD_HEAD_GROUP", 2)),
    "FORWARD_DYNAMIC": dict(switch=("FORWARD_DYNAMIC", True)),
    "FORWARD_STORE_TMA": dict(switch=("FORWARD_STORE_TMA", False)),  # (on by default)
    "knob one_wave_unsorted": dict(knob=("one_wave_unsorted", False)),
}


@needs_tlx
@pytest.mark.parametrize("change", list(FORWARD_CHANGES))
def test_forward_replay_is_not_used_when_its_key_changes(gpu, monkeypatch, change):
    """A call differing from a kept forward signature in what the key holds launches what its own full path does
    (a key without that element would replay the first signature's launch: other constants, config, choices)."""
    runs, answers = gpu
    spec = dict(FORWARD_CHANGES[change])
    lengths = spec.pop("lengths", [64, 17, 40, 5])
    switch, knob = spec.pop("switch", None), spec.pop("knob", None)
    input_args = {name: spec.pop(name) for name in ("dtype", "fused", "offsets_dtype") if name in spec}
    scale = spec.pop("scale", HEAD_DIM ** -0.5)
    options = dict(dict(causal=True), **spec)
    _forward(*_inputs([64, 17, 40, 5]), _params(causal=True))  # makes the first signature's replay
    if switch is not None:
        monkeypatch.setattr(tlx_configs, *switch)
    if knob is not None:
        monkeypatch.setattr(KNOBS, *knob)
    inputs = _inputs(lengths, seed=1, **input_args)
    params = AttentionParams(scale=scale, **options)
    runs.clear()
    answers.clear()
    _forward(*inputs, params)
    by_kept = _launches(runs, inputs)
    assert not answers  # the first signature's replay was not asked
    runs.clear()
    _full(monkeypatch, lambda: _forward(*inputs, params))
    assert _launches(runs, inputs) == by_kept


@needs_tlx
@pytest.mark.parametrize("store_tma", [False, True])
def test_forward_store_tma_launch(gpu, monkeypatch, store_tma):
    """``configs.FORWARD_STORE_TMA`` (helper item39): a forward on the v4 consumers launches with STORE_TMA and
    desc_o, a descriptor over out's [T, H*D] rows with the Q half-tile's block; off, or on the v3 consumers (ONE_LOOP
    off), the launch without it (STORE_TMA False, desc_o None); the block-sparse forward as the dense v4. The
    second call of a signature is its replay, which launches the same with a descriptor over its own fresh out."""
    runs, answers = gpu
    monkeypatch.setattr(tlx_configs, "FORWARD_STORE_TMA", store_tma)
    names = list(attn_fwd.attn_fwd_tlx_kernel.arg_names)
    lengths = [64, 17, 40, 5]
    for one_loop in (True, False):
        monkeypatch.setattr(tlx_configs, "ONE_LOOP", one_loop)
        q, k, v, offsets = _inputs(lengths)
        for call in range(2):  # the full path, then the replay it kept
            runs.clear()
            answers.clear()
            _forward(q, k, v, offsets, _params(causal=True))
            got = [dict(zip(names, values)) for name, _, values, _ in runs if name == "attn_fwd_tlx_kernel"]
            assert len(got) == 1 and [kind for kind, _ in answers] == ["replay"] * call, answers
            if store_tma and one_loop:
                assert got[0]["STORE_TMA"] is True
                desc = got[0]["desc_o"]
                assert list(desc.shape) == [sum(lengths), HEADS[0] * HEAD_DIM]
                assert list(desc.block_shape) == [tlx_configs.fwd_config(HEAD_DIM).block_m // 2, HEAD_DIM]
                assert desc.base is got[0]["Out"]
            else:
                assert got[0]["STORE_TMA"] is False and got[0]["desc_o"] is None
        attn_fwd._REPLAYS.clear()  # (one_loop's other value: its own first call)
    for sms in (3, 132):  # the block-sparse forward (the same v4 consumers): list and one wave
        _, got = _block_sparse_launch(runs, monkeypatch, True, sms)
        assert got["SPARSE"] and got["STORE_TMA"] is store_tma and (got["desc_o"] is not None) is store_tma


# Per call of one case, (q lengths, kv lengths): a signature's first call (the full path keeps its replay), a batch of
# the same rows split otherwise (its replay), other rows (a new signature: the full path), their replay, the first
# rows again (the first replay, after another signature's calls). Broadcast-Q: q lengths (L_q,), out rows B * L_q.
STORE_TMA_BATCHES = (([64, 17, 40, 5],) * 2, ([5, 40, 17, 64],) * 2, ([30, 1, 64, 3],) * 2, ([3, 64, 1, 30],) * 2,
                     ([17, 64, 5, 40],) * 2)
STORE_TMA_REPLAY_CASES = {
    "jagged causal": dict(),
    "GQA 8:2": dict(heads=(8, 2)),
    "fused projection (q row stride (Hq + 2 Hkv) D)": dict(fused=True),
    "broadcast-Q on the v4 consumers": dict(broadcast=True, switches=(("ONE_LOOP", True),)),
}


def _store_tma_inputs(q_lengths, kv_lengths, heads, fused, seed):
    g = torch.Generator().manual_seed(seed)
    (hq, hkv), rows_q, rows_kv = heads, sum(q_lengths), sum(kv_lengths)
    if fused:
        q, k, v = torch.randn(rows_q, hq + 2 * hkv, HEAD_DIM, generator=g).bfloat16().split([hq, hkv, hkv], dim=1)
    else:
        q, k, v = (torch.randn(rows, h, HEAD_DIM, generator=g).bfloat16()
                   for rows, h in ((rows_q, hq), (rows_kv, hkv), (rows_kv, hkv)))
    return q, k, v, torch.tensor([0] + list(kv_lengths)).cumsum(0).to(torch.int32)


def _check_out_descriptor(launched, q, k, v, out, lse):
    """The launch of one call writes the call's own fresh out through a descriptor over exactly its rows: base the
    returned out (not an earlier call's), global shape [out rows, Hq*D] (a stale smaller one clips stores, a larger
    one lets a store pass the end), strides out's, the Q half-tile's block; q, k, v read through descriptors over
    this call's tensors; Out, Lse, total_out this call's."""
    assert launched["STORE_TMA"] is True and launched["Out"] is out and launched["Lse"] is lse
    assert launched["total_out"] == out.shape[0] and out.is_contiguous()
    desc = launched["desc_o"]
    assert desc.base is out
    assert list(desc.shape) == [out.shape[0], out.shape[1] * HEAD_DIM]
    assert list(desc.strides) == [out.stride(0), 1]
    assert list(desc.block_shape) == [tlx_configs.fwd_config(HEAD_DIM).block_m // 2, HEAD_DIM]
    for name, t in (("desc_q", q), ("desc_k", k), ("desc_v", v)):
        got = launched[name]
        assert got.base is t and list(got.shape) == [t.shape[0], t.shape[1] * HEAD_DIM], name
        assert list(got.strides) == [t.stride(0), 1], name


@needs_tlx
@pytest.mark.parametrize("case", list(STORE_TMA_REPLAY_CASES))
def test_forward_store_tma_descriptor_follows_each_calls_out(gpu, monkeypatch, case):
    """STORE_TMA on (the default since stop 40; helper review41): every call's launch, full path or replay, writes
    its own out through desc_o (``_check_out_descriptor``), for batches of one signature and of another row count,
    with every earlier out still alive (a descriptor kept from an earlier call, or built over its rows, fails here);
    the replays served the repeats (the second, fourth and fifth calls)."""
    runs, answers = gpu
    spec = STORE_TMA_REPLAY_CASES[case]
    monkeypatch.setattr(tlx_configs, "FORWARD_STORE_TMA", True)
    for switch in spec.get("switches", ()):
        monkeypatch.setattr(tlx_configs, *switch)
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", spec.get("sms", 132))
    heads, broadcast = spec.get("heads", HEADS), spec.get("broadcast", False)
    names, kept = list(attn_fwd.attn_fwd_tlx_kernel.arg_names), []
    for seed, (q_lengths, kv_lengths) in enumerate(STORE_TMA_BATCHES):
        if broadcast:  # L_q rows of shared queries (40, then 24 from the third call: other out rows B * L_q)
            q_lengths = [40 if seed < 2 or seed == 4 else 24]
        q, k, v, offsets = _store_tma_inputs(q_lengths, kv_lengths, heads, spec.get("fused", False), seed)
        runs.clear()
        out, lse = tlx.forward(q, k, v, None if broadcast else offsets, offsets,
                               _params(causal=not broadcast, broadcast_q=broadcast))
        (launched,) = [dict(zip(names, values)) for name, _, values, _ in runs if name == "attn_fwd_tlx_kernel"]
        assert out.shape[0] == (q_lengths[0] * len(kv_lengths) if broadcast else q.shape[0])
        _check_out_descriptor(launched, q, k, v, out, lse)
        kept.append(out)
    assert [kind for kind, _ in answers] == ["replay"] * 3 and all(result is not None for _, result in answers)


@needs_tlx
def test_block_sparse_forward_store_tma_descriptor_follows_each_calls_out(gpu, monkeypatch):
    """The block-sparse forward keeps no replay (every call takes its full path) and builds desc_o per call over its
    own out: two calls of other row counts, the first out still alive (helper review41)."""
    from jfa_ops.backends.base import BlockSparseParams

    runs, answers = gpu
    monkeypatch.setattr(tlx_configs, "FORWARD_STORE_TMA", True)
    names, kept = list(attn_fwd.attn_fwd_tlx_kernel.arg_names), []
    for seed, lengths in enumerate(([640, 17, 300, 5], [200, 129, 5, 400], [640, 17, 300, 5])):
        q, k, v, offsets = _inputs(lengths, seed=seed)
        n_blocks = -(-max(lengths) // 128)
        index = torch.arange(n_blocks, dtype=torch.int32).expand(4, HEADS[1], n_blocks, n_blocks).contiguous()
        count = torch.full((4, HEADS[1], n_blocks), 2, dtype=torch.int32)
        runs.clear()
        out, lse = attn_fwd.block_sparse_forward(q, k, v, offsets, offsets, index, count,
                                                 BlockSparseParams(scale=HEAD_DIM ** -0.5, causal=True))
        (launched,) = [dict(zip(names, values)) for name, _, values, _ in runs if name == "attn_fwd_tlx_kernel"]
        assert launched["SPARSE"]
        _check_out_descriptor(launched, q, k, v, out, lse)
        kept.append(out)
    assert not answers


@needs_tlx
@pytest.mark.parametrize("zigzag", [False, True])
def test_forward_zigzag_launch(gpu, monkeypatch, zigzag):
    """``configs.FORWARD_ZIGZAG`` (helper tlxcausal): a call whose items do not fit one wave launches the forward
    with ZIGZAG, KV_MAJOR off (ZIGZAG's order replaces it) and ``fwd_head_group``'s group; off, the launch is the
    default's (ZIGZAG False, head group 1); one wave (no list) never zigzags. GQA: the group counts kv heads."""
    runs, _ = gpu
    monkeypatch.setattr(tlx_configs, "FORWARD_ZIGZAG", zigzag)
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)  # 8 heads x 8+ tiles: many rounds of 3 programs
    names = list(attn_fwd.attn_fwd_tlx_kernel.arg_names)
    for lengths, uniform in (([64, 17, 40, 5], False), ([256] * 4, True)):
        q, k, v, offsets = _inputs(lengths)
        hint = max(lengths) if uniform else 0
        runs.clear()
        _full(monkeypatch, lambda: _forward(q, k, v, offsets, _params(causal=True, max_seqlen_q=hint,
                                                                      max_seqlen_kv=hint)))
        (grid, values), = [(g, v) for name, g, v, _ in runs if name == "attn_fwd_tlx_kernel"]  # after the list's
        got = dict(zip(names, values))
        assert got["ZIGZAG"] is zigzag and not got["TILES_FROM_OFFSETS"]
        want = tlx_configs.fwd_head_group(HEADS[1], HEADS[0] // HEADS[1], got["n_slots"], grid[0], uniform)
        assert got["head_group"] == (want if zigzag else 1)
        if zigzag:
            assert got["KV_MAJOR"] is False
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 132)  # one wave: slots from the offsets, no list to order
    runs.clear()
    _full(monkeypatch, lambda: _forward(*_inputs([64, 17, 40, 5]), _params(causal=True)))
    got = dict(zip(names, runs[-1][2]))
    assert runs[-1][0] == "attn_fwd_tlx_kernel" and got["TILES_FROM_OFFSETS"] and got["ZIGZAG"] is False and got["head_group"] == 1


def _block_sparse_launch(runs, monkeypatch, causal, sms):
    """(grid, arguments by name) of the TLX block-sparse forward's launch for a jagged call of 8 heads x 10+ Q tiles
    (two blocks selected per Q block), on ``sms`` programs (3: many rounds, a sorted list; 132: one wave)."""
    from jfa_ops.backends.base import BlockSparseParams

    lengths = [640, 17, 300, 5]
    q, k, v, offsets = _inputs(lengths)
    n_blocks = -(-max(lengths) // 128)
    index = torch.arange(n_blocks, dtype=torch.int32).expand(len(lengths), HEADS[1], n_blocks, n_blocks).contiguous()
    count = torch.full((len(lengths), HEADS[1], n_blocks), 2, dtype=torch.int32)
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", sms)
    runs.clear()
    attn_fwd.block_sparse_forward(q, k, v, offsets, offsets, index, count,
                                  BlockSparseParams(scale=HEAD_DIM ** -0.5, causal=causal))
    (grid, values), = [(g, v) for name, g, v, _ in runs if name == "attn_fwd_tlx_kernel"]  # after the list's
    return grid, dict(zip(attn_fwd.attn_fwd_tlx_kernel.arg_names, values))


@needs_tlx
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("zigzag", [False, True])
def test_block_sparse_forward_zigzag_launch(gpu, monkeypatch, zigzag, causal):
    """``configs.SPARSE_FORWARD_ZIGZAG`` (helper sparsefwd): a block-sparse call whose items do not fit one wave
    launches the forward with SPARSE, ZIGZAG, KV_MAJOR off and ``fwd_head_group``'s group (the dense forward's
    order over the selected-blocks list); off, static striding as before (ZIGZAG False, head group 1, KV_MAJOR as
    ``fwd_choices`` picks: kv-major unmasked, tile-major masked); one wave (no list) never zigzags."""
    runs, _ = gpu
    monkeypatch.setattr(tlx_configs, "SPARSE_FORWARD_ZIGZAG", zigzag)
    grid, got = _block_sparse_launch(runs, monkeypatch, causal, 3)
    assert got["SPARSE"] and got["ZIGZAG"] is zigzag and not got["TILES_FROM_OFFSETS"]
    want = tlx_configs.fwd_head_group(HEADS[1], HEADS[0] // HEADS[1], got["n_slots"], grid[0], False)
    assert got["head_group"] == (want if zigzag else 1)
    assert got["KV_MAJOR"] is (not zigzag and not causal)
    assert got["WALK_AHEAD"] is False  # configs.SPARSE_FORWARD_WALK_AHEAD's default (off: stop 38's measurement)
    _, got = _block_sparse_launch(runs, monkeypatch, causal, 132)
    assert got["TILES_FROM_OFFSETS"] and got["ZIGZAG"] is False and got["head_group"] == 1


@needs_tlx
@pytest.mark.parametrize("walk_ahead", [False, True, "masked"])
def test_block_sparse_forward_walk_ahead_launch(gpu, monkeypatch, walk_ahead):
    """``configs.SPARSE_FORWARD_WALK_AHEAD`` (helper sparsefwd) is the kernel's WALK_AHEAD, read per call, list or
    one wave: True / False (the default) for every call, "masked" (helper sparse38) for causal calls only
    (``configs.sparse_walk_ahead``); the dense forward never takes it; SPARSE_ABLATE stays 0 (timing only)."""
    runs, _ = gpu
    monkeypatch.setattr(tlx_configs, "SPARSE_FORWARD_WALK_AHEAD", walk_ahead)
    for sms in (3, 132):
        for causal in (False, True):
            _, got = _block_sparse_launch(runs, monkeypatch, causal, sms)
            want = walk_ahead is True or (walk_ahead == "masked" and causal)
            assert got["SPARSE"] and got["WALK_AHEAD"] is want and got["SPARSE_ABLATE"] == 0
    runs.clear()
    _full(monkeypatch, lambda: _forward(*_inputs([64, 17, 40, 5]), _params(causal=True)))
    got = dict(zip(attn_fwd.attn_fwd_tlx_kernel.arg_names, runs[-1][2]))
    assert runs[-1][0] == "attn_fwd_tlx_kernel" and got["WALK_AHEAD"] is False


@needs_tlx
@pytest.mark.parametrize("env_name,knob,default", [
    ("JFA_TLX_SPARSE_FWD_WALK_AHEAD", "SPARSE_FORWARD_WALK_AHEAD", False),
    ("JFA_TLX_SPARSE_FWD_FIRST_UNMASKED", "SPARSE_FORWARD_FIRST_UNMASKED", "masked")])
def test_sparse_masked_knob_env(monkeypatch, env_name, knob, default):
    """The env's values (helper sparse38; the first-unmasked knob since stop 56): "masked" -> "masked" (masked calls
    only), "1" -> True, "0" -> False, unset -> ``default`` (the walk ahead off: stop 38's H200 ablation; the first
    block's mask "masked": stop 57's twin and ablations);
    ``on_for_call`` follows them. Each value on a fresh copy of the module (not in sys.modules): reloading the loaded
    one replaced its functions, which conftest's ``nothing_left_patched`` failed (stop 41)."""
    import importlib.util

    from jfa_ops.backends.tlx import configs as c

    for env, want in ((None, default), ("masked", "masked"), ("1", True), ("0", False)):
        if env is None:
            monkeypatch.delenv(env_name, raising=False)
        else:
            monkeypatch.setenv(env_name, env)
        spec = importlib.util.spec_from_file_location(c.__name__, c.__file__)
        fresh = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fresh)
        value = getattr(fresh, knob)
        assert value == want and type(value) is type(want)
        assert [fresh.on_for_call(value, m) for m in (False, True)] == {"masked": [False, True], True: [True, True],
                                                                        False: [False, False]}[want]
        assert [fresh.sparse_walk_ahead(m) for m in (False, True)] == \
            [fresh.on_for_call(fresh.SPARSE_FORWARD_WALK_AHEAD, m) for m in (False, True)]
        assert fresh.SPARSE_FORWARD_ABLATE == 0


@needs_tlx
def test_block_sparse_forward_ablation_launch(gpu, monkeypatch):
    """``configs.SPARSE_FORWARD_ABLATE`` (helper sparse38's timing-only ablation) reaches the kernel's SPARSE_ABLATE
    per call; the dense forward passes 0."""
    runs, _ = gpu
    monkeypatch.setattr(tlx_configs, "SPARSE_FORWARD_ABLATE", 1)
    _, got = _block_sparse_launch(runs, monkeypatch, True, 3)
    assert got["SPARSE"] and got["SPARSE_ABLATE"] == 1
    runs.clear()
    _full(monkeypatch, lambda: _forward(*_inputs([64, 17, 40, 5]), _params(causal=True)))
    got = dict(zip(attn_fwd.attn_fwd_tlx_kernel.arg_names, runs[-1][2]))
    assert runs[-1][0] == "attn_fwd_tlx_kernel" and got["SPARSE_ABLATE"] == 0


@needs_tlx
@pytest.mark.parametrize("peel", [False, True])
def test_block_sparse_forward_peel_launch(gpu, monkeypatch, peel):
    """``configs.SPARSE_FORWARD_PEEL`` (helper peeldiag38) reaches the kernel's SPARSE_PEEL per call (list or one
    wave, causal or not); the ablation (SPARSE_ABLATE 1, its own loop) turns it off; the dense forward passes False.
    Off by default."""
    runs, _ = gpu
    assert os.environ.get("JFA_TLX_SPARSE_FWD_PEEL") is not None or tlx_configs.SPARSE_FORWARD_PEEL is False
    monkeypatch.setattr(tlx_configs, "SPARSE_FORWARD_PEEL", peel)
    for sms in (3, 132):
        for causal in (False, True):
            _, got = _block_sparse_launch(runs, monkeypatch, causal, sms)
            assert got["SPARSE"] and got["SPARSE_PEEL"] is peel and got["SPARSE_ABLATE"] == 0
    _ablation_and_dense_leave_off(runs, monkeypatch, "SPARSE_PEEL")


def _ablation_and_dense_leave_off(runs, monkeypatch, constexpr):
    """An off-by-default forward knob's constexpr is False under the ablation (SPARSE_ABLATE 1, its own loop) and
    in the dense forward, whatever the knob says."""
    monkeypatch.setattr(tlx_configs, "SPARSE_FORWARD_ABLATE", 1)
    _, got = _block_sparse_launch(runs, monkeypatch, True, 3)
    assert got["SPARSE_ABLATE"] == 1 and got[constexpr] is False
    monkeypatch.setattr(tlx_configs, "SPARSE_FORWARD_ABLATE", 0)
    runs.clear()
    _full(monkeypatch, lambda: _forward(*_inputs([64, 17, 40, 5]), _params(causal=True)))
    got = dict(zip(attn_fwd.attn_fwd_tlx_kernel.arg_names, runs[-1][2]))
    assert runs[-1][0] == "attn_fwd_tlx_kernel" and got[constexpr] is False


@needs_tlx
@pytest.mark.parametrize("first_unmasked", [False, True, "masked"])
def test_block_sparse_forward_first_unmasked_launch(gpu, monkeypatch, first_unmasked):
    """``configs.SPARSE_FORWARD_FIRST_UNMASKED`` (helper itemcost, stop 56) reaches the kernel's FIRST_UNMASKED per
    call (list or one wave, causal or not, with the peel or without: independent knobs; "masked": causal calls
    only); the ablation (SPARSE_ABLATE 1) turns it off; the dense forward passes False. "masked" by default (stop
    57)."""
    runs, _ = gpu
    assert os.environ.get("JFA_TLX_SPARSE_FWD_FIRST_UNMASKED") is not None \
        or tlx_configs.SPARSE_FORWARD_FIRST_UNMASKED == "masked"
    monkeypatch.setattr(tlx_configs, "SPARSE_FORWARD_FIRST_UNMASKED", first_unmasked)
    for peel in (False, True):
        monkeypatch.setattr(tlx_configs, "SPARSE_FORWARD_PEEL", peel)
        for sms in (3, 132):
            for causal in (False, True):
                _, got = _block_sparse_launch(runs, monkeypatch, causal, sms)
                want = first_unmasked is True or (first_unmasked == "masked" and causal)
                assert got["SPARSE"] and got["FIRST_UNMASKED"] is want and got["SPARSE_PEEL"] is peel
                assert got["SPARSE_ABLATE"] == 0
    monkeypatch.setattr(tlx_configs, "SPARSE_FORWARD_PEEL", False)
    _ablation_and_dense_leave_off(runs, monkeypatch, "FIRST_UNMASKED")


def test_lowest_selection_keeps_counts_and_the_local_block():
    """``tools/tlx_check.py``'s ``lowest_selection`` (helper sparse38's ablation input): each row keeps its count,
    holds blocks 0 .. count - 2 and its own block (or 0 .. count - 1), ascending, -1 after."""
    tool = _tlx_check_tool()
    count = torch.tensor([[[1, 1, 2, 2, 3, 3, 4, 0, 9], [1, 2, 1, 3, 2, 4, 1, 0, 5]]], dtype=torch.int32)
    low = tool.lowest_selection(torch.zeros((1, 2, 9, 9), dtype=torch.int32), count)
    for h in range(2):
        for i in range(9):
            c = int(count[0, h, i])
            want = list(range(c)) if i < c else list(range(c - 1)) + [i] if c else []
            assert low[0, h, i, :c].tolist() == want and (low[0, h, i, c:] == -1).all()


def test_sparse_bwd_ablation_counts_and_fit():
    """``tools/tlx_check.py sparse-bwd-ablation``'s model inputs (helper sparsebwd45): ``dense_tiles`` equals a
    brute-force count of the (key tile, 64-row query tile) pairs with a visible (query, key) pair (causal: key <=
    query), and ``two_row_fit`` recovers a planted (b, a) with the items equal (the sparse backward's rows) or not."""
    tool = _tlx_check_tool()
    lens = [128, 384, 1024, 256]
    for causal in (False, True):
        want = 0
        for length in lens:
            for k0 in range(0, length, 128):
                for m0 in range(0, length, 64):
                    want += any(not causal or key <= row for row in range(m0, m0 + 64)
                                for key in range(k0, k0 + 128, 127))
        assert tool.dense_tiles(lens, 128, 64, causal) == want, causal
    for rows in (((4800.0, 63.4), (2400.0, 63.4)), ((4800.0, 63.4), (2400.0, 40.0))):
        b, a = tool.two_row_fit(*((bl, it, bl * 2.44 + it * 28.8) for bl, it in rows))
        assert abs(b - 2.44) < 1e-9 and abs(a - 28.8) < 1e-9
    # every column's settings name a real knob: "KNOBS.<name>" the triton backend's KNOBS, else a tlx configs name
    # (those where TLX imports: CI's venv has none, its TLX compile test runs in .ci-tlx)
    from jfa_ops.backends.triton.configs import KNOBS

    try:
        from jfa_ops.backends.tlx import configs
    except ImportError:
        configs = None
    for col, (settings, kind) in tool.SPARSE_BWD_ABLATION.items():
        for name in settings:
            if name.startswith("KNOBS."):
                assert hasattr(KNOBS, name[len("KNOBS."):]), col
            elif configs is not None:
                assert hasattr(configs, name), col
    assert tool.SPARSE_BWD_ABLATION["scatter"] == ({"KNOBS.sparse_transpose_scatter": True}, "sparse")
    assert tool.SPARSE_BWD_ABLATION["onesort"] == ({"KNOBS.sparse_item_one_sort": True}, "sparse")


def _tlx_check_tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tlx_check_tool", os.path.join(ROOT, "tools", "tlx_check.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_bcast_items_ladder_splits_item_and_block_costs():
    """``tools/tlx_check.py bcast-items`` (helper bcastfwd41): every ladder row gives each of 132 SMs the same items
    (4 heads x B items, B = 33 x blocks a SM / blocks an item) and its blocks a SM, and ``fit_item_cost`` recovers a
    known (a, b, c) from the ladder's points, with timing noise of 0.5 us, to within the noise's reach (swapped or
    collinear columns would not)."""
    tool = _tlx_check_tool()
    for blocks_sm, n in tool.BCAST_LADDER:
        batch = 33 * blocks_sm // n
        assert 4 * batch * n == 132 * blocks_sm and (4 * batch) % 132 == 0
    assert len({blocks_sm for blocks_sm, _ in tool.BCAST_LADDER}) == 2  # a second total: a apart from b
    rng = torch.Generator().manual_seed(41)
    a, b, c = 9.0, 2.3, 3.1
    points = [(s, s / n, a + b * s + c * s / n + 0.5 * (2 * torch.rand((), generator=rng).item() - 1))
              for s, n in tool.BCAST_LADDER]
    got_a, got_b, got_c, worst = tool.fit_item_cost(points)
    assert abs(got_b - b) < 0.05 and abs(got_c - c) < 0.05 and abs(got_a - a) < 5.0 and worst <= 1.0


def test_mx_headline_cases_are_the_bench_rows_with_their_walked_blocks(monkeypatch):
    """``tools/tlx_check.py``'s ``mx_case_specs`` (mxfp8-ablation's rows, helper mxabl42): each key the mxfp8
    bench's D128 row (lengths, heads, causal, window, broadcast-Q), its flops 4 D Hq x the pairs each query row sees
    (counted here per row from the documented mask), its n_blocks the (128-row, 128-key) blocks holding a visible
    pair (``meta_kernels.block_sparse.block_visible``, not the kernel's stage bounds) x heads; ``mx_walked_blocks``
    equals a brute count on ``visible_mask`` over small random shapes; TLX_MX_CASES picks keys, an unknown one is a
    ValueError naming it."""
    import numpy as np

    from bench.suites import mxfp8_cases
    from meta_kernels.block_sparse import block_visible

    tool = _tlx_check_tool()

    def row_pairs(lq, lk, causal, window):  # row i, d = i + lk - lq: keys max(0, d - left) .. min(lk - 1, d, d + right)
        d = np.arange(lq) + lk - lq
        left, right = window
        hi = np.full(lq, lk - 1)
        if causal:
            hi = np.minimum(hi, d)
        if right >= 0:
            hi = np.minimum(hi, d + right)
        lo = np.maximum(d - left, 0) if left >= 0 else np.zeros(lq, dtype=np.int64)
        return int(np.maximum(hi - lo + 1, 0).sum())

    def visible_blocks(lq, lk, causal, window):
        i = torch.arange(-(-lq // 128))[:, None]
        j = torch.arange(-(-lk // 128))[None, :]
        return int(block_visible(lq, lk, 128, 128, causal, window[0], window[1], i, j).sum())

    bench = {(c.label, c.causal, c.window, c.broadcast_q): c for c in mxfp8_cases((128,), "full")}
    specs = tool.mx_case_specs(list(tool.MX_CASES))
    assert [s["key"] for s in specs] == list(tool.MX_CASES) and len(bench) == len(specs) == 6
    for s in specs:
        c, p = s["case"], s["params"]
        assert (c.label, c.causal, c.window, c.broadcast_q) in bench and c.head_dim == 128
        assert (p.causal, (p.window_left, p.window_right), p.broadcast_q) == (c.causal, c.window, c.broadcast_q)
        assert (p.max_seqlen_q, p.max_seqlen_kv) == (max(c.q_lens), max(c.kv_lens))
        pairs = sum(row_pairs(lq, lk, c.causal, c.window) for lq, lk in zip(c.q_lens, c.kv_lens))
        assert s["flops"] == 4 * 128 * c.num_heads_q * pairs, s["key"]
        blocks = sum(visible_blocks(lq, lk, c.causal, c.window) for lq, lk in zip(c.q_lens, c.kv_lens))
        assert s["n_blocks"] == c.num_heads_q * blocks, s["key"]
    by_key = {s["key"]: s for s in specs}
    assert by_key["dense"]["n_blocks"] == 16 * 8 * 32 * 32 and by_key["dense-causal"]["n_blocks"] == 16 * 8 * 528
    assert by_key["window"]["case"].window == (256, 0) and by_key["window"]["case"].causal

    for lq, lk, causal, window in _random_masked_shapes(seed=42):
        want = _visible_block_count(lq, lk, causal, window, 128, 128)
        assert tool.mx_walked_blocks((lq,), (lk,), 1, causal, window) == want, (lq, lk, causal, window)

    monkeypatch.delenv("TLX_MX_CASES", raising=False)
    assert tool.mx_case_keys(tool.MX_TIMING_CASES) == ["dense", "bcast"]
    monkeypatch.setenv("TLX_MX_CASES", "window, jagged-causal")
    assert tool.mx_case_keys(tool.MX_CASES) == ["window", "jagged-causal"]
    monkeypatch.setenv("TLX_MX_CASES", "window,windows")
    with pytest.raises(ValueError, match="TLX_MX_CASES.*windows"):
        tool.mx_case_keys(tool.MX_CASES)


def test_mxfp8_ablation_times_fa4_beside_each_row(monkeypatch):
    """``tools/tlx_check.py mxfp8-ablation``'s FA4 column (helper mxbcast48): ``fa4_forward`` calls FlashAttention-4
    as the bench does, here a stub ``flash_attn.cute.interface``: dense rows as [B, S, H, D] through
    flash_attn_func, jagged and broadcast-Q rows through flash_attn_varlen_func with int32 cu_seqlens (broadcast Q
    materialized per sequence: B x Lq rows, offsets b x Lq), the row's causal flag and window, under no_grad; with
    ``flash_attn.cute`` not importable it returns (None, a reason naming it). ``ablation_lines`` prints "x fa4" as
    FA4's time over the column's (and nothing of FA4 when it did not run); TLX_MX_RUNS picks runs by ";"."""
    import sys
    import types

    import bench.peers as peers
    from bench.suites import Case

    tool = _tlx_check_tool()
    calls = []

    def record(kind):
        def call(q, k, v, **kw):
            calls.append((kind, q.shape, k.shape, kw, torch.is_grad_enabled()))
            return torch.zeros_like(q), None
        return call

    interface = types.SimpleNamespace(
        flash_attn_func=lambda q, k, v, softmax_scale=None, causal=False, window_size=None: record("dense")(
            q, k, v, softmax_scale=softmax_scale, causal=causal, window_size=window_size),
        flash_attn_varlen_func=lambda q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
        max_seqlen_k=None, softmax_scale=None, causal=False, window_size=None: record("varlen")(
            q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal, window_size=window_size))
    cute = types.ModuleType("flash_attn.cute")
    cute.interface = interface
    monkeypatch.setitem(sys.modules, "flash_attn", types.ModuleType("flash_attn"))
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", interface)
    monkeypatch.setattr(peers, "_need_cuda", lambda device: None)  # CPU tensors stand in for the GPU's

    def inputs(c):
        g = torch.Generator().manual_seed(1)
        rows_q = c.q_lens[0] if c.broadcast_q else sum(c.q_lens)
        offsets = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])  # noqa: E731 (int64)
        return (torch.randn(rows_q, c.num_heads_q, 16, generator=g), torch.randn(sum(c.kv_lens), 2, 16, generator=g),
                torch.randn(sum(c.kv_lens), 2, 16, generator=g), None if c.broadcast_q else offsets(c.q_lens),
                offsets(c.kv_lens))

    dense = Case("mxfp8", "dense", (64,) * 3, (64,) * 3, 4, 2, 16, causal=True, dense=True)
    bcast = Case("mxfp8", "bcast", (8,) * 3, (40, 7, 19), 4, 2, 16, broadcast_q=True)
    window = Case("mxfp8", "window", (30, 50), (30, 50), 4, 2, 16, causal=True, window=(8, 0))
    with torch.enable_grad():
        for c in (dense, bcast, window):
            fn, why = tool.fa4_forward(c, inputs(c))
            assert why is None
            fn()
    (k1, q1, kv1, kw1, grad1), (k2, q2, kv2, kw2, grad2), (k3, q3, kv3, kw3, grad3) = calls
    assert (k1, tuple(q1), tuple(kv1), kw1["causal"], grad1) == ("dense", (3, 64, 4, 16), (3, 64, 2, 16), True, False)
    assert (k2, tuple(q2), kw2["causal"], grad2) == ("varlen", (24, 4, 16), False, False)
    assert kw2["cu_seqlens_q"].dtype == kw2["cu_seqlens_k"].dtype == torch.int32
    assert kw2["cu_seqlens_q"].tolist() == [0, 8, 16, 24] and kw2["cu_seqlens_k"].tolist() == [0, 40, 47, 66]
    assert (k3, kw3["window_size"], kw3["causal"], grad3) == ("varlen", (8, 0), True, False)
    assert kw3["cu_seqlens_q"].tolist() == [0, 30, 80]

    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)  # import fails: the column skips with the reason
    fn, why = tool.fa4_forward(dense, inputs(dense))
    assert fn is None and "flash_attn.cute not importable" in why

    ms = {"none": 1.0, "pquant,factors": 0.5, tool.BF16_TLX: 1.5, tool.FA4_BF16: 2.0}
    lines = tool.ablation_lines(ms, ("none", "pquant,factors", tool.MX_FACTORS_TMA, tool.BF16_TLX, tool.FA4_BF16),
                                1e12, 1000, 132)
    assert len(lines) == 4 and lines[0].split()[0] == "none" and "1.50x bf16 tlx  2.00x fa4" in lines[0]
    assert "3.00x bf16 tlx  4.00x fa4" in lines[1] and lines[3].endswith("1.00x fa4")
    del ms[tool.FA4_BF16]
    assert not any("fa4" in line for line in tool.ablation_lines(ms, ("none", tool.BF16_TLX), 1e12, 1000, 132))

    runs = ("none", "pquant", "pquant,factors")
    monkeypatch.delenv("TLX_MX_RUNS", raising=False)
    assert tool.mx_ablation_runs(runs) == list(runs)
    monkeypatch.setenv("TLX_MX_RUNS", "none; pquant,factors")
    assert tool.mx_ablation_runs(runs) == ["none", "pquant,factors"]
    monkeypatch.setenv("TLX_MX_RUNS", "none;factors")
    with pytest.raises(ValueError, match="TLX_MX_RUNS.*factors"):
        tool.mx_ablation_runs(runs)


def _visible_block_count(lq: int, lk: int, causal: bool, window: tuple, block_q: int, block_k: int) -> int:
    """Brute count of the (``block_q``-row, ``block_k``-key) blocks holding a visible pair (``visible_mask``)."""
    from jfa_ops.testing import visible_mask

    mask = torch.nn.functional.pad(visible_mask(lq, lk, causal, window), (0, -lk % block_k, 0, -lq % block_q))
    return int(mask.view(-(-lq // block_q), block_q, -(-lk // block_k), block_k).any(3).any(1).sum())


def _random_masked_shapes(seed: int, count: int = 60):
    """(lq, lk, causal, window) of ``count`` small shapes, lengths 1..599, each window side off (-1) or 0..299."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for _ in range(count):
        lq, lk = (int(x) for x in rng.integers(1, 600, size=2))
        causal = bool(rng.integers(0, 2))
        yield lq, lk, causal, tuple(int(x) if x >= 0 else -1 for x in rng.integers(-1, 300, size=2))


def test_bwd_ablation_cases_count_the_blocks_the_backward_walks():
    """``tools/tlx_check.py``'s ``bwd_walked_blocks`` (backward-ablation's clk-per-block divisor, stop 42: one host
    copy of the stage walk for every case, the window row new): the dense, causal and broadcast-Q counts equal the
    closed forms the tool used before (a tile of length L sees cdiv(Lq, 64) 64-row blocks, less n0 / 64 when causal),
    and on random shapes, the window row's mask included, the (64-row, 128-key) blocks holding a visible pair
    (``visible_mask``, not the walk), halved."""
    tool = _tlx_check_tool()
    cases = {key: (case, n) for key, case, n in tool._bwd_ablation_cases()}
    assert list(cases) == ["bcast", "window", "full", "causal", "jagged"]
    for key in ("bcast", "full", "causal", "jagged"):
        case, n = cases[key]
        rows = sum(-(-lq // 64) - (n0 // 64 if case.causal else 0)
                   for lq, lk in zip(case.q_lens, case.kv_lens) for n0 in range(0, lk, 128))
        assert n == case.num_heads_q * rows / 2, key
    window, n = cases["window"]
    assert (window.causal, window.window, window.num_heads_q, sum(window.q_lens)) == (True, (256, 0), 16, 32768)

    assert n == 16 * sum(_visible_block_count(lq, lk, True, (256, 0), 64, 128)
                         for lq, lk in zip(window.q_lens, window.kv_lens)) / 2
    for lq, lk, causal, win in _random_masked_shapes(seed=7):
        case = types.SimpleNamespace(q_lens=(lq,), kv_lens=(lk,), num_heads_q=1, causal=causal, window=win)
        assert tool.bwd_walked_blocks(case) == _visible_block_count(lq, lk, causal, win, 64, 128) / 2, \
            (lq, lk, causal, win)


@needs_tlx
def test_forward_zigzag_default_takes_masked_and_jagged_calls(gpu, monkeypatch):
    """``configs.FORWARD_ZIGZAG`` None (the default; bench/NOTES.md v16's H200 order-timing: every masked row and both
    unmasked jagged rows gained, one-length unmasked dense S2048 lost 0.93x): causal and jagged calls launch ZIGZAG,
    a one-length unmasked batch (known from the max_seqlen hints) does not."""
    runs, _ = gpu
    monkeypatch.setattr(tlx_configs, "FORWARD_ZIGZAG", None)
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)
    names = list(attn_fwd.attn_fwd_tlx_kernel.arg_names)

    def zigzag(lengths, causal, hints):
        q, k, v, offsets = _inputs(lengths)
        hint = max(lengths) if hints else 0
        runs.clear()
        _full(monkeypatch, lambda: _forward(q, k, v, offsets, _params(causal=causal, max_seqlen_q=hint,
                                                                      max_seqlen_kv=hint)))
        (values,) = [v for name, _, v, _ in runs if name == "attn_fwd_tlx_kernel"]
        return dict(zip(names, values))["ZIGZAG"]

    assert zigzag([256] * 4, causal=True, hints=True)  # masked
    assert zigzag([64, 17, 40, 5], causal=False, hints=True)  # jagged, unmasked
    assert zigzag([256] * 4, causal=False, hints=False)  # lengths unknown from shapes: treated as jagged
    assert not zigzag([256] * 4, causal=False, hints=True)  # one-length, unmasked: kv-major striding


@needs_tlx
def test_forward_dynamic_default_is_head_dim_256_only(monkeypatch):
    """``configs.forward_dynamic``: unset (the default since the H200 timing of 2026-12-04), the atomic item counter
    for D256 calls only; JFA_TLX_FWD_DYNAMIC=1 / =0 force it on / off for every head dim."""
    monkeypatch.setattr(tlx_configs, "FORWARD_DYNAMIC", None)
    assert [tlx_configs.forward_dynamic(d) for d in (64, 128, 256)] == [False, False, True]
    for forced in (True, False):
        monkeypatch.setattr(tlx_configs, "FORWARD_DYNAMIC", forced)
        assert [tlx_configs.forward_dynamic(d) for d in (64, 128, 256)] == [forced] * 3


@needs_tlx
def test_forward_dynamic_launch(gpu, monkeypatch):
    """``configs.FORWARD_DYNAMIC`` (helper bcast31): a call on the v3 consumers (broadcast-Q; any call with ONE_LOOP
    off) whose items do not fit one wave launches the forward with ATOMIC_WORK, a zeroed counter of its own, the
    list's order (no ZIGZAG) and the static grid; off, the default's launch (static striding, ZIGZAG for jagged
    calls); the v4 consumers and one wave (no list) never take it."""
    runs, _ = gpu
    names = list(attn_fwd.attn_fwd_tlx_kernel.arg_names)

    def launched(dynamic, sms, broadcast=True, **switches):
        monkeypatch.setattr(tlx_configs, "FORWARD_DYNAMIC", dynamic)
        monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", sms)
        for name, value in switches.items():
            monkeypatch.setattr(tlx_configs, name, value)
        q, k, v, offsets = _inputs([640, 17, 300, 5])
        runs.clear()
        if broadcast:
            _full(monkeypatch, lambda: tlx.forward(q[:128], k, v, None, offsets, _params(broadcast_q=True)))
        else:
            _full(monkeypatch, lambda: _forward(q, k, v, offsets, _params(causal=True)))
        (grid, values), = [(g, v) for name, g, v, _ in runs if name == "attn_fwd_tlx_kernel"]
        return grid, dict(zip(names, values))

    grid, got = launched(True, 3)  # 4 tiles x 8 heads over 3 programs
    assert got["ATOMIC_WORK"] and not got["ZIGZAG"] and got["head_group"] == 1 and not got["TILES_FROM_OFFSETS"]
    assert not got["ONE_LOOP"] and got["PIPELINE"] and tuple(grid) == (3,)
    counter = got["WORK_COUNTER"]
    assert counter.dtype == torch.int32 and counter.tolist() == [0] and counter is not got["TILE_COUNT"]
    _, got = launched(False, 3)
    assert not got["ATOMIC_WORK"] and got["ZIGZAG"]  # the default: jagged KV lengths zigzag
    _, got = launched(True, 132)  # one wave: every item at once
    assert not got["ATOMIC_WORK"] and got["TILES_FROM_OFFSETS"]
    _, got = launched(True, 3, broadcast=False)  # a jagged causal call: the v4 consumers
    assert got["ONE_LOOP"] and not got["ATOMIC_WORK"] and got["ZIGZAG"]
    _, got = launched(True, 3, broadcast=False, ONE_LOOP=False)  # the same on the v3 consumers
    assert not got["ONE_LOOP"] and got["ATOMIC_WORK"] and not got["ZIGZAG"]


@needs_tlx
def test_forward_head_group_rule(monkeypatch):
    """``configs.fwd_head_group``: the fewest kv heads (a divisor) whose items fill ZIGZAG_ROUNDS rounds of the
    programs (2 for a dense batch, 8 jagged), all of them when none does; FORWARD_HEAD_GROUP (or the argument): the
    largest divisor up to it. The bench's D128 H16 cases (tools/fwd_schedule_model.py: slots = capacity)."""
    monkeypatch.setattr(tlx_configs, "FORWARD_HEAD_GROUP", None)
    rule = tlx_configs.fwd_head_group
    assert rule(16, 1, 136, 132, True) == 2  # dense B8 S2048
    assert rule(16, 1, 520, 132, True) == 1  # dense B8 S8192
    assert [rule(16, 1, slots, 132, False) for slots in (72, 140, 284, 576)] == [16, 8, 4, 2]  # jagged T8k-64k
    assert rule(4, 8, 284, 132, False) == 1  # GQA 32:4: 8 q heads per kv head
    assert rule(6, 1, 10, 132, False) == 6  # never enough rounds: one group
    assert rule(12, 1, 100, 132, True, head_group=5) == 4  # the largest divisor <= 5
    monkeypatch.setattr(tlx_configs, "FORWARD_HEAD_GROUP", 3)
    assert rule(16, 1, 136, 132, True) == 2


BACKWARD_CHANGES = {
    "dtype": dict(dtype=torch.float16),
    "row stride": dict(fused=True),
    "causal": dict(causal=False),
    "window": dict(causal=False, window_left=7, window_right=3),
    "scale": dict(scale=0.3),
    "grad_lse": dict(grad_lse=True),
    "dQ split off": dict(switch=("BACKWARD_DQ_SHARED", False)),
    "stats_ahead": dict(switch=("BACKWARD_STATS_AHEAD", True)),
    "knob one_wave_unsorted": dict(knob=("one_wave_unsorted", False)),
}


@needs_tlx
@pytest.mark.parametrize("change", list(BACKWARD_CHANGES))
def test_backward_recipe_is_not_used_when_its_key_changes(gpu, monkeypatch, change):
    """A backward call differing from a kept signature in what the recipe key holds launches what its own full path
    does (not the first signature's plans)."""
    runs, answers = gpu
    spec = dict(BACKWARD_CHANGES[change])
    switch, knob = spec.pop("switch", None), spec.pop("knob", None)
    input_args = {name: spec.pop(name) for name in ("dtype", "fused") if name in spec}
    with_grad_lse = spec.pop("grad_lse", False)
    scale = spec.pop("scale", HEAD_DIM ** -0.5)
    q, k, v, offsets = _inputs([64, 17, 40, 5])
    _backward(q, k, v, offsets, _params(causal=True), torch.randn_like(q))  # makes the first signature's recipe
    if switch is not None:
        monkeypatch.setattr(tlx_configs, *switch)
    if knob is not None:
        monkeypatch.setattr(KNOBS, *knob)
    q, k, v, offsets = _inputs([30, 1, 64], seed=1, **input_args)
    params = AttentionParams(scale=scale, **dict(dict(causal=True), **spec))
    grad_lse = torch.randn(q.shape[1], q.shape[0]) if with_grad_lse else None
    runs.clear()
    answers.clear()
    args, _ = _backward(q, k, v, offsets, params, torch.randn_like(q), grad_lse)
    by_kept = _launches(runs, args)
    assert not answers
    runs.clear()
    _full(monkeypatch, lambda: tlx.backward(*args, params))
    assert _launches(runs, args) == by_kept


@needs_tlx
@pytest.mark.parametrize("why", ["misaligned tensor", "not one wave", "empty batch"])
def test_kept_launches_decline_calls_outside_their_path(gpu, monkeypatch, why):
    """Pointers or sizes the kept launches do not cover (a base TMA cannot read: the full path copies it; a sorted
    tile list; no rows) make them decline before any launch, and the full path runs (and launches what it would)."""
    runs, answers = gpu
    params = _params(causal=True)
    lengths = [64, 17, 40, 5]
    q, k, v, offsets = _inputs(lengths)
    _forward(q, k, v, offsets, params)
    _backward(q, k, v, offsets, params, torch.randn_like(q))
    q, k, v, offsets = _inputs(lengths, seed=1)
    if why == "misaligned tensor":
        shifted = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)  # a 2-byte offset
        shifted.copy_(q)
        q = shifted
    elif why == "not one wave":
        monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)
    else:
        q, k, v, offsets = _inputs([], seed=1)
    answers.clear()
    runs.clear()
    if why != "not one wave":  # the forward replay's key holds the device, whose SM count a GPU never changes
        _forward(q, k, v, offsets, params)
        assert answers == ([("replay", None)] if why == "misaligned tensor" else [])
        by_kept = _launches(runs, (q, k, v, offsets))
        runs.clear()
        _full(monkeypatch, lambda: _forward(q, k, v, offsets, params))
        assert _launches(runs, (q, k, v, offsets)) == by_kept
    answers.clear()
    runs.clear()
    args, grads = _backward(q, k, v, offsets, params, torch.randn_like(q))
    assert answers == [("recipe", None)]
    by_kept = _launches(runs, args)
    runs.clear()
    _full(monkeypatch, lambda: tlx.backward(*args, params))
    assert _launches(runs, args) == by_kept


def _at_offset(t, rows: int = 3, misalign: bool = False):
    """``t``'s values in a view ``rows`` rows into a larger buffer (same shape and strides, another storage offset:
    16-byte aligned), or ``misalign``: one element in (a 2-byte offset, which TMA cannot read)."""
    if misalign:
        view = torch.empty(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape)
    else:
        view = torch.empty((t.shape[0] + rows,) + tuple(t.shape[1:]), dtype=t.dtype)[rows:]
    assert view.stride() == t.stride()
    return view.copy_(t)


def _served_and_same_as_full(runs, answers, monkeypatch, call, inputs, kind: str, served: bool):
    """Run ``call`` once (kept launches on) and once by its full path: the kept launch of ``kind`` answered as
    ``served`` says (True: it launched; False: it declined; None: it was not asked) and both runs launched the same
    kernels with the same arguments, this call's own tensors in their places."""
    runs.clear()
    answers.clear()
    call()
    by_kept = _launches(runs, inputs)
    expected = [] if served is None else [(kind, served)]
    assert [(k, result is not None) for k, result in answers] == expected
    runs.clear()
    _full(monkeypatch, call)
    assert _launches(runs, inputs) == by_kept


@needs_tlx
def test_forward_replay_follows_each_call_of_its_signature(gpu, monkeypatch):
    """A replay's key holds shapes, strides, dtypes of its inputs but not where they live: calls of its key with the
    rows split otherwise, q, k, v passed as one tensor, views at an aligned offset into larger buffers are served
    and launch what their own full path launches (their own tensors); a misaligned v declines; offsets of equal
    values in two tensors (another key) do not ask it (helper replay42)."""
    runs, answers = gpu
    params = _params(causal=True)
    q, k, v, offsets = _inputs([64, 17, 40, 5])
    _forward(q, k, v, offsets, params)  # makes the replay
    q, k, v, offsets = _inputs([5, 40, 17, 64], seed=1)
    views = tuple(_at_offset(t) for t in (q, k, v))
    steps = [((q, k, v, offsets, offsets), True),
             ((q, q, q, offsets, offsets), True),  # one tensor for q, k and v (MHA, equal rows)
             (views + (offsets, offsets), True),
             ((q, k, _at_offset(v, misalign=True), offsets, offsets), False),
             ((q, k, v, offsets, offsets.clone()), None)]
    for inputs, served in steps:
        _served_and_same_as_full(runs, answers, monkeypatch, lambda: tlx.forward(*inputs, params), inputs, "replay",
                                 served)


@needs_tlx
def test_backward_recipe_follows_each_call_of_its_signature(gpu, monkeypatch):
    """One recipe key (no sizes in it) serves calls whose batch size, rows and max_seqlen hints change (each call's
    sizes derived again), q, k, v passed as one tensor, out and dO views at an aligned offset into larger buffers,
    and two backwards of one forward with other dO (retain_graph): each launches what its own full path launches,
    from its own tensors; a misaligned dO declines (helper replay42)."""
    runs, answers = gpu
    base = _params(causal=True)
    steps = []
    for seed, (lengths, how) in enumerate((([64, 17, 40, 5], "first"), ([30, 1, 64], "rows"),
                                           ([32, 32, 32, 32], "hints"), ([3, 0, 70, 1, 9], "views"),
                                           ([64, 17, 40, 5], "one tensor"), ([64, 17, 40, 5], "misaligned dO"))):
        q, k, v, offsets = _inputs(lengths, seed=seed)
        if how == "one tensor":
            k = v = q
        params = dataclasses.replace(base, max_seqlen_q=32, max_seqlen_kv=32) if how == "hints" else base
        g = torch.Generator().manual_seed(100 + seed)
        out = torch.randn(q.shape, generator=g).to(q.dtype)
        lse = torch.randn(q.shape[1], q.shape[0], generator=g)
        grad_outs = [torch.randn(q.shape, generator=g).to(q.dtype) for _ in range(2 if how == "rows" else 1)]
        if how == "views":
            out, grad_outs = _at_offset(out), [_at_offset(grad_outs[0])]
        if how == "misaligned dO":
            grad_outs = [_at_offset(grad_outs[0], misalign=True)]
        for grad_out in grad_outs:  # "rows": a second backward of the same forward with another dO
            steps.append(((grad_out, None, q, k, v, out, lse, offsets, offsets), params,
                          None if how == "first" else how != "misaligned dO"))
    for args, params, served in steps:
        _served_and_same_as_full(runs, answers, monkeypatch, lambda: tlx.backward(*args, params), args, "recipe",
                                 served)


@needs_tlx
def test_kept_launch_keys_hold_the_device_and_none_while_traced(gpu):
    """The forward replay's and both backwards' recipe keys hold the device (one signature on two devices: two keys;
    ``device_guard`` makes it the current device, whose stream each launch takes), and are None while a backend is
    traced into a torch.compile graph (nothing kept or served there: ``launch.replays_enabled``)."""
    from jfa_ops.backends.base import traced

    q, k, v, offsets = _inputs([64, 17, 40, 5])
    params = _params(causal=True)
    variant = ("the variant",)  # whatever attention_backward settled on: part of the key

    def keys(q, k, v, offsets):
        return (attn_fwd._replay_key(q, k, v, offsets, offsets, params),
                attn_bwd._recipe_key(q, None, q, k, v, q, params, variant),
                triton_bwd._recipe_key(q, None, q, k, v, q, params))

    here, meta = keys(q, k, v, offsets), keys(*(t.to("meta") for t in (q, k, v, offsets)))
    assert all(key is not None for key in here + meta)
    assert all(a != b for a, b in zip(here, meta))
    with traced():
        assert not launch.replays_enabled()
        assert keys(q, k, v, offsets) == (None, None, None)


@needs_tlx
def test_broadcast_replay_declines_inside_a_cuda_graph_capture(gpu, monkeypatch):
    """A broadcast-Q replay launches with the output offsets it keeps (made outside any capture): inside a CUDA graph
    capture it declines (the full path makes offsets in the graph's pool), since a captured graph would read their
    memory on every replay after the replay and the per-shape cache let go of them (``launch.clear_cache``, the
    replay table's bound, the cache's 64 shapes): silently another tensor's data. A replay holding no tensor (jagged
    Q) still serves a capture (helper replay42)."""
    runs, answers = gpu
    q, k, v, offsets = _inputs([64, 17, 40, 5])
    calls = {"broadcast Q": lambda: tlx.forward(q[:40], k, v, None, offsets, _params(broadcast_q=True)),
             "jagged Q": lambda: tlx.forward(q, k, v, offsets, offsets, _params(causal=True))}
    for call in calls.values():
        call()  # makes its replay (outside a capture)
    monkeypatch.setattr(triton_fwd, "capturing", lambda device: True)
    for name, call in calls.items():
        answers.clear()
        call()
        assert [(kind, result is not None) for kind, result in answers] == [("replay", name == "jagged Q")], name


@needs_tlx
def test_kept_launches_are_verified_under_launch_verify(gpu, monkeypatch):
    """JFA_LAUNCH_VERIFY=1 (the GPU suite runs with it): the replay and the recipe still serve, and each of their
    launches is checked against Triton's own choice of binary (``launch._verify``, a stand-in here) with the values
    it launches."""
    runs, answers = gpu
    monkeypatch.setattr(launch, "VERIFY", True)
    checked = []
    monkeypatch.setattr(launch, "_verify", lambda kernel, compiled, grid, values, options: checked.append(
        (kernel.fn.__name__, values)))
    params = _params(causal=True)
    q, k, v, offsets = _inputs([64, 17, 40, 5])
    _forward(q, k, v, offsets, params)
    _backward(q, k, v, offsets, params, torch.randn_like(q))
    checked.clear()
    runs.clear()
    _forward(q, k, v, offsets, params)
    _backward(q, k, v, offsets, params, torch.randn_like(q))
    assert [kind for kind, _ in answers] == ["replay", "recipe"] and all(r is not None for _, r in answers)
    assert [name for name, _ in checked] == ["attn_fwd_tlx_kernel", "attn_bwd_delta_kernel", "attn_bwd_tlx_kernel",
                                             "attn_bwd_dq_finalize_kernel"]
    assert all(c[1] is r[2] for c, r in zip(checked, runs))


@needs_tlx
@pytest.mark.parametrize("where", ["clear_cache", "replays off", "recipes off"])
def test_no_kept_launches_where_the_full_path_must_run(gpu, monkeypatch, where):
    """launch.clear_cache() drops the tlx replays and recipes with the plans; replays off (launch.REPLAYS_ENABLED)
    or the backward recipes off (JFA_BWD_RECIPES=0: triton.attn_bwd.RECIPES_ENABLED) keep and use none."""
    runs, answers = gpu
    params = _params(causal=True)
    q, k, v, offsets = _inputs([64, 17, 40, 5])
    _forward(q, k, v, offsets, params)
    _backward(q, k, v, offsets, params, torch.randn_like(q))
    if where == "clear_cache":
        launch.clear_cache()
        assert not attn_fwd._REPLAYS and not attn_bwd._RECIPES
    elif where == "replays off":
        monkeypatch.setattr(launch, "REPLAYS_ENABLED", False)
    else:
        monkeypatch.setattr(triton_bwd, "RECIPES_ENABLED", False)
    answers.clear()
    _forward(q, k, v, offsets, params)
    _backward(q, k, v, offsets, params, torch.randn_like(q))
    expected = {"clear_cache": [], "replays off": [], "recipes off": ["replay"]}[where]
    assert [kind for kind, _ in answers] == expected


@needs_tlx
@pytest.mark.parametrize("rows", [64, 128])
def test_rebased_descriptors_equal_triton_built_ones(rows):
    """Kept launches build their descriptors from a kept layout over the call's tensor without TensorDescriptor's
    asserts (``triton.attn_fwd.rebase``: the caller checked them): every field equals Triton's own build over that
    tensor (a field Triton adds, or a default it changes, fails this), and the layout holds no tensor."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    q, _, _, _ = _inputs([64, 17, 40, 5])
    other, _, _, _ = _inputs([30, 1, 2], seed=1)
    fused, _, _, _ = _inputs([30, 1], fused=True)
    for t in (q, fused):
        layout = triton_fwd.descriptor_layout(triton_fwd.rows_descriptor(t, rows))
        assert not any(isinstance(x, torch.Tensor) for x in layout.values())
        built = triton_fwd.rebase(layout, t)
        assert type(built) is TensorDescriptor and built == triton_fwd.rows_descriptor(t, rows) and built.base is t
    layout = triton_fwd.descriptor_layout(triton_fwd.rows_descriptor(q, rows))
    assert triton_fwd.rebase(layout, other, other.shape[0]) == triton_fwd.rows_descriptor(other, rows)
    accumulators = [torch.zeros(t.shape, dtype=torch.float32) for t in (q, other)]
    layout = triton_fwd.descriptor_layout(attn_bwd._dq_descriptor(accumulators[0], rows, HEAD_DIM // 2))
    assert (triton_fwd.rebase(layout, accumulators[1], other.shape[0])
            == attn_bwd._dq_descriptor(accumulators[1], rows, HEAD_DIM // 2))


@needs_tlx
@pytest.mark.parametrize("knobs,want", [
    (dict(head_group=4, uniform_walk=True, group_order=True), (4, True, True)),
    (dict(head_group=0, uniform_walk=True, group_order=True), (0, False, False)),  # no head groups to order
    (dict(head_group=4, group_order=True), (0, False, False)),  # the schedule's ride on the uniform walk
    (dict(head_group=4, uniform_walk=True, item_order=True), (0, True, False)),  # the item order alone: no groups
])
def test_block_sparse_group_order_variant(monkeypatch, knobs, want):
    """``configs.BACKWARD_GROUP_ORDER`` (helper hgorder): the item order's kernel (item_order on) over a list in the
    head groups, so the variant (plan key) keeps head_group; without head groups or the uniform walk it is off."""
    seen = []
    monkeypatch.setattr(attn_bwd, "_full_backward", lambda *args: seen.append(args[10]))
    attn_bwd.block_sparse_backward(*(None,) * 11, _params(), **knobs)
    assert (seen[0].head_group, seen[0].item_order, seen[0].group_order) == want


def _block_sparse_backward_launch(runs, causal):
    """The TLX block-sparse backward kernel's arguments by name for a jagged call (tlx's ``_block_sparse_backward``,
    with configs as set): 8 kv heads, two KV blocks selected per Q block, one wave (the list's host ops would index
    with the stubbed list kernels' empty tensors)."""
    from jfa_ops.backends.base import BlockSparseParams

    lengths = [640, 17, 300, 5]
    q, k, v, offsets = _inputs(lengths)
    n_blocks = -(-max(lengths) // 128)
    index = torch.arange(n_blocks, dtype=torch.int32).expand(len(lengths), HEADS[1], n_blocks, n_blocks).contiguous()
    count = torch.full((len(lengths), HEADS[1], n_blocks), 2, dtype=torch.int32)
    out = torch.randn(q.shape, generator=torch.Generator().manual_seed(7)).to(q.dtype)
    lse = torch.randn(q.shape[1], q.shape[0])
    runs.clear()
    tlx._block_sparse_backward(torch.randn_like(q), None, q, k, v, out, lse, offsets, offsets, index, count,
                               BlockSparseParams(scale=HEAD_DIM ** -0.5, causal=causal))
    names = attn_bwd.attn_bwd_tlx_kernel.arg_names
    (launched,) = [dict(zip(names, values)) for name, _, values, _ in runs if name == "attn_bwd_tlx_kernel"]
    return launched


@needs_tlx
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_kv_early_reaches_the_block_sparse_kernel_only(gpu, monkeypatch, causal):
    """``configs.SPARSE_BACKWARD_KV_EARLY`` (helper sparsebwd45, env JFA_TLX_SPARSE_BWD_KV_EARLY; off by default) sets
    the block-sparse backward's KV_EARLY, and STORE_TMA with it where ``configs.BACKWARD_STORE_TMA`` is on (never
    without it); every other constexpr as without the knob (SPARSE, the uniform walk under the group order's list).
    The dense backward's KV_EARLY stays ``configs.BACKWARD_KV_EARLY``'s."""
    runs, _ = gpu
    assert not tlx_configs.SPARSE_BACKWARD_KV_EARLY and tlx_configs.SPARSE_BACKWARD
    launches = {}
    for on, tma in ((False, False), (True, False), (True, True), (False, True)):
        monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_KV_EARLY", on)
        monkeypatch.setattr(tlx_configs, "BACKWARD_STORE_TMA", tma)
        got = _block_sparse_backward_launch(runs, causal)
        assert got["SPARSE"] is True and got["UNIFORM_WALK"] is True
        assert got["KV_EARLY"] is on and got["STORE_TMA"] is (on and tma), (on, tma)
        assert (got["desc_dk"] is None) is not (on and tma)
        launches[on, tma] = got
    constexprs = [n for n in attn_bwd.attn_bwd_tlx_kernel.arg_names
                  if n.isupper() and n not in ("KV_EARLY", "STORE_TMA", "Q_OFF", "KV_OFF", "TILE_SEQ", "TILE_START",
                                               "TILE_COUNT", "WORK_COUNTER", "TILE_HEAD", "DK", "DV",
                                               "Q_BLOCK_INDEX", "Q_BLOCK_COUNT")]
    assert all({n: got[n] for n in constexprs} == {n: launches[False, False][n] for n in constexprs}
               for got in launches.values())
    # the dense backward ignores the sparse knob (its own: BACKWARD_KV_EARLY)
    monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_KV_EARLY", True)
    monkeypatch.setattr(tlx_configs, "BACKWARD_KV_EARLY", False)
    q, k, v, offsets = _inputs([300, 17, 700, 5])
    runs.clear()
    _backward(q, k, v, offsets, _params(causal=causal), torch.randn_like(q))
    (dense,) = [dict(zip(attn_bwd.attn_bwd_tlx_kernel.arg_names, values)) for name, _, values, _ in runs
                if name == "attn_bwd_tlx_kernel"]
    assert dense["SPARSE"] is False and dense["KV_EARLY"] is False


@needs_tlx
@pytest.mark.parametrize("causal", [False, True])
def test_causal_order_launches_the_streams_item_list(gpu, monkeypatch, causal):
    """``configs.BACKWARD_CAUSAL_ORDER`` (helper tlxbwdcausal): a masked dense call whose key tile list is sorted
    (not one wave) launches the TLX backward with ITEM_LIST and SNAKE over ``block_sparse_bwd.causal_item_list``'s
    items (one per key tile slot and kv head); a call without a mask launches the default (tile-major, no list)."""
    runs, _ = gpu
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)  # more items than programs: the sorted tile list
    monkeypatch.setattr(tlx_configs, "BACKWARD_CAUSAL_ORDER", True)
    q, k, v, offsets = _inputs([300, 17, 700, 5])
    _backward(q, k, v, offsets, _params(causal=causal), torch.randn_like(q))
    names = attn_bwd.attn_bwd_tlx_kernel.arg_names
    (launched,) = [dict(zip(names, values)) for name, _, values, _ in runs if name == "attn_bwd_tlx_kernel"]
    assert launched["ITEM_LIST"] is causal and launched["SNAKE"] is causal and not launched["HEAD_GROUPED"]
    if not causal:
        return
    # the tile list's kernels are stubbed here (its contents are test_item_order.py's): one entry per (slot, kv head)
    capacity = attn_bwd.capacity_of(q.shape[0], 128, len(offsets) - 1)
    assert [launched[n].numel() for n in ("TILE_SEQ", "TILE_START", "TILE_HEAD")] == [capacity * HEADS[1]] * 3


def _causal_call_and_repeat(runs, answers, monkeypatch, knob: str, value, q, k, v, offsets) -> list:
    """The TLX backward kernel's arguments of a causal call and of its repeat with ``tlx_configs.<knob>`` = value
    (recipes and answers cleared first: the repeat shows whether the first call kept a recipe)."""
    monkeypatch.setattr(tlx_configs, knob, value)
    attn_bwd._RECIPES.clear()
    answers.clear()
    names = attn_bwd.attn_bwd_tlx_kernel.arg_names
    launches = []
    for _ in range(2):  # a signature's first call, then its repeat
        runs.clear()
        _backward(q, k, v, offsets, _params(causal=True), torch.randn_like(q))
        (launched,) = [dict(zip(names, values)) for name, _, values, _ in runs if name == "attn_bwd_tlx_kernel"]
        launches.append(launched)
    return launches


def _knob_changes_one_constexpr(runs, answers, monkeypatch, knob: str, constexpr: str, q, k, v, offsets) -> None:
    """``tlx_configs.<knob>`` off, on, off again: a causal call and its repeat launch the backward with
    ``constexpr`` as the knob says, each setting served by its own recipe (the variant), every other constexpr
    the same either way."""
    launches = {}
    for on in (False, True, False):
        for launched in _causal_call_and_repeat(runs, answers, monkeypatch, knob, on, q, k, v, offsets):
            assert launched[constexpr] is on, launched[constexpr]
            launches[on] = launched
        assert [kind for kind, _ in answers] == ["recipe"], answers
    constexprs = [n for n in attn_bwd.attn_bwd_tlx_kernel.arg_names
                  if n.isupper() and n not in (constexpr, "Q_OFF", "KV_OFF", "TILE_SEQ", "TILE_START", "TILE_COUNT",
                                               "WORK_COUNTER", "TILE_HEAD", "DK", "DV", "Q_BLOCK_INDEX",
                                               "Q_BLOCK_COUNT")]
    assert {n: launches[True][n] for n in constexprs} == {n: launches[False][n] for n in constexprs}


@needs_tlx
def test_kv_early_reaches_the_kernel_where_it_applies(gpu, monkeypatch):
    """``configs.BACKWARD_KV_EARLY`` (helper window31, env JFA_TLX_BWD_KV_EARLY) sets the TLX backward's KV_EARLY,
    on by default, on a windowed jagged call and its repeat (served by the recipe it kept); ignored (False) where its
    staging buffer is not the epilogue's: a GQA split (dK/dV added from registers)."""
    runs, answers = gpu
    assert tlx_configs.BACKWARD_KV_EARLY  # on by default since the H200 timing of 2026-12-04
    q, k, v, offsets = _inputs([300, 17, 700, 5, 0, 1])
    names = attn_bwd.attn_bwd_tlx_kernel.arg_names
    window = _params(causal=True, window_left=256)
    for on in (False, True, False):
        monkeypatch.setattr(tlx_configs, "BACKWARD_KV_EARLY", on)
        attn_bwd._RECIPES.clear()
        answers.clear()
        for _ in range(2):  # a signature's first call, then its repeat
            runs.clear()
            _backward(q, k, v, offsets, window, torch.randn_like(q))
            launched = [dict(zip(names, values))["KV_EARLY"] for name, _, values, _ in runs
                        if name == "attn_bwd_tlx_kernel"]
            assert launched == [on], launched
        assert [kind for kind, _ in answers] == ["recipe"], answers
    monkeypatch.setattr(tlx_configs, "BACKWARD_KV_EARLY", True)
    monkeypatch.setattr(tlx_configs, "BACKWARD_GQA_SPLIT", 16)
    gq = torch.randn(q.shape[0], 8, HEAD_DIM).to(q.dtype)
    gk, gv = k[:, :2].contiguous(), v[:, :2].contiguous()
    runs.clear()
    _backward(gq, gk, gv, offsets, _params(causal=True), torch.randn_like(gq))
    (launched,) = [dict(zip(names, values)) for name, _, values, _ in runs if name == "attn_bwd_tlx_kernel"]
    assert launched["GROUP_SPLIT"] > 1 and launched["KV_EARLY"] is False


@needs_tlx
def test_peel_reaches_the_kernel_where_it_applies(gpu, monkeypatch):
    """``configs.BACKWARD_PEEL`` (helper peel37, env JFA_TLX_BWD_PEEL) sets the TLX backward's PEEL, off by default,
    on a causal jagged call and its repeat (each setting its own recipe: the variant); the kernel's other switches as
    without it."""
    runs, answers = gpu
    assert not tlx_configs.BACKWARD_PEEL  # off: 1.01x dense on the H200 (stop 37)
    _knob_changes_one_constexpr(runs, answers, monkeypatch, "BACKWARD_PEEL", "PEEL", *_inputs([300, 17, 700, 5, 0, 1]))


def _backward_launch(runs, call) -> dict:
    """The TLX backward kernel's arguments by name of the one launch ``call`` makes (``gpu``'s records)."""
    runs.clear()
    call()
    names = attn_bwd.attn_bwd_tlx_kernel.arg_names
    (values,) = [dict(zip(names, values)) for name, _, values, _ in runs if name == "attn_bwd_tlx_kernel"]
    return values


def _broadcast_and_causal_calls(q, k, v, offsets, lq: int = 40) -> tuple:
    """Two backward calls of the knob tests: broadcast-Q (the first ``lq`` rows of q as the shared queries, one output
    block per sequence) and causal jagged on q, k, v."""
    bq, bout = q[:lq], torch.randn(lq * (offsets.numel() - 1), q.shape[1], q.shape[2]).to(q.dtype)
    broadcast = lambda: tlx.backward(torch.randn_like(bout), None, bq, k, v, bout,  # noqa: E731
                                     torch.randn(q.shape[1], bout.shape[0]), None, offsets,
                                     _params(broadcast_q=True))
    causal = lambda: _backward(q, k, v, offsets, _params(causal=True), torch.randn_like(q))  # noqa: E731
    return broadcast, causal


def _launches_with_knob(monkeypatch, knob: str, calls: tuple, launched, answers):
    """(on, call, the kernel's arguments) of each of ``calls`` (broadcast, causal: ``_broadcast_and_causal_calls``)
    with ``configs.<knob>`` off, then on, each from an empty recipe table; after each, the repeat: a recipe serves the
    causal signature only with the knob off (none of these knobs has recipe support)."""
    for on in (False, True):
        monkeypatch.setattr(tlx_configs, knob, on)
        for call in calls:
            attn_bwd._RECIPES.clear()
            answers.clear()
            yield on, call, launched(call)
            launched(call)
            assert [kind for kind, _ in answers] == (["recipe"] if call is calls[-1] and not on else []), (knob, on)


def _assert_reads_every_row_block(desc, stats, block_rows: int = 64):
    """STATS_SMEM's descriptor over ``stats`` (fp32 [Hq, rows]) meets TMA's rules (base and row stride 16-byte
    aligned, the box [1, block_rows] with 16-byte rows) and a box at (r % 4, r - r % 4), an inner start a multiple of
    4 fp32, holds flat rows r .. r + block_rows - 1 of ``stats`` for every r, zeros past the end (TMA reads zeros
    past the descriptor's shape: emulated by padding)."""
    base, flat = desc.base, stats.reshape(-1).cpu()
    assert desc.block_shape == [1, block_rows] and desc.shape == list(base.shape) and desc.shape[0] == 4
    assert desc.strides[1] == 1 and desc.strides[0] * 4 % 16 == 0 and base.data_ptr() % 16 == 0
    assert base.dtype == torch.float32 and desc.shape[1] >= flat.numel()
    # bit patterns: delta comes from a launch stubbed here (torch.empty's garbage, NaN at times: torch.equal fails)
    tile = torch.nn.functional.pad(base.cpu(), (0, block_rows)).view(torch.int32)  # the box past the shape: zeros
    want = torch.nn.functional.pad(flat, (0, block_rows)).view(torch.int32)
    for r in range(flat.numel()):
        column = r - r % 4
        assert torch.equal(tile[r % 4, column:column + block_rows], want[r:r + block_rows]), r


@needs_tlx
def test_stats_smem_reaches_the_kernel_where_it_applies(gpu, monkeypatch):
    """``configs.BACKWARD_STATS_SMEM`` (helper lsedelta40, env JFA_TLX_BWD_STATS_SMEM), off by default, sets the TLX
    backward's STATS_SMEM with two descriptors over lse and delta, each 4 shifted copies of the flat vector (helper
    statssmem42: a TMA box's inner start must be 16-byte aligned), from which a box [1, 64] at (r % 4, r - r % 4)
    reads flat rows r .. r + 63 for every r (zeros past the end), on a causal jagged call and a broadcast-Q call (rows
    = sequences x Lq), STATS_AHEAD off beside it, no recipe kept (the repeat takes the full path); off, the default's
    launch (STATS_SMEM False, no descriptors) and its recipe. An lse view off 16-byte alignment reads the same; the
    MXFP8 backward ignores the knob."""
    runs, answers = gpu
    assert not tlx_configs.BACKWARD_STATS_SMEM  # off until timed on the H200
    q, k, v, offsets = _inputs([300, 17, 700, 5, 0, 1])
    launched = functools.partial(_backward_launch, runs)

    lq = 40
    broadcast, causal = _broadcast_and_causal_calls(q, k, v, offsets, lq)
    for on, call, got in _launches_with_knob(monkeypatch, "BACKWARD_STATS_SMEM", (broadcast, causal), launched,
                                             answers):
        rows = lq * (offsets.numel() - 1) if call is broadcast else q.shape[0]  # broadcast: sequences x Lq
        assert got["STATS_SMEM"] is on and got["STATS_AHEAD"] is False and got["KV_EARLY"] is True
        if on:
            for name, stats in (("desc_lse", got["Lse"]), ("desc_delta", got["Delta"])):
                assert stats.numel() == q.shape[1] * rows, name
                _assert_reads_every_row_block(got[name], stats)
        else:
            assert got["desc_lse"] is None and got["desc_delta"] is None
    # with it on: STATS_AHEAD's prefetch yields; an lse view 4 bytes off alignment is copied (same values)
    out = torch.randn(q.shape, generator=torch.Generator().manual_seed(7)).to(q.dtype)
    lse_storage = torch.randn(q.shape[1] * q.shape[0] + 1)
    lse = lse_storage[1:].view(q.shape[1], q.shape[0])
    assert lse.data_ptr() % 16 == 4
    got = launched(lambda: attn_bwd.attention_backward(torch.randn_like(q), None, q, k, v, out, lse, offsets, offsets,
                                                       _params(causal=True), dq_shared=True, stats_ahead=True,
                                                       stats_smem=True))
    assert got["STATS_SMEM"] is True and got["STATS_AHEAD"] is False
    _assert_reads_every_row_block(got["desc_lse"], lse)
    got = launched(lambda: attn_bwd.attention_backward(torch.randn_like(q), None, q, k, v, out, lse, offsets, offsets,
                                                       _params(causal=True), dq_shared=True, stats_smem=True,
                                                       mxfp8=True, delta_grad_out=torch.randn_like(q)))
    assert got["STATS_SMEM"] is False and got["desc_lse"] is None


@needs_tlx
def test_store_tma_reaches_the_kernel_where_it_applies(gpu, monkeypatch):
    """``configs.BACKWARD_STORE_TMA`` (helper dkvtma40, env JFA_TLX_BWD_STORE_TMA), off by default, sets the TLX
    backward's STORE_TMA with two row descriptors over the dK / dV outputs ([T_kv, Hkv x D], blocks [64, D]: a
    consumer's half-tile of keys) on a broadcast-Q call (the target) and a causal jagged call, no recipe kept (the
    repeat takes the full path); off, the default's launch (no descriptors) and its recipe. Where KV_EARLY does not
    run (the knob off, MXFP8) STORE_TMA stays off: it rides on KV_EARLY's staging buffer."""
    runs, answers = gpu
    assert not tlx_configs.BACKWARD_STORE_TMA  # off until timed on the H200
    q, k, v, offsets = _inputs([300, 17, 700, 5, 0, 1])
    launched = functools.partial(_backward_launch, runs)

    broadcast, causal = _broadcast_and_causal_calls(q, k, v, offsets)
    for on, _, got in _launches_with_knob(monkeypatch, "BACKWARD_STORE_TMA", (broadcast, causal), launched, answers):
        assert got["STORE_TMA"] is on and got["KV_EARLY"] is True
        if on:
            for name, out in (("desc_dk", got["DK"]), ("desc_dv", got["DV"])):
                desc = got[name]
                assert desc.base is out and out.shape == k.shape, name
                assert desc.shape == [k.shape[0], k.shape[1] * HEAD_DIM] and desc.block_shape == [64, HEAD_DIM]
                assert desc.strides == [k.shape[1] * HEAD_DIM, 1]
        else:
            assert got["desc_dk"] is None and got["desc_dv"] is None
    out = torch.randn(q.shape, generator=torch.Generator().manual_seed(7)).to(q.dtype)
    lse = torch.randn(q.shape[1], q.shape[0])
    for off in (dict(kv_early=False), dict(kv_early=True, mxfp8=True, delta_grad_out=torch.randn_like(q))):
        got = launched(lambda: attn_bwd.attention_backward(torch.randn_like(q), None, q, k, v, out, lse, offsets,
                                                           offsets, _params(causal=True), dq_shared=True,
                                                           store_tma=True, **off))
        assert got["STORE_TMA"] is False and got["desc_dk"] is None and got["KV_EARLY"] is False, off


def _causal_backward_launch(runs, monkeypatch, lengths, head_dim=HEAD_DIM, hints=False) -> dict:
    """The TLX backward kernel's arguments for a causal bf16 batch of ``lengths`` (``hints``: max_seqlen given)."""
    runs.clear()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), h, head_dim, generator=g).to(torch.bfloat16)
               for h in (HEADS[0], HEADS[1], HEADS[1]))
    offsets = torch.tensor([0] + list(lengths)).cumsum(0).to(torch.int32)
    longest = dict(max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths)) if hints else {}
    params = dataclasses.replace(_params(causal=True, **longest), scale=head_dim ** -0.5)
    _full(monkeypatch, lambda: _backward(q, k, v, offsets, params, torch.randn_like(q)))
    names = attn_bwd.attn_bwd_tlx_kernel.arg_names
    (values,) = [dict(zip(names, v)) for name, _, v, _ in runs if name == "attn_bwd_tlx_kernel"]
    return values


@needs_tlx
def test_causal_order_rule_head_dim_and_uniform_batches(gpu, monkeypatch):
    """helper causalorder2's rule for ``configs.BACKWARD_CAUSAL_ORDER``: a head dim below
    ``configs.CAUSAL_ORDER_MIN_HEAD_DIM`` keeps the default (tile-major, no list: its causal loop is not DRAM-bound);
    a causal batch of one length (the max_seqlen hints times B cover the rows) launches the list made once per shape
    (``uniform_causal_item_list``: no per-call list ops), the same tensors call after call; a jagged one the per-call
    list (capacity x kv heads entries)."""
    from jfa_ops.backends.triton.block_sparse_bwd import uniform_causal_item_list

    runs, _ = gpu
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)  # more items than programs: the sorted tile list
    monkeypatch.setattr(tlx_configs, "BACKWARD_CAUSAL_ORDER", True)

    def launched(lengths, head_dim=HEAD_DIM, hints=False):
        return _causal_backward_launch(runs, monkeypatch, lengths, head_dim, hints)

    assert not launched([300, 300, 300], head_dim=64, hints=True)["ITEM_LIST"]
    first, again = launched([300, 300, 300], hints=True), launched([300, 300, 300], hints=True)
    kept = uniform_causal_item_list(3, 300, HEADS[1], (HEADS[0] // HEADS[1]) * HEAD_DIM * 8,
                                    tlx_configs.CAUSAL_ORDER_L2_BYTES, 128, torch.device("cpu"))
    assert first["ITEM_LIST"] and all(first[n] is again[n] is t for n, t in zip(("TILE_SEQ", "TILE_START",
                                                                                   "TILE_HEAD"), kept))
    jagged = launched([300, 17, 700], hints=True)
    capacity = attn_bwd.capacity_of(1017, 128, 3)
    assert jagged["ITEM_LIST"] and jagged["TILE_HEAD"].numel() == capacity * HEADS[1]


@needs_tlx
def test_causal_order_without_the_device_list_takes_one_length_causal_batches_only(gpu, monkeypatch):
    """``configs.BACKWARD_CAUSAL_ORDER`` None (the default since stop 24's H200 timings, bench/NOTES.md v16) with
    the device-built list switched off (JFA_TLX_BWD_CAUSAL_ORDER_JAGGED=0): a one-length causal batch launches the
    kept list; a jagged batch, or one without the hints, the default (tile-major, no list: a per-call torch list
    costs ~59 host ops). With the device list (on by default, v21) those take a list too: the next test."""
    runs, _ = gpu
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)
    monkeypatch.setattr(tlx_configs, "BACKWARD_CAUSAL_ORDER", None)
    monkeypatch.setattr(tlx_configs, "BACKWARD_CAUSAL_ORDER_JAGGED", False)
    assert _causal_backward_launch(runs, monkeypatch, [300, 300, 300], hints=True)["ITEM_LIST"]
    assert not _causal_backward_launch(runs, monkeypatch, [300, 17, 700], hints=True)["ITEM_LIST"]
    assert not _causal_backward_launch(runs, monkeypatch, [300, 300, 300])["ITEM_LIST"]


@needs_tlx
def test_causal_order_jagged_builds_the_list_on_the_device(gpu, monkeypatch):
    """``configs.BACKWARD_CAUSAL_ORDER_JAGGED`` (helper jaggedorder), on by default: with CAUSAL_ORDER unset, a
    jagged causal call launches the list too, built by ``causal_streams_kernel`` then ``causal_items_kernel``
    (the torch list is not made): the kernel's TILE_SEQ / TILE_START / TILE_HEAD are the rows of the items kernel's
    output, and a repeat launches both through their launch plans (``launch.launch_planned``: no rebinding). A
    one-length batch keeps its kept list; D64 takes none, nor a GQA call where the split runs; a list of more
    items x tiles than
    ``configs.CAUSAL_ORDER_DEVICE_MAX_PAIRS`` is the torch one."""
    from jfa_ops.backends.triton.block_sparse_bwd import causal_items_kernel, uniform_causal_item_list

    assert tlx_configs.BACKWARD_CAUSAL_ORDER_JAGGED  # on since the H200 timing (bench/NOTES.md v21)
    runs, _ = gpu
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)  # more items than programs: the sorted tile list
    monkeypatch.setattr(tlx_configs, "BACKWARD_CAUSAL_ORDER", None)
    monkeypatch.setattr(tlx_configs, "BACKWARD_CAUSAL_ORDER_JAGGED", True)
    monkeypatch.setattr(attn_bwd, "causal_item_list", lambda *a: pytest.fail("the torch list was made"))
    lists = ("causal_streams_kernel", "causal_items_kernel")
    for repeat in (False, True):
        launched = _causal_backward_launch(runs, monkeypatch, [300, 17, 700], hints=True)
        made = [(name, values, options) for name, _, values, options in runs if name in lists]
        assert [name for name, _, _ in made] == list(lists)
        assert all((options is None) == repeat for _, _, options in made)  # None: launch._run of a plan
        names = causal_items_kernel.arg_names
        out = dict(zip(names, made[1][1]))["OUT"]
        n_items = attn_bwd.capacity_of(1017, 128, 3) * HEADS[1]
        assert launched["ITEM_LIST"] and launched["SNAKE"]
        for row, name in enumerate(("TILE_SEQ", "TILE_START", "TILE_HEAD")):
            got = launched[name]
            assert got.numel() == n_items and got.data_ptr() == out.data_ptr() + row * n_items * 4
    kept = _causal_backward_launch(runs, monkeypatch, [300, 300, 300], hints=True)
    assert kept["TILE_HEAD"] is uniform_causal_item_list(3, 300, HEADS[1], (HEADS[0] // HEADS[1]) * HEAD_DIM * 8,
                                                         tlx_configs.CAUSAL_ORDER_L2_BYTES, 128,
                                                         torch.device("cpu"))[2]
    assert not any(name in lists for name, *_ in runs)
    assert not _causal_backward_launch(runs, monkeypatch, [300, 17, 700], head_dim=64, hints=True)["ITEM_LIST"]
    # GQA where the split would run: _gqa_split's rule (a list to build: no split), asked as if none were
    monkeypatch.setattr(attn_bwd, "_gqa_split", lambda *a: (1, False) if a[4] else (2, False))
    monkeypatch.setattr(tlx_configs, "BACKWARD_GQA_SPLIT", -1)
    monkeypatch.setitem(globals(), "HEADS", (8, 4))
    split = _causal_backward_launch(runs, monkeypatch, [300, 17, 700], hints=True)
    assert split["GROUP_SPLIT"] == 2 and not split["ITEM_LIST"]
    monkeypatch.setattr(attn_bwd, "_gqa_split", lambda *a: (1, False))
    assert _causal_backward_launch(runs, monkeypatch, [300, 17, 700], hints=True)["ITEM_LIST"]
    monkeypatch.setitem(globals(), "HEADS", (8, 8))
    made = []  # over configs.CAUSAL_ORDER_DEVICE_MAX_PAIRS (items x tiles): the torch list
    monkeypatch.setattr(attn_bwd, "causal_item_list", lambda *a: made.append(a) or (a[0]["TILE_SEQ"],) * 3)
    pairs = attn_bwd.capacity_of(1017, 128, 3) ** 2 * HEADS[1]
    for limit, device in ((pairs, True), (pairs - 1, False)):
        monkeypatch.setattr(tlx_configs, "CAUSAL_ORDER_DEVICE_MAX_PAIRS", limit)
        made.clear()
        assert _causal_backward_launch(runs, monkeypatch, [300, 17, 700], hints=True)["ITEM_LIST"]
        assert len(made) == (not device) and any(name in lists for name, *_ in runs) == device

@needs_tlx
def test_causal_order_timing_columns_on_one_length(gpu, monkeypatch):
    """``tools/tlx_check.py backward-timing``'s JAGGED rows (helper uniformorder): its columns default (CAUSAL_ORDER
    None), causalorder (True) and causaljagged (None with CAUSAL_ORDER_JAGGED) launch the same kernels with the same
    arguments, the same kept list, on a one-length causal batch given the max_seqlen hints (the dense control row:
    its ratios are the harness's noise, not an order's cost); without the hints (the ``no hints`` row) the default
    launches the tile-major order (no list, no snake), causalorder the torch list and causaljagged the list built
    on the device."""
    runs, _ = gpu
    made = []  # torch lists made
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)  # more items than programs: the sorted tile list
    monkeypatch.setattr(attn_bwd, "causal_item_list", lambda *a: made.append("torch") or (a[0]["TILE_SEQ"],) * 3)
    columns = dict(default=(None, False), causalorder=(True, False), causaljagged=(None, True))
    lists = ("causal_streams_kernel", "causal_items_kernel")

    def column(name, hints):
        monkeypatch.setattr(tlx_configs, "BACKWARD_CAUSAL_ORDER", columns[name][0])
        monkeypatch.setattr(tlx_configs, "BACKWARD_CAUSAL_ORDER_JAGGED", columns[name][1])
        made.clear()
        launched = _causal_backward_launch(runs, monkeypatch, [300, 300, 300], hints=hints)
        return launched, [(n, tuple(grid), comparable_launch_values(v, ())) for n, grid, v, _ in runs], list(made)

    hinted = {name: column(name, True) for name in columns}
    first, launches, _ = hinted["default"]
    assert first["ITEM_LIST"] and first["SNAKE"] and not any(n in lists for n, *_ in launches)
    for launched, others, torch_list in hinted.values():
        assert others == launches and not torch_list
        assert all(launched[n] is first[n] for n in ("TILE_SEQ", "TILE_START", "TILE_HEAD"))  # the kept list
    plain = {name: column(name, False) for name in columns}
    assert not plain["default"][0]["ITEM_LIST"] and not plain["default"][0]["SNAKE"]  # tile-major
    assert plain["causalorder"][0]["ITEM_LIST"] and plain["causalorder"][2] == ["torch"]
    jagged, launches, torch_list = plain["causaljagged"]
    assert jagged["ITEM_LIST"] and jagged["SNAKE"] and not torch_list
    assert [n for n, *_ in launches if n in lists] == list(lists)


@needs_tlx
def test_backward_ablations_are_off_unless_asked_for(gpu, monkeypatch):
    """``configs.BACKWARD_ABLATE`` (helper bwdablate: stages removed from the kernel, TIMING ONLY, wrong gradients)
    is 0 unless JFA_TLX_BWD_ABLATE names stages, and the default backward launches ABLATE=0 without a warning; set,
    the launch carries its bits under a warning (plans apart: the variant keeps it), and a kernel variant the
    ablations do not cover (the dQ split off) refuses it."""
    import warnings

    assert os.environ.get("JFA_TLX_BWD_ABLATE") or tlx_configs.BACKWARD_ABLATE == 0
    assert tlx_configs.backward_ablation_mask("") == tlx_configs.backward_ablation_mask("none") == 0
    for names in tlx_configs.BACKWARD_ABLATION_RUNS:  # written in the bits' order (the kernel names' spelling)
        assert tlx_configs.backward_ablation_names(tlx_configs.backward_ablation_mask(names)) == names
    with pytest.raises(ValueError, match="unknown backward ablations"):
        tlx_configs.backward_ablation_mask("dq,softmax")
    runs, _ = gpu
    q, k, v, offsets = _inputs([300, 17])
    names = attn_bwd.attn_bwd_tlx_kernel.arg_names

    def ablate_launched():
        runs.clear()
        _backward(q, k, v, offsets, _params(causal=True), torch.randn_like(q))
        (values,) = [dict(zip(names, v)) for name, _, v, _ in runs if name == "attn_bwd_tlx_kernel"]
        return values["ABLATE"]

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning on the default path
        assert ablate_launched() == 0
    mask = tlx_configs.backward_ablation_mask("exp2,dq")
    monkeypatch.setattr(tlx_configs, "BACKWARD_ABLATE", mask)
    with pytest.warns(UserWarning, match="TIMING ONLY"):
        assert ablate_launched() == mask
    monkeypatch.setattr(tlx_configs, "BACKWARD_DQ_SHARED", False)
    with pytest.raises(ValueError, match="ablations"):
        ablate_launched()


@needs_tlx
@pytest.mark.parametrize("group, parts", [(8, 1), (8, 2), (8, 4), (8, 8), (4, 2), (6, 3)])
def test_group_parts_walk_every_q_head_once(group, parts):
    """GROUP_SPLIT (helper gqabwd): the kernel's own ``_group_part`` (its Python source on ints) maps the work units
    of a key tile (kv head x part) to q-head ranges that walk every q head of every group exactly once, each part
    group / parts heads of its own kv head."""
    heads_kv, walked = 3, []
    for unit in range(heads_kv * parts):
        kv_head, first, end = attn_bwd._group_part.fn(unit, group, parts)
        assert end - first == group // parts and 0 <= first < end <= group
        walked += [kv_head * group + g for g in range(first, end)]
    assert sorted(walked) == list(range(heads_kv * group))


@needs_tlx
def test_gqa_split_parts_rule():
    """``configs.gqa_split_parts``: 1 when off or when the items already fill the rounds (and for MHA), else the
    fewest divisor parts of the group that do, the whole group when none does. The bench's Hq16:Hkv2 T32768 row
    (284 key tile slots x 2 kv heads, 132 SMs): 4 parts at 16 rounds, 2 at 8."""
    parts = tlx_configs.gqa_split_parts
    assert parts(8, 568, 132, 0) == 1 and parts(1, 5, 132, 16) == 1 and parts(8, 2112, 132, 16) == 1
    assert parts(8, 568, 132, 16) == 4 and parts(8, 568, 132, 8) == 2 and parts(8, 10, 132, 16) == 8
    assert parts(6, 100, 132, 2) == 3  # divisors of 6: 1, 2, 3 (300 >= 264), 6


@needs_tlx
@pytest.mark.parametrize("rounds, parts", [(0, 1), (4, 2), (16, 4)])
def test_gqa_split_launches_group_parts(gpu, monkeypatch, rounds, parts):
    """``configs.BACKWARD_GQA_SPLIT`` (helper gqabwd): a GQA call (Hq8:Hkv2, 12 key tile slots: 24 items on 8 programs)
    launches GROUP_SPLIT = ``gqa_split_parts``' parts (4 rounds: 2; 16: the whole group of 4) under the snake with DK
    / DV the two slabs of one zeroed fp32 [2, T, Hkv, D] accumulator, and returns dk / dv in k's dtype; off (0), the
    default launch (GROUP_SPLIT 1, striding, DK / DV in k's dtype). A repeat launches the same (past one wave no
    recipe serves it)."""
    runs, answers = gpu
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 8)
    monkeypatch.setattr(tlx_configs, "BACKWARD_GQA_SPLIT", rounds)
    # the split's own launch: without it a causal call takes the device-built causal list (tested on its own)
    monkeypatch.setattr(tlx_configs, "BACKWARD_CAUSAL_ORDER_JAGGED", False)
    lengths = [300, 17, 700, 5]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), h, HEAD_DIM, generator=g).to(torch.bfloat16) for h in (8, 2, 2))
    offsets = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    names = attn_bwd.attn_bwd_tlx_kernel.arg_names
    for _ in range(2):
        runs.clear()
        _, (dq, dk, dv) = _backward(q, k, v, offsets, _params(causal=True), torch.randn_like(q))
        (launched,) = [dict(zip(names, values)) for name, _, values, _ in runs if name == "attn_bwd_tlx_kernel"]
        assert launched["GROUP_SPLIT"] == parts and launched["SNAKE"] is (parts > 1)
        acc = torch.float32 if parts > 1 else torch.bfloat16
        assert launched["DK"].dtype == launched["DV"].dtype == acc and launched["DK"].shape == k.shape
        if parts > 1:
            assert launched["DV"].data_ptr() - launched["DK"].data_ptr() == k.numel() * 4
            assert not launched["DK"].any() and not launched["DV"].any()  # zeroed (the stubbed kernel adds nothing)
        assert dk.dtype == dv.dtype == k.dtype and dk.shape == dv.shape == k.shape
        assert dk.untyped_storage().data_ptr() != dv.untyped_storage().data_ptr()  # the op's outputs never alias
    assert not answers  # the sorted list (24 x parts items > 8 programs): no recipe either way


@needs_tlx
@pytest.mark.parametrize("sms, hint, parts, snake", [(8, -1, 1, False), (8, 700, 1, True), (64, -1, 4, True),
                                                     (64, 700, 4, True)])
def test_gqa_split_auto_launches_the_plan(gpu, monkeypatch, sms, hint, parts, snake):
    """``JFA_TLX_BWD_GQA_SPLIT=auto`` (``configs.GQA_SPLIT_AUTO``, helper gqarule): the launch follows
    ``gqa_split.plan`` for the call's shapes (Hq8:Hkv2 causal, 1022 rows in 4 sequences; the max_seqlen hint or none):
    on 8 programs the default, or with the hint the snake alone (SNAKE, GROUP_SPLIT 1, dK/dV in k's dtype); on 64
    the group in 4 parts (fp32 dK/dV). The plan is read from shapes only (the same for any lengths of those sizes)."""
    from jfa_ops.backends import gqa_split

    runs, _ = gpu
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", sms)
    monkeypatch.setattr(tlx_configs, "BACKWARD_GQA_SPLIT", tlx_configs.GQA_SPLIT_AUTO)
    monkeypatch.setattr(tlx_configs, "BACKWARD_CAUSAL_ORDER_JAGGED", False)  # the plan's launch alone (see above)
    lengths = [300, 17, 700, 5]
    chosen = gqa_split.plan(4, 2, 4, sum(lengths), sum(lengths), hint, HEAD_DIM, (False, 0, True, 0), False, sms)
    assert (chosen.parts, chosen.snake) == (parts, snake)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), h, HEAD_DIM, generator=g).to(torch.bfloat16) for h in (8, 2, 2))
    offsets = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
    names = attn_bwd.attn_bwd_tlx_kernel.arg_names
    _, (dq, dk, dv) = _backward(q, k, v, offsets, _params(causal=True, max_seqlen_q=hint, max_seqlen_kv=hint),
                                torch.randn_like(q))
    (launched,) = [dict(zip(names, values)) for name, _, values, _ in runs if name == "attn_bwd_tlx_kernel"]
    assert launched["GROUP_SPLIT"] == parts and launched["SNAKE"] is snake
    assert launched["DK"].dtype == (torch.float32 if parts > 1 else torch.bfloat16)
    assert dk.dtype == dv.dtype == k.dtype


@needs_tlx
@pytest.mark.parametrize("mxfp8", [False, True])
def test_mxfp8_backward_launches_with_delta_from_the_given_dout(gpu, mxfp8):
    """The MXFP8 backward's host call (``attn_bwd.attention_backward(..., mxfp8=True, delta_grad_out=dO)``, helper
    mxbwdd; ``tlx/mxfp8_attn_bwd.py``): the delta pre-pass reads the given dO (the caller's, unquantized) while the
    TLX kernel's dO descriptor is over grad_out (the MX dO), the kernel launches with MXFP8 True, and no recipe is
    kept (a recipe's delta would read the walked dO); without it the same call launches MXFP8 False, delta from
    grad_out, and keeps its recipe."""
    runs, _ = gpu
    q, k, v, offsets = _inputs((300, 129))
    g = torch.Generator().manual_seed(3)
    do_mx, do = (torch.randn(q.shape, generator=g).to(q.dtype) for _ in range(2))
    out, lse = torch.randn(q.shape, generator=g).to(q.dtype), torch.randn(q.shape[1], q.shape[0])
    extra = dict(mxfp8=True, delta_grad_out=do) if mxfp8 else {}
    attn_bwd.attention_backward(do_mx, None, q, k, v, out, lse, offsets, offsets, _params(causal=True),
                                dq_shared=True, **extra)
    launched = {name: dict(zip(kernel.arg_names, values)) for name, _, values, _ in runs
                for kernel in (attn_bwd.attn_bwd_tlx_kernel, triton_bwd.attn_bwd_delta_kernel)
                if kernel.fn.__name__ == name}
    assert launched["attn_bwd_delta_kernel"]["DOut"] is (do if mxfp8 else do_mx)
    assert launched["attn_bwd_tlx_kernel"]["desc_do"].base is do_mx
    assert launched["attn_bwd_tlx_kernel"]["MXFP8"] is mxfp8
    assert bool(attn_bwd._RECIPES) is not mxfp8


@needs_tlx
@pytest.mark.parametrize("tma", [False, True])
def test_mxfp8_forward_factors_tma_launch(gpu, monkeypatch, tma):
    """``configs.MXFP8_FACTORS_TMA`` (helper mxbcast48) in the MXFP8 forward's host call: on, K's factors go
    through ``key_factor_tiles`` (its kernel given the [Hkv, T] factors) and the kernel gets FACTORS_TMA True with
    fp32 descriptors over the tiled K factors as [tiles x Hkv, 128] and V's column factors as [tiles x Hkv, D],
    boxes [1, 128] / [1, D] (rows the producer's coordinates tile x Hkv + head pick); factors given already tiled
    (tools/tlx_check.py's kernel-alone column) are not tiled again; off: no tiling launch, the descriptors None and
    FACTORS_TMA False (the loads' arguments), and factors given tiled a ValueError naming ``rebased`` before any
    launch (the loads would read them as [Hkv, T]: other keys' factors, review48)."""
    from jfa_ops.backends.tlx import mxfp8_attn_fwd
    from jfa_ops.backends.triton import mxfp8_rebase

    runs, _ = gpu
    monkeypatch.setattr(tlx_configs, "MXFP8_FACTORS_TMA", tma)
    lengths = (300, 129, 5)
    kv_off = torch.tensor([0, 300, 429, 434], dtype=torch.int32)
    hkv, dim, tiles = 2, 128, mxfp8_rebase.v_tiles(434, 3, 128)
    g = torch.Generator().manual_seed(5)
    q_mx = (torch.randn(434, 4, dim, generator=g).to(torch.float8_e4m3fn),
            torch.zeros(434, 4, dim // 32, dtype=torch.uint8).view(torch.float8_e8m0fnu))
    k_mx = (torch.randn(434, hkv, dim, generator=g).to(torch.float8_e4m3fn), q_mx[1][:, :hkv])
    v_mx = k_mx
    operands = (torch.empty(434, 4, dim, dtype=torch.float8_e4m3fn), torch.ones(4, 434),
                torch.empty(434, hkv, dim, dtype=torch.float8_e4m3fn), torch.rand(hkv, 434, generator=g),
                torch.empty(hkv * dim, tiles * 128, dtype=torch.float8_e4m3fn), torch.rand(tiles, hkv, dim))
    params = _params(causal=True, max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))
    for rebased in (operands, (*operands[:3], torch.rand(tiles, hkv, 128), *operands[4:])):
        runs.clear()
        if not tma and rebased[3].dim() == 3:
            with pytest.raises(ValueError, match="rebased: K's factors are tiled"):
                mxfp8_attn_fwd.attention_forward(q_mx, k_mx, v_mx, kv_off, kv_off, params, torch.bfloat16,
                                                 rebased=rebased)
            assert not runs
            continue
        mxfp8_attn_fwd.attention_forward(q_mx, k_mx, v_mx, kv_off, kv_off, params, torch.bfloat16, rebased=rebased)
        launched = {name: dict(zip(kernel.arg_names, values)) for name, _, values, _ in runs
                    for kernel in (mxfp8_attn_fwd.mxfp8_attn_fwd_tlx_kernel, mxfp8_rebase.key_factor_tiles_kernel)
                    if kernel.fn.__name__ == name}
        kernel = launched["mxfp8_attn_fwd_tlx_kernel"]
        assert kernel["FACTORS_TMA"] is tma
        tiled_given = rebased[3].dim() == 3
        assert ("key_factor_tiles_kernel" in launched) is (tma and not tiled_given)
        if not tma:
            assert kernel["desc_kf"] is None and kernel["desc_vf"] is None
            continue
        if not tiled_given:
            assert launched["key_factor_tiles_kernel"]["KF"] is rebased[3]
        kf, vf = kernel["desc_kf"], kernel["desc_vf"]
        assert list(kf.block_shape) == [1, 128] and list(vf.block_shape) == [1, dim]
        assert tuple(kf.base.shape) == (tiles * hkv, 128) and tuple(vf.base.shape) == (tiles * hkv, dim)
        assert vf.base.data_ptr() == rebased[5].data_ptr()
        if tiled_given:
            assert kf.base.data_ptr() == rebased[3].data_ptr()
        assert kf.base.stride(0) * 4 % 16 == 0 and vf.base.stride(0) * 4 % 16 == 0


def _mxfp8_forward_two_sequences():
    """One MXFP8 forward on a small causal batch of pre-quantized pairs (2 kv heads, D128, unit scales): the launch
    tests below read what it passed. Returns (pair, v_pair, kv_off) for tests that re-base them again."""
    from jfa_ops.backends.tlx import mxfp8_attn_fwd

    kv_off = torch.tensor([0, 300, 429], dtype=torch.int32)
    g = torch.Generator().manual_seed(5)
    pair = (torch.randn(429, 2, 128, generator=g).to(torch.float8_e4m3fn),
            torch.zeros(429, 2, 4, dtype=torch.uint8).view(torch.float8_e8m0fnu))
    v_pair = (pair[0], torch.zeros(429 // 32 + 2, 2, 128, dtype=torch.uint8).view(torch.float8_e8m0fnu))
    params = _params(causal=True, max_seqlen_q=300, max_seqlen_kv=300)
    mxfp8_attn_fwd.attention_forward(pair, pair, v_pair, kv_off, kv_off, params, torch.bfloat16)
    return pair, v_pair, kv_off


@needs_tlx
@pytest.mark.parametrize("factors_tma", [False, True])
@pytest.mark.parametrize("tiled", [False, True])
def test_mxfp8_forward_tiled_key_factors_launches(gpu, monkeypatch, tiled, factors_tma):
    """``configs.MXFP8_TILED_KEY_FACTORS`` (helper kfold50) in the MXFP8 forward's host call, every path that makes
    K's factors (pre-quantized pairs, which bf16 in with MXFP8_FUSED_QUANTIZE off also takes; bf16 in fused, with
    and without MXFP8_FUSED_V; GQA and broadcast-Q shapes): on with FACTORS_TMA, no ``key_factor_tiles`` launch (it
    is patched to raise) and K's one launch (``rebase_key_tiles_kernel``, or the quantize kernel with KEY_TILE 128)
    writes the tensor the kernel's K-factor descriptor reads; otherwise today's launches (``rebase_rows_kernel`` /
    KEY_TILE 0, then ``key_factor_tiles_kernel`` with FACTORS_TMA; nothing tiled without it), so the knob alone
    never tiles factors the loads would read as [Hkv, T]."""
    from jfa_ops.backends.tlx import mxfp8_attn_fwd
    from jfa_ops.backends.triton import mxfp8_quantize, mxfp8_rebase

    runs, _ = gpu
    monkeypatch.setattr(tlx_configs, "MXFP8_FACTORS_TMA", factors_tma)
    monkeypatch.setattr(tlx_configs, "MXFP8_TILED_KEY_FACTORS", tiled)
    one_launch = tiled and factors_tma
    if one_launch:
        def no_tiling(*a, **k):
            raise AssertionError("key_factor_tiles launched under MXFP8_TILED_KEY_FACTORS")
        monkeypatch.setattr(mxfp8_attn_fwd, "key_factor_tiles", no_tiling)
    kv_off = torch.tensor([0, 300, 429, 434], dtype=torch.int32)
    tiles, dim = mxfp8_rebase.v_tiles(434, 3, 128), 128
    g = torch.Generator().manual_seed(5)
    for hq, hkv, broadcast_q in ((4, 2, False), (4, 4, True)):  # GQA; broadcast-Q (one query block per sequence)
        rows_q = 128 if broadcast_q else 434
        q_mx = (torch.randn(rows_q, hq, dim, generator=g).to(torch.float8_e4m3fn),
                torch.zeros(rows_q, hq, dim // 32, dtype=torch.uint8).view(torch.float8_e8m0fnu))
        k_mx = (torch.randn(434, hkv, dim, generator=g).to(torch.float8_e4m3fn),
                torch.zeros(434, hkv, dim // 32, dtype=torch.uint8).view(torch.float8_e8m0fnu))
        v_mx = (k_mx[0], torch.zeros(434 // 32 + 3, hkv, dim, dtype=torch.uint8).view(torch.float8_e8m0fnu))
        bf16 = [torch.randn(rows_q, hq, dim).bfloat16(), torch.randn(434, hkv, dim).bfloat16(),
                torch.randn(434, hkv, dim).bfloat16()]
        q_off = None if broadcast_q else kv_off
        params = _params(causal=not broadcast_q, broadcast_q=broadcast_q, max_seqlen_q=128 if broadcast_q else 300,
                         max_seqlen_kv=300)
        calls = dict(
            pairs=lambda: mxfp8_attn_fwd.attention_forward(q_mx, k_mx, v_mx, q_off, kv_off, params, torch.bfloat16),
            bf16=lambda: mxfp8_attn_fwd.attention_forward_quantizing(*bf16, q_off, kv_off, params, "rceil"))
        for path, settings in (("pairs", {}), ("bf16", {}), ("bf16", {"MXFP8_FUSED_V": True})):
            runs.clear()
            with monkeypatch.context() as m:
                for name, value in settings.items():
                    m.setattr(tlx_configs, name, value)
                calls[path]()
            names = [name for name, _, _, _ in runs]
            kernel = [dict(zip(mxfp8_attn_fwd.mxfp8_attn_fwd_tlx_kernel.arg_names, values))
                      for name, _, values, _ in runs if name == "mxfp8_attn_fwd_tlx_kernel"]
            assert len(kernel) == 1 and kernel[0]["FACTORS_TMA"] is factors_tma
            assert names.count("key_factor_tiles_kernel") == int(factors_tma and not tiled), (path, names)
            if path == "pairs":
                k_launch = [dict(zip(mxfp8_rebase.rebase_key_tiles_kernel.arg_names, values))
                            for name, _, values, _ in runs if name == "rebase_key_tiles_kernel"]
                assert names.count("rebase_rows_kernel") == (1 if one_launch else 2), names  # Q (and K)
                k_factors = k_launch[0]["KFT"] if one_launch else None
                assert len(k_launch) == int(one_launch)
            else:
                quantize = [dict(zip(mxfp8_quantize.mxfp8_quantize_kernel.arg_names, values))
                            for name, _, values, _ in runs if name == "mxfp8_quantize_kernel"]
                assert sorted(q["KEY_TILE"] for q in quantize) == sorted([0, 0, 128 if one_launch else 0])
                k_factors = next((q["F"] for q in quantize if q["KEY_TILE"]), None)
            if one_launch:  # the descriptor's base is the tensor K's launch wrote, [tiles, Hkv, 128]
                assert k_factors.shape == (tiles, hkv, 128)
                assert kernel[0]["desc_kf"].base.data_ptr() == k_factors.data_ptr()
            elif factors_tma:
                tiling = [dict(zip(mxfp8_rebase.key_factor_tiles_kernel.arg_names, values))
                          for name, _, values, _ in runs if name == "key_factor_tiles_kernel"]
                assert kernel[0]["desc_kf"].base.data_ptr() == tiling[0]["KFT"].data_ptr()
            else:
                assert kernel[0]["desc_kf"] is None and kernel[0]["KF"].shape == (hkv, 434)


@needs_tlx
@pytest.mark.parametrize("permuted", [False, True])
def test_mxfp8_forward_permuted_v_keys_launch(gpu, monkeypatch, permuted):
    """``configs.MXFP8_PERMUTED_V_KEYS`` (helper mxfmul49) in the MXFP8 forward's host call: the re-basing stage
    writes V^T in the order the kernel reads it (``rebase_v_tiles_kernel`` PERMUTED_KEYS and the TLX kernel's
    PERMUTED_V_KEYS both the knob's value), and ``rebase_operands(..., permuted_v_keys=False)`` (tools/tlx_check.py's
    float64 model of the natural order) the natural order whatever the knob."""
    from jfa_ops.backends.tlx import mxfp8_attn_fwd
    from jfa_ops.backends.triton import mxfp8_rebase

    runs, _ = gpu
    monkeypatch.setattr(tlx_configs, "MXFP8_PERMUTED_V_KEYS", permuted)
    pair, v_pair, kv_off = _mxfp8_forward_two_sequences()
    launched = {name: dict(zip(kernel.arg_names, values)) for name, _, values, _ in runs
                for kernel in (mxfp8_attn_fwd.mxfp8_attn_fwd_tlx_kernel, mxfp8_rebase.rebase_v_tiles_kernel)
                if kernel.fn.__name__ == name}
    assert launched["rebase_v_tiles_kernel"]["PERMUTED_KEYS"] is permuted
    assert launched["mxfp8_attn_fwd_tlx_kernel"]["PERMUTED_V_KEYS"] is permuted
    runs.clear()
    mxfp8_attn_fwd.rebase_operands(pair, pair, v_pair, kv_off, permuted_v_keys=False)
    assert [dict(zip(mxfp8_rebase.rebase_v_tiles_kernel.arg_names, values))["PERMUTED_KEYS"]
            for name, _, values, _ in runs if name == "rebase_v_tiles_kernel"] == [False]


@needs_tlx
@pytest.mark.parametrize("one_column", [False, True])
def test_mxfp8_forward_rowsum_one_column_launch(gpu, monkeypatch, one_column):
    """``configs.MXFP8_ROWSUM_ONE_COLUMN`` (helper mxexact50) reaches the MXFP8 forward's launch: the TLX kernel's
    ROWSUM_ONE_COLUMN is the knob's value (the GPU twin compares it with the shipped kernel bit for bit, which a
    knob that never reached the kernel would pass too)."""
    from jfa_ops.backends.tlx import mxfp8_attn_fwd

    runs, _ = gpu
    monkeypatch.setattr(tlx_configs, "MXFP8_ROWSUM_ONE_COLUMN", one_column)
    _mxfp8_forward_two_sequences()
    kernel = mxfp8_attn_fwd.mxfp8_attn_fwd_tlx_kernel
    launched = [dict(zip(kernel.arg_names, values)) for name, _, values, _ in runs if name == kernel.fn.__name__]
    assert len(launched) == 1 and launched[0]["ROWSUM_ONE_COLUMN"] is one_column


@needs_tlx
@pytest.mark.parametrize("keys_on", [False, True])
def test_mxfp8_ablation_exact_knob_columns(monkeypatch, keys_on):
    """``tools/tlx_check.py mxfp8-ablation``'s exact-option columns (helpers mxfmul49, mxexact50), each column's
    kernel call recorded instead of timed: "none" with the defaults; the keys column with PERMUTED_V_KEYS' other
    setting and V^T re-based in that order; "none, lq one column" with ROWSUM_ONE_COLUMN on and the default's
    operands; "none, keys perm + 1 col" with both on and V^T in the permuted order (whichever the default is); every
    column with the factors by TMA; the bf16-in call as shipped and with PERMUTED_V_KEYS' other setting."""
    import types

    import jfa_ops

    from jfa_ops.backends.tlx import mxfp8_attn_fwd
    from jfa_ops.backends.triton import mxfp8_rebase

    tool = _tlx_check_tool()
    monkeypatch.syspath_prepend(os.path.join(ROOT, "tools"))  # host_profile, as for the script run from tools/
    monkeypatch.setattr(tlx_configs, "MXFP8_PERMUTED_V_KEYS", keys_on)
    monkeypatch.setattr(tlx_configs, "MXFP8_ROWSUM_ONE_COLUMN", False)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(multi_processor_count=132))
    kv_off = torch.tensor([0, 128], dtype=torch.int32)
    vt_default, vt_other = object(), object()
    case = dict(inputs=(None, None, None, None, kv_off), rebased=("q", "qf", "k", "kf", vt_default, "vf"),
                pairs=("qp", "kp", ("vp", "vs")), params=None, case=None, label="row", n_blocks=1, flops=1.0,
                max_q=1, max_kv=1, opts={})
    monkeypatch.setattr(tool, "_mx_headline_cases", lambda keys: [case])
    monkeypatch.setattr(tool, "fa4_forward", lambda c, inputs: (None, "stub"))
    monkeypatch.setattr(mxfp8_attn_fwd, "tiled_key_factors", lambda kf, off, n: "kf tiles")
    monkeypatch.setattr(mxfp8_rebase, "rebase_v_tiles", lambda vp, vs, off, n, permuted_keys: (
        vt_other if permuted_keys != keys_on else vt_default, "vf2"))
    monkeypatch.setattr(mxfp8_attn_fwd, "attention_forward", lambda *a, rebased=None: (
        tlx_configs.MXFP8_FACTORS_TMA, tlx_configs.MXFP8_PERMUTED_V_KEYS, tlx_configs.MXFP8_ROWSUM_ONE_COLUMN,
        rebased[3], rebased[4]))
    monkeypatch.setattr(jfa_ops, "mxfp8_attention", lambda *a, **kw: ("bf16 in", tlx_configs.MXFP8_PERMUTED_V_KEYS))
    calls = {}
    monkeypatch.setattr(tool, "_medians", lambda label, fns, rounds=1: (
        calls.update({col: fn() for col, fn in fns.items() if col.startswith(("none", "mxfp8 bf16 in"))}) or {}, 0))
    monkeypatch.setenv("TLX_MX_RUNS", "none")
    assert tool.mxfp8_ablation() == 0
    keys_col = tool.MX_NATURAL_V_KEYS if keys_on else tool.MX_PERMUTED_V_KEYS
    permuted_vt = vt_default if keys_on else vt_other
    assert calls["none"] == (True, keys_on, False, "kf tiles", vt_default)
    assert calls[keys_col] == (True, not keys_on, False, "kf tiles", vt_other)
    assert calls[tool.MX_ROWSUM_ONE_COLUMN] == (True, keys_on, True, "kf tiles", vt_default)
    assert calls[tool.MX_EXACT_BOTH] == (True, True, True, "kf tiles", permuted_vt)
    # the bf16-in call as shipped, and with PERMUTED_V_KEYS' other setting (stop 53: its re-basing store)
    assert calls[tool.MX_BF16_IN] == ("bf16 in", keys_on)
    bf16_in_col = tool.MX_BF16_IN_V_NATURAL if keys_on else tool.MX_BF16_IN_V_PERMUTED
    assert calls[bf16_in_col] == ("bf16 in", not keys_on) and len(calls) == 7

# helper sparsehg47's head-group rule (configs.sparse_auto_head_group) on self-attention batches, 132 SMs and a 50 MiB
# L2 (the H100's and H200's): (label, kv heads, q heads per kv head, head dim, lengths, causal, the group it gives
# after head_group's divisor rule). tools/sparse_bwd_model.py --groups holds the model's choice beside each kind.
_BENCH_LENS = (16384, 128, 2688, 896, 1024, 1280, 256, 1280, 640, 16384, 2048, 1024, 1152, 768, 512, 1024, 2816, 1280,
               4992, 1280, 1664, 7424)
AUTO_GROUP_CASES = (
    ("bench", 16, 1, 128, _BENCH_LENS, False, 1),  # one head's rows 1.3 L2s; skew 1.36
    ("bench causal", 16, 1, 128, _BENCH_LENS, True, 2),  # skew 2.72: one head's items balance badly
    ("bench x2 causal", 16, 1, 128, tuple(2 * n for n in _BENCH_LENS), True, 1),  # twice the items a head: 1.36
    ("4 x 16k causal", 16, 1, 128, (16384,) * 4, True, 1),  # even lengths: 0.52
    ("3 x 16k + 8 x 2k causal", 16, 1, 128, (16384,) * 3 + (2048,) * 8, True, 1),  # 1.42
    ("2 x 32k + 16 x 1k causal", 16, 1, 128, (32768,) * 2 + (1024,) * 16, True, 2),  # 2.97
    ("2 x 32k + 16 x 1k", 16, 1, 128, (32768,) * 2 + (1024,) * 16, False, 1),  # 1.48
    ("22 x 1k", 16, 1, 128, (1024,) * 22, False, 2),  # one head's rows fit the L2: groups of 2 hit already
    ("bench D64", 16, 1, 64, _BENCH_LENS, False, 2),  # the same, at half the bytes a row
    ("4 x 32k D64", 16, 1, 64, (32768,) * 4, False, 1),
    ("bench GQA 2:1", 8, 2, 128, _BENCH_LENS, False, 2),  # skew x2: 2.72
    ("bench GQA 4:1", 4, 4, 128, _BENCH_LENS, False, 2),
    ("4 x 7.5k GQA 2:1", 8, 2, 128, (7680,) * 4, False, 1),  # 1.10
    ("4 x 7.5k GQA 2:1 causal", 8, 2, 128, (7680,) * 4, True, 2),  # 2.20
    ("bench 2 kv heads", 2, 1, 128, _BENCH_LENS, False, 1),  # groups of 1 (the default's 2 is all: tile-major, 0)
    ("bench 2 kv heads causal", 2, 1, 128, _BENCH_LENS, True, 0),
    ("bench 1 kv head", 1, 1, 128, _BENCH_LENS, False, 0),
)


@needs_tlx
def test_sparse_auto_head_group_rule_table():
    """``configs.sparse_auto_head_group`` (helper sparsehg47, JFA_TLX_SPARSE_BWD_AUTO_GROUP) through ``head_group``'s
    divisor rule: groups of 1 where one kv head's query-side rows overflow the L2 and a group of one head's skew
    (longest item over an SM's share, bounded from shapes) is at most AUTO_GROUP_MAX_SKEW; else the default's
    SPARSE_HEAD_GROUP. The table's comments give each case's term; a GPU of twice the SMs halves a head's share."""
    assert tlx_configs.SPARSE_HEAD_GROUP == 2
    for label, hkv, per_kv, dim, lens, causal, want in AUTO_GROUP_CASES:
        group = tlx_configs.sparse_auto_head_group(hkv, per_kv, dim, sum(lens), sum(lens), len(lens), max(lens),
                                                   causal, 132, 50 << 20)
        assert tlx_configs.head_group(hkv, group, sparse=True) == want, label
    bench = (16, 1, 128, sum(_BENCH_LENS), sum(_BENCH_LENS), len(_BENCH_LENS), max(_BENCH_LENS), False)
    assert tlx_configs.sparse_auto_head_group(*bench, 264, 50 << 20) == 2  # 2.72 on twice the SMs
    assert tlx_configs.sparse_auto_head_group(*bench, 132, 80 << 20) == 2  # the rows fit an 80 MiB L2
    # degenerate calls keep the default
    for args in ((16, 1, 128, 0, 0, 0, 0), (16, 1, 128, 66944, 66944, 22, -1)):
        assert tlx_configs.sparse_auto_head_group(*args, False, 132, 50 << 20) == tlx_configs.SPARSE_HEAD_GROUP


@needs_tlx
def test_sparse_auto_head_group_reaches_the_call(monkeypatch):
    """tlx's ``_sparse_head_group`` (the block-sparse backward's group): the default's without the knob, the rule's
    with it from the call's shapes alone (expanded tensors: no data read, no sync), the longest sequence from
    max_seqlen_kv or else the selection's key-block extent; an explicit JFA_TLX_BWD_HEAD_GROUP wins."""
    from jfa_ops.backends.base import BlockSparseParams

    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 132)  # CPU tensors: the interpreter's SMs, a 50 MiB L2
    lens = _BENCH_LENS
    offsets = torch.tensor([0, *lens]).cumsum(0).to(torch.int32)
    rows = sum(lens)
    q = torch.empty(1, 1, 1, dtype=torch.bfloat16).expand(rows, 16, 128)
    k = torch.empty(1, 1, 1, dtype=torch.bfloat16).expand(rows, 16, 128)
    index = torch.empty(1, 1, 1, 1, dtype=torch.int32).expand(len(lens), 16, 128, 128)  # 128 key blocks: 16384
    for causal, max_kv, want in ((False, -1, 1), (True, -1, 2), (False, 16384, 1), (True, 16384, 2),
                                 (True, 2048, 1)):  # a (wrong) short max_seqlen_kv: the rule reads the hint
        params = BlockSparseParams(scale=0.1, causal=causal, max_seqlen_kv=max_kv)
        monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_AUTO_GROUP", False)
        assert tlx._sparse_head_group(q, k, offsets, index, params) == 2
        monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_AUTO_GROUP", True)
        assert tlx._sparse_head_group(q, k, offsets, index, params) == want, (causal, max_kv)
        monkeypatch.setattr(tlx_configs, "BACKWARD_HEAD_GROUP", 4)
        assert tlx._sparse_head_group(q, k, offsets, index, params) == 4
        monkeypatch.setattr(tlx_configs, "BACKWARD_HEAD_GROUP", None)
    monkeypatch.setattr(tlx_configs, "AUTO_GROUP_L2_BYTES", rows * 8 * 128 + 1)  # one head's rows fit: the default
    assert tlx._sparse_head_group(q, k, offsets, index, BlockSparseParams(scale=0.1)) == 2


@needs_tlx
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_auto_head_group_launches_the_default_kernel_over_groups_of_one(gpu, monkeypatch, causal):
    """With the knob on, the block-sparse backward launches the default's kernel (every constexpr equal: no new
    specialization); the head group reaches ``item_list`` (the list the kernel reads where it takes one): the
    default's 2 on a small call, 1 once the rule's bounds let it (the L2 shrunk, the skew bound opened)."""
    runs, _ = gpu
    groups = []

    def item_list(schedule, q_count, heads_kv, block_kv, head_group, *rest):  # the group; a list of the right size
        groups.append(head_group)  # (the stubbed selection kernels leave the counts the real list indexes unset)
        n = schedule["TILE_SEQ"].numel() * heads_kv
        return tuple(torch.zeros(n, dtype=torch.int32) for _ in range(3))
    monkeypatch.setattr(attn_bwd, "item_list", item_list)
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)  # more items than programs: the item list is built
    monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_SECTIONS", False)  # head groups order the list (sections: on)
    monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_AUTO_GROUP", False)  # the rule off (on by default since stop 48)
    default = _block_sparse_backward_launch(runs, causal)
    monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_AUTO_GROUP", True)
    small = _block_sparse_backward_launch(runs, causal)
    monkeypatch.setattr(tlx_configs, "AUTO_GROUP_L2_BYTES", 1)
    monkeypatch.setattr(tlx_configs, "AUTO_GROUP_MAX_SKEW", float("inf"))
    auto = _block_sparse_backward_launch(runs, causal)
    assert groups == [2, 2, 1], groups
    constexprs = [n for n in attn_bwd.attn_bwd_tlx_kernel.arg_names if n.isupper() and n not in (
        "Q_OFF", "KV_OFF", "TILE_SEQ", "TILE_START", "TILE_COUNT", "WORK_COUNTER", "TILE_HEAD", "DK", "DV",
        "Q_BLOCK_INDEX", "Q_BLOCK_COUNT")]
    assert {n: auto[n] for n in constexprs} == {n: default[n] for n in constexprs} == {n: small[n] for n in constexprs}
    assert auto["ITEM_LIST"] is True and auto["TILE_HEAD"] is not None


def _fake_item_lists(monkeypatch):
    """The TLX sparse backward's item list builders replaced by stand-ins that record (which: "groups" for
    ``item_list``, "sections" for ``sectioned_item_list``, "sectionsdev" for ``sectioned_item_list_device``,
    heads_kv, the other arguments) and return a list of the right size (the stubbed list kernels leave the counts
    the real lists index unset). Returns the records."""
    calls = []

    def fake(name):
        def build(schedule, q_count, heads_kv, *rest):
            calls.append((name, heads_kv) + tuple(rest))
            n = schedule["TILE_SEQ"].numel() * heads_kv
            return tuple(torch.zeros(n, dtype=torch.int32) for _ in range(3))
        return build
    monkeypatch.setattr(attn_bwd, "item_list", fake("groups"))
    monkeypatch.setattr(attn_bwd, "sectioned_item_list", fake("sections"))
    monkeypatch.setattr(attn_bwd, "sectioned_item_list_device", fake("sectionsdev"))
    return calls


@needs_tlx
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_sections_launch_the_default_kernel_over_the_sectioned_list(gpu, monkeypatch, causal):
    """``configs.SPARSE_BACKWARD_SECTIONS`` (stop 54; on since stop 55's GPU twins passed) hands the block-sparse
    backward's item list to ``sectioned_item_list`` with the query rows' bytes (Q, dO, fp32 dQ of a kv head's q
    heads), the sections' L2 bytes, the rows and the walks' bound, and launches the kernel the head groups' list
    launches (every constexpr equal); off, ``item_list`` builds it. Fails if the knob is not read or the list's
    arguments drift."""
    runs, _ = gpu
    calls = _fake_item_lists(monkeypatch)
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)  # more items than programs: the item list is built
    monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_SECTIONS", True)
    monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_SECTIONS_DEVICE", False)  # the torch list (the device's: below)
    sections = _block_sparse_backward_launch(runs, causal)
    monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_SECTIONS", False)
    groups = _block_sparse_backward_launch(runs, causal)
    heads_q, heads_kv = HEADS
    row_bytes = heads_q // heads_kv * HEAD_DIM * (2 * 2 + 4)
    assert [c[0] for c in calls] == ["sections", "groups"], calls
    block_kv, q_off, got_bytes, l2, rows, width = calls[0][2:]
    assert (block_kv, got_bytes, l2, rows) == (128, row_bytes, tlx_configs.CAUSAL_ORDER_L2_BYTES, 640 + 17 + 300 + 5)
    assert q_off.tolist() == [0, 640, 657, 957, 962] and width == 5
    constexprs = [n for n in attn_bwd.attn_bwd_tlx_kernel.arg_names if n.isupper() and n not in (
        "Q_OFF", "KV_OFF", "TILE_SEQ", "TILE_START", "TILE_COUNT", "WORK_COUNTER", "TILE_HEAD", "DK", "DV",
        "Q_BLOCK_INDEX", "Q_BLOCK_COUNT")]
    assert {n: sections[n] for n in constexprs} == {n: groups[n] for n in constexprs}
    assert sections["ITEM_LIST"] is True and sections["TILE_HEAD"] is not None


@needs_tlx
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_sections_device_builds_the_same_list_on_the_device(gpu, monkeypatch, causal):
    """``configs.SPARSE_BACKWARD_SECTIONS_DEVICE`` (on by default since stop 56) hands the sectioned list to
    ``sectioned_item_list_device`` with ``sectioned_item_list``'s arguments, and launches the same kernel (every
    constexpr equal); off, the torch list. Fails if the switch is not read per call or the arguments drift."""
    runs, _ = gpu
    calls = _fake_item_lists(monkeypatch)
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 3)  # more items than programs: the item list is built
    monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_SECTIONS", True)
    assert tlx_configs.SPARSE_BACKWARD_SECTIONS_DEVICE is True  # the default (stop 56's timing)
    monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_SECTIONS_DEVICE", False)
    torch_list = _block_sparse_backward_launch(runs, causal)
    monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_SECTIONS_DEVICE", True)
    device_list = _block_sparse_backward_launch(runs, causal)
    assert [c[0] for c in calls] == ["sections", "sectionsdev"], calls
    (_, *want), (_, *got) = calls
    assert got[:2] + got[3:] == want[:2] + want[3:] and got[2].tolist() == want[2].tolist()  # q_off: a new tensor
    constexprs = [n for n in attn_bwd.attn_bwd_tlx_kernel.arg_names if n.isupper() and n not in (
        "Q_OFF", "KV_OFF", "TILE_SEQ", "TILE_START", "TILE_COUNT", "WORK_COUNTER", "TILE_HEAD", "DK", "DV",
        "Q_BLOCK_INDEX", "Q_BLOCK_COUNT")]
    assert {n: device_list[n] for n in constexprs} == {n: torch_list[n] for n in constexprs}
    assert device_list["ITEM_LIST"] is True and device_list["TILE_HEAD"] is not None


@needs_tlx
@pytest.mark.parametrize("sections", [False, True], ids=["groups", "sections"])
@pytest.mark.parametrize("name", SPARSE_KV_EARLY_CASES)
def test_sections_twin_builds_an_item_list_on_every_case(gpu, monkeypatch, name, sections):
    """The GPU sections twin (``test_tlx_gpu.py``
    ``test_tlx_block_sparse_backward_sections_match_the_oracle_and_keep_dk_dv``) in its setting
    (``sections_twin_knobs``), on its cases' shapes with an H100's SMs and L2 (the ``gpu`` fixture's 132, the host
    rules' 50 MiB): the TLX block-sparse backward builds one item list a call, the sectioned one with
    SPARSE_BACKWARD_SECTIONS (the head groups' for broadcast Q), ``item_list`` without. Stop 54's twin (without
    ITEM_ORDER) built none on the 2-kv-head cases, where the head-group rule gives head group 0: this fails there
    without it, as that GPU run did on exactly those four cases."""
    from jfa_ops.backends.base import BlockSparseParams
    from tests.backends.test_tlx_gpu import SPARSE_BWD_CASES, sections_twin_knobs

    runs, _ = gpu
    sections_twin_knobs(monkeypatch)
    monkeypatch.setattr(tlx_configs, "SPARSE_BACKWARD_SECTIONS", sections)
    calls = _fake_item_lists(monkeypatch)
    bc = SPARSE_BWD_CASES[name]
    c = bc.case.replace(device="cpu")
    x = c.make_inputs(1)
    q_rows = x.q.shape[0] if c.broadcast_q else max(c.q_lengths)
    index = torch.zeros((len(c.kv_lengths), c.heads_kv, -(-q_rows // bc.block_q),
                         -(-max(c.kv_lengths) // bc.block_kv)), dtype=torch.int32)
    count = torch.ones(index.shape[:3], dtype=torch.int32)
    out = torch.zeros((x.kv_offsets.numel() - 1) * x.q.shape[0] if c.broadcast_q else x.q.shape[0], c.heads_q,
                      c.head_dim, dtype=c.dtype)
    lse = torch.zeros(c.heads_q, out.shape[0])
    params = BlockSparseParams(scale=c.head_dim ** -0.5, causal=c.causal, window_left=c.window[0],
                               window_right=c.window[1], broadcast_q=c.broadcast_q, block_q=bc.block_q,
                               block_kv=bc.block_kv)
    runs.clear()
    tlx._block_sparse_backward(torch.zeros_like(out), None, x.q, x.k, x.v, out, lse, x.q_offsets, x.kv_offsets, index,
                               count, params)
    (launched,) = [dict(zip(attn_bwd.attn_bwd_tlx_kernel.arg_names, values)) for kernel, _, values, _ in runs
                   if kernel == "attn_bwd_tlx_kernel"]
    sectioned = "sectionsdev" if tlx_configs.SPARSE_BACKWARD_SECTIONS_DEVICE else "sections"  # the default: dev
    assert [call[0] for call in calls] == [sectioned if sections and not c.broadcast_q else "groups"], calls
    assert launched["ITEM_LIST"] is True and launched["SNAKE"] is True and launched["SPARSE"] is True


@needs_tlx
def test_sparse_bwd_ablation_auto_column_names_the_rule_group():
    """``tools/tlx_check.py sparse-bwd-ablation``'s "auto" column turns SPARSE_BACKWARD_AUTO_GROUP on, and the group it
    prints per row is the rule's: on the bench's four sparse rows (H100 and H200: 132 SMs, 50 MiB L2) groups of 1
    unmasked, the default's 2 causal (the device command's prediction in bench/NOTES.md rests on it)."""
    from bench.suites import sparse_cases

    tool = _tlx_check_tool()
    assert tool.SPARSE_BWD_ABLATION["auto"] == ({"SPARSE_BACKWARD_AUTO_GROUP": True}, "sparse")
    rows = {(c.keep_ratio, c.causal): c for c in sparse_cases([128], "quick")}
    assert {key: tool._auto_head_group(case, 132, 50 << 20) for key, case in rows.items()} == {
        (0.5, False): 1, (0.25, False): 1, (0.5, True): 2, (0.25, True): 2}


def test_sparse_ladder_separates_the_item_cost():
    """``tools/tlx_check.py sparse-ladder`` (stop 58): on the bench's batch the top_k ladder moves blocks a SM with
    the items fixed, and the half-heads point halves both, so ``fit_item_cost`` recovers a planted per-call c,
    per-block b and per-item a from those points with 0.5 us of timing noise (the ladder alone could not: its items
    are all equal)."""
    from bench.suites import sparse_cases

    tool = _tlx_check_tool()
    case = next(c for c in sparse_cases([128], "quick") if c.causal)
    sms, heads = 132, case.num_heads_q

    items = sum(-(-n // 128) for n in case.q_lens)
    keys = [(heads, k) for k in tool.SPARSE_LADDER_TOP_K] + [(heads // 2, 4)]
    c, b, a = 15.0, 2.4, 4.4
    rng = torch.Generator().manual_seed(58)
    points = []
    for h, k in keys:
        bl, it = case.kv_blocks(k)[1] * h / sms, items * h / sms
        points.append((bl, it, c + b * bl + a * it + 0.5 * (2 * torch.rand((), generator=rng).item() - 1)))
    assert len({round(it, 6) for _, it, _ in points}) == 2
    got_c, got_b, got_a, worst = tool.fit_item_cost(points)
    assert abs(got_b - b) < 0.02 and abs(got_a - a) < 0.5 and abs(got_c - c) < 20 and worst <= 1.0
