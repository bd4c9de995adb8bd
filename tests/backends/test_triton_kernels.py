"""Triton backend kernels against a float64 per-sequence softmax oracle.

Without CUDA these run in Triton's CPU interpreter (TRITON_INTERPRET=1 must be set before triton is first imported;
tests/conftest.py does that too) with 16x16 tiles, so the shapes below (lengths up to ~70) still give several key
blocks per sequence: the masked edges, the mask-free bulk and the partial last block all run.

Under the interpreter only fp16 and fp32 are tested: the interpreter multiplies bf16 ``tl.dot`` operands as raw uint16
and returns garbage. bf16 runs on the GPU only (``@pytest.mark.gpu``).
"""
from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytest.importorskip("triton")

from jfa_ops.backends.base import AttentionParams, Problem  # noqa: E402
from jfa_ops.testing import assert_attention_close, reference_attention, row_visibility, visible_mask  # noqa: E402
from jfa_ops.backends import triton as tb  # noqa: E402
from jfa_ops.backends.triton import common, configs, scheduling  # noqa: E402
import triton  # noqa: E402

CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
# Every test that runs kernels runs on both: CPU tensors under the interpreter (no CUDA here: conftest set
# TRITON_INTERPRET=1 before triton was imported; with CUDA the interpreter is off, so the CPU variant skips) and CUDA
# tensors (marked gpu: the GPU runbook's `pytest -m gpu` runs them, on the real TMA/sm_90 paths).
DEVICES = [pytest.param("cpu", id="cpu", marks=pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")),
           pytest.param("cuda", id="cuda", marks=[gpu, needs_cuda])]
on_each_device = pytest.mark.parametrize("device", DEVICES)


# ------------------------------------------------------------------------------------------------------- oracle
def oracle(q, k, v, q_off, kv_off, scale, causal=False, wl=-1, wr=-1, broadcast_q=False, grad_out=None,
           grad_lse=None):
    """jfa_ops.testing.reference_attention (float64, per sequence) on CPU copies; with grad_out also (dq, dk, dv)
    by autograd (through lse too when grad_lse is given)."""
    q64, k64, v64 = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
    out, lse = reference_attention(q64, k64, v64, None if q_off is None else q_off.cpu(), kv_off.cpu(), scale=scale,
                                   causal=causal, window=(wl, wr), broadcast_q=broadcast_q)
    if grad_out is None:
        return out, lse
    loss = (out * grad_out.cpu().double()).sum()
    if grad_lse is not None:
        loss = loss + (torch.where(torch.isfinite(lse), lse, 0.0) * grad_lse.cpu().double()).sum()
    return (out, lse) + torch.autograd.grad(loss, (q64, k64, v64), allow_unused=True, materialize_grads=True)


@pytest.fixture
def poison(monkeypatch):
    """Outputs start as NaN: any element a kernel forgets to write fails the comparison."""
    def alloc(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    monkeypatch.setattr(common, "alloc_output", alloc)


def make_inputs(len_q, len_k, hq, hkv, d, dtype, device, broadcast_q=False, offsets_dtype=torch.int32, seed=0):
    g = torch.Generator().manual_seed(seed)
    kv_off = torch.tensor([0] + list(len_k)).cumsum(0).to(offsets_dtype)
    q_off = None if broadcast_q else torch.tensor([0] + list(len_q)).cumsum(0).to(offsets_dtype)
    t_q = len_q[0] if broadcast_q else int(q_off[-1])
    q = torch.randn(t_q, hq, d, generator=g).to(dtype)
    k = torch.randn(int(kv_off[-1]), hkv, d, generator=g).to(dtype)
    v = torch.randn(int(kv_off[-1]), hkv, d, generator=g).to(dtype)
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    return to(q), to(k), to(v), to(q_off), to(kv_off)


# name: (len_q, len_k, Hq, Hkv, D, causal, window_left, window_right, broadcast_q)
CASES = {
    "jagged_empty_len1": ([1, 37, 0, 20, 5], [1, 37, 5, 0, 70], 2, 2, 64, False, -1, -1, False),
    "gqa2_d40": ([23, 50], [41, 50], 4, 2, 40, False, -1, -1, False),
    "gqa4_d8_causal": ([50, 3], [50, 30], 4, 1, 8, True, -1, -1, False),
    "causal_lq_gt_lk": ([45, 20], [17, 20], 2, 1, 72, True, -1, -1, False),  # rows with no visible key
    "causal_lq_lt_lk": ([12, 31], [60, 33], 2, 2, 128, True, -1, -1, False),
    "window_left": ([48, 9], [48, 26], 2, 1, 64, False, 10, -1, False),
    "window_right": ([40, 30], [52, 30], 2, 1, 40, False, -1, 5, False),
    "window_both": ([64, 33], [64, 47], 2, 2, 8, False, 7, 20, False),
    "causal_window_left": ([66], [70], 2, 1, 64, True, 17, -1, False),
    "window_empty_rows": ([30], [8], 2, 1, 16, False, 2, 1, False),  # Lq > Lk: windows leave rows empty
    "broadcast_q": ([21], [45, 0, 1, 33], 4, 2, 40, False, -1, -1, True),
    "broadcast_q_causal": ([37], [45, 20, 0, 50], 2, 1, 64, True, -1, -1, True),
    "broadcast_q_window": ([20], [50, 7, 33], 2, 2, 72, False, 5, 9, True),
}


def run_case(case, dtype, device, deterministic=False, with_grad_lse=False, offsets_dtype=torch.int32, seed=0):
    len_q, len_k, hq, hkv, d, causal, wl, wr, bq = case
    q, k, v, q_off, kv_off = make_inputs(len_q, len_k, hq, hkv, d, dtype, device, bq, offsets_dtype, seed)
    params = AttentionParams(scale=d ** -0.5, causal=causal, window_left=wl, window_right=wr, broadcast_q=bq,
                             deterministic=deterministic)
    assert tb.supports(Problem.of(q, k, params)) is None
    out, lse = tb.forward(q, k, v, q_off, kv_off, params)
    g = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(out.shape, generator=g).to(dtype).to(device)
    grad_lse = torch.randn(lse.shape, generator=g).to(device) if with_grad_lse else None
    dq, dk, dv = tb.backward(grad_out, grad_lse, q, k, v, out, lse, q_off, kv_off, params)
    ref = oracle(q, k, v, q_off, kv_off, params.scale, causal, wl, wr, bq, grad_out, grad_lse)
    visibility = row_visibility(q.shape[0], q_off, kv_off, causal=causal, window=(wl, wr), broadcast_q=bq)
    return (out, lse, dq, dk, dv), ref, visibility


def check(got, ref, visibility, dtype):
    """jfa_ops.testing's comparison of (out, lse, dq, dk, dv) with the oracle: dtypes, rows that see nothing exactly
    0 (lse -inf there), relative error norms at the tolerance kind of each output (lse at 1e-5 for every dtype)."""
    out, lse, dq, dk, dv = got
    assert out.dtype == dtype and lse.dtype == torch.float32 and dq.dtype == dtype and dk.dtype == dtype
    out_sees, q_sees, kv_seen = visibility
    compared = (("out", "forward", out, ~out_sees), ("lse", "lse", lse, None), ("dq", "grad", dq, ~q_sees),
                ("dk", "grad", dk, ~kv_seen), ("dv", "grad", dv, ~kv_seen))
    for (name, kind, actual, zero), expected in zip(compared, ref):
        assert_attention_close(actual, expected, dtype=dtype, kind=kind, name=name, zero_rows=zero)


# ------------------------------------------------------------------------------------------------------- tests
@on_each_device
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_oracle_fp16(name, device, poison):
    check(*run_case(CASES[name], torch.float16, device), torch.float16)


@pytest.mark.parametrize("name", ["jagged_empty_len1", "causal_lq_gt_lk", "window_both", "broadcast_q_causal"])
@on_each_device
def test_matches_oracle_fp32(name, device, poison):
    check(*run_case(CASES[name], torch.float32, device), torch.float32)


@pytest.mark.parametrize("name", ["gqa2_d40", "causal_lq_gt_lk", "window_empty_rows", "broadcast_q_window"])
@on_each_device
def test_grad_lse(name, device, poison):
    check(*run_case(CASES[name], torch.float16, device, with_grad_lse=True), torch.float16)


@on_each_device
def test_int64_offsets(device, poison):
    check(*run_case(CASES["causal_lq_lt_lk"], torch.float16, device, offsets_dtype=torch.int64), torch.float16)


@pytest.mark.parametrize("name", ["broadcast_q", "broadcast_q_window"])
@on_each_device
def test_broadcast_q_deterministic_matches_oracle(name, device, poison):
    check(*run_case(CASES[name], torch.float16, device, deterministic=True, with_grad_lse=True), torch.float16)


@pytest.mark.parametrize("name", ["gqa2_d40", "broadcast_q_causal", "window_both"])
@on_each_device
def test_deterministic_bitwise(name, device):
    first = run_case(CASES[name], torch.float16, device, deterministic=True, seed=3)[0]
    second = run_case(CASES[name], torch.float16, device, deterministic=True, seed=3)[0]
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("knobs", [dict(bwd_fused_dq=True, bwd_dq_tma=False, bwd_kv_major=True),
                                   dict(bwd_fused_dq=True, bcast_dq_slabs=1 << 20),  # one slab per program
                                   dict(bwd_fused_dq=False, bcast_fused_dq=False, fwd_kv_major=False,
                                        fwd_fma_softmax=False, fwd_schedule="static"),
                                   dict(fwd_schedule="atomic", bwd_schedule="atomic"),
                                   dict(fwd_schedule="static", bwd_schedule="grid", bwd_fused_dq=True)])
@pytest.mark.parametrize("name", ["gqa4_d8_causal", "causal_lq_gt_lk", "window_both", "broadcast_q",
                                  "broadcast_q_window"])
@on_each_device
def test_code_paths_match_oracle(name, knobs, device, monkeypatch, poison):
    """Fused dQ (atomics inside the dK/dV pass; broadcast Q: per-program partial-sum slabs, or one shared slab), the
    unfused path with the old work order, and every work schedule (grid, static striding, atomic counter; the
    interpreter's 3 "SMs" make the persistent ones loop), against the oracle."""
    for k, val in knobs.items():
        monkeypatch.setattr(configs.KNOBS, k, val)
    check(*run_case(CASES[name], torch.float16, device, with_grad_lse=True), torch.float16)


@on_each_device
def test_fused_dq_only_broadcast_nondeterministic(device, monkeypatch):
    """By default only broadcast-Q non-deterministic backward fuses dQ into the dK/dV kernel (no dq kernel launch,
    a finalize instead); deterministic mode and plain jagged launch the separate dq kernel."""
    from jfa_ops.backends.triton.launch import LAUNCHES

    dq_kernels = ("attn_bwd_dq_kernel", "attn_bwd_dq_finalize_kernel")
    for name, det, fused in (("broadcast_q", False, True), ("broadcast_q", True, False), ("gqa2_d40", False, False)):
        LAUNCHES.clear()
        run_case(CASES[name], torch.float16, device, deterministic=det)
        launched = [k for k in dq_kernels if LAUNCHES[k]]
        assert launched == (["attn_bwd_dq_finalize_kernel"] if fused else ["attn_bwd_dq_kernel"]), (name, launched)


@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16)])
@pytest.mark.skipif(CUDA, reason="the interpreter's block sizes")
def test_unequal_blocks(block_m, block_n, monkeypatch, poison):
    """Tile shapes other than square exercise the stage bounds' rounding. Interpreter only by nature: it patches
    the interpreter's config; GPU tile shapes come from the device's fixed table (tested by the GPU cases)."""
    device = "cpu"
    monkeypatch.setattr(configs, "INTERPRETER_CONFIG", configs.KernelConfig(block_m, block_n, 1, 1))
    for name in ("causal_lq_lt_lk", "window_both", "broadcast_q_window"):
        check(*run_case(CASES[name], torch.float16, device), torch.float16)


def _tma_in_interpreter(monkeypatch):
    """Run the TMA paths under the interpreter (it emulates tensor descriptors); the real use_tma rules otherwise."""
    from jfa_ops.backends.triton import attn_fwd

    monkeypatch.setattr(attn_fwd, "_tma_device", lambda t: True)
    if not hasattr(triton.runtime.interpreter.InterpreterBuilder, "create_descriptor_reduce"):
        # Triton 3.6's interpreter has no descriptor reductions (3.9's has): those stay GPU-tested.
        monkeypatch.setattr(configs.KNOBS, "bwd_dq_tma", False)


@on_each_device
def test_tma_paths(device, monkeypatch, poison):
    """Tensor descriptors (the sm_90 paths; the interpreter emulates them): forward K/V, backward Q/dO (dK/dV pass)
    and K/V (dQ pass), fused broadcast-Q dQ reductions. Blocks that run into the next sequence's rows must be
    masked, and sequences shorter than a block, empty ones and GQA must come out right."""
    if device == "cpu":
        _tma_in_interpreter(monkeypatch)
    gqa_d64 = ([23, 50, 0, 17], [41, 50, 3, 17], 4, 2, 64, True, -1, -1, False)
    window_d64 = ([48, 9, 0], [48, 26, 5], 2, 1, 64, False, 10, 3, False)
    for case in [CASES[n] for n in ("jagged_empty_len1", "causal_lq_lt_lk", "window_both", "broadcast_q_causal")] \
            + [gqa_d64, window_d64]:
        check(*run_case(case, torch.float16, device), torch.float16)
        check(*run_case(case, torch.float16, device, deterministic=True), torch.float16)


@pytest.mark.skipif(CUDA, reason="the interpreter's SM count")
def test_launch_schedule():
    # Interpreter only by nature: the expected program counts follow from its 3 "SMs" (configs.INTERPRETER_NUM_SMS);
    # the GPU's schedules run in test_code_paths_match_oracle[cuda].
    cpu = torch.device("cpu")
    assert common.launch_schedule("grid", 40, 1, cpu) == (40, None)
    assert common.launch_schedule("static", 40, 2, cpu) == (6, None)
    programs, counter = common.launch_schedule("atomic", 2, 1, cpu)
    assert programs == 2 and counter.tolist() == [0]
    with pytest.raises(ValueError, match="schedule must be one of"):
        common.launch_schedule("dynamic", 4, 1, cpu)


def test_no_tma_above_head_dim_128():  # host only (the shipped table): no device to run on
    """Regression: the causal TMA forward hung on the H200 at head_dim 256 (test_head_dims_gpu[256]); the shipped
    sm_90 specializations and the launch-time choice both keep TMA to head dims <= 128."""
    from jfa_ops.backends.triton import attn_fwd
    from jfa_ops.backends.triton.specializations import specialization

    assert attn_fwd.TMA_MAX_HEAD_DIM == 128
    assert specialization("fwd", 128, torch.bfloat16, True).constexprs["USE_TMA"]
    for causal in (False, True):
        assert not specialization("fwd", 256, torch.bfloat16, causal).constexprs["USE_TMA"]


@on_each_device
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("bq", [False, True])
def test_slices_of_a_fused_projection_need_no_copy(tma, bq, device, monkeypatch, poison):
    """q, k, v sliced out of one [T, (Hq + 2 Hkv) * D] projection (row stride > H * D) go to the kernels as they are
    (pointer and TMA paths; dK/dV are written contiguous all the same), with the oracle's results."""
    from jfa_ops.backends.triton import attn_fwd, common

    if tma and device == "cpu":
        _tma_in_interpreter(monkeypatch)
    copies = []
    packed = common.packed_rows
    monkeypatch.setattr(attn_fwd, "packed_rows", lambda t: copies.append(packed(t) is not t) or packed(t))
    len_q, len_k, hq, hkv, d = ([23, 0, 40], [30, 5, 40], 4, 2, 64)
    if bq:
        len_q = [21]
    g = torch.Generator().manual_seed(5)
    rows = max(sum(len_q), sum(len_k))
    fused = torch.randn(rows, (hq + 2 * hkv) * d, generator=g).to(torch.float16).to(device)
    q = fused[:sum(len_q), :hq * d].unflatten(-1, (hq, d))
    k = fused[:sum(len_k), hq * d:(hq + hkv) * d].unflatten(-1, (hkv, d))
    v = fused[:sum(len_k), (hq + hkv) * d:].unflatten(-1, (hkv, d))
    assert not q.is_contiguous() and q.stride(0) == (hq + 2 * hkv) * d
    off = lambda lens: torch.tensor([0] + lens, device=device).cumsum(0).to(torch.int32)  # noqa: E731
    q_off, kv_off = (None if bq else off(len_q)), off(len_k)
    params = AttentionParams(scale=d ** -0.5, causal=True, broadcast_q=bq)
    out, lse = tb.forward(q, k, v, q_off, kv_off, params)
    assert copies == [False, False, False]
    grad_out = torch.randn(out.shape, generator=g).to(torch.float16).to(device)
    dq, dk, dv = tb.backward(grad_out, None, q, k, v, out, lse, q_off, kv_off, params)
    assert dk.is_contiguous() and dv.is_contiguous()
    ref = oracle(q, k, v, q_off, kv_off, params.scale, True, -1, -1, bq, grad_out, None)
    visibility = row_visibility(q.shape[0], q_off, kv_off, causal=True, broadcast_q=bq)
    check((out, lse, dq, dk, dv), ref, visibility, torch.float16)


@on_each_device
def test_all_sequences_empty(device, poison):
    params = AttentionParams(scale=0.125, causal=True)
    q, k, v, q_off, kv_off = make_inputs([0, 0], [3, 0], 2, 1, 64, torch.float16, device)
    out, lse = tb.forward(q, k, v, q_off, kv_off, params)
    assert out.shape == (0, 2, 64) and lse.shape == (2, 0)
    dq, dk, dv = tb.backward(out, None, q, k, v, out, lse, q_off, kv_off, params)
    assert dq.shape == q.shape and torch.equal(dk, torch.zeros_like(k)) and torch.equal(dv, torch.zeros_like(v))


@on_each_device
def test_tile_list_covers_each_tile_once_longest_first(device):
    lens_q, lens_k = [0, 1, 37, 16, 70], [5, 0, 37, 64, 3]
    q_off = torch.tensor([0] + lens_q).cumsum(0).to(torch.int32)
    kv_off = torch.tensor([0] + lens_k).cumsum(0).to(torch.int32)
    tiles = scheduling.forward_tiles(q_off.to(device), kv_off.to(device), int(q_off[-1]), int(kv_off[-1]), 16, 0, 0,
                                     False, True)
    count = int(tiles.count)
    assert tiles.capacity >= count == sum((n + 15) // 16 for n in lens_q)
    assert (tiles.seq[count:] == -1).all()
    real = sorted(zip(tiles.seq[:count].tolist(), tiles.start[:count].tolist()))
    assert real == sorted((b, s) for b, n in enumerate(lens_q) for s in range(0, n, 16))
    # causal: rows x keys any row of the tile sees (the oracle's mask), descending
    masks = [visible_mask(lq, lk, causal=True) for lq, lk in zip(lens_q, lens_k)]
    tile_masks = [masks[b][s:s + 16] for b, s in zip(tiles.seq[:count].tolist(), tiles.start[:count].tolist())]
    cost = [m.shape[0] * int(m.any(dim=0).sum()) for m in tile_masks]
    assert cost == sorted(cost, reverse=True)


def reference_tiles(lens_s, lens_o, block, causal, wl, wr, kv_side):
    """Plain-Python tile list: (seq, start, cost) for every block of every stationary sequence, in (seq, start)
    order. cost = rows x |other-side positions any row of the tile sees|, from the oracle's mask."""
    tiles = []
    for b, (ls, lo) in enumerate(zip(lens_s, lens_o)):
        visible = visible_mask(lo, ls, causal, (wl, wr)).T if kv_side else visible_mask(ls, lo, causal, (wl, wr))
        for start in range(0, ls, block):
            rows = visible[start:start + block]  # [stationary rows of the tile, other side]
            tiles.append((b, start, rows.shape[0] * int(rows.any(dim=0).sum())))
    return tiles


@given(lens=st.lists(st.tuples(st.sampled_from([0, 0, 1, 5, 16, 17, 40]) | st.integers(0, 90), st.integers(0, 90)),
                     min_size=1, max_size=8),
       causal=st.booleans(), wl=st.integers(-1, 30), wr=st.integers(-1, 30), block=st.sampled_from([16, 32, 64]),
       kv_side=st.booleans())
@on_each_device
def test_tile_list_matches_python_reference(device, lens, causal, wl, wr, block, kv_side):
    """The device tile list against ``reference_tiles``: the same (seq, start, cost) entries, longest first, ties in
    (seq, start) order (stable), padding (seq -1) after the real count, and the count on the device."""
    lens_q, lens_k = [a for a, _ in lens], [b for _, b in lens]
    q_off = torch.tensor([0] + lens_q).cumsum(0).to(torch.int32)
    kv_off = torch.tensor([0] + lens_k).cumsum(0).to(torch.int32)
    has_left, window_left, has_right, right = common.window_bounds(causal, wl, wr)
    lens_s, lens_o = (lens_k, lens_q) if kv_side else (lens_q, lens_k)
    total = sum(lens_s)
    build = scheduling.kv_tiles if kv_side else scheduling.forward_tiles
    tiles = build(q_off.to(device), kv_off.to(device), sum(lens_q), sum(lens_k), block, window_left, right, has_left,
                  has_right)
    ref = reference_tiles(lens_s, lens_o, block, causal, wl, wr, kv_side)
    expected = sorted(ref, key=lambda t: -t[2])  # Python's sort is stable: ties keep (seq, start) order
    assert tiles.capacity == -(-(-(-total // block) + len(lens)) // 4) * 4
    assert tiles.seq.shape == tiles.start.shape == (tiles.capacity,) and tiles.count.shape == (1,)
    assert tiles.seq.dtype == tiles.start.dtype == tiles.count.dtype == torch.int32
    count = int(tiles.count)
    assert count == len(ref)
    cost = {(b, s): c for b, s, c in ref}
    got = [(b, s, cost.get((b, s))) for b, s in zip(tiles.seq[:count].tolist(), tiles.start[:count].tolist())]
    assert got == expected
    assert (tiles.seq[count:] == -1).all()


@on_each_device
def test_tile_list_issues_few_host_ops(device, monkeypatch):
    """build_tiles is a handful of ops whatever B is (was ~45 small torch ops: each a launch on the GPU)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    launches = []
    monkeypatch.setattr(scheduling, "launch", lambda kernel, grid, args, **options: launches.append(grid))
    off = torch.arange(0, 40 * 100 + 1, 100, dtype=torch.int32, device=device)
    with Count():
        scheduling.kv_tiles(off, off, 4000, 4000, 16, 3, 0, True, True)
    assert len(launches) == 2 and Count.n <= 5, (launches, Count.n)  # slots + rank kernels; 4 empty, unbind


@on_each_device
@pytest.mark.parametrize("capacity", [1, 31, 300, 1000])
def test_rank_tiles_kernel_is_a_stable_descending_sort(device, capacity):
    """rank_tiles_kernel orders slots as torch.sort(cost, descending=True, stable=True) + index_select would: ties
    (many here) and padding (cost -1, last) keep slot order."""
    if device == "cpu" and capacity > 300:
        pytest.skip("interpreter: capacity^2 compares")
    cost = torch.randint(-1, 6, (capacity,), dtype=torch.int64, device=device)
    slots = torch.randint(0, 1000, (2, capacity), dtype=torch.int32, device=device)
    ordered = torch.full((2, capacity), -7, dtype=torch.int32, device=device)  # poison: every column must be written
    scheduling.launch(scheduling.rank_tiles_kernel, (triton.cdiv(capacity, scheduling.RANK_BLOCK),), dict(
        SLOTS=slots, COST=cost, ORDERED=ordered, capacity=capacity, BLOCK=scheduling.RANK_BLOCK,
        CHUNK=scheduling.RANK_CHUNK), num_warps=4, num_stages=1)
    want = slots.index_select(1, torch.sort(cost, descending=True, stable=True).indices)
    assert torch.equal(ordered, want)


@on_each_device
def test_long_lists_take_the_sort(device, monkeypatch):
    """Above RANK_MAX_SLOTS the list is sorted by torch.sort: same tiles, same order."""
    off = torch.tensor([0, 50, 50, 170, 171], dtype=torch.int32, device=device)
    ranked = scheduling.forward_tiles(off, off, 171, 171, 16, 0, 0, False, True)
    monkeypatch.setattr(scheduling, "RANK_MAX_SLOTS", 0)
    sorted_ = scheduling.forward_tiles(off, off, 171, 171, 16, 0, 0, False, True)
    assert torch.equal(ranked.seq, sorted_.seq) and torch.equal(ranked.start, sorted_.start)


@on_each_device
def test_shape_constant_lists_are_cached(device):
    a, b = scheduling.single_tiles(5, 16, torch.device(device)), scheduling.single_tiles(5, 16, torch.device(device))
    assert a is b and a.start.tolist() == [0, 16, 32, 48, 64] and int(a.count) == 5


def test_shape_constants_are_kept_per_stream(monkeypatch):
    """``scheduling.shape_constant`` keys its entries by the current stream (``base.stream_key``): made on one
    stream, a list is ordered before that stream's reads only (helper replay42). Fails when the stream is dropped."""
    monkeypatch.setattr(scheduling, "stream_key", lambda device: "a")
    a = scheduling.single_tiles(7, 16, torch.device("cpu"))
    assert scheduling.single_tiles(7, 16, torch.device("cpu")) is a
    monkeypatch.setattr(scheduling, "stream_key", lambda device: "b")
    b = scheduling.single_tiles(7, 16, torch.device("cpu"))
    assert b is not a and torch.equal(b.start, a.start)


@on_each_device
def test_supports_reasons(device):
    base = dict(device_type=device, dtype=torch.float16, head_dim=64, num_heads_q=4, num_heads_kv=2, causal=False,
                window_left=-1, window_right=-1, broadcast_q=False, deterministic=False)
    assert tb.supports(Problem(**base)) is None
    assert "head_dim" in tb.supports(Problem(**{**base, "head_dim": 12}))
    assert "head_dim" in tb.supports(Problem(**{**base, "head_dim": 264}))
    assert "dtype" in tb.supports(Problem(**{**base, "dtype": torch.float64}))
    assert tb.supports(Problem(**{**base, "device_type": "meta"})) is not None
    if device == "cpu":
        assert "bf16" in tb.supports(Problem(**{**base, "dtype": torch.bfloat16}))


# ---------------------------------------------------------------------------------------------------------- GPU
@gpu
@needs_cuda
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_oracle_bf16_gpu(name, poison):
    check(*run_case(CASES[name], torch.bfloat16, "cuda", with_grad_lse=True), torch.bfloat16)


@gpu
@needs_cuda
@pytest.mark.parametrize("d", [8, 40, 72, 128, 256])
def test_head_dims_gpu(d, poison):
    case = ([130, 1, 0, 257], [200, 1, 9, 257], 4, 2, d, True, -1, -1, False)
    check(*run_case(case, torch.bfloat16, "cuda", with_grad_lse=True), torch.bfloat16)
    check(*run_case(case, torch.float16, "cuda"), torch.float16)


@gpu
@needs_cuda
def test_no_host_sync_gpu():
    """Forward and backward never synchronize with the host (lengths stay on the device)."""
    for name in ("jagged_empty_len1", "broadcast_q_causal"):
        len_q, len_k, hq, hkv, d, causal, wl, wr, bq = CASES[name]
        q, k, v, q_off, kv_off = make_inputs(len_q, len_k, hq, hkv, d, torch.bfloat16, "cuda", bq)
        for det in (False, True):
            params = AttentionParams(scale=0.1, causal=causal, broadcast_q=bq, deterministic=det)
            tb.forward(q, k, v, q_off, kv_off, params)  # compile outside the checked region
            out, lse = tb.forward(q, k, v, q_off, kv_off, params)
            tb.backward(out, lse, q, k, v, out, lse, q_off, kv_off, params)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                out, lse = tb.forward(q, k, v, q_off, kv_off, params)
                tb.backward(out, lse, q, k, v, out, lse, q_off, kv_off, params)
            finally:
                torch.cuda.set_sync_debug_mode("default")


# ------------------------------------------------------------------------------------ one wave, launches, checks
@pytest.fixture
def one_wave(monkeypatch):
    """Every work list fits one wave (a GPU with many SMs): no sorted list, the kernels map items to slots."""
    if CUDA:
        pytest.skip("interpreter SM count only")
    monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 10 ** 4)


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_wave_unsorted_matches_oracle(name, one_wave, poison):
    check(*run_case(CASES[name], torch.float16, "cpu", with_grad_lse=True), torch.float16)
    if CASES[name][-1]:  # broadcast Q: the deterministic chunked dQ keeps its own list
        check(*run_case(CASES[name], torch.float16, "cpu", deterministic=True), torch.float16)


def _count_launches(fn):
    """(kernels launched through launch.py, aten ops that launch a kernel on a GPU) during fn()."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from jfa_ops.backends.triton.launch import LAUNCHES

    no_kernel = ("empty", "empty_strided", "view", "unbind", "select", "slice", "alias", "_reshape_alias", "as_strided",
                 "detach", "t", "expand", "unsqueeze", "squeeze", "lift_fresh")
    aten = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] not in no_kernel:
                aten.append(func.__name__)
            return func(*args, **(kwargs or {}))

    from triton.runtime.interpreter import InterpretedFunction
    from torch.utils._python_dispatch import _disable_current_modes

    run = InterpretedFunction.run

    def run_uncounted(self, *args, **kwargs):  # the interpreter's own tensor ops are no GPU launches
        with _disable_current_modes():
            return run(self, *args, **kwargs)

    LAUNCHES.clear()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(InterpretedFunction, "run", run_uncounted)
        with Count():
            fn()
    return dict(LAUNCHES), aten


def test_launch_counts_one_wave(one_wave, monkeypatch):
    """The aims of issue 9 for a small call, counted on the host: forward = the attention kernel + the offset check's
    assert (no scheduling kernel, no sort, no separate check); backward = delta, dK/dV, dQ (no lists, no memsets)."""
    from jfa_ops import validation

    monkeypatch.setattr(validation, "validation_mode", lambda device: "async")
    q, k, v, q_off, kv_off = make_inputs([40, 17, 0, 64], [40, 17, 0, 64], 2, 2, 64, torch.float16, "cpu")
    params = AttentionParams(scale=0.125, causal=True, check_offsets=True)
    result = {}
    kernels, aten = _count_launches(lambda: result.update(fwd=tb.forward(q, k, v, q_off, kv_off, params)))
    out, lse = result["fwd"]
    assert kernels == {"attn_fwd_kernel": 1} and aten == ["_assert_async.msg"], (kernels, aten)
    grad = torch.randn_like(out)
    kernels, aten = _count_launches(lambda: tb.backward(grad, None, q, k, v, out, lse, q_off, kv_off, params))
    assert kernels == {"attn_bwd_delta_kernel": 1, "attn_bwd_dkdv_kernel": 1, "attn_bwd_dq_kernel": 1} and not aten, \
        (kernels, aten)


def test_launch_counts_sorted_lists(monkeypatch):
    """Beyond one wave: the check rides in the scheduling kernel (one flag, one assert), then the rank kernel orders
    the list (no sort, no gather)."""
    from jfa_ops import validation

    if CUDA:
        pytest.skip("interpreter SM count only")
    monkeypatch.setattr(validation, "validation_mode", lambda device: "async")
    q, k, v, q_off, kv_off = make_inputs([40, 17, 0, 64], [40, 17, 0, 64], 2, 2, 64, torch.float16, "cpu")
    params = AttentionParams(scale=0.125, causal=True, check_offsets=True)
    kernels, aten = _count_launches(lambda: tb.forward(q, k, v, q_off, kv_off, params))
    assert kernels == {"tile_slots_kernel": 1, "rank_tiles_kernel": 1, "attn_fwd_kernel": 1}, kernels
    assert aten.count("_assert_async.msg") == 1 and len(aten) <= 2, aten  # assert (+ unbind)


@on_each_device
def test_broadcast_fused_dq_accumulator_zeroed_by_delta_kernel(device, poison, monkeypatch):
    """The fp32 dQ accumulator the atomics add into is zeroed by the delta kernel, not by a memset (poisoned
    allocations and torch.empty both must give the oracle's dQ)."""
    zeros = torch.zeros

    def no_fp32_memset(*args, **kwargs):  # the oracle's own (float64, bool) zeros are fine
        if kwargs.get("dtype") == torch.float32:
            pytest.fail("an fp32 memset (torch.zeros) in the backward")
        return zeros(*args, **kwargs)

    monkeypatch.setattr(torch, "zeros", no_fp32_memset)
    for name in ("broadcast_q", "broadcast_q_causal"):
        check(*run_case(CASES[name], torch.float16, device), torch.float16)


@pytest.mark.parametrize("wave", ["one_wave", "sorted"])
@pytest.mark.parametrize("case", range(9))
@pytest.mark.skipif(CUDA, reason="CPU tensors through the interpreter (tests/test_api_validation.py has the GPU case)")
def test_folded_offset_check_flag_and_no_out_of_bounds(case, wave, monkeypatch, request):
    """The check folded into the scheduling kernel (sorted lists) or into the forward kernel (one wave) flags exactly
    the offsets the host check rejects, and bad offsets (a sequence past the rows, a negative offset) run through the
    kernels' guards (empty list, ``slot_tile``'s range checks) without a failure: what JFA_VALIDATE=deferred relies
    on. (The GPU suite's test_deferred_* cases would hit an illegal address if a guard were missing.)"""
    from jfa_ops import validation

    if wave == "one_wave":
        request.getfixturevalue("one_wave")
    cases = [([0, 3, 7], 7, -1), ([0], 0, -1), ([0, 0, 7, 7], 7, 7), ([1, 3, 7], 7, -1), ([0, 3, 6], 7, -1),
             ([0, 5, 3, 7], 7, -1), ([0, 3, 7], 7, 3), ([0, 9, 7], 7, -1), ([0, -4, 7], 7, -1)]
    offsets, rows, max_seqlen = cases[case]
    try:
        validation.check_on_host("kv_offsets", torch.tensor(offsets), rows, max_seqlen)
        expected = True
    except ValueError:
        expected = False
    flags = []
    monkeypatch.setattr(validation, "validation_mode", lambda device: "deferred")
    monkeypatch.setattr(validation, "device_flag", lambda flag, mode: flags.append(int(flag)))
    off = torch.tensor(offsets, dtype=torch.int32)
    q, k, v = (torch.randn(rows, 2, 16, dtype=torch.float16) for _ in range(3))
    params = AttentionParams(scale=0.25, causal=True, check_offsets=True, max_seqlen_q=max_seqlen,
                             max_seqlen_kv=max_seqlen)
    out, lse = tb.forward(q, k, v, off, off, params)
    assert flags == [int(expected)]
    if expected and rows:
        ref = oracle(q, k, v, off, off, 0.25, causal=True)[0].double()
        assert (out.double() - ref).norm() <= 2e-3 * ref.norm()


def test_small_calls_skip_tma(monkeypatch):
    """Below TMA_MIN_ROWS rows the pointer path (no descriptor to build and encode on every call)."""
    from jfa_ops.backends.triton import attn_fwd

    monkeypatch.setattr(attn_fwd, "_tma_device", lambda t: True)
    monkeypatch.setattr(attn_fwd, "TMA_MIN_ROWS", 64)
    small, large = (torch.empty(rows, 2, 64, dtype=torch.float16) for rows in (63, 64))
    assert not attn_fwd.use_tma(False, small, small)
    assert attn_fwd.use_tma(False, large, large)


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_forward_replays_match_the_oracle_gpu(poison, monkeypatch, dtype):
    """Repeated small call signatures on the GPU take the forward's replay (attn_fwd._REPLAYS; no tile schedule
    after the first call) and every call, fresh inputs each, matches the float64 oracle: a replay that launched a
    stale tensor, a wrong size or another signature's kernel fails here (bench overhead case shapes, int32 and
    int64 offsets, GQA, a window, causal, broadcast Q)."""
    from jfa_ops.backends.triton import attn_fwd

    cases = [([64, 17, 40, 5], 8, 8, 128, dict(causal=True)), ([1, 0, 33], 4, 2, 64, dict(window_left=5)),
             ([128, 7], 6, 3, 128, dict(causal=True, window_left=16, window_right=0)),
             ([50, 0, 9, 130], 4, 4, 128, dict(causal=True, broadcast_q=True))]  # broadcast Q of 24 rows
    monkeypatch.setattr(attn_fwd, "TMA_MIN_ROWS", 1 << 30)  # small calls' pointer path, as outside the tests
    full = []
    real = attn_fwd.tile_schedule
    attn_fwd._REPLAYS.clear()
    for lengths, hq, hkv, d, opts in cases:
        for offsets_dtype in (torch.int32, torch.int64):
            off = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(offsets_dtype)
            params = AttentionParams(scale=d ** -0.5, check_offsets=True, **opts)
            bcast = opts.get("broadcast_q", False)
            q_off = None if bcast else off
            for call in range(3):
                q = torch.randn(24 if bcast else int(off[-1]), hq, d, device="cuda", dtype=dtype)
                k, v = (torch.randn(int(off[-1]), hkv, d, device="cuda", dtype=dtype) for _ in range(2))
                n_full = len(full)
                attn_fwd.tile_schedule = lambda *a, **kw: full.append(1) or real(*a, **kw)
                try:
                    out, lse = tb.forward(q, k, v, q_off, off, params)
                finally:
                    attn_fwd.tile_schedule = real
                assert (len(full) > n_full) == (call == 0), (lengths, offsets_dtype, call)
                want_out, want_lse = oracle(q, k, v, q_off, off, params.scale, opts.get("causal", False),
                                            opts.get("window_left", -1), opts.get("window_right", -1), bcast)
                assert_attention_close(out.cpu(), want_out, dtype=dtype, kind="forward", name="out")
                assert_attention_close(lse.cpu(), want_lse, dtype=dtype, kind="lse", name="lse")
