"""The triton backend's block-sparse family (selection, forward, backward) against the float64 oracles.

Without CUDA the kernels run in Triton's CPU interpreter, in fp16 and fp32 only: the interpreter multiplies bf16
``tl.dot`` operands as raw uint16 (garbage), so bf16 runs on the GPU only (``@pytest.mark.gpu``). Blocks of 16/32
rows and lengths up to ~70 give several Q and KV blocks per sequence with the interpreter's 16x16 tiles.
"""
from __future__ import annotations

import math
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import jfa_ops  # noqa: E402
from jfa_ops.backends.triton.block_sparse_fwd import selected_tiles_split  # noqa: E402
from jfa_ops.backends.triton.block_sparse_select import _order_table, _safe_lag, _slot_at  # noqa: E402
from jfa_ops.backends import Problem, available_backends, get_backend, select_backend  # noqa: E402
from jfa_ops.backends import triton as tb  # noqa: E402
from jfa_ops.testing import (AttentionCase, BlockSparseCase, assert_attention_close, attention_cases,  # noqa: E402
                             check_block_sparse_case)
from tests.common import captured_after_warm_up  # noqa: E402

CUDA = torch.cuda.is_available()


@triton.jit
def _split_kernel(IDS, LIMITS, OUT, count, n_limits, ONE_PASS: tl.constexpr):  # test_stage_split_points
    i = tl.program_id(0)
    lead, bulk = selected_tiles_split(IDS, count, tl.load(LIMITS + i), tl.load(LIMITS + n_limits - 1 - i), 32, 16,
                                      ONE_PASS)
    tl.store(OUT + i, lead)
    tl.store(OUT + n_limits + i, bulk)
DEVICES = [pytest.param("cpu", id="cpu", marks=pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")),
           pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu,
                                                   pytest.mark.skipif(not CUDA, reason="needs a CUDA device")])]
on_each_device = pytest.mark.parametrize("device", DEVICES)


def _dtypes(device):
    return (torch.float16, torch.float32) if device == "cpu" else (torch.bfloat16, torch.float16, torch.float32)


FEATURES = {
    "jagged_empty_len1_gqa_causal": (AttentionCase((40, 0, 1, 70), (50, 0, 1, 70), heads_q=4, heads_kv=2,
                                                   causal=True), 16, 16, 0.5, None),
    "broadcast_q_window": (AttentionCase((20,), (50, 0, 1, 70), heads_q=2, heads_kv=1, broadcast_q=True,
                                         window=(20, 5)), 16, 32, 0.5, None),
    "padded_head_dim_top_k": (AttentionCase((40, 3, 33), (50, 9, 20), head_dim=24), 32, 16, None, 2),
    "cross_lq_gt_lk_causal": (AttentionCase((70, 5), (20, 40), causal=True, heads_q=2, heads_kv=1), 16, 16, 0.25,
                              None),
}


@on_each_device
@pytest.mark.parametrize("name", list(FEATURES))
def test_feature_cases(device, name):
    case, block_q, block_kv, keep_ratio, top_k = FEATURES[name]
    for dtype in _dtypes(device):
        sparse = BlockSparseCase(case.replace(device=device, dtype=dtype), block_q, block_kv, keep_ratio, top_k)
        check_block_sparse_case(sparse, "triton", seed=hash(name) % 1000)


@on_each_device
def test_random_selection(device):
    """Stage 2 alone with arbitrary block subsets (not only top-k shapes): forward and backward."""
    case = AttentionCase((40, 0, 1, 70), (50, 0, 1, 70), heads_q=4, heads_kv=2, device=device,
                         dtype=_dtypes(device)[0])
    check_block_sparse_case(BlockSparseCase(case, 16, 16, keep_ratio=None), "triton", seed=5)


def sparse_cases(device):
    @st.composite
    def cases(draw):
        case = draw(attention_cases(devices=(device,), dtypes=_dtypes(device), max_total=96, max_len=40,
                                    head_dims=(16, 32)))
        how = draw(st.sampled_from(["ratio", "top_k", "random"]))
        return BlockSparseCase(case, block_q=draw(st.sampled_from([16, 32])), block_kv=draw(st.sampled_from([16, 32])),
                               keep_ratio={"ratio": draw(st.sampled_from([0.25, 0.5, 1.0])), "top_k": 0.5,
                                           "random": None}[how],
                               top_k=draw(st.integers(1, 2)) if how == "top_k" else None,
                               always_local=draw(st.booleans()))
    return cases()


@settings(max_examples=6)
@given(case=sparse_cases("cpu"), seed=st.integers(0, 2**31 - 1))
@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
def test_random_cases_interpreted(case, seed):
    check_block_sparse_case(case, "triton", seed=seed)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@settings(max_examples=60)
@given(case=sparse_cases("cuda"), seed=st.integers(0, 2**31 - 1))
def test_random_cases_gpu(case, seed):
    check_block_sparse_case(case, "triton", seed=seed)


@on_each_device
def test_unselected_blocks_are_never_read(device):
    """NaN in every key/value row of blocks no query selected: a kernel that loaded them (even masked) would leak
    NaN through 0 * NaN. Forward and backward stay finite and equal the reference."""
    dtype = _dtypes(device)[0]
    case = AttentionCase((64,), (64,), heads_q=2, heads_kv=1, device=device, dtype=dtype, causal=True)
    x = case.make_inputs(0)
    index, count = jfa_ops.select_kv_blocks(x.q, x.k, x.q_offsets, x.kv_offsets, 64, 64, block_q=16, block_kv=16,
                                            top_k=1, backend="triton")  # the diagonal block only
    assert count.flatten().tolist() == [1, 1, 1, 1]
    k, v = x.k.clone(), x.v.clone()
    # Q blocks 0..2 (rows 0..47) selected KV blocks 0..2: poison block 3 and keep only those query rows
    k[48:], v[48:] = float("nan"), float("nan")
    q = x.q[:48].detach().clone().requires_grad_()
    k.requires_grad_(), v.requires_grad_()
    q_off = torch.tensor([0, 48], device=device)
    out = jfa_ops.block_sparse_attention(q, k, v, q_off, x.kv_offsets, index, count, block_q=16, block_kv=16,
                                         causal=True, backend="triton")
    assert torch.isfinite(out).all()
    dq, dk, dv = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert torch.isfinite(dq).all() and torch.isfinite(dk[:48]).all() and torch.isfinite(dv[:48]).all()
    # the reference (which multiplies masked NaN by 0) on the clean K/V: unselected rows do not matter
    ref = jfa_ops.block_sparse_attention(q, x.k, x.v, q_off, x.kv_offsets, index, count, block_q=16, block_kv=16,
                                         causal=True, backend="reference")
    assert_attention_close(out, ref, dtype=dtype, kind="forward", name="out")


@pytest.mark.parametrize("knobs", [dict(fwd_schedule="atomic", bwd_schedule="atomic"),
                                   dict(fwd_schedule="static", bwd_schedule="grid", fwd_kv_major=False,
                                        bwd_kv_major=True),
                                   dict(one_wave=True)])
@pytest.mark.parametrize("name", ["jagged_empty_len1_gqa_causal", "broadcast_q_window"])
@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
def test_work_schedules(name, knobs, monkeypatch):
    """The sparse kernels take the dense kernels' work lists: every schedule (grid, static striding, atomic counter;
    the interpreter's 3 "SMs" make the persistent ones loop), both work orders, and the one-wave path that maps
    unsorted slots in the kernel (no list), against the oracle; outputs start as NaN (every element written)."""
    from jfa_ops.backends.triton import common, configs

    for key, val in knobs.items():
        if key == "one_wave":
            monkeypatch.setattr(configs, "INTERPRETER_NUM_SMS", 10 ** 4)
        else:
            monkeypatch.setattr(configs.KNOBS, key, val)
    monkeypatch.setattr(common, "alloc_output", lambda shape, dtype, device: torch.full(
        shape, float("nan"), dtype=dtype, device=device))
    case, block_q, block_kv, keep_ratio, top_k = FEATURES[name]
    check_block_sparse_case(BlockSparseCase(case.replace(dtype=torch.float16), block_q, block_kv, keep_ratio, top_k),
                            "triton", seed=11)


# the selection's same-results knobs: scores in a scratch row or in registers (+ the pooling's 64-ary search), and
# selection v5 (whole-block pooling loads, rows scored over their visible blocks only) on each; 4 Q blocks per
# select program (rows in registers, group slots found by the 64-ary search); fp32 scores with mul.rn products (plain
# products under the interpreter: the GPU run is the test of mul.rn)
SELECT_VARIANTS = {
    # the pre-v6 pool (sparse_pool_stream and _one_launch off): the pool variants' baseline
    "scratch": dict(sparse_select_rows=False, sparse_pool_fanout=False, sparse_pool_stream=False,
                    sparse_pool_one_launch=False),
    "rows": dict(sparse_select_rows=True, sparse_pool_fanout=True),
    "v5": dict(sparse_select_rows=False, sparse_pool_fanout=True, sparse_pool_whole_block=True,
               sparse_select_visible=True),
    "v5_rows": dict(sparse_select_rows=True, sparse_pool_fanout=True, sparse_pool_whole_block=True,
                    sparse_select_visible=True),
    "v5_grouped": dict(sparse_select_rows=False, sparse_pool_fanout=True, sparse_pool_whole_block=True,
                       sparse_select_visible=True, sparse_select_grouped=True),
    "fp32_rn": dict(sparse_select_rows=False, sparse_select_fp32_rn=True),
    "fp32_rn_grouped": dict(sparse_select_rows=False, sparse_pool_fanout=True, sparse_pool_whole_block=True,
                            sparse_select_visible=True, sparse_select_grouped=True, sparse_select_fp32_rn=True),
    # the default since v22 (visible range, fp32 mul.rn scores, the top-k by a radix select: helper select30)
    "v6_visible_fp32_rn_radix": dict(sparse_select_visible=True, sparse_select_fp32_rn=True, sparse_select_radix=True),
    # the pairwise rank (the default before v22) on the same kernel; fp64 scores' 64-bit radix keys: the GPU-only
    # test_radix_select_equals_the_pairwise_rank
    "pairwise": dict(sparse_select_visible=True, sparse_select_fp32_rn=True, sparse_select_radix=False),
    # selection pool v6: 4 kv heads per pooling program (either search), Q and K pooled in one launch
    "pool_stream": dict(sparse_select_rows=False, sparse_pool_fanout=False, sparse_pool_stream=True,
                        sparse_pool_one_launch=False),
    "pool_one_launch": dict(sparse_select_rows=True, sparse_pool_fanout=True, sparse_pool_whole_block=True,
                            sparse_pool_stream=False, sparse_pool_one_launch=True),
    "pool_stream_one_launch": dict(sparse_select_rows=False, sparse_pool_fanout=True, sparse_pool_stream=True,
                                   sparse_pool_one_launch=True),
}
POOL_VARIANTS = ("pool_stream", "pool_one_launch", "pool_stream_one_launch")


def _set_select_variant(monkeypatch, variant, **extra):
    """The knobs of ``SELECT_VARIANTS[variant]`` (and ``extra``), every other knob a variant names at its default: a
    test running several variants must not carry one's knobs into the next."""
    from jfa_ops.backends.triton import configs

    defaults = configs.Knobs()
    for knob in {k for v in SELECT_VARIANTS.values() for k in v}:
        monkeypatch.setattr(configs.KNOBS, knob, getattr(defaults, knob))
    for knob, value in {**SELECT_VARIANTS[variant], **extra}.items():
        monkeypatch.setattr(configs.KNOBS, knob, value)


@on_each_device
@pytest.mark.parametrize("variant", list(SELECT_VARIANTS))
def test_selection_ties_and_many_blocks(device, variant, monkeypatch):
    """The selection kernel ranks blocks without sorting: equal scores (KV blocks that repeat every 3 blocks) go to
    the lower index as the reference's stable sort, and rows of more KV blocks than one rank step (70 > 64) rank
    across steps; the sequences' own blocks only (a short sequence beside a long one). Equals the reference
    exactly, causal and not; with the scores in a scratch row or in registers (``KNOBS.sparse_select_rows``). Equal
    blocks sit at every position of a rank tile here (period 3 against tiles of 32): scores that depend on a block's
    position (fp32 FMA contraction, which the interpreter never does: test_arch_compile's
    test_sm90_selection_scores_are_contraction_free) fail it on the GPU.

    On the CPU the data are small integers, q constant within each 16-row block: every pooled value and score is
    exact in fp32, so no summation order can split a tie. Why: the interpreter's ``tl.dot`` is numpy's matmul, and
    OpenBLAS on some x86 CPUs (measured on the 2-core box of 2026-12-03: a [16, 16] x [16, 32] product) rounds a
    column differently by its position in the tile, which split these ties on randn data in every variant there."""
    _set_select_variant(monkeypatch, variant)
    gen = torch.Generator().manual_seed(0)
    lengths = (70 * 16 - 5, 40)
    if device == "cpu":
        k_blocks = torch.randint(-4, 5, (3, 16, 1, 16), generator=gen).float()
        q = torch.randint(-4, 5, (sum(lengths) // 16 + 1, 1, 2, 16), generator=gen).float()
        q = q.expand(-1, 16, -1, -1).flatten(0, 1)[:sum(lengths)].contiguous()
    else:
        k_blocks = torch.randn(3, 16, 1, 16, generator=gen)
        q = torch.randn(sum(lengths), 2, 16, generator=gen).to(device)
    k_blocks = k_blocks.repeat(24, 1, 1, 1).flatten(0, 1)  # [1152, 1, 16]
    k = torch.cat([k_blocks[:lengths[0]], k_blocks[:lengths[1]]]).to(device)
    off = torch.tensor([0, lengths[0], sum(lengths)], device=device)
    for causal in (False, True):
        for keep in (0.25, 0.5):
            got = jfa_ops.select_kv_blocks(q, k, off, off, lengths[0], lengths[0], block_q=16, block_kv=16,
                                           keep_ratio=keep, causal=causal, backend="triton")
            want = jfa_ops.select_kv_blocks(q.cpu(), k.cpu(), off.cpu(), off.cpu(), lengths[0], lengths[0],
                                            block_q=16, block_kv=16, keep_ratio=keep, causal=causal,
                                            backend="reference")
            assert torch.equal(got[1].cpu(), want[1]) and torch.equal(got[0].cpu(), want[0]), (causal, keep)


def _assert_selection_equals_reference(q, k, q_off, kv_off, max_q, max_kv, **opts):
    got = jfa_ops.select_kv_blocks(q, k, q_off, kv_off, max_q, max_kv, backend="triton", **opts)
    cpu = [None if t is None else t.cpu() for t in (q, k, q_off, kv_off)]
    want = jfa_ops.select_kv_blocks(*cpu, max_q, max_kv, backend="reference", **opts)
    assert torch.equal(got[1].cpu(), want[1]) and torch.equal(got[0].cpu(), want[0]), opts
    return got


SELECTION_EDGES = {  # (q lengths or None for the kv lengths, kv lengths, broadcast L_q, block_q, block_kv)
    # 24 sequences (5 binary-search steps): empty, length 1, shorter than a block, exactly one, a partial tail
    "many_sequences": (None, (0, 1, 15, 16, 17, 33, 0, 64, 70, 5, 2, 0, 31, 32, 48, 9, 1, 0, 40, 12, 3, 66, 8, 0),
                       None, 16, 32),
    "all_shorter_than_a_block": (None, (1, 7, 0, 15, 3), None, 16, 16),
    # 70 sequences: the pooling's 64-ary slot search takes two levels (scheduling.slot_tile_fanout)
    "more_than_64_sequences": (None, tuple((7 * i) % 37 for i in range(70)), None, 16, 16),
    # 64-row blocks: two 32-row pooling steps per head and kv head group, the last one partial
    "pooling_steps_and_tails": ((70, 100, 64, 0), (130, 45, 64, 1), None, 64, 32),
    "broadcast_q_many_sequences": (None, (0, 1, 15, 33, 70, 0, 5, 48, 16, 17, 2), 37, 16, 32),
}


@on_each_device
@pytest.mark.parametrize("variant", list(SELECT_VARIANTS))
@pytest.mark.parametrize("name", list(SELECTION_EDGES))
def test_selection_edge_cases(device, name, variant, monkeypatch):
    """Programs exist only for the batch's real blocks (slots, ``scheduling.slot_tile``), found from the offsets:
    empty sequences, length 1, sequences shorter than a block, many sequences, GQA groups pooled in several steps,
    broadcast Q; equals the float64 reference exactly, causal or not, with and without always_local; with the
    scores in a scratch row or in registers (``KNOBS.sparse_select_rows``), the pooling's slot search binary or
    64-ary (``KNOBS.sparse_pool_fanout``, taken together with the rows here), and selection v5's knobs
    (``SELECT_VARIANTS``); a window on both sides (the visible range's lower and upper bounds)."""
    _set_select_variant(monkeypatch, variant)
    q_lens, kv_lens, broadcast, block_q, block_kv = SELECTION_EDGES[name]
    gen = torch.Generator().manual_seed(len(kv_lens))
    q_lens = q_lens or kv_lens
    rows_q = broadcast or sum(q_lens)
    q = torch.randn(rows_q, 4, 24, generator=gen).half().to(device)  # padded head dim (24 of 32)
    k = torch.randn(sum(kv_lens), 2, 24, generator=gen).half().to(device)
    kv_off = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q_off = None if broadcast else torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], device=device)
    max_q = broadcast or max(q_lens)
    for causal, always_local, window in ((False, True, (-1, -1)), (True, False, (-1, -1)), (False, True, (40, 5))):
        _assert_selection_equals_reference(q, k, q_off, kv_off, max_q, max(kv_lens), block_q=block_q,
                                           block_kv=block_kv, keep_ratio=0.5, causal=causal, window=window,
                                           broadcast_q=bool(broadcast), always_local=always_local)


# GPU only: ~300 s under the interpreter (its 140-block rows), beyond CI's budget; the CPU covers the radix select
# through the ``radix`` variant of the selection tests above. Runs on the GPU before the knob may flip.
@pytest.mark.gpu
@pytest.mark.parametrize("scores_fp32_rn", [True, False], ids=["fp32_rn", "fp64"])
def test_radix_select_equals_the_pairwise_rank(scores_fp32_rn, monkeypatch):
    """``KNOBS.sparse_select_radix`` keeps exactly the blocks of the pairwise rank, the default (same index and
    count rows), where a radix select could part from it: scores +0.0 and -0.0 (KV blocks of +0 and -0 keys: equal
    for the compares, not for the bits) and other exact ties (repeated blocks), causal, GQA 2:1, rows of 1, 20 and
    140 blocks (a 256-wide row); the finite batch also against the float64 reference, and a batch of 6 kv heads (4
    a program: a partial group) with a window. With a NaN block and a +inf block in the batch (pooled NaN and +-inf
    scores: NaN blocks are kept wherever visible), against the default only (the reference sorts NaN otherwise).
    Rows over ``SELECT_RADIX_MAX`` blocks keep the pairwise rank. With fp32 mul.rn scores (the default) and fp64
    scores (the radix's 64-bit keys)."""
    from jfa_ops.backends.triton import block_sparse_select
    from jfa_ops.backends.triton.configs import KNOBS

    device = "cuda"
    monkeypatch.setattr(KNOBS, "sparse_select_fp32_rn", scores_fp32_rn)  # fp64 scores: the radix's 64-bit keys
    gen = torch.Generator().manual_seed(3)
    # Every pooled value exact (block means of small integers over 16 or 8 rows; the length-5 sequence is one block),
    # so every implementation's scores are the same exact numbers and only the tie rule orders equal ones. A 13-row
    # tail (pooled /13) once made the fp32 and float64 scores of two blocks with equal true scores round apart: the
    # reference comparison then hung on an unseeded sign draw (H200, stop 35).
    lengths, block = (140 * 16 - 8, 20 * 16, 5), 16
    blocks = torch.randint(-3, 4, (4, block, 1, 16), generator=gen).float()
    blocks[0], blocks[1] = 0.0, -0.0  # scores +0 and -0 for a positive q
    k = blocks[torch.arange(sum(lengths) // block + 1) % 4].flatten(0, 1)[:sum(lengths)]
    q = torch.randint(1, 3, (sum(lengths) // block + 1, 1, 2, 16), generator=gen).float()
    q = q.expand(-1, block, -1, -1).flatten(0, 1)[:sum(lengths)]
    q[:block * 80] *= torch.randint(-1, 2, (1, 1, 16), generator=gen).float()  # negative products in the long row's first rows
    off = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=device)
    q, k = q.contiguous().to(device), k.contiguous().to(device)
    opts = dict(block_q=block, block_kv=block, keep_ratio=0.3)

    def select(q, k, radix, causal, backend="triton"):
        monkeypatch.setattr(KNOBS, "sparse_select_radix", radix)
        return jfa_ops.select_kv_blocks(q, k, off, off, lengths[0], lengths[0], causal=causal, backend=backend,
                                        **opts)

    k_bad = k.clone()
    k_bad[block * 7:block * 7 + 3] = float("nan")
    k_bad[block * 9] = float("inf")
    for causal in (False, True):
        got, want = select(q, k, True, causal), select(q, k, False, causal)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), causal
        ref = jfa_ops.select_kv_blocks(q.cpu(), k.cpu(), off.cpu(), off.cpu(), lengths[0], lengths[0], causal=causal,
                                       backend="reference", **opts)
        assert all(torch.equal(a.cpu(), b) for a, b in zip(got, ref)), causal
    got, want = select(q, k_bad, True, False), select(q, k_bad, False, False)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), "non-finite"
    # 6 kv heads: a program's second group of 4 has 2 (the others' warps masked); GQA 2:1, a window, empty sequences
    monkeypatch.setattr(KNOBS, "sparse_select_radix", True)
    q6, k6 = (torch.randn(100, h, 16, generator=gen).half().to(device) for h in (12, 6))
    off6 = torch.tensor([0, 50, 50, 83, 100], device=device)
    for causal, window in ((False, (-1, -1)), (True, (20, 0))):
        _assert_selection_equals_reference(q6, k6, off6, off6, 50, 50, block_q=16, block_kv=16, keep_ratio=0.4,
                                           causal=causal, window=window)
    assert block_sparse_select.select_radix_width(block_sparse_select.SELECT_RADIX_MAX) == 512
    assert block_sparse_select.select_radix_width(block_sparse_select.SELECT_RADIX_MAX + 1) == 0


# (q lengths or None: the kv lengths, kv lengths, broadcast L_q, q heads, kv heads, block_q, block_kv)
POOLING_CASES = {
    # empty, length 1, tails not a multiple of the block, one block exactly; GQA 3 with 6 kv heads (4 + a partial 2)
    "jagged_gqa_partial_head_group": ((0, 1, 37, 32, 70, 0, 5), (3, 0, 64, 33, 1, 90, 12), None, 18, 6, 32, 32),
    # 2 kv heads (fewer than a stream's 4), several 32-row steps a head, 64-row Q blocks beside 32-row KV blocks
    "few_heads_long_blocks": ((130, 64, 1, 0, 100), (45, 130, 0, 64, 7), None, 2, 2, 64, 32),
    "broadcast_q": (None, (0, 1, 15, 33, 70, 0, 48), 77, 8, 4, 32, 16),
}


@on_each_device
@pytest.mark.parametrize("name", list(POOLING_CASES))
def test_pool_variants_equal_the_default_bit_for_bit(device, name, monkeypatch):
    """Selection pool v6 (``KNOBS.sparse_pool_stream``: 4 kv heads per program, 3 steps in flight;
    ``KNOBS.sparse_pool_one_launch``: Q and K in one launch) sums each kv head in the default's order (the same
    [32, D] accumulator and step order; on sm_90 the same TTGIR layout of it and of its reduction, the stream's steps
    landing through shared memory): pooled Q, pooled K and the slot -> sequence map equal the default's bit for bit
    (fp16 inputs; bf16 on the GPU), every element the default leaves unwritten unwritten, on jagged batches with
    empty sequences, length 1, partial tails, GQA, a partial group of heads and broadcast Q; the choices equal the
    reference's."""
    from jfa_ops.backends.triton import block_sparse_select
    from jfa_ops.backends.triton.configs import KNOBS

    pooled, outputs = [], {}
    real_launch = block_sparse_select.launch

    def spy(kernel, grid, args, **options):  # each pooling output starts as a sentinel before its first launch, so a
        # variant writing any other element (or fewer) differs; read back when the select kernel launches
        if kernel is block_sparse_select.block_select_kernel:
            pooled.append([outputs.pop(what).clone() for what in ("pooled_q", "pooled_k", "q_slot_seq")])
        else:
            pair = "PooledK" in args
            for what, name in (("pooled_q" if pair or args["WRITE_SEQ"] else "pooled_k", "Pooled"),
                               ("pooled_k", "PooledK"), ("q_slot_seq", "SLOT_SEQ")):
                if name in args and what not in outputs:
                    outputs[what] = args[name].fill_(-12345)
        return real_launch(kernel, grid, args, **options)

    monkeypatch.setattr(block_sparse_select, "launch", spy)
    monkeypatch.setattr(KNOBS, "sparse_select_layouts", False)  # every launch through ``launch`` (not plans)
    # the pooling's sums, every row pooled: KNOBS.sparse_pool_skip leaves rows 0 (its own test below), and the
    # pooling and select launches apart (KNOBS.sparse_select_overlap's one launch: its own tests)
    monkeypatch.setattr(KNOBS, "sparse_pool_skip", False)
    monkeypatch.setattr(KNOBS, "sparse_select_overlap", False)
    q_lens, kv_lens, broadcast, heads_q, heads_kv, block_q, block_kv = POOLING_CASES[name]
    gen = torch.Generator().manual_seed(5)
    q_lens = q_lens or kv_lens
    q = torch.randn(broadcast or sum(q_lens), heads_q, 24, generator=gen) * 4  # padded head dim (24 of 32)
    k = torch.randn(sum(kv_lens), heads_kv, 24, generator=gen) * 4
    kv_off = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q_off = None if broadcast else torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                                                device=device)
    opts = dict(block_q=block_q, block_kv=block_kv, keep_ratio=0.5, causal=not broadcast,
                broadcast_q=bool(broadcast))
    dtypes = (torch.float16,) if device == "cpu" else (torch.bfloat16,)  # the GPU: the bench's dtype
    # each variant against the pre-v6 pool with the same body: pool_one_launch runs the whole-block body
    # (KNOBS.sparse_pool_whole_block), whose one [block, D] reduction sums in another order than the 32-row steps
    whole_block = dict(sparse_pool_whole_block=True)
    runs = [("scratch", {}), ("scratch", whole_block), *((v, {}) for v in POOL_VARIANTS)]
    baseline = {"pool_stream": 0, "pool_one_launch": 1, "pool_stream_one_launch": 0}
    for dtype in dtypes:
        for variant, extra in runs:
            _set_select_variant(monkeypatch, variant, **extra)
            _assert_selection_equals_reference(q.to(device, dtype), k.to(device, dtype), q_off, kv_off,
                                               broadcast or max(q_lens), max(kv_lens), **opts)
    assert len(pooled) == len(dtypes) * len(runs)
    for dtype, first in zip(dtypes, range(0, len(pooled), len(runs))):
        bases, variants = pooled[first:first + 2], pooled[first + 2:first + len(runs)]
        for variant, got in zip(POOL_VARIANTS, variants):
            for what, a, b in zip(("pooled_q", "pooled_k", "q_slot_seq"), bases[baseline[variant]], got):
                assert torch.equal(a, b), (dtype, variant, what)


class _JunkEmpty:
    """``torch`` for block_sparse_select with ``empty`` int32 tensors full of junk (12345: no id, no count), so that
    an element ``KNOBS.sparse_select_fill`` leaves unwritten shows (fresh memory often reads 0, the padding's
    count)."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*shape, dtype=None, **kwargs):
        if dtype == torch.int32:
            return torch.full(*shape, 12345, dtype=dtype, **kwargs)
        return torch.empty(*shape, dtype=dtype, **kwargs)


class _JunkPools(_JunkEmpty):
    """``_JunkEmpty`` with fp32 ``empty`` tensors (the pooled rows) full of NaN: a pooled row read before its pool
    item stored it shows (fresh memory often holds the previous call's pooled rows: the right values)."""

    @staticmethod
    def empty(*shape, dtype=None, **kwargs):
        if dtype == torch.float32:
            return torch.full(*shape, float("nan"), dtype=dtype, **kwargs)
        return _JunkEmpty.empty(*shape, dtype=dtype, **kwargs)


# (edge case of SELECTION_EDGES, the select kernel's path as a SELECT_VARIANTS name)
FILL_CASES = [("many_sequences", "v6_visible_fp32_rn_radix"), ("many_sequences", "v5_grouped"),
              ("pooling_steps_and_tails", "pairwise"), ("broadcast_q_many_sequences", "v6_visible_fp32_rn_radix"),
              ("broadcast_q_many_sequences", "fp32_rn_grouped")]


@on_each_device
@pytest.mark.parametrize("name,variant", FILL_CASES, ids=[f"{n}-{v}" for n, v in FILL_CASES])
def test_select_fill_equals_the_fills_bit_for_bit(device, name, variant, monkeypatch):
    """``KNOBS.sparse_select_fill``: the select launch writes every element of index and count itself (its rows'
    -1 before their kept ids, one program per (sequence, kv head) for the rows past the sequence's end) instead of
    torch.full / torch.zeros first: the same index and count bit for bit as with the fills, and the float64
    reference's, from outputs that start as junk; on jagged batches with empty sequences, length 1, lengths off the
    block, GQA 2:1, causal, a two-sided window, broadcast Q; the radix, pairwise and grouped select paths."""
    from jfa_ops.backends.triton import block_sparse_select, configs

    _set_select_variant(monkeypatch, variant)
    monkeypatch.setattr(block_sparse_select, "torch", _JunkEmpty())
    q_lens, kv_lens, broadcast, block_q, block_kv = SELECTION_EDGES[name]
    gen = torch.Generator().manual_seed(len(kv_lens))
    q_lens = q_lens or kv_lens
    q = torch.randn(broadcast or sum(q_lens), 4, 24, generator=gen).half().to(device)
    k = torch.randn(sum(kv_lens), 2, 24, generator=gen).half().to(device)
    kv_off = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q_off = None if broadcast else torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], device=device)
    # max_seqlen_q above the longest sequence: whole index rows past every sequence's end (jagged)
    max_q = broadcast or max(q_lens) + 2 * block_q
    for causal, always_local, window in ((False, True, (-1, -1)), (True, False, (-1, -1)), (False, True, (40, 5))):
        opts = dict(block_q=block_q, block_kv=block_kv, keep_ratio=0.5, causal=causal, window=window,
                    broadcast_q=bool(broadcast), always_local=always_local)
        chosen = []
        for fill in (False, True):
            monkeypatch.setattr(configs.KNOBS, "sparse_select_fill", fill)
            chosen.append(_assert_selection_equals_reference(q, k, q_off, kv_off, max_q, max(kv_lens), **opts))
        assert all(torch.equal(a, b) for a, b in zip(*chosen)), opts


# (q lengths or None for the kv lengths, kv lengths, block_q, block_kv): rows that keep all, only the local block,
# none (a causal Q longer than its K: rows before the first key) and rows that rank, side by side
SKIP_CASES = {
    "jagged_causal_rows": (None, (0, 1, 15, 16, 17, 33, 0, 64, 100, 5, 130), 16, 16),
    "cross_lengths": ((70, 5, 0, 40, 96), (20, 40, 9, 0, 130), 16, 32),
}


@on_each_device
@pytest.mark.parametrize("name", list(SKIP_CASES))
def test_pool_skip_equals_the_full_pooling_bit_for_bit(device, name, monkeypatch):
    """``KNOBS.sparse_pool_skip``: Q blocks whose row ranks nothing by score (keeps all its visible blocks, only the
    local one, or none) are not pooled (their pooled rows 0): the same index and count bit for bit as the full
    pooling, and the float64 reference's; causal (keep 0.25 and 0.5), a two-sided window, always_local off,
    top_k, GQA 2:1, empty sequences, length 1, lengths off the block, Q longer and shorter than K; and it skips
    some block in every case (else the test would prove nothing)."""
    from jfa_ops.backends.triton import block_sparse_select, configs

    _set_select_variant(monkeypatch, "v6_visible_fp32_rn_radix")
    monkeypatch.setattr(configs.KNOBS, "sparse_select_layouts", False)  # every launch through ``launch``
    monkeypatch.setattr(configs.KNOBS, "sparse_select_overlap", False)  # the pooling's own launch (spied on below)
    zero_rows = []
    real_launch = block_sparse_select.launch

    def spy(kernel, grid, args, **options):  # the pooled Q rows the pooling left 0 (randn Q: none by chance)
        if kernel is block_sparse_select.block_select_kernel and configs.KNOBS.sparse_pool_skip:
            zero_rows.append(int((args["PQ"] == 0).all(-1).all(-1).sum()))
        return real_launch(kernel, grid, args, **options)

    monkeypatch.setattr(block_sparse_select, "launch", spy)
    q_lens, kv_lens, block_q, block_kv = SKIP_CASES[name]
    gen = torch.Generator().manual_seed(len(kv_lens))
    q_lens = q_lens or kv_lens
    q = torch.randn(sum(q_lens), 4, 24, generator=gen).half().to(device)
    k = torch.randn(sum(kv_lens), 2, 24, generator=gen).half().to(device)
    kv_off = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q_off = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    for opts in (dict(causal=True, keep_ratio=0.25), dict(causal=True, keep_ratio=0.5, always_local=False),
                 dict(window=(40, 5), keep_ratio=0.25), dict(causal=True, top_k=2)):
        opts = dict(block_q=block_q, block_kv=block_kv, **opts)
        chosen = []
        for skip in (False, True):
            monkeypatch.setattr(configs.KNOBS, "sparse_pool_skip", skip)
            chosen.append(_assert_selection_equals_reference(q, k, q_off, kv_off, max(q_lens), max(kv_lens), **opts))
        assert all(torch.equal(a, b) for a, b in zip(*chosen)), opts
        assert zero_rows and zero_rows[-1] > 0, (opts, zero_rows)


# KNOBS.sparse_select_overlap: (a batch of SELECTION_EDGES or SKIP_CASES, the select path as a SELECT_VARIANTS name,
# KNOBS.sparse_pool_skip)
OVERLAP_CASES = [("many_sequences", "v6_visible_fp32_rn_radix", False), ("many_sequences", "pairwise", False),
                 ("pooling_steps_and_tails", "v6_visible_fp32_rn_radix", False),
                 ("broadcast_q_many_sequences", "v6_visible_fp32_rn_radix", False),
                 ("jagged_causal_rows", "v6_visible_fp32_rn_radix", True),
                 ("cross_lengths", "v6_visible_fp32_rn_radix", True)]


def _overlap_batch(name, device):
    """(q, k, q_offsets, kv_offsets, max_seqlen_q, max_seqlen_kv, block_q, block_kv, broadcast L_q or None) of an
    OVERLAP_CASES batch: fp16, GQA 2:1, offsets as two tensors (the bench's way) even where their values are equal."""
    if name in SKIP_CASES:
        q_lens, kv_lens, block_q, block_kv = SKIP_CASES[name]
        broadcast = None
    else:
        q_lens, kv_lens, broadcast, block_q, block_kv = SELECTION_EDGES[name]
    gen = torch.Generator().manual_seed(len(kv_lens) + 7)
    q_lens = q_lens or kv_lens
    q = torch.randn(broadcast or sum(q_lens), 4, 24, generator=gen).half().to(device)
    k = torch.randn(sum(kv_lens), 2, 24, generator=gen).half().to(device)
    kv_off = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q_off = None if broadcast else torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32,
                                                device=device)
    max_q = broadcast or max(q_lens) + 2 * block_q  # whole index rows past every sequence's end
    return q, k, q_off, kv_off, max_q, max(kv_lens), block_q, block_kv, broadcast


def _overlap_options(broadcast):
    """Causal keep 0.25 and 0.5 (always_local off), a two-sided window, causal top_k, non-causal (broadcast Q: the
    non-causal ones)."""
    opts = [dict(window=(40, 5), keep_ratio=0.25), dict(keep_ratio=0.5)]
    if not broadcast:
        opts += [dict(causal=True, keep_ratio=0.25), dict(causal=True, keep_ratio=0.5, always_local=False),
                 dict(causal=True, top_k=2)]
    return opts


@on_each_device
@pytest.mark.parametrize("name,variant,skip", OVERLAP_CASES, ids=[f"{n}-{v}-{'skip' if s else 'full'}"
                                                                  for n, v, s in OVERLAP_CASES])
def test_select_overlap_equals_the_default_bit_for_bit(device, name, variant, skip, monkeypatch):
    """``KNOBS.sparse_select_overlap``: the pools and the select in one launch, work items by ticket, the select
    items waiting on the pools' done-counters: the same index and count bit for bit as the default's two launches and
    fills, and the float64 reference's, from outputs that start as junk (every element written by the one launch);
    jagged batches with empty sequences, length 1, lengths off the block, max_seqlen_q past every sequence, Q longer
    and shorter than K, 64-row blocks, broadcast Q; causal, window, top_k, always_local off; the radix and pairwise
    select paths, with and without ``KNOBS.sparse_pool_skip``; offsets as two tensors and as one. On the CPU the
    interpreter runs programs in order (ticket = program id): this tests the items' choices and coverage (a missing
    item leaves junk, a doubled pool item a counter past its target: a wait that never ends), not the waits."""
    from jfa_ops.backends.triton import block_sparse_select, configs

    _set_select_variant(monkeypatch, variant)
    monkeypatch.setattr(configs.KNOBS, "sparse_pool_skip", skip)
    monkeypatch.setattr(block_sparse_select, "torch", _JunkEmpty())
    monkeypatch.setattr(configs.KNOBS, "sparse_select_layouts", False)  # every launch through ``launch``
    kernels = []
    real_launch = block_sparse_select.launch
    monkeypatch.setattr(block_sparse_select, "launch",
                        lambda kernel, grid, args, **o: kernels.append(kernel) or real_launch(kernel, grid, args, **o))
    q, k, q_off, kv_off, max_q, max_kv, block_q, block_kv, broadcast = _overlap_batch(name, device)
    same_lengths = q_off is not None and torch.equal(q_off, kv_off)
    for opts in _overlap_options(broadcast):
        opts = dict(block_q=block_q, block_kv=block_kv, broadcast_q=bool(broadcast), **opts)
        chosen = []
        for overlap, offsets in ((False, q_off), (True, q_off), *(((True, kv_off),) if same_lengths else ())):
            monkeypatch.setattr(configs.KNOBS, "sparse_select_overlap", overlap)
            kernels.clear()
            chosen.append(_assert_selection_equals_reference(q, k, offsets, kv_off, max_q, max_kv, **opts))
            want = [block_sparse_select.block_select_overlap_kernel] if overlap else None
            assert want is None or kernels == want, (opts, kernels)
        assert all(torch.equal(a, b) for got in chosen[1:] for a, b in zip(chosen[0], got)), opts


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("tail", [False, True], ids=["slot_order", "longest_first"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_select_overlap_many_calls_gpu(causal, tail, monkeypatch):
    """``KNOBS.sparse_select_overlap`` on the GPU, where programs run at once and in any order: 200 calls (eager,
    layouts kept, the state zeroed per call) and 50 replays of a captured call, each bit for bit the default's
    selection on a bench-like bf16 batch (jagged lengths up to 16 blocks of 128, an empty sequence, H 8, GQA 2:1,
    D 128, offsets as two tensors: the lag from the device), with and without the pool skip; in slot order and in
    ``KNOBS.sparse_select_overlap_tail``'s longest-first order (40 sequences: ordered). A select item reading a
    pooled row before its pool item stored it (a missing wait, a release or acquire too weak, a K limit off)
    changes some choice in some call."""
    from jfa_ops.backends.triton import configs
    from tests.common import captured_after_warm_up

    gen = torch.Generator().manual_seed(46)
    lens = torch.randint(1, 16 * 128, (40,), generator=gen)
    lens[3] = 0
    lens[7] = 16 * 128
    q = torch.randn(int(lens.sum()), 8, 128, generator=gen).to("cuda", torch.bfloat16)
    k = torch.randn(int(lens.sum()), 4, 128, generator=gen).to("cuda", torch.bfloat16)
    q_off = torch.nn.functional.pad(lens.cumsum(0), (1, 0)).to(torch.int32).cuda()
    kv_off = q_off.clone()
    opts = dict(block_q=128, block_kv=128, keep_ratio=0.25, causal=causal)

    def select():
        return jfa_ops.select_kv_blocks(q, k, q_off, kv_off, 16 * 128, 16 * 128, backend="triton", **opts)

    want = select()
    monkeypatch.setattr(configs.KNOBS, "sparse_select_overlap_tail", tail)
    for skip in (False, True):
        monkeypatch.setattr(configs.KNOBS, "sparse_pool_skip", skip)
        monkeypatch.setattr(configs.KNOBS, "sparse_select_overlap", True)
        for call in range(200):
            got = select()
            assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0]), (skip, call)
        graph, got = captured_after_warm_up(select)
        for replay in range(50):
            got[0].fill_(-7)
            graph.replay()
            assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0]), (skip, replay)
        monkeypatch.setattr(configs.KNOBS, "sparse_select_overlap", False)


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
@pytest.mark.parametrize("tail", [False, True], ids=["slot_order", "longest_first"])
def test_select_overlap_state_is_zeroed_per_call(tail, monkeypatch):
    """``KNOBS.sparse_select_overlap``'s ticket, lag word and counters: a fresh zeroed state for each call (never
    shared between launches, stop 46; the kernel counts tickets from 0 and reads a lag word of 0 as not yet
    published: no generation since stop 47), and what the launch leaves in it: every ticket taken, the lag word
    published (lag >= 1; the order bit set under ``KNOBS.sparse_select_overlap_tail``), every slot's done-counter at
    its pool items (1 here); each call equals the reference."""
    from jfa_ops.backends.triton import block_sparse_select, configs

    _set_select_variant(monkeypatch, "v6_visible_fp32_rn_radix")
    monkeypatch.setattr(configs.KNOBS, "sparse_select_overlap", True)
    monkeypatch.setattr(configs.KNOBS, "sparse_select_overlap_tail", tail)
    monkeypatch.setattr(block_sparse_select, "_layout_key", lambda *args: None)  # every launch through ``launch``
    seen = []
    real_launch = block_sparse_select.launch

    def spy(kernel, grid, args, **options):
        if "STATE" in args:  # zeroed before the launch
            assert not args["STATE"].any() and not args["FLAGS"].any()
        out = real_launch(kernel, grid, args, **options)
        if "STATE" in args:
            # the STATE tensor itself kept, not its id: a freed tensor's id can come back for the next call's
            # (a CI flake in stop 49: 2 ids over 3 calls)
            seen.append((args["STATE"].clone(), args["FLAGS"].clone(), grid[0], args["STATE"], args["q_programs"]))
        return out

    monkeypatch.setattr(block_sparse_select, "launch", spy)
    q, k, q_off, kv_off, max_q, max_kv, block_q, block_kv, _ = _overlap_batch("jagged_causal_rows", "cpu")
    for n in range(1, 4):
        _assert_selection_equals_reference(q, k, q_off, kv_off, max_q, max_kv, block_q=block_q, block_kv=block_kv,
                                           causal=True, keep_ratio=0.25)
        assert len(seen) == n
        state, flags, programs, _, q_programs = seen[-1]
        lag, ordered = state[1].item() & 0xFFFFFFFF, state[1].item() >> 32
        assert state[0].item() == programs and lag >= 1 and ordered == int(tail), (n, state)
        counters = q_programs + int(-(-int(kv_off[-1]) // block_kv) + len(kv_off) - 1 + 3) // 4 * 4
        assert (flags[:counters] == 1).all(), (n, flags)  # 2 kv heads: 1 item a slot
        assert len(flags) == counters + (256 if tail else 0), len(flags)
    assert len({id(state) for *_, state, _ in seen}) == 3  # a fresh state each call (all kept alive)


@triton.jit
def _order_kernel(Q_OFF, KV_OFF, TABLE, OUT, kv_seqs, qs, ks, n_kv_blocks, limit, BLOCK_Q: tl.constexpr,
                  BLOCK_KV: tl.constexpr, MAP: tl.constexpr):  # test_select_overlap_tail_order_...
    """OUT[0, 1]: _order_table's (lag, ordered); then MAP positions' (Q slot, Q rank) and (K slot, K rank)."""
    lag, ordered = _order_table(Q_OFF, KV_OFF, TABLE, kv_seqs, qs, ks, n_kv_blocks, limit, BLOCK_Q, BLOCK_KV)
    tl.store(OUT, lag)
    tl.store(OUT + 1, ordered)
    tl.debug_barrier()
    if ordered != 0:
        for p in range(0, MAP):
            t, at = _slot_at(TABLE, p)
            tl.store(OUT + 2 + 4 * p, t)
            tl.store(OUT + 3 + 4 * p, at)
            t, at = _slot_at(TABLE + 2 * 64, p)
            tl.store(OUT + 4 + 4 * p, t)
            tl.store(OUT + 5 + 4 * p, at)


def _overlap_order_oracle(q_lens, kv_lens, block_q, block_kv, n_kv):
    """The longest-first order by hand: sequence 0, then the others by K slots (blocks + 1) descending, ties by
    index; (the position of each Q slot, of each K slot, the lag that puts every real select item after the Q slot
    and K slots it reads, the slot counts)."""
    g_q = [sum(q_lens[:b]) // block_q + b for b in range(len(q_lens) + 1)]  # scheduling.slot_tile's layout
    g_k = [sum(kv_lens[:b]) // block_kv + b for b in range(len(kv_lens) + 1)]
    order = [0] + sorted(range(1, len(kv_lens)), key=lambda b: (-(g_k[b + 1] - g_k[b]), b))
    q_pos, k_pos, pq, pk = {}, {}, 0, 0
    for b in order:
        for j in range(g_q[b + 1] - g_q[b]):
            q_pos[g_q[b] + j] = pq + j
        for j in range(g_k[b + 1] - g_k[b]):
            k_pos[g_k[b] + j] = pk + j
        pq, pk = pq + g_q[b + 1] - g_q[b], pk + g_k[b + 1] - g_k[b]
    lag = 1
    for b, (len_q, len_k) in enumerate(zip(q_lens, kv_lens)):
        for i in range(-(-len_q // block_q)):  # Q slot g_q(b) + i's select reads it and the sequence's K slots
            reads = [k_pos[g_k[b] + j] for j in range(min(-(-len_k // block_kv), n_kv))]
            lag = max(lag, *(r - q_pos[g_q[b] + i] + 1 for r in reads), 1)
    return q_pos, k_pos, lag, g_q[-1], g_k[-1]


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
def test_select_overlap_tail_order_covers_every_dependency():
    """``KNOBS.sparse_select_overlap_tail``'s order (``_order_table`` by ticket 0's program, ``_slot_at`` by every
    item), against the order built by hand (``_overlap_order_oracle``) on random jagged batches (empty sequences,
    sequence 0 empty, length 1, Q longer / shorter / as long as K, unequal blocks, max_seqlen under the longest):
    each side's positions map one to one onto its slots (padding slots past the batch at their own place), position
    0 is slot 0 (the fills wait on it), each sequence's slots in order, the order longest first; the lag is the
    oracle's: every select item at position (its Q slot's) + lag comes after its Q slot and every K slot it reads,
    and no later. A lag one short, or a K slot mapped elsewhere, would make an item skip a wait (its position bound
    keeps it deadlock-free) and read a pooled row before its done-counter: this is the test of that. 64 sequences
    or more, or a sequence with no slot (bad offsets): ordered 0, the slot order (table untouched)."""
    gen = torch.Generator().manual_seed(47)
    for trial in range(40):
        num_seqs = int(torch.randint(1, 30, (), generator=gen)) if trial % 10 else 64 + trial % 3
        kv_lens = torch.randint(0, 300, (num_seqs,), generator=gen) * (torch.rand(num_seqs, generator=gen) > 0.15)
        q_lens = kv_lens if trial % 3 == 0 else torch.randint(0, 300, (num_seqs,), generator=gen)
        if trial % 7 == 0:
            kv_lens[0] = q_lens[0] = 0
        block_q, block_kv = ((16, 16), (16, 32), (64, 16))[trial % 3]
        n_kv = max(1, -(-int(kv_lens.max()) // block_kv) - (trial % 5 == 0))
        q_off = torch.nn.functional.pad(q_lens.cumsum(0), (1, 0)).to(torch.int32)
        kv_off = torch.nn.functional.pad(kv_lens.cumsum(0), (1, 0)).to(torch.int32)
        qs = (-(-int(q_off[-1]) // block_q) + num_seqs + 3) // 4 * 4
        ks = (-(-int(kv_off[-1]) // block_kv) + num_seqs + 3) // 4 * 4
        table = torch.full((4 * 64,), -5, dtype=torch.int32)
        out = torch.zeros(2 + 4 * max(qs, ks), dtype=torch.int32)
        _order_kernel[(1,)](q_off, kv_off, table, out, num_seqs, qs, ks, n_kv, max(qs, ks), block_q, block_kv,
                            max(qs, ks))
        if num_seqs >= 64:
            assert int(out[1]) == 0 and (table == -5).all(), trial
            continue
        q_pos, k_pos, lag, end_q, end_k = _overlap_order_oracle(q_lens.tolist(), kv_lens.tolist(), block_q,
                                                                block_kv, n_kv)
        assert int(out[1]) == 1 and int(out[0]) == lag, (trial, out[:2].tolist(), lag)
        got = out[2:].view(-1, 4)
        for side, (pos, slots, end) in enumerate(((q_pos, qs, end_q), (k_pos, ks, end_k))):
            mapped = got[:slots, 2 * side].tolist()
            want = [next(t for t, at in pos.items() if at == p) if p < end else p for p in range(slots)]
            assert mapped == want, (trial, side)
            assert sorted(mapped) == list(range(slots)) and mapped[0] == 0, (trial, side)
        # the Q and K ranks of a position agree for the select's K limit: a sequence's rank on both sides
        ranks_q = {int(got[p, 0]): int(got[p, 1]) for p in range(end_q)}
        ranks_k = {int(got[p, 2]): int(got[p, 3]) for p in range(end_k)}
        g_q = [int(q_off[b]) // block_q + b for b in range(num_seqs)]
        g_k = [int(kv_off[b]) // block_kv + b for b in range(num_seqs)]
        assert all(ranks_q[g_q[b]] == ranks_k[g_k[b]] for b in range(num_seqs)), trial
        counts = [g_k[b + 1] - g_k[b] if b + 1 < num_seqs else end_k - g_k[b] for b in range(num_seqs)]
        by_rank = sorted(range(1, num_seqs), key=lambda b: ranks_k[g_k[b]])
        assert all(counts[a] >= counts[b] for a, b in zip(by_rank, by_rank[1:])), trial  # longest first
    # bad offsets (a sequence's end before its start: a slot count < 1): the slot order
    q_off = torch.tensor([0, 40, 10, 50], dtype=torch.int32)
    table = torch.full((4 * 64,), -5, dtype=torch.int32)
    out = torch.zeros(2 + 4 * 8, dtype=torch.int32)
    _order_kernel[(1,)](q_off, q_off, table, out, 3, 8, 8, 4, 8, 16, 16, 8)
    assert int(out[1]) == 0 and (table == -5).all()


# KNOBS.sparse_select_overlap_tail: batches of OVERLAP_CASES (names) that it orders, and one past its 64 sequences
TAIL_CASES = ["many_sequences", "pooling_steps_and_tails", "jagged_causal_rows", "cross_lengths",
              "more_than_64_sequences"]


@on_each_device
@pytest.mark.parametrize("name", TAIL_CASES)
def test_select_overlap_tail_equals_the_default_bit_for_bit(device, name, monkeypatch):
    """``KNOBS.sparse_select_overlap_tail``: the overlap's positions in longest-first order give the same index and
    count bit for bit as the slot order's (the default) and the float64 reference's, from outputs and pooled rows
    that start as junk (``_JunkPools``: a select item that read a pooled row before its pool item ran reads NaN;
    the interpreter runs items in ticket order, so this catches an order that puts a read after its item, not a
    skipped wait on an earlier one: ``test_select_overlap_tail_order_covers_every_dependency`` pins the lag);
    jagged batches with empty sequences (sequence 0 empty), length 1, lengths off the block, Q longer and shorter
    than K, 64-row blocks, GQA 2:1; causal, window, top_k, always_local off, the pool skip on the SKIP_CASES
    batches; the published order bit says the order was used (70 sequences: the slot order), and the order is not
    the identity (else the test would prove nothing)."""
    from jfa_ops.backends.triton import block_sparse_select, configs

    _set_select_variant(monkeypatch, "v6_visible_fp32_rn_radix")
    monkeypatch.setattr(configs.KNOBS, "sparse_pool_skip", name in SKIP_CASES)
    monkeypatch.setattr(block_sparse_select, "torch", _JunkPools())
    monkeypatch.setattr(configs.KNOBS, "sparse_select_layouts", False)  # every launch through ``launch``
    monkeypatch.setattr(configs.KNOBS, "sparse_select_overlap", True)
    states = []
    real_launch = block_sparse_select.launch

    def spy(kernel, grid, args, **options):
        out = real_launch(kernel, grid, args, **options)
        if "STATE" in args:
            states.append((int(args["STATE"][1]) >> 32, args["FLAGS"][-3 * 64:-2 * 64].clone()))
        return out

    monkeypatch.setattr(block_sparse_select, "launch", spy)
    if name in SKIP_CASES:
        q, k, q_off, kv_off, max_q, max_kv, block_q, block_kv, broadcast = _overlap_batch(name, device)
    else:
        q_lens, kv_lens, broadcast, block_q, block_kv = SELECTION_EDGES[name]
        gen = torch.Generator().manual_seed(len(kv_lens) + 7)
        q_lens = q_lens or kv_lens
        q = torch.randn(sum(q_lens), 4, 24, generator=gen).half().to(device)
        k = torch.randn(sum(kv_lens), 2, 24, generator=gen).half().to(device)
        kv_off = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
        q_off = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
        max_q, max_kv = max(q_lens) + 2 * block_q, max(kv_lens)
    ordered = len(kv_off) - 1 < 64
    options = _overlap_options(False) if name != "more_than_64_sequences" else [dict(causal=True, keep_ratio=0.25)]
    for opts in options:
        opts = dict(block_q=block_q, block_kv=block_kv, **opts)
        chosen = []
        for tail in (False, True):
            monkeypatch.setattr(configs.KNOBS, "sparse_select_overlap_tail", tail)
            states.clear()
            chosen.append(_assert_selection_equals_reference(q, k, q_off, kv_off, max_q, max_kv, **opts))
            assert len(states) == 1 and states[0][0] == int(tail and ordered), (opts, states)
        assert all(torch.equal(a, b) for a, b in zip(*chosen)), opts
        if ordered:  # the Q table's first slots by rank: not in slot order
            firsts = states[0][1].cpu()
            firsts = firsts[:len(kv_off) - 1]
            assert not torch.equal(firsts, firsts.sort().values), firsts


@triton.jit
def _safe_lag_kernel(Q_OFF, KV_OFF, OUT, kv_seqs, n_q_blocks, n_kv_blocks, limit, BLOCK_Q: tl.constexpr,
                     BLOCK_KV: tl.constexpr, BROADCAST_Q: tl.constexpr):  # test_select_overlap_lag_...
    tl.store(OUT, _safe_lag(Q_OFF, KV_OFF, kv_seqs, n_q_blocks, n_kv_blocks, limit, BLOCK_Q, BLOCK_KV, BROADCAST_Q))


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
@pytest.mark.parametrize("broadcast", [False, True], ids=["jagged", "broadcast_q"])
def test_select_overlap_lag_covers_every_dependency(broadcast):
    """``KNOBS.sparse_select_overlap``'s lag (``_safe_lag``, on the device from the offsets) puts every select item
    after the pool items it reads, and no later than needed: counted item by item here (select slot t at position
    t + lag; its Q slot and its sequence's K slots at their slot's position), on random jagged batches with Q
    longer, shorter and as long as K, empty sequences, unequal blocks, max_seqlen under the longest (NKB clamps).
    A lag too small makes the kernel skip a wait (its position bound keeps it deadlock-free) and read unfinished
    pools, which the interpreter's in-order programs never show: this is the test of it."""
    gen = torch.Generator().manual_seed(11)
    for trial in range(40):
        num_seqs = int(torch.randint(1, 30, (), generator=gen))
        kv_lens = torch.randint(0, 300, (num_seqs,), generator=gen) * (torch.rand(num_seqs, generator=gen) > 0.15)
        q_lens = kv_lens if trial % 3 == 0 else torch.randint(0, 300, (num_seqs,), generator=gen)
        block_q, block_kv = ((16, 16), (16, 32), (64, 16))[trial % 3]
        len_bq = int(torch.randint(1, 300, (), generator=gen)) if broadcast else None
        q_lens = torch.tensor([len_bq]) if broadcast else q_lens
        n_q = -(-int(q_lens.max()) // block_q) if trial % 4 else max(1, -(-int(q_lens.max()) // block_q) - 2)
        n_kv = max(1, -(-int(kv_lens.max()) // block_kv) - (trial % 5 == 0))
        q_off = torch.nn.functional.pad(q_lens.cumsum(0), (1, 0)).to(torch.int32)
        kv_off = torch.nn.functional.pad(kv_lens.cumsum(0), (1, 0)).to(torch.int32)
        q_slots = -(-int(q_off[-1]) // block_q) + len(q_lens)
        kv_slots = -(-int(kv_off[-1]) // block_kv) + num_seqs
        need = 1
        for b in range(num_seqs):
            len_q = int(q_lens[0] if broadcast else q_lens[b])
            g_k = int(kv_off[b]) // block_kv + b
            k_slots = range(g_k, g_k + min(-(-int(kv_lens[b]) // block_kv), n_kv))
            for i in range(min(-(-len_q // block_q), n_q)):  # the real select items of sequence b
                t = b * n_q + i if broadcast else int(q_off[b]) // block_q + b + i
                for slot in (i if broadcast else t, *k_slots):
                    need = max(need, slot - t + 1)  # slot's position < t + lag
        out = torch.zeros(1, dtype=torch.int32)
        _safe_lag_kernel[(1,)](q_off, kv_off, out, num_seqs, n_q, n_kv, max(q_slots, kv_slots), block_q, block_kv,
                               broadcast)
        assert int(out) == need, (trial, int(out), need)


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
@pytest.mark.parametrize("knob", ["sparse_select_fill", "sparse_select_overlap"])
def test_select_fill_bad_offsets_deferred(knob, monkeypatch):
    """``KNOBS.sparse_select_fill`` under JFA_VALIDATE=deferred: bad offsets (a sequence past the rows, a length
    over max_seqlen, lengths that do not add up) still leave every count in [0, NKB] and every id in [-1, NKB)
    (a later block_sparse_attention reads count ids of a row: junk there reads past it), check_pending raises; the
    pooling's check reaches the select kernel through the slot map's extra element."""
    from jfa_ops import validation
    from jfa_ops.backends.triton import block_sparse_select, configs

    monkeypatch.setattr(block_sparse_select, "torch", _JunkEmpty())
    monkeypatch.setattr(configs.KNOBS, knob, True)  # the overlap implies the fill (its lag from bad offsets too)
    monkeypatch.setattr(validation, "validation_mode", lambda device: "deferred")
    validation._pending.clear()
    q = torch.randn(40, 2, 16).half()
    good = torch.tensor([0, 17, 40], dtype=torch.int32)
    # then good Q offsets beside a KV sequence past the rows (its rows: -1 and 0 from the select programs); the last:
    # offsets that fall back (sequence 2's slots overlap sequence 0's: the slot search maps its block 0 to no
    # program, so only the check's flag gets that row written)
    for q_off, kv_off, max_len in ((torch.tensor([0, 57, 40], dtype=torch.int32), None, 60), (good, None, 10),
                                   (torch.tensor([0, 30, 20], dtype=torch.int32), None, 30),
                                   (good, torch.tensor([0, 50, 40], dtype=torch.int32), 50),
                                   (torch.tensor([0, 40, 10, 40], dtype=torch.int32), None, 40)):
        kv_off = q_off if kv_off is None else kv_off
        index, count = jfa_ops.select_kv_blocks(q, q, q_off, kv_off, max_len, max_len, block_q=16, block_kv=16,
                                                backend="triton")
        width = index.shape[-1]
        assert ((count >= 0) & (count <= width)).all() and ((index >= -1) & (index < width)).all(), (kv_off, count)
        with pytest.raises(ValueError, match="JFA_VALIDATE=deferred"):
            jfa_ops.check_pending()
    validation._pending.clear()


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
def test_selection_grids_follow_the_rows_not_max_seqlen(monkeypatch):
    """The selection launches one program per (real block slot, kv head): cdiv(T, block) + B slots per side, not
    B x cdiv(max_seqlen, block) (one long sequence beside many short ones made ~80% of the programs idle)."""
    from jfa_ops.backends.triton import block_sparse_select
    from jfa_ops.backends.triton.configs import KNOBS

    grids = []
    real_launch = block_sparse_select.launch
    monkeypatch.setattr(block_sparse_select, "launch",
                        lambda kernel, grid, args, **o: grids.append(grid) or real_launch(kernel, grid, args, **o))
    lengths = (256, 1, 2, 3, 4, 5, 6, 7)  # max_seqlen 256: 16 blocks x 8 sequences = 128 rows of the output
    off = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(lengths), 2, 16).half()
    slots = (sum(lengths) + 15) // 16 + len(lengths)  # 18 + 8
    bound = -(-slots // 4) * 4 * 2  # 2 kv heads; vs 16 * 8 * 2 = 256
    for overlap in (False, True):
        monkeypatch.setattr(KNOBS, "sparse_select_overlap", overlap)
        grids.clear()
        _assert_selection_equals_reference(q, q, off, off, 256, 256, block_q=16, block_kv=16, causal=True)
        programs = [math.prod(g) for g in grids]
        if overlap:  # one launch: the pools' programs, the select's and one fill program per (sequence, kv head)
            assert len(grids) == 1 and programs[0] <= 2 * bound + len(lengths) * 2, grids
            continue
        # the pools (Q's and K's in one launch with KNOBS.sparse_pool_one_launch, the default), then the select
        assert len(grids) == (2 if KNOBS.sparse_pool_one_launch else 3), grids
        assert max(programs) <= bound, grids


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_selection_deferred_bad_offsets_gpu(monkeypatch):
    """JFA_VALIDATE=deferred on the GPU: bad offsets (a sequence past the rows, a length over max_seqlen) give no
    illegal address in the selection's kernels; check_pending raises; the next good call equals the reference."""
    from jfa_ops import validation

    monkeypatch.setenv("JFA_VALIDATE", "deferred")
    validation._pending.clear()
    q = torch.randn(4000, 4, 64, device="cuda", dtype=torch.bfloat16)
    good = torch.tensor([0, 1500, 4000], device="cuda", dtype=torch.int32)
    for bad, max_len in ((torch.tensor([0, 4100, 4000], device="cuda", dtype=torch.int32), 4100), (good, 1000)):
        jfa_ops.select_kv_blocks(q, q, bad, bad, max_len, max_len, block_q=64, block_kv=64, backend="triton")
        torch.cuda.synchronize()  # no illegal address
        with pytest.raises(ValueError, match="JFA_VALIDATE=deferred"):
            jfa_ops.check_pending()
    _assert_selection_equals_reference(q, q, good, good, 2500, 2500, block_q=64, block_kv=64, causal=True)
    jfa_ops.check_pending()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("broadcast_q", [False, True], ids=["jagged", "broadcast_q"])
def test_captured_selection_outlives_the_kept_layout(broadcast_q):
    """A selection captured into a CUDA graph after its signature's layout was kept (an eager call first): the graph
    reads the layout's keep table (and broadcast offsets) on every replay. After ``launch.clear_cache()`` and the
    per-shape caches drop them and their blocks go to other tensors, a replay still equals the reference selection
    (stop 43: the layout used to be freed under the graph; its keep counts then read another tensor's data)."""
    import gc

    from jfa_ops.backends.triton import block_sparse_select, launch

    launch.clear_cache()
    lengths = torch.tensor([0, 700, 0, 1, 300, 1500, 64])
    kv_off = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32).cuda()
    rows_q = 200 if broadcast_q else int(lengths.sum())
    q = torch.randn(rows_q, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(int(lengths.sum()), 4, 64, device="cuda", dtype=torch.bfloat16)
    q_off = None if broadcast_q else kv_off
    max_q = rows_q if broadcast_q else 1500
    opts = dict(block_q=64, block_kv=64, keep_ratio=0.25, causal=not broadcast_q, broadcast_q=broadcast_q)

    def select():
        return jfa_ops.select_kv_blocks(q, k, q_off, kv_off, max_q, 1500, backend="triton", **opts)

    select()  # eager: keeps the signature's layout
    held = set(block_sparse_select._READ_BY_GRAPHS)
    graph, (index, count) = captured_after_warm_up(select)  # the capture meets the warm-up's kept layout
    assert set(block_sparse_select._READ_BY_GRAPHS) - held, "the capture did not read a kept layout"
    launch.clear_cache()
    block_sparse_select._keep_table.cache_clear()
    block_sparse_select._broadcast_offsets.cache_clear()
    gc.collect()
    junk = [torch.full((64,), 1 << 20, dtype=torch.int32, device="cuda") for _ in range(512)]  # their blocks, reused
    index.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    want = jfa_ops.select_kv_blocks(q.cpu(), k.cpu(), None if q_off is None else q_off.cpu(), kv_off.cpu(), max_q,
                                    1500, backend="reference", **opts)
    assert torch.equal(count.cpu(), want[1]) and torch.equal(index.cpu(), want[0])
    del junk


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
def test_selection_launch_counts(monkeypatch):
    """A selection call (JFA_VALIDATE=async, counted on the host): the pooling (Q with the offset check, then K: one
    launch with KNOBS.sparse_pool_one_launch, the default since 2026-12-03, else two) and the select kernel, plus
    the outputs' fills and the check's assert; the keep table is built once per shape (the first call)."""
    from jfa_ops import validation
    from jfa_ops.backends.base import BlockSelectParams
    from jfa_ops.backends.triton import configs
    from tests.backends.test_triton_kernels import _count_launches

    monkeypatch.setattr(validation, "validation_mode", lambda device: "async")
    q = torch.randn(64, 2, 16).half()
    off = torch.tensor([0, 40, 40, 64], dtype=torch.int32)
    params = BlockSelectParams(block_q=16, block_kv=16, n_q_blocks=3, n_kv_blocks=3, causal=True, max_seqlen_q=40,
                               max_seqlen_kv=40, check_offsets=True)
    tb.select_kv_blocks(q, q, off, off, params)  # builds the keep table
    # the launches apart first (KNOBS.sparse_select_overlap, on since stop 46: one launch, the end of this test)
    monkeypatch.setattr(configs.KNOBS, "sparse_select_overlap", False)
    # KNOBS.sparse_pool_skip (on since stop 46) has its own pair kernel, on the one-launch pooling only
    for one_launch, skip, pools in ((True, True, {"block_pool_pair_skip_kernel": 1}),
                                    (True, False, {"block_pool_pair_kernel": 1}),
                                    (False, True, {"block_pool_kernel": 2})):
        monkeypatch.setattr(configs.KNOBS, "sparse_pool_one_launch", one_launch)
        monkeypatch.setattr(configs.KNOBS, "sparse_pool_skip", skip)
        kernels, aten = _count_launches(lambda: tb.select_kv_blocks(q, q, off, off, params))
        assert kernels == {**pools, "block_select_kernel": 1}, (one_launch, skip, kernels)
    assert sorted(aten) == ["_assert_async.msg", "full.default", "zeros.default"], aten
    monkeypatch.setattr(configs.KNOBS, "sparse_select_fill", True)  # the select launch writes the outputs: no fills
    kernels, aten = _count_launches(lambda: tb.select_kv_blocks(q, q, off, off, params))
    assert kernels == {"block_pool_kernel": 2, "block_select_kernel": 1} and aten == ["_assert_async.msg"], \
        (kernels, aten)
    # KNOBS.sparse_select_overlap (on the one-launch pooling): one launch in all; its ticket and counters zeroed
    # per call (test_select_overlap_state_is_zeroed_per_call)
    monkeypatch.setattr(configs.KNOBS, "sparse_pool_one_launch", True)
    monkeypatch.setattr(configs.KNOBS, "sparse_select_overlap", True)
    kernels, aten = _count_launches(lambda: tb.select_kv_blocks(q, q, off, off, params))
    assert kernels == {"block_select_overlap_kernel": 1}, kernels
    assert sorted(aten) == ["_assert_async.msg", "zeros.default", "zeros.default"], aten


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
def test_selection_checks_offsets_in_its_kernel(monkeypatch):
    """JFA_VALIDATE=deferred (here on CPU tensors): the pooling kernel checks both offsets tensors and holds the
    flag (no aten device check); bad offsets (a sequence past the rows, a length over max_seqlen) read and write
    nothing out of bounds, and check_pending raises once."""
    from jfa_ops import validation

    q = torch.randn(40, 2, 16).half()
    good = torch.tensor([0, 17, 40], dtype=torch.int32)
    want = jfa_ops.select_kv_blocks(q, q, good, good, 23, 23, block_q=16, block_kv=16, backend="reference")
    monkeypatch.setattr(validation, "validation_mode", lambda device: "deferred")
    monkeypatch.setattr(validation, "device_check", None)  # the aten path must not run
    validation._pending.clear()
    got = jfa_ops.select_kv_blocks(q, q, good, good, 23, 23, block_q=16, block_kv=16, backend="triton")
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    jfa_ops.check_pending()
    for bad, max_len in ((torch.tensor([0, 57, 40], dtype=torch.int32), 60), (good, 10)):  # 10: 1 block of 2
        jfa_ops.select_kv_blocks(q, q, bad, bad, max_len, max_len, block_q=16, block_kv=16, backend="triton")
        with pytest.raises(ValueError, match="JFA_VALIDATE=deferred"):
            jfa_ops.check_pending()
    validation._pending.clear()


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA (the GPU cases take TMA where it holds)")
@pytest.mark.parametrize("name", ["jagged_empty_len1_gqa_causal", "broadcast_q_window", "cross_lq_gt_lk_causal"])
def test_tma_paths(name, monkeypatch):
    """K/V (forward, dQ) and Q/dO (dK/dV) through tensor descriptors (the sm_90 paths; the interpreter emulates
    them): a masked tile may reach into the next sequence's rows (or past the tensor), which must stay masked."""
    from jfa_ops.backends.triton import attn_fwd, configs

    launched = []
    monkeypatch.setattr(configs.KNOBS, "sparse_tma", True)
    monkeypatch.setattr(attn_fwd, "_tma_device", lambda t: True)
    real_descriptor = attn_fwd.rows_descriptor
    monkeypatch.setattr(attn_fwd, "rows_descriptor", lambda t, rows: launched.append(rows) or real_descriptor(t, rows))
    from jfa_ops.backends.triton import block_sparse_bwd, block_sparse_fwd
    for module in (block_sparse_fwd, block_sparse_bwd):
        monkeypatch.setattr(module, "rows_descriptor", attn_fwd.rows_descriptor)
    case, block_q, block_kv, keep_ratio, top_k = FEATURES[name]
    check_block_sparse_case(BlockSparseCase(case.replace(dtype=torch.float16), block_q, block_kv, keep_ratio, top_k),
                            "triton", seed=13)
    assert len(launched) == 6  # K, V forward; Q, dO dK/dV; K, V dQ


V4_KNOBS = ("sparse_list_cost_in_kernel", "sparse_one_pass_split", "sparse_pool_fanout", "sparse_transpose_kernel",
            "sparse_select_rows")


@on_each_device
@pytest.mark.parametrize("name", ["jagged_empty_len1_gqa_causal", "broadcast_q_window", "cross_lq_gt_lk_causal"])
def test_sparse4_knobs_end_to_end(device, name, monkeypatch):
    """The same-results knobs of bench/NOTES.md "sparse v4" all on (list cost in the tile kernel, one-pass stage
    split, 64-ary pooling search, one-launch transpose, selection rows in registers): selection, forward and
    backward equal the oracles as with them off."""
    from jfa_ops.backends.triton import configs

    for knob in V4_KNOBS:
        monkeypatch.setattr(configs.KNOBS, knob, True)
    case, block_q, block_kv, keep_ratio, top_k = FEATURES[name]
    for dtype in _dtypes(device):
        check_block_sparse_case(BlockSparseCase(case.replace(device=device, dtype=dtype), block_q, block_kv,
                                                keep_ratio, top_k), "triton", seed=17)


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
def test_causal_forward_wide_tiles(monkeypatch):
    """KNOBS.sparse_causal_fwd_wide: the causal forward on the non-causal config's key tiles (D128: 128 keys, so a
    128-block's diagonal is one masked tile); equals the oracle, forward and backward."""
    from jfa_ops.backends.triton import block_sparse_fwd, configs

    monkeypatch.setattr(configs.KNOBS, "sparse_causal_fwd_wide", True)
    monkeypatch.setattr(block_sparse_fwd, "get_config", lambda kernel, head_dim, dtype, causal, device: (  # sm_90's
        configs.table_config(kernel, head_dim, dtype, causal, configs.SHARED_MEMORY_LIMITS[90])))
    tiles = []
    real_launch = block_sparse_fwd.launch
    monkeypatch.setattr(block_sparse_fwd, "launch",
                        lambda kernel, grid, args, **o: tiles.append(args["BLOCK_N"]) or real_launch(kernel, grid,
                                                                                                     args, **o))
    case = AttentionCase((300, 130), (300, 130), heads_q=2, heads_kv=1, head_dim=128, causal=True,
                         dtype=torch.float16)
    check_block_sparse_case(BlockSparseCase(case, 128, 128, 0.5, None), "triton", seed=3)
    assert tiles == [128], tiles


@pytest.mark.parametrize("in_kernel", [False, True], ids=["torch", "kernel"])
def test_work_list_is_longest_first(in_kernel):
    """The forward's work list holds every real query tile once, ordered by the selected-block count of its Q block
    (summed over kv heads), descending; ties keep (sequence, row) order. Tiles past the selection's Q blocks cost 0
    (here a strided view with 4 of sequence 3's 5 blocks). The cost by torch ops or read inside the tile-list
    kernel (``KNOBS.sparse_list_cost_in_kernel``)."""
    from jfa_ops.backends.triton.block_sparse_fwd import selected_cost
    from jfa_ops.backends.triton.scheduling import forward_tiles

    q_off = torch.tensor([0, 40, 40, 41, 111], dtype=torch.int32)  # lengths 40, 0, 1, 70
    count = torch.zeros((4, 2, 5), dtype=torch.int32)  # [B, Hkv, NQB] with block_q 16
    count[0, :, :3] = torch.tensor([[1, 2, 3], [1, 0, 3]])
    count[2, :, 0] = 1
    count[3, :, :5] = torch.tensor([[5, 1, 2, 4, 3], [5, 1, 0, 4, 3]])
    cost = dict(selected=(count[..., :4], 16)) if in_kernel else dict(cost_of=selected_cost(count[..., :4], 16))
    tiles = forward_tiles(q_off, q_off, 111, 111, 16, 0, 0, False, False, **cost)
    n = int(tiles.count)
    got = list(zip(tiles.seq[:n].tolist(), tiles.start[:n].tolist()))
    cost = {(b, 16 * i): int(count[b, :, i].sum()) if i < 4 else 0 for b, length in enumerate((40, 0, 1, 70))
            for i in range(-(-length // 16))}
    assert sorted(got) == sorted(cost)
    assert got == sorted(cost, key=lambda tile: -cost[tile])  # sorted() is stable: ties keep (seq, row) order


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
@pytest.mark.parametrize("one_pass", [False, True])
def test_stage_split_points(one_pass):
    """``selected_tiles_split``: of the selected 16-row tiles of 32-row blocks (ascending ids; negative ids first,
    ids past the sequence last), how many end at or below each of two limits, i.e. the masked lead's and the bulk's
    ends (one pass over the ids for both, or one each)."""
    ids = torch.tensor([-1, 0, 2, 3, 7] + [5] * 70, dtype=torch.int32)  # 75 ids: more than one IDS_CHUNK step
    count = 75
    limits = torch.tensor([0, 16, 32, 64, 80, 96, 112, 128, 160, 224, 256, 4096], dtype=torch.int32)
    out = torch.empty(2 * len(limits), dtype=torch.int32)
    _split_kernel[(len(limits),)](ids, limits, out, count, len(limits), one_pass)
    below = [sum(2 if b < 0 else min(max(limit - 32 * b, 0) // 16, 2) for b in ids.tolist())
             for limit in limits.tolist()]
    assert out[:len(limits)].tolist() == below  # lead limits ascending
    assert out[len(limits):].tolist() == below[::-1]  # bulk limits descending, in the same programs


def test_transposed_selection():
    from jfa_ops.backends.triton.block_sparse_bwd import transpose_selection

    index = torch.tensor([[[[0, 2, -1], [1, 2, 0], [5, -1, -1]]]], dtype=torch.int32)  # [1, 1, 3 Q blocks, 3]
    count = torch.tensor([[[2, 1, 1]]], dtype=torch.int32)  # row 1 uses only its first id; row 2's id 5 is out
    q_index, q_count = transpose_selection(index, count, 3)
    assert q_count.tolist() == [[[1, 1, 1]]]
    assert q_index.tolist() == [[[[0, 3, 3], [1, 3, 3], [0, 3, 3]]]]


@pytest.mark.parametrize("path", ["kernel", "torch", "scatter"])
def test_transposed_selection_random(path, monkeypatch):
    """Random selections (ids out of range, duplicates, entries past the count, empty rows) against a plain loop:
    the one-launch kernel, the torch ops for rows wider than it takes, and the marks-then-lists launches
    (``KNOBS.sparse_transpose_scatter``)."""
    from jfa_ops.backends.triton import block_sparse_bwd, configs

    monkeypatch.setattr(configs.KNOBS, "sparse_transpose_kernel", path == "kernel")
    monkeypatch.setattr(configs.KNOBS, "sparse_transpose_scatter", path == "scatter")
    launched = []
    real_launch = block_sparse_bwd.launch
    monkeypatch.setattr(block_sparse_bwd, "launch", lambda kernel, *a, **o: launched.append(kernel) or real_launch(
        kernel, *a, **o))
    gen = torch.Generator().manual_seed(7)
    batch, heads, n_q, width, n_kv = 2, 3, 9, 40, 37  # 37 KV blocks: two 32-block program chunks, one partial
    index = torch.randint(-2, n_kv + 3, (batch, heads, n_q, width), generator=gen, dtype=torch.int32)
    count = torch.randint(0, width + 1, (batch, heads, n_q), generator=gen, dtype=torch.int32)
    count[0, 1] = 0
    q_index, q_count = block_sparse_bwd.transpose_selection(index, count, n_kv)
    want_index = torch.full((batch, heads, n_kv, n_q), n_q, dtype=torch.int32)
    want_count = torch.zeros((batch, heads, n_kv), dtype=torch.int32)
    for b in range(batch):
        for h in range(heads):
            for i in range(n_q):
                for j in sorted(set(index[b, h, i, :count[b, h, i]].tolist())):
                    if 0 <= j < n_kv:
                        want_index[b, h, j, want_count[b, h, j]] = i
                        want_count[b, h, j] += 1
    assert torch.equal(q_count, want_count)
    assert torch.equal(q_index, want_index)
    assert launched == {"kernel": [block_sparse_bwd.transpose_selection_kernel], "torch": [],
                        "scatter": [block_sparse_bwd.transpose_mark_kernel,
                                    block_sparse_bwd.transpose_lists_kernel]}[path]


TRANSPOSE_PATHS = {"torch": dict(sparse_transpose_kernel=False, sparse_transpose_scatter=False),
                   "kernel": dict(sparse_transpose_kernel=True, sparse_transpose_scatter=False),
                   "scatter": dict(sparse_transpose_kernel=True, sparse_transpose_scatter=True)}


def _transposes(index, count, n_kv, monkeypatch):
    """{path: (q_index, q_count)} of ``transpose_selection`` by each of TRANSPOSE_PATHS."""
    from jfa_ops.backends.triton import block_sparse_bwd, configs

    out = {}
    for path, knobs in TRANSPOSE_PATHS.items():
        for knob, value in knobs.items():
            monkeypatch.setattr(configs.KNOBS, knob, value)
        out[path] = block_sparse_bwd.transpose_selection(index, count, n_kv)
    return out


def _assert_transposes_equal(index, count, n_kv, monkeypatch):
    """The three paths give the same bits; returns the scatter path's (q_index, q_count)."""
    out = _transposes(index, count, n_kv, monkeypatch)
    for path in ("kernel", "scatter"):
        assert torch.equal(out[path][1], out["torch"][1]), path
        assert torch.equal(out[path][0], out["torch"][0]), path
    return out["scatter"]


# (q lengths, kv lengths, block_q, block_kv, selection options): jagged batches with empty, length-1 and off-block
# sequences, Lq != Lk, broadcast Q (one Q sequence against every KV sequence)
TRANSPOSE_SELECTIONS = {
    "jagged_causal": ((40, 0, 1, 70, 33), (50, 0, 1, 70, 17), 16, 16, dict(keep_ratio=0.5, causal=True)),
    "jagged_causal_keep_quarter": ((97, 1, 0, 130), (97, 1, 5, 130), 16, 16, dict(keep_ratio=0.25, causal=True)),
    "window": ((40, 3, 70), (50, 9, 70), 16, 32, dict(keep_ratio=0.5, window=(20, 5))),
    "top_k_cross": ((70, 5, 0), (20, 40, 3), 32, 16, dict(top_k=2)),
    "lq_gt_lk_causal": ((70, 5), (20, 40), 16, 16, dict(keep_ratio=0.25, causal=True)),
    "broadcast_q": ((20,), (50, 0, 1, 70), 16, 32, dict(keep_ratio=0.5, broadcast_q=True)),
}


@on_each_device
@pytest.mark.parametrize("name", list(TRANSPOSE_SELECTIONS))
def test_transpose_scatter_equals_the_other_paths(device, name, monkeypatch):
    """``KNOBS.sparse_transpose_scatter`` on real selections: the same bits as the torch ops and the one-launch
    kernel, with and without junk past each row's count (ids in and out of range: ignored), every list ascending
    and NQB-padded, its count what the selection's rows name."""
    q_lens, kv_lens, block_q, block_kv, opts = TRANSPOSE_SELECTIONS[name]
    gen = torch.Generator().manual_seed(len(name))
    q = torch.randn(sum(q_lens), 2, 16, generator=gen).half().to(device)
    k = torch.randn(sum(kv_lens), 2, 16, generator=gen).half().to(device)
    q_off = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    kv_off = torch.tensor([0, *torch.tensor(kv_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    if opts.get("broadcast_q"):
        q_off = None
    index, count = jfa_ops.select_kv_blocks(q, k, q_off, kv_off, max(q_lens), max(kv_lens), block_q=block_q,
                                            block_kv=block_kv, backend="triton", **opts)
    n_q, n_kv = index.shape[2], -(-max(kv_lens) // block_kv)
    assert count.sum() > 0
    q_index, q_count = _assert_transposes_equal(index, count, n_kv, monkeypatch)
    # independent: per KV block, the Q blocks whose used ids name it, ascending, then n_q
    want = torch.full(q_index.shape, n_q, dtype=torch.int32)
    index_cpu, count_cpu = index.cpu(), count.cpu()
    for b, h, i in torch.nonzero(torch.ones_like(count_cpu)).tolist():
        for j in sorted(set(index_cpu[b, h, i, :count_cpu[b, h, i]].tolist())):
            if 0 <= j < n_kv:
                want[b, h, j, int((want[b, h, j] < n_q).sum())] = i
    assert torch.equal(q_index.cpu(), want)
    assert torch.equal(q_count.cpu(), (want < n_q).sum(-1, dtype=torch.int32))
    junk = torch.randint(-3, n_kv + 4, index.shape, generator=gen, dtype=torch.int32).to(device)
    past = torch.arange(index.shape[-1], device=device) >= count[..., None]
    got = _assert_transposes_equal(torch.where(past, junk, index), count, n_kv, monkeypatch)
    assert torch.equal(got[0], q_index) and torch.equal(got[1], q_count)


@on_each_device
def test_transpose_scatter_wide_and_degenerate(device, monkeypatch):
    """Rows wider than the one-launch kernel takes (TRANSPOSE_MAX_WIDTH: the others fall back to the torch ops; the
    scatter path takes any width, in several id steps), lists longer than one step of the list pass (LISTS_CHUNK),
    counts past the width or negative, and shapes with no Q blocks, no KV blocks or no ids."""
    from jfa_ops.backends.triton import block_sparse_bwd

    gen = torch.Generator().manual_seed(3)
    wide = block_sparse_bwd.TRANSPOSE_MAX_WIDTH + 44
    for batch, heads, n_q, width, n_kv in ((1, 2, 21, wide, wide - 5), (2, 1, 19, 7, 300), (1, 1, 300, 9, 6),
                                           (2, 2, 0, 4, 5),
                                           (2, 1, 5, 3, 0), (1, 1, 6, 0, 4)):
        index = torch.randint(-2, n_kv + 3, (batch, heads, n_q, width), generator=gen, dtype=torch.int32)
        count = torch.randint(-3, width + 5, (batch, heads, n_q), generator=gen, dtype=torch.int32)
        q_index, q_count = _assert_transposes_equal(index.to(device), count.to(device), n_kv, monkeypatch)
        assert q_index.shape == (batch, heads, n_kv, n_q) and q_count.shape == (batch, heads, n_kv)
        if n_q and n_kv and width:
            assert 0 < int(q_count.sum()) < batch * heads * n_q * n_kv


@pytest.mark.skipif(CUDA, reason="the interpreter is off with CUDA")
def test_transpose_scatter_bad_offsets_deferred(monkeypatch):
    """Under JFA_VALIDATE=deferred a selection of bad offsets (a sequence past the rows, a length over max_seqlen,
    lengths that do not add up) still transposes safely (the scatter path reads no offsets: only each row's used
    ids, in range or dropped) to the same bits as the other paths; check_pending raises."""
    from jfa_ops import validation

    monkeypatch.setattr(validation, "validation_mode", lambda device: "deferred")
    validation._pending.clear()
    q = torch.randn(40, 2, 16).half()
    good = torch.tensor([0, 17, 40], dtype=torch.int32)
    for q_off, max_len in ((torch.tensor([0, 57, 40], dtype=torch.int32), 60), (good, 10),
                           (torch.tensor([0, 30, 20], dtype=torch.int32), 30)):
        index, count = jfa_ops.select_kv_blocks(q, q, q_off, q_off, max_len, max_len, block_q=16, block_kv=16,
                                                causal=True, backend="triton")
        _assert_transposes_equal(index, count, -(-max_len // 16), monkeypatch)
        with pytest.raises(ValueError, match="JFA_VALIDATE=deferred"):
            jfa_ops.check_pending()
    validation._pending.clear()


@on_each_device
@pytest.mark.parametrize("name", ["jagged_empty_len1_gqa_causal", "broadcast_q_window", "cross_lq_gt_lk_causal"])
def test_transpose_scatter_end_to_end(device, name, monkeypatch):
    """``KNOBS.sparse_transpose_scatter`` on: the block-sparse backward (its dK/dV walks read the transposed
    selection) equals the oracle."""
    from jfa_ops.backends.triton import configs

    monkeypatch.setattr(configs.KNOBS, "sparse_transpose_scatter", True)
    case, block_q, block_kv, keep_ratio, top_k = FEATURES[name]
    check_block_sparse_case(BlockSparseCase(case.replace(device=device, dtype=_dtypes(device)[0]), block_q, block_kv,
                                            keep_ratio, top_k), "triton", seed=23)


def test_supports_block_sizes():
    base = Problem("cpu", torch.float16, 64, 2, 2, False, -1, -1, False, False, block_q=128, block_kv=64)
    assert tb.block_sparse_supports(base) is None
    assert "block_q 8 must be a power of two >= 16" in tb.block_sparse_supports(
        Problem("cpu", torch.float16, 64, 2, 2, False, -1, -1, False, False, block_q=8, block_kv=64))
    assert "block_kv 48" in tb.block_sparse_supports(
        Problem("cpu", torch.float16, 64, 2, 2, False, -1, -1, False, False, block_q=16, block_kv=48))


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_triton_is_the_automatic_choice_on_cuda():
    """The selection runs on triton; the block-sparse attention too, unless the TLX kernel runs here (sm_90 with
    TLX installed and ``JFA_TLX_SPARSE`` not 0: tlx/configs.SPARSE_AUTO) and the call is large enough for its size
    rule (rows at least the triton backend's TMA_MIN_ROWS; unknown rows: triton)."""
    import dataclasses

    from jfa_ops.backends.triton import attn_fwd

    large = max(attn_fwd.TMA_MIN_ROWS, 1)
    problem = Problem("cuda", torch.bfloat16, 128, 8, 2, True, -1, -1, False, False, block_q=128, block_kv=128,
                      rows_q=large, rows_kv=large)
    assert select_backend(None, problem, family="select_kv_blocks").name == "triton"
    tlx_runs = "tlx" in available_backends() and get_backend("tlx").families["block_sparse"].supports(problem) is None
    tlx_first = tlx_runs and get_backend("tlx").families["block_sparse"].priority > 10
    assert select_backend(None, problem, family="block_sparse").name == ("tlx" if tlx_first else "triton")
    unknown = dataclasses.replace(problem, rows_q=None, rows_kv=None)  # a Problem made by hand: no rows
    tlx_anyway = tlx_first and get_backend("tlx").families["block_sparse"].auto_supports(unknown) is None  # "always"
    assert select_backend(None, unknown, family="block_sparse").name == ("tlx" if tlx_anyway else "triton")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_no_host_sync_gpu():
    """Both stages and the backward run with CUDA-graph-unsafe syncs forbidden."""
    case = AttentionCase((300, 0, 1, 700), (300, 0, 1, 700), heads_q=8, heads_kv=2, head_dim=128, device="cuda",
                         dtype=torch.bfloat16, causal=True)
    x = case.make_inputs(0, requires_grad=True)
    jfa_ops.sparse_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, 700, 700, keep_ratio=0.5)  # warm up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = jfa_ops.sparse_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, 700, 700, keep_ratio=0.5)
        out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@on_each_device
def test_opcheck_every_op(device):
    case = AttentionCase((40, 0, 20), (33, 5, 20), heads_q=4, heads_kv=2, causal=True, device=device,
                         dtype=torch.float16)
    x = case.make_inputs(0, requires_grad=True)
    q, k = x.q.detach(), x.k.detach()
    opts = dict(block_q=16, block_kv=16, backend="triton")
    torch.library.opcheck(torch.ops.jfa.select_kv_blocks.default, (q, k, x.q_offsets, x.kv_offsets, 40, 33),
                          dict(opts, keep_ratio=0.5, causal=True))
    index, count = torch.ops.jfa.select_kv_blocks(q, k, x.q_offsets, x.kv_offsets, 40, 33, causal=True, **opts)
    args = (x.q, x.k, x.v, x.q_offsets, x.kv_offsets, index, count, 16, 16, 40, 33)
    torch.library.opcheck(torch.ops.jfa.block_sparse_attention.default, args, dict(causal=True, backend="triton"))
    with torch.no_grad():
        out, lse = torch.ops.jfa.block_sparse_attention(*args, causal=True, backend="triton")
    plain = [t.detach() if isinstance(t, torch.Tensor) else t for t in args]
    torch.library.opcheck(torch.ops.jfa.block_sparse_attention_backward.default,
                          (torch.randn_like(out), torch.randn_like(lse), *plain[:3], out, lse, *plain[3:]),
                          dict(causal=True, backend="triton"))


@on_each_device
def test_strided_int32_offsets_are_read_by_value(device):
    """Offsets that are a strided int32 view (a column of a [B+1, 2] tensor) give the selection, out and the
    (deterministic) gradients of the call with contiguous offsets, bit for bit. Fails if a kernel reads offsets[b]
    at base + b (it did: another selection and NaN rows)."""
    case = FEATURES["cross_lq_gt_lk_causal"][0].replace(device=device, dtype=torch.float16,
                                                         offsets_dtype=torch.int32)
    inputs = case.make_inputs(5, requires_grad=True)

    def column(offsets):
        return torch.stack([offsets, torch.full_like(offsets, 10 ** 6)], dim=1)[:, 0]

    results = []
    plain = (inputs.q_offsets, inputs.kv_offsets)
    for q_off, kv_off in (plain, tuple(map(column, plain))):
        kw = dict(block_q=16, block_kv=16, causal=True, backend="triton")
        selection = jfa_ops.select_kv_blocks(inputs.q.detach(), inputs.k.detach(), q_off, kv_off, 70, 40,
                                             keep_ratio=0.5, **kw)
        out = jfa_ops.block_sparse_attention(inputs.q, inputs.k, inputs.v, q_off, kv_off, *selection,
                                             deterministic=True, **kw)
        grads = torch.autograd.grad(out.float().square().sum(), (inputs.q, inputs.k, inputs.v))
        results.append((*selection, out, *grads))
    for name, want, got in zip(("index", "count", "out", "dq", "dk", "dv"), *results):
        assert torch.equal(got, want), name
