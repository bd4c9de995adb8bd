"""The tlx backend on an sm_90 GPU (skipped without one, or without TLX): every feature case of
``jfa_ops.testing.FEATURE_MATRIX`` at the head dims tlx runs, forward from a NaN-poisoned allocator and gradients
(the backward is the triton backend's, fed tlx's out/lse), value/key rows of a neighbour sequence full of NaN/inf,
and routing of what tlx declines; the block-sparse forward and backward (SPARSE) against the oracle with the
selection's block mask.
The whole GPU suite also runs tlx wherever it parametrizes over
``available_backends("cuda")``.
"""
import dataclasses
import math

import pytest
import torch

import jfa_ops
from jfa_ops.backends import select_backend, unavailable_reason
from jfa_ops.testing import (FEATURE_MATRIX, AttentionCase, BlockSparseCase, check_attention_case,
                             check_backend_writes_every_row, check_block_sparse_case, reference_attention)
from tests.common import captured_after_warm_up

pytestmark = pytest.mark.gpu


def _tlx_or_skip(case: AttentionCase) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    reason = unavailable_reason("tlx", case.problem())
    if reason is not None:
        pytest.skip(f"tlx: {reason}")


def _require_tlx() -> None:
    """Skip without a GPU or TLX, for tests that import the tlx package before they build a case (without TLX that
    import raises ImportError: a failure on a GPU machine with stock Triton, seen in stop 23's suite run)."""
    _tlx_or_skip(FEATURE_MATRIX["causal"].replace(device="cuda", dtype=torch.bfloat16, head_dim=128))


CASES = [pytest.param(name, d, dtype, id=f"{name}-d{d}-{str(dtype)[6:]}")
         for name in FEATURE_MATRIX for d, dtype in ((64, torch.float16), (128, torch.bfloat16), (256, torch.bfloat16))
         if name != "head_dim_256" or d == 256]


@pytest.mark.parametrize("name,head_dim,dtype", CASES)
def test_forward_writes_every_row(name, head_dim, dtype):
    case = FEATURE_MATRIX[name].replace(device="cuda", dtype=dtype, head_dim=head_dim)
    _tlx_or_skip(case)
    check_backend_writes_every_row("tlx", case)


@pytest.mark.parametrize("name,head_dim,dtype", [c for c in CASES if c.values[1] == 128])
def test_forward_and_gradients_match_the_oracle(name, head_dim, dtype):
    case = FEATURE_MATRIX[name].replace(device="cuda", dtype=dtype, head_dim=head_dim)
    _tlx_or_skip(case)
    check_attention_case(case, "tlx")


# The backward's variants: configs flags (the others off). v2 (without the dQ split), v2 + dQ split (the default), and
# the experiments on the default: the masked dense calls' per-item list (CAUSAL_ORDER, helper tlxbwdcausal: runs where
# the key tile list is sorted, see test_causal_order_list_matches_the_oracle); GQA groups in parts with dK/dV added in
# fp32 (GQA_SPLIT, helper gqabwd: the feature matrix's GQA cases are small, so every part count is the whole group; MHA
# cases keep the default); the split rule of helper gqarule (JFA_TLX_BWD_GQA_SPLIT=auto, the default since 2026-12-03:
# gqa_split.plan's parts or the snake alone, as its model picks for each case's shapes; bwd-gqaoff: no split, the
# default before); K/V freed before the dK/dV epilogue, which stores through the dQ staging buffer (KV_EARLY, helper
# window31: the default since 2026-12-04; bwd-kvearlyoff: the default before); the consumers' block loop peeled per
# stage, the mask-free bulk's without the masked blocks' dS guard (PEEL, helper peel37: off by default).
_BWD = dict(BACKWARD=True, BACKWARD_DQ_SHARED=True, BACKWARD_GQA_SPLIT=-1,
            BACKWARD_CAUSAL_ORDER_JAGGED=True, BACKWARD_KV_EARLY=True)  # the shipped default
BWD_VARIANTS = {"bwd-v2": dict(BACKWARD=True), "bwd-v2-dqshared": _BWD,
                "bwd-causalorder": dict(_BWD, BACKWARD_CAUSAL_ORDER=True),
                "bwd-gqasplit": dict(_BWD, BACKWARD_GQA_SPLIT=16),
                "bwd-gqaoff": dict(_BWD, BACKWARD_GQA_SPLIT=0),  # the default before 2026-12-03 (no split)
                "bwd-kvearlyoff": dict(_BWD, BACKWARD_KV_EARLY=False),  # the default before 2026-12-04
                # the causal list built on the device is the default since stop 30; off: the default before
                "bwd-causaljaggedoff": dict(_BWD, BACKWARD_CAUSAL_ORDER_JAGGED=False),
                "bwd-peel": dict(_BWD, BACKWARD_PEEL=True),
                # helper lsedelta40: lse / delta loaded into shared memory with Q / dO (STATS_SMEM: off by default)
                "bwd-statssmem": dict(_BWD, BACKWARD_STATS_SMEM=True),
                # helper dkvtma40: whole dK/dV half-tiles written by TMA stores (STORE_TMA: off by default)
                "bwd-storetma": dict(_BWD, BACKWARD_STORE_TMA=True)}


def test_stats_ahead_is_the_default_at_head_dim_64_only(monkeypatch):
    """STATS_AHEAD (the next block's lse/delta prefetched) won at D64 only on the H200 (bench/NOTES.md v14): unset,
    the v2 backward runs it at D64 and not at D128; the env value forces it either way."""
    _require_tlx()
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, "BACKWARD_STATS_AHEAD", None)
    assert configs.stats_ahead(64) and not configs.stats_ahead(128)
    for forced in (False, True):
        monkeypatch.setattr(configs, "BACKWARD_STATS_AHEAD", forced)
        assert configs.stats_ahead(64) is forced and configs.stats_ahead(128) is forced


@pytest.mark.parametrize("variant", list(BWD_VARIANTS))
@pytest.mark.parametrize("name,head_dim,dtype", [c for c in CASES if c.values[1] in (64, 128)])
def test_tlx_backward_matches_the_oracle(name, head_dim, dtype, variant, monkeypatch):
    """The TLX backward (configs.BACKWARD, on by default) without and with dQ split between its consumers
    (BACKWARD_DQ_SHARED, the default), and the experiments on it: every feature case (jagged, causal, window, GQA,
    broadcast-Q with dQ reduced over the batch, empty sequences, length 1), gradients against the float64 oracle."""
    case = FEATURE_MATRIX[name].replace(device="cuda", dtype=dtype, head_dim=head_dim)
    _tlx_or_skip(case)
    from jfa_ops.backends.tlx import configs

    for flag in ("BACKWARD", "BACKWARD_DQ_SHARED", "BACKWARD_STATS_AHEAD", "BACKWARD_CAUSAL_ORDER",
                 "BACKWARD_GQA_SPLIT", "BACKWARD_CAUSAL_ORDER_JAGGED", "BACKWARD_KV_EARLY",
                 "BACKWARD_PEEL", "BACKWARD_STATS_SMEM"):
        monkeypatch.setattr(configs, flag, BWD_VARIANTS[variant].get(flag, False))
    check_attention_case(case, "tlx")


@pytest.mark.parametrize("causal,window,heads,lengths", [(True, (-1, -1), (8, 4), (2048, 1000, 3000)),
                                                          (True, (300, -1), (4, 4), (2048, 1000, 3000)),
                                                          (False, (200, 100), (8, 4), (2048, 1000, 3000)),
                                                          (True, (-1, -1), (8, 4), (1000,) * 5)])
def test_causal_order_list_matches_the_oracle(causal, window, heads, lengths, monkeypatch):
    """CAUSAL_ORDER (``block_sparse_bwd.causal_item_list``): masked dense calls with more work items than programs
    (the key tile list is sorted, not one wave: 52 tiles x 4 kv heads = 208 > 132) walk the items in L2-sized
    sections of (sequence, kv head) streams; every item once, so the gradients match the oracle (dQ's reduce-adds
    land in another order: fp32 sums, within the oracle's tolerance). One length with the max_seqlen hints (5 x 8
    tiles x 4 kv heads = 160 > 132): the list made once per shape (``uniform_causal_item_list``)."""
    _require_tlx()
    case = AttentionCase(lengths, lengths, heads_q=heads[0], heads_kv=heads[1], head_dim=128, dtype=torch.bfloat16,
                         device="cuda", causal=causal, window=window, pass_max_seqlen=len(set(lengths)) == 1)
    _tlx_or_skip(case)
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, "BACKWARD_CAUSAL_ORDER", True)
    check_attention_case(case, "tlx")


def test_causal_order_keeps_dk_dv_bit_for_bit(monkeypatch):
    """CAUSAL_ORDER changes which program runs an item and when; each item still computes its own dK/dV over the
    same blocks in the same order, so dK/dV equal the default's bit for bit; dQ is the same fp32 terms reduce-added
    in another order (close, not equal)."""
    _require_tlx()
    case = AttentionCase((2048, 1000, 3000), (2048, 1000, 3000), heads_q=8, heads_kv=4, head_dim=128,
                         dtype=torch.bfloat16, device="cuda", causal=True)
    _tlx_or_skip(case)
    from jfa_ops.backends.tlx import configs

    x = case.make_inputs(0)
    q, k, v = (t.detach().requires_grad_() for t in (x.q, x.k, x.v))
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(device="cuda", dtype=q.dtype)
    grads = []
    for on in (False, True):
        monkeypatch.setattr(configs, "BACKWARD_CAUSAL_ORDER", on)
        out = jfa_ops.jagged_attention(q, k, v, x.q_offsets, x.kv_offsets, causal=True, backend="tlx")
        grads.append(torch.autograd.grad(out, (q, k, v), grad))
    (dq0, dk0, dv0), (dq1, dk1, dv1) = grads
    assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1)
    torch.testing.assert_close(dq1.float(), dq0.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("seed", range(3))
def test_sparse_sections_device_list_is_the_torch_list(seed):
    """``configs.SPARSE_BACKWARD_SECTIONS_DEVICE``: compiled for the GPU, ``sectioned_item_list_device`` is
    ``sectioned_item_list``'s list bit for bit (the interpreter's test, ``test_item_order.py``, on CUDA tensors):
    kv heads 1 / 2 / 3 / 16, a section per stream, a few, or one. Triton alone (no TLX)."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    from tests.backends.test_item_order import _sectioned_lists, random_sectioned_case

    for heads in (1, 2, 3, 16):
        for budget in ("stream", "some", "all"):
            case = random_sectioned_case(heads, budget, seed)
            want, got = _sectioned_lists(*case, device="cuda")
            assert all(torch.equal(a, b) for a, b in zip(want, got)), case


@pytest.mark.parametrize("heads,lengths", [((8, 8), (2048, 1000, 3000, 1, 0, 129)), ((4, 4), (5000, 17, 700, 128))])
def test_causal_order_jagged_device_list(heads, lengths, monkeypatch):
    """``configs.BACKWARD_CAUSAL_ORDER_JAGGED`` (helper jaggedorder): compiled for the GPU, the device-built list
    (``causal_item_list_device``) is ``causal_item_list``'s bit for bit over the call's own key tile list; a jagged
    causal backward with the knob takes it (more items than programs, MHA: no GQA split) and matches the oracle,
    its dK/dV bit for bit those of the torch list (CAUSAL_ORDER=1: the same list, so the same work per item)."""
    _require_tlx()
    from jfa_ops.backends.tlx import configs
    from jfa_ops.backends.triton.block_sparse_bwd import causal_item_list, causal_item_list_device
    from jfa_ops.backends.triton.scheduling import kv_tiles

    case = AttentionCase(lengths, lengths, heads_q=heads[0], heads_kv=heads[1], head_dim=128, dtype=torch.bfloat16,
                         device="cuda", causal=True)
    _tlx_or_skip(case)
    x = case.make_inputs(0)
    offsets = x.q_offsets.to(torch.int32)
    tiles = kv_tiles(offsets, offsets, sum(lengths), sum(lengths), 128, 0, 0, False, True)
    schedule = dict(TILE_SEQ=tiles.seq, TILE_START=tiles.start)
    row_bytes = 128 * 8  # MHA D128 bf16: Q, dO, fp32 dQ
    want = causal_item_list(schedule, heads[1], offsets, row_bytes, configs.CAUSAL_ORDER_L2_BYTES)
    got = causal_item_list_device(schedule, heads[1], offsets, sum(lengths), row_bytes, configs.CAUSAL_ORDER_L2_BYTES)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    monkeypatch.setattr(configs, "BACKWARD_CAUSAL_ORDER_JAGGED", True)
    check_attention_case(case, "tlx")
    q, k, v = (t.detach().requires_grad_() for t in (x.q, x.k, x.v))
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(device="cuda", dtype=q.dtype)
    grads = []
    for on in (False, True):  # the torch list (CAUSAL_ORDER=1), then the device one
        monkeypatch.setattr(configs, "BACKWARD_CAUSAL_ORDER", None if on else True)
        monkeypatch.setattr(configs, "BACKWARD_CAUSAL_ORDER_JAGGED", on)
        out = jfa_ops.jagged_attention(q, k, v, x.q_offsets, x.kv_offsets, causal=True, backend="tlx")
        grads.append(torch.autograd.grad(out, (q, k, v), grad))
    assert torch.equal(grads[0][1], grads[1][1]) and torch.equal(grads[0][2], grads[1][2])

# KV_EARLY's cases (helper window31): many short items per program (the producer's next K/V loads land while the
# epilogue still stores through the dQ staging buffer), windows (the bench's (256, 0) causal, two-sided), jagged with
# empty and length-1 sequences, GQA, D64 and D128
_SHORT = (700, 1500, 33, 2100, 129, 900, 0, 1, 4096, 1, 0, 257)
_KV_BF = dict(head_dim=128, dtype=torch.bfloat16, device="cuda")
KV_EARLY_CASES = {
    "window (256,0) causal H8": AttentionCase(_SHORT, _SHORT, heads_q=8, heads_kv=8, causal=True, window=(256, 0),
                                              **_KV_BF),
    "window (128,64) GQA 8:2": AttentionCase(_SHORT, _SHORT, heads_q=8, heads_kv=2, window=(128, 64), **_KV_BF),
    "causal GQA 6:3": AttentionCase(_SHORT, _SHORT, heads_q=6, heads_kv=3, causal=True, **_KV_BF),
    "full H8 D64 fp16": AttentionCase(_SHORT, _SHORT, heads_q=8, heads_kv=8, head_dim=64, dtype=torch.float16,
                                      device="cuda"),
    "window (300,0) causal D64 fp16": AttentionCase(_SHORT, _SHORT, heads_q=4, heads_kv=4, causal=True,
                                                    window=(300, 0), head_dim=64, dtype=torch.float16, device="cuda"),
}


def _grads_with_knob_off_and_on(case, monkeypatch, knob: str):
    """dQ, dK, dV of one input with ``tlx.configs.<knob>`` False, then True (the same upstream gradient)."""
    from jfa_ops.backends.tlx import configs

    x = case.make_inputs(0)
    q, k, v = (t.detach().requires_grad_() for t in (x.q, x.k, x.v))
    grads = []
    for on in (False, True):
        monkeypatch.setattr(configs, knob, on)
        out = jfa_ops.jagged_attention(q, k, v, x.q_offsets, x.kv_offsets, **x.kwargs, backend="tlx")
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device="cuda", dtype=out.dtype)
        grads.append(torch.autograd.grad(out, (q, k, v), grad))
    return grads


@pytest.mark.parametrize("name", list(KV_EARLY_CASES))
def test_kv_early_matches_the_oracle_and_keeps_dk_dv(name, monkeypatch):
    """KV_EARLY (``configs.BACKWARD_KV_EARLY``, helper window31) moves only when K/V are freed and which shared
    buffer dK/dV leave through: gradients match the float64 oracle, and dK/dV equal the default's bit for bit (each
    item computes its own); dQ is the same fp32 terms, reduce-added in another order (close, not equal)."""
    case = KV_EARLY_CASES[name]
    _tlx_or_skip(case)
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, "BACKWARD_GQA_SPLIT", 0)  # a split's items add dK/dV from registers: no KV_EARLY
    monkeypatch.setattr(configs, "BACKWARD_KV_EARLY", True)
    check_attention_case(case, "tlx")
    (dq0, dk0, dv0), (dq1, dk1, dv1) = _grads_with_knob_off_and_on(case, monkeypatch, "BACKWARD_KV_EARLY")
    assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1)
    torch.testing.assert_close(dq1.float(), dq0.float(), rtol=2e-2, atol=2e-2)


# PEEL's cases (helper peel37): masked lead blocks (causal, windows), masked tails (lengths not multiples of 64),
# mask-free bulks (dense S1024, long jagged rows), key tiles past a sequence's end, empty and length-1 sequences, GQA,
# D64 and D128; "short": every sequence within one key tile (<= 128 keys), so each dQ element gets one reduce-add
# and dQ is deterministic too
PEEL_CASES = {
    "causal H8": AttentionCase(_SHORT, _SHORT, heads_q=8, heads_kv=8, causal=True, **_KV_BF),
    "window (256,0) causal H8": AttentionCase(_SHORT, _SHORT, heads_q=8, heads_kv=8, causal=True, window=(256, 0),
                                              **_KV_BF),
    "window (128,64) GQA 8:2": AttentionCase(_SHORT, _SHORT, heads_q=8, heads_kv=2, window=(128, 64), **_KV_BF),
    "full H8": AttentionCase(_SHORT, _SHORT, heads_q=8, heads_kv=8, **_KV_BF),
    "dense B2 S1024 full": AttentionCase((1024, 1024), (1024, 1024), heads_q=4, heads_kv=4, pass_max_seqlen=True,
                                         **_KV_BF),
    "dense B2 S1024 causal": AttentionCase((1024, 1024), (1024, 1024), heads_q=4, heads_kv=4, causal=True,
                                           pass_max_seqlen=True, **_KV_BF),
    "causal D64 fp16": AttentionCase(_SHORT, _SHORT, heads_q=4, heads_kv=4, causal=True, head_dim=64,
                                     dtype=torch.float16, device="cuda"),
    "short causal": AttentionCase((100, 128, 1, 0, 77, 128, 65, 3), (100, 128, 1, 0, 77, 128, 65, 3), heads_q=8,
                                  heads_kv=8, causal=True, **_KV_BF),
}


@pytest.mark.parametrize("knob", ["BACKWARD_PEEL", "BACKWARD_STATS_SMEM"])
@pytest.mark.parametrize("name", list(PEEL_CASES))
def test_same_blocks_knob_matches_the_oracle_and_the_default_bit_for_bit(name, knob, monkeypatch):
    """Knobs that run the same blocks in the same order with the same arithmetic per block: PEEL
    (``configs.BACKWARD_PEEL``, helper peel37: a mask-free block never took the default's masked branch; a masked one
    runs the same mask code) and STATS_SMEM
    (``configs.BACKWARD_STATS_SMEM``, helper lsedelta40: the same lse and delta values, through shared memory; a row
    past its sequence's end reads another row's or TMA's zeros instead of the masked load's zeros, and the masked
    block zeroes its P and dS; "short causal"'s last block reads past the end of lse). On PEEL's cases
    (masked lead blocks and tails, key tiles past a sequence's end, empty and length-1 sequences, GQA, D64 fp16 and
    D128 bf16) gradients match the float64 oracle, and dK/dV equal the default's bit for bit; dQ is the same fp32
    terms, reduce-added by programs in a racy order, so close (and equal where each dQ element gets one add:
    "short")."""
    case = PEEL_CASES[name]
    _tlx_or_skip(case)
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, knob, True)
    check_attention_case(case, "tlx")
    (dq0, dk0, dv0), (dq1, dk1, dv1) = _grads_with_knob_off_and_on(case, monkeypatch, knob)
    assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1), (name, knob)
    if name == "short causal":
        assert torch.equal(dq0, dq1)
    else:
        torch.testing.assert_close(dq1.float(), dq0.float(), rtol=2e-2, atol=2e-2)


# configs.FORWARD_ZIGZAG's cases: more items than one wave of programs (else no list and no order), dense (the
# uniform rule) and jagged (GQA, a window), D64 and D128
_JAG = (700, 1500, 33, 2100, 129, 900, 0, 1)
_BF = dict(head_dim=128, dtype=torch.bfloat16, device="cuda")
ZIGZAG_CASES = {
    "dense B8 S2048 H16 causal": AttentionCase((2048,) * 8, (2048,) * 8, heads_q=16, heads_kv=16, causal=True,
                                               pass_max_seqlen=True, **_BF),
    "jagged GQA 6:3 causal": AttentionCase(_JAG, _JAG, heads_q=6, heads_kv=3, causal=True, **_BF),
    "jagged H8 window (200,0) causal": AttentionCase(_JAG, _JAG, heads_q=8, heads_kv=8, causal=True, window=(200, 0),
                                                     **_BF),
    "jagged H8 full D64 fp16": AttentionCase(_JAG, _JAG, heads_q=8, heads_kv=8, head_dim=64, dtype=torch.float16,
                                             device="cuda"),
}


@pytest.mark.parametrize("name", list(ZIGZAG_CASES))
def test_zigzag_order_gives_the_default_outputs_bit_for_bit(name, monkeypatch):
    """configs.FORWARD_ZIGZAG (helper tlxcausal) changes which program runs a work item and when, nothing within an
    item (same blocks, same order, same arithmetic): out and lse equal the default order's bit for bit."""
    _assert_switch_keeps_the_bits(ZIGZAG_CASES[name], "FORWARD_ZIGZAG", monkeypatch)


def _assert_switch_keeps_the_bits(case, switch, monkeypatch, calls: int = 1):
    """The tlx forward's out and lse on ``case`` with ``configs.<switch>`` True (``calls`` times) == with it False,
    bit for bit."""
    _tlx_or_skip(case)
    from jfa_ops.backends.tlx import configs

    x = case.make_inputs(0)
    monkeypatch.setattr(configs, switch, False)
    want = x.call("tlx")
    monkeypatch.setattr(configs, switch, True)
    for _ in range(calls):
        for g, w, what in zip(x.call("tlx"), want, ("out", "lse")):
            assert torch.equal(g, w), f"{what}: {(g.float() - w.float()).abs().max().item()} max difference"


# configs.FORWARD_STORE_TMA (helper item39, bench/NOTES.md "item39"), on by default since stop 40: out through each
# consumer's Q slot and one TMA store per full half-tile (the v4 consumers); the same division, so the same bits as
# with it off (JFA_TLX_FWD_STORE_TMA=0: the pointer-store epilogue)
@pytest.mark.parametrize("name,head_dim,dtype", [c for c in CASES if c.values[1] in (64, 128)])
def test_store_tma_off_matches_the_oracle(name, head_dim, dtype, monkeypatch):
    """configs.FORWARD_STORE_TMA off (the rest of this file runs it on, the default): out/lse (and the gradients
    from them) == the float64 oracle on every feature case at D64 and D128, so the off switch's kernels stay right."""
    case = FEATURE_MATRIX[name].replace(device="cuda", dtype=dtype, head_dim=head_dim)
    _tlx_or_skip(case)
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, "FORWARD_STORE_TMA", False)
    check_attention_case(case, "tlx")


@pytest.mark.parametrize("name", list(ZIGZAG_CASES))
def test_store_tma_gives_the_default_outputs_bit_for_bit(name, monkeypatch):
    """STORE_TMA changes only where out is written from (the Q slot by TMA instead of registers by pointer stores),
    not the division or the rounding: out and lse equal those with it off bit for bit, on calls with many items a
    program (the Q slots reused across items: a slot released before its TMA store read it would show here; three
    calls, as such a race would not show every time)."""
    _assert_switch_keeps_the_bits(ZIGZAG_CASES[name], "FORWARD_STORE_TMA", monkeypatch, calls=3)


# configs.FORWARD_DYNAMIC's cases (helper bcast31): calls on the v3 consumers with more items than one wave of
# programs (else no list and no counter): broadcast-Q (the pipelined v2 consumers; empty and one-key sequences, whose
# items hand their index over without a Q load), broadcast-Q causal over 3 query tiles, a jagged causal GQA call on
# the unpipelined v3 (ONE_LOOP off), D256 (v3 by default)
_BCAST_KV = tuple((i * 7919) % 1531 if i % 17 else i % 2 for i in range(200))
DYNAMIC_CASES = {
    "broadcast Lq100 H4 B200": AttentionCase((100,), _BCAST_KV, heads_q=4, heads_kv=4, broadcast_q=True, **_BF),
    "broadcast Lq300 H2 B100 causal": AttentionCase((300,), _BCAST_KV[:100], heads_q=2, heads_kv=2, broadcast_q=True,
                                                    causal=True, **_BF),
    "jagged GQA 6:3 causal": AttentionCase(_JAG, _JAG, heads_q=6, heads_kv=3, causal=True, **_BF),
    "jagged H8 causal D256": AttentionCase(_JAG, _JAG, heads_q=8, heads_kv=8, causal=True, head_dim=256,
                                           dtype=torch.bfloat16, device="cuda"),
}


@pytest.mark.parametrize("name", list(DYNAMIC_CASES))
def test_dynamic_work_matches_the_oracle_and_the_default(name, monkeypatch):
    """configs.FORWARD_DYNAMIC (helper bcast31: items from an atomic counter, each handed from the producer to the
    consumers with its Q slot) changes which program runs an item and when, nothing within it: out and lse equal
    the static order's bit for bit (three calls: the items race for the counter differently each time), and the
    forward matches the float64 oracle."""
    case = DYNAMIC_CASES[name]
    _tlx_or_skip(case)
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, "ONE_LOOP", False)  # the v3 consumers (broadcast-Q and D256 take them anyway)
    x = case.make_inputs(0)
    monkeypatch.setattr(configs, "FORWARD_DYNAMIC", False)
    want = x.call("tlx")
    monkeypatch.setattr(configs, "FORWARD_DYNAMIC", True)
    for _ in range(3):  # the counter is zeroed per call; items race for it differently each time
        got = x.call("tlx")
        for g, w, what in zip(got, want, ("out", "lse")):
            assert torch.equal(g, w), f"{what}: {(g.float() - w.float()).abs().max().item()} max difference"
    check_attention_case(case, "tlx", grads=())  # the forward only: the knob leaves the backward alone


@pytest.mark.parametrize("causal", [False, True])
def test_blocks_reaching_into_a_poisoned_neighbour_stay_finite(causal):
    """Sequence 1's keys are +inf and its values NaN; the 128-row TMA blocks of sequence 0 read them (the kernel
    must mask the keys and zero the values: p = 0 times NaN is NaN)."""
    x = _poisoned_neighbour_inputs(causal)
    _assert_clean_sequences_match(x, *x.call("tlx"), causal)


@pytest.mark.parametrize("causal", [False, True])
def test_backward_keeps_a_poisoned_neighbour_out_of_the_gradients(causal):
    """The TLX backward with sequence 1's keys +inf and values NaN: sequence 1's 64-row query block runs into
    sequence 2's rows (dO zeroed there, but dP = 0 x NaN values is NaN, and 0 x NaN again in dS): its dQ reduce-add
    must add exact zeros to sequence 2's rows. Gradients of the clean outputs match the oracle on sequences 0 and 2
    (found by helper tlxsparsebwd: before the fix sequence 2's first dQ rows were NaN)."""
    x = _poisoned_neighbour_inputs(causal)
    q, k, v = (t.detach().requires_grad_() for t in (x.q, x.k, x.v))
    keep_q = torch.ones(187, dtype=torch.bool, device="cuda")
    keep_q[100:137] = False
    keep_kv = torch.ones(204, dtype=torch.bool, device="cuda")
    keep_kv[90:127] = False
    grad = torch.randn(187, 4, 128, device="cuda", dtype=torch.bfloat16) * keep_q[:, None, None]
    out, _ = jfa_ops.jagged_attention(q, k, v, x.q_offsets, x.kv_offsets, causal=causal, backend="tlx",
                                      return_lse=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    assert torch.isfinite(dq[keep_q]).all() and torch.isfinite(dk[keep_kv]).all() and torch.isfinite(dv[keep_kv]).all()
    clean = [(0, 100, 0, 90), (137, 187, 127, 204)]  # (q rows, kv rows) of sequences 0 and 2
    for q0, q1, k0, k1 in clean:
        ref = [t[a:b].detach().double().requires_grad_() for t, a, b in ((x.q, q0, q1), (x.k, k0, k1), (x.v, k0, k1))]
        off_q = torch.tensor([0, q1 - q0], device="cuda")
        off_k = torch.tensor([0, k1 - k0], device="cuda")
        ref_out, _ = reference_attention(*ref, off_q, off_k, causal=causal)
        want = torch.autograd.grad(ref_out, ref, grad[q0:q1].double())
        for got, w, name in zip((dq[q0:q1], dk[k0:k1], dv[k0:k1]), want, ("dq", "dk", "dv")):
            err = ((got.double() - w).norm() / w.norm()).item()
            assert err <= 2e-2, f"{name} of rows {q0}..{q1}: relative error {err:.3g}"


def _spy_kept_launches(monkeypatch) -> list:
    """What each kept launch answered (the forward replay's and the backward recipe's ``run``: None = declined),
    from no kept launch: they are keyed on static facts (lengths travel in the offsets), so one an earlier test kept
    would serve the caller's first call (seen on the H100, stop 42: 8 answers where 7 were counted)."""
    from jfa_ops.backends.tlx import attn_bwd
    from jfa_ops.backends.triton import attn_fwd as triton_fwd
    from jfa_ops.backends.triton import launch

    launch.clear_cache()

    answers = []
    for cls in (triton_fwd._Replay, attn_bwd._Recipe):
        def spy(self, *args, run=cls.run):
            answers.append(run(self, *args))
            return answers[-1]
        monkeypatch.setattr(cls, "run", spy)
    return answers


def _poisoned_neighbour_inputs(causal):
    """Three sequences (q 100/37/50, kv 90/37/77), sequence 1's keys +inf and values NaN."""
    case = AttentionCase((100, 37, 50), (90, 37, 77), heads_q=4, heads_kv=2, head_dim=128, dtype=torch.bfloat16,
                         device="cuda", causal=causal)
    _tlx_or_skip(case)
    x = case.make_inputs(0)
    x.k[90:127] = math.inf
    x.v[90:127] = math.nan
    return x


def _assert_clean_sequences_match(x, out, lse, causal):
    """Sequences 0 and 2 (the poisoned one's rows left out) == the oracle, and finite."""
    ref_out, ref_lse = reference_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, causal=causal)
    keep = torch.ones(187, dtype=torch.bool, device="cuda")
    keep[100:137] = False
    assert torch.isfinite(out[keep]).all()
    torch.testing.assert_close(out[keep].double(), ref_out[keep].double(), rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(lse[:, keep].double(), ref_lse[:, keep].double(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("head_dim,dtype", [(72, torch.bfloat16), (32, torch.float16), (128, torch.float32)])
def test_declined_problems_route_elsewhere(head_dim, dtype):
    case = AttentionCase((37, 0, 130), (50, 3, 129), heads_q=4, heads_kv=2, head_dim=head_dim, dtype=dtype,
                         device="cuda")
    if not torch.cuda.is_available() or unavailable_reason("tlx") is not None:
        pytest.skip("no GPU or no TLX")
    assert unavailable_reason("tlx", case.problem()) is not None
    check_attention_case(case, None, grads=("both",))


# ------------------------------------------------------------------------------- block-sparse forward (SPARSE)
def _sparse_case(q, kv, block=128, **kw):
    ratio = kw.pop("keep_ratio", 0.5)
    return BlockSparseCase(AttentionCase(tuple(q), tuple(kv), device="cuda", **{"dtype": torch.bfloat16,
                                                                                "head_dim": 128, **kw}),
                           block_q=block, block_kv=block, keep_ratio=ratio)


_EDGE = (0, 1, 127, 128, 129, 300, 5, 700, 0, 1000)
SPARSE_CASES = {
    "edge lengths": _sparse_case(_EDGE, _EDGE, heads_q=4, heads_kv=4),
    "edge causal keep 0.25": _sparse_case(_EDGE, _EDGE, causal=True, keep_ratio=0.25),
    "random blocks": _sparse_case(_EDGE, _EDGE, keep_ratio=None),  # any subset, visible or not
    "random blocks causal GQA 4:2": _sparse_case(_EDGE, _EDGE, causal=True, heads_q=4, heads_kv=2, keep_ratio=None),
    "window (300,0) causal": _sparse_case(_EDGE, _EDGE, causal=True, window=(300, 0)),
    "cross lengths causal": _sparse_case((3, 200, 0, 50, 129), (400, 10, 7, 0, 64), causal=True),
    "broadcast-Q": _sparse_case((300,), (0, 1, 700, 64, 129, 2000), broadcast_q=True, heads_q=4, heads_kv=2),
    "fp16 D64 causal": _sparse_case(_EDGE, _EDGE, causal=True, head_dim=64, dtype=torch.float16),
    "blocks 256x256 causal": _sparse_case(_EDGE, _EDGE, block=256, causal=True),
    "one long S4096 causal keep 0.25": _sparse_case((4096,), (4096,), causal=True, keep_ratio=0.25),
}


@pytest.mark.parametrize("name", list(SPARSE_CASES))
def test_block_sparse_forward_matches_the_oracle(name):
    """out/lse (and dq/dk/dv through the triton backward) == the float64 oracle with the selection's block mask;
    stage 1 on triton (tlx has no selection kernel)."""
    case = SPARSE_CASES[name]
    _tlx_or_skip(case.case)
    reason = unavailable_reason("tlx", dataclasses.replace(case.case.problem(), block_q=case.block_q,
                                                           block_kv=case.block_kv), family="block_sparse")
    assert reason is None, reason
    check_block_sparse_case(case, "tlx", seed=1, select_backend="triton")


def _sparse_outputs_with_switch(case, switch, values, monkeypatch):
    """(out, lse) of the TLX block-sparse forward on ``case`` (its selection made once) with ``configs.<switch>`` set
    to each of ``values`` in turn."""
    _require_tlx()
    from jfa_ops.backends.tlx import configs

    _tlx_or_skip(case.case)
    x = case.case.make_inputs(1)
    index, count = case.random_selection(x, 1) if case.keep_ratio is None else case.select(x, "triton")
    kw = x.kwargs
    results = []
    for value in values:
        monkeypatch.setattr(configs, switch, value)
        results.append(jfa_ops.block_sparse_attention(
            x.q, x.k, x.v, x.q_offsets, x.kv_offsets, index, count, kw["max_seqlen_q"], kw["max_seqlen_kv"],
            block_q=case.block_q, block_kv=case.block_kv, scale=kw["scale"], causal=kw["causal"],
            window=kw["window"], broadcast_q=kw["broadcast_q"], return_lse=True, backend="tlx"))
    return results


@pytest.mark.parametrize("name", ["edge lengths", "random blocks causal GQA 4:2", "window (300,0) causal",
                                  "broadcast-Q", "fp16 D64 causal", "blocks 256x256 causal"])
def test_block_sparse_forward_uniform_walk_is_bit_identical(name, monkeypatch):
    """configs.SPARSE_FORWARD_UNIFORM_WALK (helper fwduniform) passes the same walk bounds through redux.sync: out
    and lse equal the default walk's bit for bit."""
    (out, lse), (out_u, lse_u) = _sparse_outputs_with_switch(SPARSE_CASES[name], "SPARSE_FORWARD_UNIFORM_WALK",
                                                             (False, True), monkeypatch)
    assert torch.equal(out, out_u) and torch.equal(lse, lse_u), name


@pytest.mark.parametrize("name", ["edge lengths", "random blocks causal GQA 4:2", "broadcast-Q", "fp16 D64 causal"])
def test_block_sparse_forward_store_tma_is_bit_identical(name, monkeypatch):
    """The block-sparse forward runs the same v4 consumers and epilogue: with configs.FORWARD_STORE_TMA (the default)
    out and lse equal those with it off bit for bit (helper item39)."""
    _require_tlx()
    (out, lse), (out_t, lse_t) = _sparse_outputs_with_switch(SPARSE_CASES[name], "FORWARD_STORE_TMA", (False, True),
                                                             monkeypatch)
    assert torch.equal(out, out_t) and torch.equal(lse, lse_t), name


# configs.SPARSE_FORWARD_ZIGZAG's cases: more items than one wave of programs (else no list and no order; the
# SPARSE_CASES above fit one)
SPARSE_ZIGZAG_CASES = {
    "jagged H16 causal": _sparse_case(_JAG, _JAG, heads_q=16, heads_kv=16, causal=True),
    "jagged H16 keep 0.25": _sparse_case(_JAG, _JAG, heads_q=16, heads_kv=16, keep_ratio=0.25),
    "jagged GQA 8:4 random blocks causal": _sparse_case(_JAG, _JAG, heads_q=8, heads_kv=4, causal=True,
                                                        keep_ratio=None),
    "jagged H16 fp16 D64 causal": _sparse_case(_JAG, _JAG, heads_q=16, heads_kv=16, causal=True, head_dim=64,
                                               dtype=torch.float16),
}


@pytest.mark.parametrize("name", ["edge lengths", "random blocks causal GQA 4:2", "window (300,0) causal",
                                  "broadcast-Q", "fp16 D64 causal", *SPARSE_ZIGZAG_CASES])
def test_block_sparse_forward_walk_ahead_is_bit_identical(name, monkeypatch):
    """configs.SPARSE_FORWARD_WALK_AHEAD (helper sparsefwd) moves only when the producer reads the next item's walk
    (the same tiles loaded in the same order): out and lse equal the default's bit for bit (random blocks: items that
    load nothing; the jagged cases: more items than one wave)."""
    case = SPARSE_CASES.get(name) or SPARSE_ZIGZAG_CASES[name]
    (out, lse), (out_w, lse_w) = _sparse_outputs_with_switch(case, "SPARSE_FORWARD_WALK_AHEAD", (False, True),
                                                             monkeypatch)
    assert torch.equal(out, out_w) and torch.equal(lse, lse_w), name


@pytest.mark.parametrize("name", list(SPARSE_ZIGZAG_CASES))
def test_block_sparse_forward_zigzag_order_is_bit_identical(name, monkeypatch):
    """configs.SPARSE_FORWARD_ZIGZAG (helper sparsefwd) changes which program runs a work item and when, nothing
    within an item (same tiles, same order, same arithmetic): out and lse equal the default order's bit for bit."""
    (out, lse), (out_z, lse_z) = _sparse_outputs_with_switch(SPARSE_ZIGZAG_CASES[name], "SPARSE_FORWARD_ZIGZAG",
                                                             (False, True), monkeypatch)
    assert torch.equal(out, out_z) and torch.equal(lse, lse_z), name


# configs.SPARSE_FORWARD_PEEL's cases (helper peeldiag38): lengths off multiples of 128 (the sequences' partial last
# tiles: a masked tail without causality), causal diagonals, a left window (the masked lead: two rounds), blocks of
# two tiles (the split inside a block), random selections (items with no block, blocks wholly masked), broadcast-Q,
# fp16 D64, and the jagged cases of more items than one wave (zigzag order)
SPARSE_PEEL_CASES = ["edge lengths", "edge causal keep 0.25", "random blocks", "random blocks causal GQA 4:2",
                     "window (300,0) causal", "cross lengths causal", "broadcast-Q", "fp16 D64 causal",
                     "blocks 256x256 causal", *SPARSE_ZIGZAG_CASES]


@pytest.mark.parametrize("name,walk_ahead", [(name, False) for name in SPARSE_PEEL_CASES] + [
    (name, True) for name in ("random blocks causal GQA 4:2", "window (300,0) causal", "jagged H16 causal")])
def test_block_sparse_forward_peel_is_bit_identical(name, walk_ahead, monkeypatch):
    """configs.SPARSE_FORWARD_PEEL (helper peeldiag38) splits the consumers' walk into a mask-free loop and masked
    loops: the same tiles in the same order with the same arithmetic, so out and lse equal the one loop's bit for
    bit, with the walk ahead off (the default) and, on three masked cases, on (its consumers read the row's first ids
    beside the count, but not under a left window)."""
    _require_tlx()
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, "SPARSE_FORWARD_WALK_AHEAD", walk_ahead)
    case = SPARSE_CASES.get(name) or SPARSE_ZIGZAG_CASES[name]
    (out, lse), (out_p, lse_p) = _sparse_outputs_with_switch(case, "SPARSE_FORWARD_PEEL", (False, True), monkeypatch)
    assert torch.equal(out, out_p) and torch.equal(lse, lse_p), name


@pytest.mark.parametrize("name", ["edge lengths", "random blocks causal GQA 4:2", "window (300,0) causal",
                                  "cross lengths causal", "blocks 256x256 causal"])
def test_block_sparse_forward_peel_matches_the_oracle(name, monkeypatch):
    """With configs.SPARSE_FORWARD_PEEL on, out/lse (and the triton backward's grads) == the float64 oracle with the
    selection's block mask (non-causal, causal, a left window, two tiles per block; lengths off multiples of 128)."""
    _require_tlx()
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, "SPARSE_FORWARD_PEEL", True)
    case = SPARSE_CASES[name]
    _tlx_or_skip(case.case)
    check_block_sparse_case(case, "tlx", seed=1, select_backend="triton")


@pytest.mark.parametrize("name,peel", [(name, False) for name in SPARSE_PEEL_CASES] + [
    (name, True) for name in ("edge causal keep 0.25", "window (300,0) causal", "jagged H16 causal")])
def test_block_sparse_forward_first_unmasked_is_bit_identical(name, peel, monkeypatch):
    """configs.SPARSE_FORWARD_FIRST_UNMASKED (helper itemcost, stop 56) gives each item's first block the block
    loop's mask form (the key interval mask only outside the mask-free bulk): an all-visible mask is the identity and
    a masked first tile gets the loop's mask, so out and lse equal the default's bit for bit on the peel's cases
    (partial last tiles, causal diagonals, a left window, two tiles per block, items with no block, broadcast-Q, fp16
    D64, more items than one wave), with the peel off (the default) and, on three masked cases, on."""
    _require_tlx()
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, "SPARSE_FORWARD_PEEL", peel)
    case = SPARSE_CASES.get(name) or SPARSE_ZIGZAG_CASES[name]
    (out, lse), (out_f, lse_f) = _sparse_outputs_with_switch(case, "SPARSE_FORWARD_FIRST_UNMASKED", (False, True),
                                                             monkeypatch)
    assert torch.equal(out, out_f) and torch.equal(lse, lse_f), name


@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_blocks_reaching_into_a_poisoned_neighbour_stay_finite(causal):
    """As the dense test: sequence 0's one selected block (all its keys) reads sequence 1's NaN/inf rows through
    TMA."""
    x = _poisoned_neighbour_inputs(causal)
    index = torch.tensor([0, -1], dtype=torch.int32, device="cuda").expand(3, 2, 1, 2).contiguous()
    count = torch.ones(3, 2, 1, dtype=torch.int32, device="cuda")
    out, lse = jfa_ops.block_sparse_attention(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, index, count, 100, 90,
                                              causal=causal, return_lse=True, backend="tlx")
    _assert_clean_sequences_match(x, out, lse, causal)


def test_block_sparse_declined_block_sizes_route_to_triton():
    """block_q 64 (half a work item's query tile): tlx declines with the reason; the automatic choice runs triton."""
    case = _sparse_case(_EDGE, _EDGE, block=64, causal=True)
    _tlx_or_skip(case.case)
    problem = dataclasses.replace(case.case.problem(), block_q=64, block_kv=64)
    assert "multiples" in unavailable_reason("tlx", problem, family="block_sparse")
    assert select_backend(None, problem, family="block_sparse").name == "triton"
    check_block_sparse_case(case, None, seed=2)


# ------------------------------------------------------------------------------ block-sparse backward (SPARSE)
def _short_lengths(seed):
    return tuple(torch.randint(0, 400, (300,), generator=torch.Generator().manual_seed(seed)).tolist())


SPARSE_BWD_CASES = dict(SPARSE_CASES, **{
    "300 short seqs GQA": _sparse_case(_short_lengths(2), _short_lengths(3), heads_q=4, heads_kv=2, keep_ratio=None),
    "window (200,100) random blocks": _sparse_case(_EDGE, _EDGE, window=(200, 100), keep_ratio=None),
})


def _spy_tlx_sparse_backward(monkeypatch):
    """The calls of the TLX block-sparse backward (``attn_bwd.block_sparse_backward``), counted."""
    from jfa_ops.backends.tlx import attn_bwd

    calls, real = [], attn_bwd.block_sparse_backward
    monkeypatch.setattr(attn_bwd, "block_sparse_backward", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize("dq_shared", [True, False], ids=["dqshared", "dq-per-consumer"])
@pytest.mark.parametrize("name", list(SPARSE_BWD_CASES))
def test_tlx_block_sparse_backward_matches_the_oracle(name, dq_shared, monkeypatch):
    """The TLX block-sparse backward (configs.SPARSE_BACKWARD, env JFA_TLX_SPARSE_BWD=1: the v2 backward with
    SPARSE, each key tile walking the query tiles of the Q blocks that selected it): dq/dk/dv == the float64 oracle
    with the selection's block mask (jagged edge lengths, empty sequences, causal, windows, cross lengths, GQA,
    broadcast-Q with dQ reduced over the batch, D64, 256-blocks, one long sequence, 300 short ones), and it ran."""
    case = SPARSE_BWD_CASES[name]
    _tlx_or_skip(case.case)
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, "SPARSE_BACKWARD", True)
    monkeypatch.setattr(configs, "BACKWARD_DQ_SHARED", dq_shared)
    calls = _spy_tlx_sparse_backward(monkeypatch)
    check_block_sparse_case(case, "tlx", seed=1, select_backend="triton")
    assert calls, "the TLX block-sparse backward did not run"


def test_tlx_block_sparse_backward_off_runs_the_triton_one(monkeypatch):
    """configs.SPARSE_BACKWARD off (JFA_TLX_SPARSE_BWD=0): the triton sparse backward, still correct."""
    case = SPARSE_CASES["edge causal keep 0.25"]
    _tlx_or_skip(case.case)
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, "SPARSE_BACKWARD", False)
    calls = _spy_tlx_sparse_backward(monkeypatch)
    check_block_sparse_case(case, "tlx", seed=3, select_backend="triton")
    assert not calls


# helper sparsebwd45's KV_EARLY on the block-sparse backward (configs.SPARSE_BACKWARD_KV_EARLY; STORE_TMA rides on it):
# edge lengths (key tiles past a sequence's end: the partial half-tiles keep the pointer stores), causal keep 0.25
# (items of few blocks), GQA, windows, broadcast-Q, D64 fp16, 300 short sequences (many items a program)
SPARSE_KV_EARLY_CASES = ("edge lengths", "edge causal keep 0.25", "random blocks causal GQA 4:2",
                         "window (300,0) causal", "broadcast-Q", "fp16 D64 causal", "300 short seqs GQA",
                         "one long S4096 causal keep 0.25")


def _assert_knob_keeps_dk_dv(case, monkeypatch, configs, knob: str):
    """The TLX block-sparse backward with ``configs.<knob>`` off, then on: dK/dV bit for bit (each item computes its
    own), dQ close (the same fp32 terms reduce-added in another order)."""
    x = case.case.make_inputs(1)
    index, count = case.random_selection(x, 1) if case.keep_ratio is None else case.select(x, "triton")
    q, k, v = (t.detach().requires_grad_() for t in (x.q, x.k, x.v))
    kw = x.kwargs
    grads = []
    for on in (False, True):
        monkeypatch.setattr(configs, knob, on)
        out = jfa_ops.block_sparse_attention(
            q, k, v, x.q_offsets, x.kv_offsets, index, count, kw["max_seqlen_q"], kw["max_seqlen_kv"],
            block_q=case.block_q, block_kv=case.block_kv, scale=kw["scale"], causal=kw["causal"],
            window=kw["window"], broadcast_q=kw["broadcast_q"], backend="tlx")
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device="cuda", dtype=out.dtype)
        grads.append(torch.autograd.grad(out, (q, k, v), grad))
    (dq0, dk0, dv0), (dq1, dk1, dv1) = grads
    assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1)
    torch.testing.assert_close(dq1.float(), dq0.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("store_tma", [False, True], ids=["kvearly", "kvearly-storetma"])
@pytest.mark.parametrize("name", SPARSE_KV_EARLY_CASES)
def test_tlx_block_sparse_backward_kv_early_matches_the_oracle_and_keeps_dk_dv(name, store_tma, monkeypatch):
    """configs.SPARSE_BACKWARD_KV_EARLY (env JFA_TLX_SPARSE_BWD_KV_EARLY=1) moves only when K/V are freed and which
    shared buffer dK/dV leave through (with BACKWARD_STORE_TMA: by TMA stores where a half-tile is whole): dq/dk/dv
    match the float64 oracle with the selection's block mask, and dK/dV equal the knob-off backward's bit for bit
    (each item computes its own); dQ is the same fp32 terms reduce-added in another timing (close)."""
    case = SPARSE_BWD_CASES[name]
    _tlx_or_skip(case.case)
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, "SPARSE_BACKWARD", True)
    monkeypatch.setattr(configs, "BACKWARD_STORE_TMA", store_tma)
    monkeypatch.setattr(configs, "SPARSE_BACKWARD_KV_EARLY", True)
    calls = _spy_tlx_sparse_backward(monkeypatch)
    check_block_sparse_case(case, "tlx", seed=1, select_backend="triton")
    assert calls, "the TLX block-sparse backward did not run"
    _assert_knob_keeps_dk_dv(case, monkeypatch, configs, "SPARSE_BACKWARD_KV_EARLY")


@pytest.mark.parametrize("name", SPARSE_KV_EARLY_CASES)
def test_tlx_block_sparse_backward_auto_group_matches_the_oracle_and_keeps_dk_dv(name, monkeypatch):
    """configs.SPARSE_BACKWARD_AUTO_GROUP (helper sparsehg47, env JFA_TLX_SPARSE_BWD_AUTO_GROUP=1) with the rule's
    bounds opened (an L2 of 1 byte, no skew bound), so that it gives groups of 1 kv head on these small cases: the
    backward got that group, dq/dk/dv match the float64 oracle with the selection's block mask, and dK/dV equal the
    knob-off backward's bit for bit (another item order; each item computes its own dK/dV); dQ is the same fp32 terms
    reduce-added in another order (close)."""
    case = SPARSE_BWD_CASES[name]
    _tlx_or_skip(case.case)
    from jfa_ops.backends.tlx import attn_bwd, configs

    monkeypatch.setattr(configs, "SPARSE_BACKWARD", True)
    monkeypatch.setattr(configs, "BACKWARD_HEAD_GROUP", None)
    monkeypatch.setattr(configs, "AUTO_GROUP_L2_BYTES", 1)
    monkeypatch.setattr(configs, "AUTO_GROUP_MAX_SKEW", float("inf"))
    monkeypatch.setattr(configs, "SPARSE_BACKWARD_AUTO_GROUP", True)
    groups, real = [], attn_bwd.block_sparse_backward
    monkeypatch.setattr(attn_bwd, "block_sparse_backward",
                        lambda *a, **k: groups.append(k["head_group"]) or real(*a, **k))
    check_block_sparse_case(case, "tlx", seed=1, select_backend="triton")
    heads_kv = case.case.heads_kv
    assert groups and set(groups) == {configs.head_group(heads_kv, 1, sparse=True)}, groups
    _assert_knob_keeps_dk_dv(case, monkeypatch, configs, "SPARSE_BACKWARD_AUTO_GROUP")


@pytest.mark.parametrize("name", ("edge causal keep 0.25", "random blocks causal GQA 4:2", "broadcast-Q",
                                  "300 short seqs GQA"))
def test_tlx_block_sparse_backward_delta_stream_matches_the_oracle_and_keeps_dk_dv(name, monkeypatch):
    """configs.SPARSE_BACKWARD_DELTA_STREAM (stop 58, env JFA_TLX_SPARSE_BWD_DELTA_STREAM=1): the delta pre-pass on a
    side stream beside the list launches, joined before the kernel: dq/dk/dv match the float64 oracle with the
    selection's block mask, dK/dV equal the knob-off backward's bit for bit (the same launches), and the side stream
    was used. A missing join would read delta and dq_acc before the pre-pass wrote them: wrong dK/dV (and dQ)."""
    case = SPARSE_BWD_CASES[name]
    _tlx_or_skip(case.case)
    from jfa_ops.backends.tlx import attn_bwd, configs

    monkeypatch.setattr(configs, "SPARSE_BACKWARD", True)
    monkeypatch.setattr(configs, "SPARSE_BACKWARD_DELTA_STREAM", True)
    streams, real = [], attn_bwd._delta_side_stream
    monkeypatch.setattr(attn_bwd, "_delta_side_stream", lambda d: streams.append(1) or real(d))
    check_block_sparse_case(case, "tlx", seed=1, select_backend="triton")
    assert streams, "the side stream was not used"
    _assert_knob_keeps_dk_dv(case, monkeypatch, configs, "SPARSE_BACKWARD_DELTA_STREAM")


def test_tlx_block_sparse_backward_delta_stream_under_graph_capture(monkeypatch):
    """The side stream's fork and join captured in a CUDA graph (forward and backward, as a whole-step capture does),
    knob off (the control) and on; each graph replayed on the same inputs: dK/dV bit for bit between the two, dQ
    close, and the knob-on replay's gradients match the float64 oracle's through the eager check first."""
    case = SPARSE_BWD_CASES["edge causal keep 0.25"]
    _tlx_or_skip(case.case)
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, "SPARSE_BACKWARD", True)
    x = case.case.make_inputs(1)
    index, count = case.select(x, "triton")
    kw = x.kwargs
    q, k, v = (t.detach().clone().requires_grad_() for t in (x.q, x.k, x.v))
    grad = torch.randn(x.q.shape, generator=torch.Generator().manual_seed(2)).to(device="cuda", dtype=x.q.dtype)

    def step():
        out = jfa_ops.block_sparse_attention(
            q, k, v, x.q_offsets, x.kv_offsets, index, count, kw["max_seqlen_q"], kw["max_seqlen_kv"],
            block_q=case.block_q, block_kv=case.block_kv, scale=kw["scale"], causal=kw["causal"],
            window=kw["window"], broadcast_q=kw["broadcast_q"], backend="tlx")
        return torch.autograd.grad(out, (q, k, v), grad[: out.shape[0]])

    replays = []
    for on in (False, True):
        monkeypatch.setattr(configs, "SPARSE_BACKWARD_DELTA_STREAM", on)
        graph, got = captured_after_warm_up(step)  # (compiles, plans and the side stream in the warm-up)
        graph.replay()
        torch.cuda.synchronize()
        replays.append([g.clone() for g in got])
    (dq0, dk0, dv0), (dq1, dk1, dv1) = replays
    assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1)
    torch.testing.assert_close(dq1.float(), dq0.float(), rtol=2e-2, atol=2e-2)
    monkeypatch.setattr(configs, "SPARSE_BACKWARD_DELTA_STREAM", False)
    eager = step()
    assert torch.equal(eager[1], dk0) and torch.equal(eager[2], dv0)


def sections_twin_knobs(monkeypatch):
    """The setting of the sections twin below (and of its CPU check, ``test_tlx_host.py``
    ``test_sections_twin_builds_an_item_list_on_every_case``): the TLX sparse backward on, a sorted key tile list
    forced (one wave takes no item list), sections of 4 KiB (these small cases' streams fall into several), and
    ``configs.BACKWARD_ITEM_ORDER``, so that every case takes an item list. Without it the 2-kv-head cases whose
    rows fit the L2 take none: the head-group rule gives SPARSE_HEAD_GROUP (2) = all their kv heads, so head group 0,
    no group order, tile-major, and neither list is built (where stop 54's combined twin failed: "edge causal keep
    0.25", "random blocks causal GQA 4:2", "window (300,0) causal", "fp16 D64 causal", its `lists` assertion). With
    it the head groups' list stays the default's where the default builds one ("edge lengths": groups of 2; "300
    short seqs GQA": the rule's groups of 1), and is the plain longest-first list elsewhere: the same kernel
    (ITEM_LIST, SNAKE). Returns (attn_bwd, configs)."""
    from jfa_ops.backends.tlx import attn_bwd, configs
    from jfa_ops.backends.triton.configs import KNOBS

    monkeypatch.setattr(KNOBS, "one_wave_unsorted", False)  # a sorted key tile list (so an item list) on small cases
    monkeypatch.setattr(configs, "SPARSE_BACKWARD", True)
    monkeypatch.setattr(configs, "CAUSAL_ORDER_L2_BYTES", 4096)
    monkeypatch.setattr(configs, "BACKWARD_ITEM_ORDER", True)
    return attn_bwd, configs


def _spy_item_lists(monkeypatch, attn_bwd):
    """The item lists the TLX sparse backward builds, in call order: "groups" (``item_list``) or "sections"
    (``sectioned_item_list``)."""
    built = []
    for name, fn in (("groups", "item_list"), ("sections", "sectioned_item_list")):
        real = getattr(attn_bwd, fn)
        monkeypatch.setattr(attn_bwd, fn, lambda *a, _real=real, _name=name, **k: built.append(_name) or _real(*a, **k))
    return built


@pytest.mark.parametrize("check", ["groups-oracle", "sections-oracle", "sections-dkdv"])
@pytest.mark.parametrize("name", SPARSE_KV_EARLY_CASES)
def test_tlx_block_sparse_backward_sections_match_the_oracle_and_keep_dk_dv(name, check, monkeypatch):
    """configs.SPARSE_BACKWARD_SECTIONS (stop 54, env JFA_TLX_SPARSE_BWD_SECTIONS=1) against the head groups' list,
    in ``sections_twin_knobs``' setting (a sorted key tile list forced, 4 KiB sections, an item list on every case).
    Three checks, apart, so that a failure says which: "groups-oracle" the head groups' list on the forced sorted
    list against the float64 oracle with the selection's block mask (the control); "sections-oracle" the sectioned
    list against the oracle; "sections-dkdv" dK/dV equal to the head groups' bit for bit (another item order; each
    item computes its own dK/dV), dQ close (the same fp32 terms reduce-added in another order). Each asserts which
    list was built (broadcast Q takes the head groups' list either way). Stop 54's H100 run of the combined test
    failed on the four causal cases it reached (`.FFF.F.`): the cases where, without ITEM_ORDER, no list was built
    at all (``sections_twin_knobs``), so its "the sectioned list was not built" assertion failed whatever the
    gradients."""
    case = SPARSE_BWD_CASES[name]
    _tlx_or_skip(case.case)
    attn_bwd, configs = sections_twin_knobs(monkeypatch)
    built = _spy_item_lists(monkeypatch, attn_bwd)
    sections = "groups" if case.case.broadcast_q else "sections"  # not for broadcast Q (its rows are one stream)
    if check == "sections-dkdv":
        _assert_knob_keeps_dk_dv(case, monkeypatch, configs, "SPARSE_BACKWARD_SECTIONS")
        assert built == ["groups", sections], built
        return
    monkeypatch.setattr(configs, "SPARSE_BACKWARD_SECTIONS", check == "sections-oracle")
    calls = _spy_tlx_sparse_backward(monkeypatch)
    check_block_sparse_case(case, "tlx", seed=1, select_backend="triton")
    assert calls, "the TLX block-sparse backward did not run"
    assert built == [sections if check == "sections-oracle" else "groups"], built


@pytest.mark.parametrize("causal", [False, True])
def test_tlx_block_sparse_backward_neighbour_poison_stays_out(causal, monkeypatch):
    """Sequence 0's one selected block reads sequence 1's NaN/inf key/value rows through TMA (its key tile and query
    blocks run past its end; the rows past it are zeroed in shared memory): sequence 0's gradients and the key/value
    gradients of sequence 2 stay finite, its dQ rows too (sequence 1's own dQ block runs into them: dS is zeroed
    where P is, so its NaN values add no NaN there)."""
    _require_tlx()
    from jfa_ops.backends.tlx import configs

    x = _poisoned_neighbour_inputs(causal)
    monkeypatch.setattr(configs, "SPARSE_BACKWARD", True)
    calls = _spy_tlx_sparse_backward(monkeypatch)
    q, k, v = (t.detach().requires_grad_() for t in (x.q, x.k, x.v))
    index = torch.tensor([0, -1], dtype=torch.int32, device="cuda").expand(3, 2, 1, 2).contiguous()
    count = torch.ones(3, 2, 1, dtype=torch.int32, device="cuda")
    out = jfa_ops.block_sparse_attention(q, k, v, x.q_offsets, x.kv_offsets, index, count, 100, 90, causal=causal,
                                         backend="tlx")
    keep_q = torch.ones(187, dtype=torch.bool, device="cuda")
    keep_q[100:137] = False
    dq, dk, dv = torch.autograd.grad(out[keep_q].float().sum(), (q, k, v))
    keep_kv = torch.ones(204, dtype=torch.bool, device="cuda")
    keep_kv[90:127] = False
    assert calls
    assert torch.isfinite(dq[keep_q]).all() and torch.isfinite(dk[keep_kv]).all() and torch.isfinite(dv[keep_kv]).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim, heads", [(128, (8, 8)), (64, (4, 2))])
def test_kept_launches_match_the_full_path(monkeypatch, dtype, head_dim, heads):
    """The tlx forward's replays and the backward's recipes (tests/backends/test_tlx_host.py: what they launch, on
    CPU) serve the later calls of a signature on the GPU, and their outputs and gradients equal the full path's bit
    for bit (same kernels, same arguments; sequences of at most 128 keys: one key tile per sequence, so each dQ row
    gets one reduce-add and no summation order differs), and match the oracle. Under JFA_LAUNCH_VERIFY=1 each kept
    launch is also verified against Triton's own choice of binary."""
    _require_tlx()
    from jfa_ops.backends import Problem
    from jfa_ops.backends.base import AttentionParams
    from jfa_ops.backends.tlx import attn_fwd  # noqa: F401 (the TLX kernels)
    from jfa_ops.backends.triton import launch
    from tests.backends.test_triton_kernels import make_inputs

    answers = _spy_kept_launches(monkeypatch)
    from jfa_ops.backends import tlx  # the backend module: forward/backward as the registry calls them

    params = AttentionParams(scale=head_dim ** -0.5, causal=True)
    for seed, lengths in enumerate(([30, 5, 0, 29], [1, 64, 2], [17] * 7, [128, 3])):
        q, k, v, q_off, kv_off = make_inputs(lengths, lengths[::-1], *heads, head_dim, dtype, "cuda", seed=seed)
        if seed == 0:
            reason = unavailable_reason("tlx", Problem.of(q, k, params))
            if reason is not None:
                pytest.skip(f"tlx: {reason}")
        tlx.forward(q, k, v, q_off, kv_off, params)  # a new signature: the full path, which keeps a replay
        out, lse = tlx.forward(q, k, v, q_off, kv_off, params)  # the replay
        grad_out = torch.randn_like(out)
        grads = tlx.backward(grad_out, None, q, k, v, out, lse, q_off, kv_off, params)  # a recipe after the first
        monkeypatch.setattr(launch, "REPLAYS_ENABLED", False)
        full_out, full_lse = tlx.forward(q, k, v, q_off, kv_off, params)
        full = tlx.backward(grad_out, None, q, k, v, out, lse, q_off, kv_off, params)
        monkeypatch.setattr(launch, "REPLAYS_ENABLED", True)
        assert torch.equal(out, full_out) and torch.equal(lse, full_lse)
        for name, got, want in zip(("dq", "dk", "dv"), grads, full):
            assert torch.equal(got, want), name
        ref = reference_attention(q, k, v, q_off, kv_off, causal=True, scale=params.scale)
        torch.testing.assert_close(out.float(), ref[0].float(), atol=3e-2, rtol=3e-2)
    assert len(answers) == 4 + 3 and all(a is not None for a in answers), [a is None for a in answers]


# STORE_TMA's replays (on by default since stop 40; helper review41): five calls per case, (q lengths, kv lengths)
# each: a signature's first call (the full path keeps its replay), the same rows split otherwise (its replay), other
# rows (a new signature: the full path), their replay, the first rows again (the first replay, after the other
# signature's); lengths with whole half-tiles (TMA stores) and partial ones (pointer stores) at nonzero out rows
STORE_TMA_REPLAY_BATCHES = ((64, 17, 40, 5, 300), (5, 40, 300, 17, 64), (30, 1, 64, 3, 129), (3, 129, 1, 30, 64),
                            (300, 64, 17, 40, 5))
STORE_TMA_REPLAY_CASES = {
    "jagged causal H8 D128 bf16": dict(heads=(8, 8), head_dim=128, dtype=torch.bfloat16, causal=True),
    "GQA 4:2 D64 fp16": dict(heads=(4, 2), head_dim=64, dtype=torch.float16),
    "broadcast-Q on the v4 consumers H4 D128 bf16": dict(heads=(4, 4), head_dim=128, dtype=torch.bfloat16,
                                                        broadcast=True, switches=(("ONE_LOOP", True),)),
}


@pytest.fixture
def nan_outputs(monkeypatch):
    """Every output buffer starts as NaN (``common.alloc_output``, which the full path and the replays allocate
    from): a row a launch does not write, or writes through a descriptor over another buffer, fails."""
    from jfa_ops.backends.triton import common

    monkeypatch.setattr(common, "alloc_output", lambda shape, dtype, device: torch.full(
        shape, math.nan, dtype=dtype, device=device))


@pytest.mark.parametrize("name", list(STORE_TMA_REPLAY_CASES))
def test_store_tma_replays_write_each_calls_own_out(name, monkeypatch, nan_outputs):
    """The forward with STORE_TMA (desc_o rebuilt over each replay's fresh out: helper flip40) serves the repeats of
    a signature by its replay, and every call's out/lse, from NaN buffers, == the float64 oracle, across two row
    counts; every earlier call's out and lse stay as they were (kept alive: a store through a descriptor over an
    earlier out would change it). tests/backends/test_tlx_host.py's ``test_forward_store_tma_descriptor_follows_
    each_calls_out`` checks the same launches' arguments on CPU."""
    _require_tlx()
    from jfa_ops.backends import tlx
    from jfa_ops.backends.base import AttentionParams
    from jfa_ops.backends.tlx import configs
    from jfa_ops.testing import assert_attention_close

    spec = STORE_TMA_REPLAY_CASES[name]
    monkeypatch.setattr(configs, "FORWARD_STORE_TMA", True)
    for switch in spec.get("switches", ()):
        monkeypatch.setattr(configs, *switch)
    answers = _spy_kept_launches(monkeypatch)
    (hq, hkv), broadcast = spec["heads"], spec.get("broadcast", False)
    kept = []
    for seed, lengths in enumerate(STORE_TMA_REPLAY_BATCHES):
        q_lengths = ((200 if seed < 2 or seed == 4 else 72),) if broadcast else lengths
        case = AttentionCase(q_lengths, lengths, heads_q=hq, heads_kv=hkv, head_dim=spec["head_dim"],
                             dtype=spec["dtype"], device="cuda", causal=spec.get("causal", False),
                             broadcast_q=broadcast)
        _tlx_or_skip(case)
        x = case.make_inputs(seed)
        params = AttentionParams(scale=case.head_dim ** -0.5, causal=case.causal, broadcast_q=broadcast)
        out, lse = tlx.forward(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, params)
        ref_out, ref_lse = x.oracle()
        assert_attention_close(out, ref_out, dtype=case.dtype, kind="forward", name=f"{name} call {seed} out",
                               zero_rows=~x.visibility()[0])
        assert_attention_close(lse, ref_lse, dtype=case.dtype, kind="lse", name=f"{name} call {seed} lse")
        kept.append((out, out.clone(), lse, lse.clone()))
    for n, (out, was, lse, lse_was) in enumerate(kept):
        assert torch.equal(out, was) and torch.equal(lse, lse_was), f"call {n}'s out/lse changed by a later call"
    assert len(answers) == 3 and all(a is not None for a in answers), [a is None for a in answers]


@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_store_tma_writes_each_calls_own_out(causal, monkeypatch, nan_outputs):
    """The block-sparse forward (no replay: desc_o built per call over its out) from NaN buffers, three calls of two
    row counts in a row, == the float64 oracle with the selection's block mask (helper review41)."""
    _require_tlx()
    from jfa_ops.backends.tlx import configs

    monkeypatch.setattr(configs, "FORWARD_STORE_TMA", True)
    for seed, lengths in enumerate(((640, 17, 300, 5), (200, 129, 5, 400, 64), (640, 17, 300, 5))):
        case = _sparse_case(lengths, lengths, causal=causal)
        _tlx_or_skip(case.case)
        check_block_sparse_case(case, "tlx", seed=seed, select_backend="triton")


# configs.BACKWARD_STORE_TMA's cases (helper dkvtma40), each with the config overrides that make the epilogue run
# (STORE_TMA rides on KV_EARLY, which a GQA split turns off): broadcast-Q (the target; empty and one-key sequences,
# whose half-tiles are partial or past the end: the pointer stores), jagged causal GQA past one wave (the split off,
# so that KV_EARLY runs; lengths not multiples of 64: whole and partial half-tiles in one call), dense D64 (1000 keys:
# the last tile's second half partial) and D128 (whole tiles only), and the split's own path unchanged
STORE_TMA_CASES = {
    "broadcast Lq128 H4 B200": (AttentionCase((128,), _BCAST_KV, heads_q=4, heads_kv=4, broadcast_q=True, **_BF), {}),
    "jagged causal GQA 8:2 past one wave": (AttentionCase(_SHORT * 4, _SHORT * 4, heads_q=8, heads_kv=2, causal=True,
                                                          **_BF), dict(BACKWARD_GQA_SPLIT=0)),
    "jagged causal GQA 8:2 split": (AttentionCase(_SHORT * 4, _SHORT * 4, heads_q=8, heads_kv=2, causal=True, **_BF),
                                    dict(BACKWARD_GQA_SPLIT=16)),
    "dense B3 S1000 H4 D64 causal": (AttentionCase((1000,) * 3, (1000,) * 3, heads_q=4, heads_kv=4, causal=True,
                                                   head_dim=64, dtype=torch.bfloat16, device="cuda"), {}),
    "dense B2 S2048 H4 D128 fp16": (AttentionCase((2048,) * 2, (2048,) * 2, heads_q=4, heads_kv=4, head_dim=128,
                                                  dtype=torch.float16, device="cuda"), {}),
}


@pytest.mark.parametrize("name", list(STORE_TMA_CASES))
def test_store_tma_matches_the_oracle_and_keeps_dk_dv(name, monkeypatch):
    """STORE_TMA (``configs.BACKWARD_STORE_TMA``, helper dkvtma40) changes only how whole dK/dV half-tiles are
    written (one TMA store each from the staging buffer instead of a read back and masked pointer stores): gradients
    match the float64 oracle with it on, and dK/dV equal the default's bit for bit (the same conversion, the same
    rows); dQ is the same fp32 terms, reduce-added by programs in a racy order (close)."""
    case, overrides = STORE_TMA_CASES[name]
    _tlx_or_skip(case)
    from jfa_ops.backends.tlx import configs

    for knob, value in overrides.items():
        monkeypatch.setattr(configs, knob, value)
    monkeypatch.setattr(configs, "BACKWARD_STORE_TMA", True)
    check_attention_case(case, "tlx")
    (dq0, dk0, dv0), (dq1, dk1, dv1) = _grads_with_knob_off_and_on(case, monkeypatch, "BACKWARD_STORE_TMA")
    if overrides.get("BACKWARD_GQA_SPLIT", 0) > 0:
        # the split's parts atomically add their dK/dV in fp32 (GROUP_SPLIT): a racy order, so two runs differ by
        # roundings even with the knob off (the H100, stop 42: not equal); the epilogue it changes does not run here
        torch.testing.assert_close(dk1.float(), dk0.float(), rtol=1e-2, atol=1e-3)
        torch.testing.assert_close(dv1.float(), dv0.float(), rtol=1e-2, atol=1e-3)
    else:
        assert torch.equal(dk0, dk1) and torch.equal(dv0, dv1), name
    torch.testing.assert_close(dq1.float(), dq0.float(), rtol=2e-2, atol=2e-2)


# Kept launches under random calls (helper replay42): per fixed static signature, calls of random sizes drawn from a
# few shape classes (B, q rows (broadcast-Q: L_q), kv rows) so that shapes repeat (a forward replay's key holds them)
# while lengths, hints, grad_lse, layouts and dO change (a backward recipe's key holds none of those), the last class
# past one wave (kept launches decline there: the full path's sorted lists). Layouts: "views" (q, k, v in views at an
# aligned offset into larger buffers: same key, other addresses), "misaligned k" (a 2-byte offset: declined, the full
# path copies), "one tensor" (k is v, one offsets tensor for both sides: MHA, equal lengths). Every output from NaN
# buffers, against the float64 oracle; a quarter of the calls run two backwards of one forward with other dO
# (retain_graph). Served counts on 132 SMs (tests/backends/test_tlx_host.py's stubbed launches, helper replay42):
# tlx forward 7 / 8 / 6, backward 12 / 0 / 15; triton forward 9 / 9 / 7, backward 9 / 0 / 12.
KEPT_PROPERTY_SIGNATURES = {
    "jagged causal GQA 8:2 D128 bf16": dict(
        heads=(8, 2), head_dim=128, dtype=torch.bfloat16, causal=True,
        classes=((4, 300, 300), (1, 77, 130), (6, 520, 400), (3, 3000, 2500)),
        layouts=("contiguous", "contiguous", "views", "misaligned k")),
    "broadcast-Q H4 D128 bf16": dict(
        heads=(4, 4), head_dim=128, dtype=torch.bfloat16, broadcast=True,
        classes=((3, 40, 200), (5, 129, 700), (1, 1, 64), (40, 100, 3000)),
        layouts=("contiguous", "contiguous", "views", "misaligned k")),
    "window (50,10) H4 D64 fp16 int64 offsets": dict(
        heads=(4, 4), head_dim=64, dtype=torch.float16, window=(50, 10), offsets_dtype=torch.int64,
        classes=((2, 150, 150), (5, 333, 333), (3, 200, 90), (4, 5000, 5000)),
        layouts=("contiguous", "views", "misaligned k", "one tensor")),
}
KEPT_PROPERTY_REPEATS = 3  # calls of each (shape class, hints or not): 24 a signature


def _random_lengths(rng, total: int, count: int) -> tuple:
    """``count`` lengths summing to ``total``: random cuts, then (often) one sequence made empty and one of length 1
    (their rows moved to another sequence)."""
    cuts = sorted(rng.randrange(total + 1) for _ in range(count - 1))
    lengths = [hi - lo for lo, hi in zip([0] + cuts, cuts + [total])]
    for special in (0, 1):
        if count > 1 and rng.random() < 0.5:
            i, j = rng.sample(range(count), 2)
            if lengths[i] >= special:
                lengths[j] += lengths[i] - special
                lengths[i] = special
    return tuple(lengths)


def _placed(t: torch.Tensor, layout: str, rng) -> torch.Tensor:
    """``t``'s values where ``layout`` puts them: a view some rows into a larger buffer (same shape and strides), or a
    2-byte misaligned view."""
    if layout == "misaligned":
        view = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape)
    else:
        extra = rng.randrange(1, 6)
        view = torch.empty((t.shape[0] + extra,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)[extra:]
    return view.copy_(t)


def _oracle_grads(ref_out, ref_lse, leaves, grad_out, grad_lse):
    """(dq, dk, dv) of the float64 oracle for cotangents (grad_out, grad_lse or zeros); zeros where an output does not
    depend on a leaf."""
    pairs = [(o, c) for o, c in ((ref_out, grad_out.double()),
                                 (ref_lse, torch.zeros_like(ref_lse) if grad_lse is None else grad_lse.double()))
             if o.requires_grad]
    if not pairs:
        return tuple(torch.zeros_like(leaf) for leaf in leaves)
    grads = torch.autograd.grad([o for o, _ in pairs], leaves, [c for _, c in pairs], retain_graph=True,
                                allow_unused=True)
    return tuple(torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves))


def _kept_launch_property(name: str, backend, answers: dict, runs_case=_tlx_or_skip, seed: int = 0,
                          device: str = "cuda") -> dict:
    """Run random calls of signature ``name`` (``KEPT_PROPERTY_REPEATS`` of each shape class with and without hints)
    through ``backend``'s forward and backward (module functions, as the registry calls them), each out, lse, dq,
    dk, dv checked against the float64 oracle; ``answers``: {"forward": [...], "backward": [...]}, the lists the kept
    launches' spies append their answers to; ``runs_case(case)``: skips a case the backend does not run. Returns how
    many calls each kind served (answered not None)."""
    import random

    from jfa_ops.backends.base import AttentionParams
    from jfa_ops.testing import assert_attention_close

    spec = KEPT_PROPERTY_SIGNATURES[name]
    rng = random.Random(f"{name} {seed}")
    (hq, hkv), broadcast, head_dim, dtype = spec["heads"], spec.get("broadcast", False), spec["head_dim"], spec["dtype"]
    served = {"forward": 0, "backward": 0}
    # each shape class without hints and with its rows as hints (upper bounds of every length: one key a class;
    # B = 1 makes them exact: a uniform batch), KEPT_PROPERTY_REPEATS times, in random order
    draws = [(shape, hints) for shape in spec["classes"] for hints in (False, True)] * KEPT_PROPERTY_REPEATS
    rng.shuffle(draws)
    for n, ((batch, rows_q, rows_kv), hints) in enumerate(draws):
        layout = rng.choice(spec["layouts"])
        kv_lengths = _random_lengths(rng, rows_kv, batch)
        q_lengths = (rows_q,) if broadcast else kv_lengths if layout == "one tensor" else _random_lengths(
            rng, rows_q, batch)
        case = AttentionCase(q_lengths, kv_lengths, heads_q=hq, heads_kv=hkv, head_dim=head_dim, dtype=dtype,
                             device=device, causal=spec.get("causal", False), window=spec.get("window", (-1, -1)),
                             broadcast_q=broadcast, offsets_dtype=spec.get("offsets_dtype", torch.int32))
        runs_case(case)
        x = case.make_inputs(rng.randrange(2 ** 31))
        q, k, v, q_off, kv_off = x.q, x.k, x.v, x.q_offsets, x.kv_offsets
        if layout == "views":
            q, k, v = (_placed(t, "views", rng) for t in (q, k, v))
        elif layout == "misaligned k":
            k = _placed(k, "misaligned", rng)
        elif layout == "one tensor":  # k is v, one offsets tensor for both sides (the oracle reads x.k twice)
            v, kv_off = k, q_off
        values = (x.q, x.k, x.k) if layout == "one tensor" else (x.q, x.k, x.v)
        params = AttentionParams(scale=head_dim ** -0.5, causal=case.causal, window_left=case.window[0],
                                 window_right=case.window[1], broadcast_q=broadcast,
                                 max_seqlen_q=rows_q if hints else -1, max_seqlen_kv=rows_kv if hints else -1)
        label = f"{name} call {n} ({case}, {layout})"
        before = len(answers["forward"])
        out, lse = backend.forward(q, k, v, q_off, kv_off, params)
        served["forward"] += sum(a is not None for a in answers["forward"][before:])
        leaves = tuple(t.detach().double().requires_grad_() for t in values)
        ref_out, ref_lse = reference_attention(*leaves, x.q_offsets, x.kv_offsets, scale=params.scale,
                                               causal=case.causal, window=case.window, broadcast_q=broadcast)
        out_sees, q_sees, kv_seen = x.visibility()
        assert_attention_close(out, ref_out, dtype=dtype, kind="forward", name=f"{label} out", zero_rows=~out_sees)
        assert_attention_close(lse, ref_lse, dtype=dtype, kind="lse", name=f"{label} lse")
        for backward_call in range(2 if rng.random() < 0.25 else 1):
            g = torch.Generator().manual_seed(rng.randrange(2 ** 31))  # CPU draws: a failing call reproduces
            grad_out = torch.randn(out.shape, generator=g).to(out.device, out.dtype)
            grad_lse = torch.randn(lse.shape, generator=g).to(lse.device) if rng.random() < 0.5 else None
            before = len(answers["backward"])
            grads = backend.backward(grad_out, grad_lse, q, k, v, out, lse, q_off, kv_off, params)
            served["backward"] += sum(a is not None for a in answers["backward"][before:])
            want = _oracle_grads(ref_out, ref_lse, leaves, grad_out, grad_lse)
            for var, got, w, zero in zip("qkv", grads, want, (~q_sees, ~kv_seen, ~kv_seen)):
                assert_attention_close(got, w, dtype=dtype, kind="grad", name=f"{label} d{var} ({backward_call})",
                                       zero_rows=zero)
    return served


def _spy_runs(monkeypatch, **classes) -> dict:
    """{kind: answers} of each class's ``run`` (None = declined), from no kept launch (``launch.clear_cache``: one an
    earlier test kept would serve the first call)."""
    from jfa_ops.backends.triton import launch

    launch.clear_cache()
    answers = {kind: [] for kind in classes}
    for kind, cls in classes.items():
        def spy(self, *args, run=cls.run, kept=answers[kind]):
            kept.append(run(self, *args))
            return kept[-1]
        monkeypatch.setattr(cls, "run", spy)
    return answers


@pytest.mark.parametrize("name", list(KEPT_PROPERTY_SIGNATURES))
def test_kept_launches_serve_random_calls_correctly(name, monkeypatch, nan_outputs):
    """The tlx forward's replays and backward's recipes under 24 random calls of one static
    signature (``_kept_launch_property``): every out, lse, dq, dk, dv from NaN buffers == the float64 oracle, and
    the kept launches served calls (at least 3 forwards; the backward: at least 8 calls, none for broadcast-Q, whose
    backward keeps no recipe). Fails where a kept launch serves a call it does not fit (a stale size, descriptor,
    buffer or schedule: wrong or NaN rows)."""
    _require_tlx()
    from jfa_ops.backends import tlx
    from jfa_ops.backends.tlx import attn_bwd
    from jfa_ops.backends.triton import attn_fwd as triton_fwd

    answers = _spy_runs(monkeypatch, forward=triton_fwd._Replay, backward=attn_bwd._Recipe)
    served = _kept_launch_property(name, tlx, answers)
    assert served["forward"] >= 3, served
    if KEPT_PROPERTY_SIGNATURES[name].get("broadcast"):
        assert not answers["backward"], "a broadcast-Q backward asked a recipe"
    else:
        assert served["backward"] >= 8, served


@pytest.mark.parametrize("name", list(KEPT_PROPERTY_SIGNATURES))
def test_triton_kept_launches_serve_random_calls_correctly(name, monkeypatch, nan_outputs):
    """``test_kept_launches_serve_random_calls_correctly`` on the triton backend (its forward replays and backward
    recipes, ``triton.attn_bwd._Recipe``; no TLX needed)."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    from jfa_ops.backends import triton as triton_backend
    from jfa_ops.backends.triton import attn_bwd as triton_bwd
    from jfa_ops.backends.triton import attn_fwd as triton_fwd

    def runs_case(case):
        reason = unavailable_reason("triton", case.problem())
        if reason is not None:
            pytest.skip(f"triton: {reason}")

    # the forward on the pointer path: it keeps no replay of a TMA launch (``attn_fwd.forward``), and conftest's
    # TMA_MIN_ROWS = 0 sends nearly every call there on sm_90 (stop 43's H100: 1 forward served of 24)
    monkeypatch.setattr(triton_fwd, "TMA_MIN_ROWS", 1 << 40)
    answers = _spy_runs(monkeypatch, forward=triton_fwd._Replay, backward=triton_bwd._Recipe)
    served = _kept_launch_property(name, triton_backend, answers, runs_case)
    assert served["forward"] >= 3, served
    if KEPT_PROPERTY_SIGNATURES[name].get("broadcast"):
        assert not answers["backward"], "a broadcast-Q backward asked a recipe"
    else:
        assert served["backward"] >= 8, served


def _backend_or_skip(name: str, case: AttentionCase):
    """The backend module ``name`` ("tlx" or "triton"), skipping where it does not run ``case``."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    if name == "tlx":
        _tlx_or_skip(case)
        from jfa_ops.backends import tlx

        return tlx
    reason = unavailable_reason("triton", case.problem())
    if reason is not None:
        pytest.skip(f"triton: {reason}")
    from jfa_ops.backends import triton

    return triton


@pytest.mark.parametrize("backend_name", ["triton", "tlx"])
def test_captured_broadcast_forward_outlives_the_kept_launches(backend_name):
    """A broadcast-Q forward captured into a CUDA graph after its signature's replay was kept: the graph's replays
    stay right after the kept launches and the per-shape caches are dropped and their memory handed to other tensors
    (helper replay42: the replay used to serve the capture with its kept output offsets, whose memory the graph then
    read after they were freed: other data, silently wrong rows or an illegal address; now it declines there and
    the full path makes the offsets in the graph's pool)."""
    import gc

    from jfa_ops.backends.base import AttentionParams
    from jfa_ops.backends.triton import attn_fwd as triton_fwd
    from jfa_ops.backends.triton import launch
    from jfa_ops.testing import assert_attention_close

    case = AttentionCase((40,), (64, 17, 40, 5), heads_q=4, heads_kv=4, head_dim=128, dtype=torch.bfloat16,
                         device="cuda", broadcast_q=True)
    backend = _backend_or_skip(backend_name, case)
    launch.clear_cache()
    x = case.make_inputs(0)
    params = AttentionParams(scale=case.head_dim ** -0.5, broadcast_q=True)

    def forward():
        return backend.forward(x.q, x.k, x.v, None, x.kv_offsets, params)

    forward()  # the full path, which keeps the replay
    graph, (out, lse) = captured_after_warm_up(forward)  # the capture meets the warm-up's kept replay
    launch.clear_cache()  # drops the replay ...
    triton_fwd.broadcast_offsets.cache_clear()  # ... and the per-shape cache: the kept offsets are freed
    gc.collect()
    junk = [torch.full((5,), 1 << 20, dtype=torch.int32, device="cuda") for _ in range(512)]  # their blocks, reused
    graph.replay()
    torch.cuda.synchronize()
    ref_out, ref_lse = x.oracle()
    assert_attention_close(out, ref_out, dtype=case.dtype, kind="forward", name="captured out",
                           zero_rows=~x.visibility()[0])
    assert_attention_close(lse, ref_lse, dtype=case.dtype, kind="lse", name="captured lse")
    del junk


@pytest.mark.parametrize("backend_name", ["triton", "tlx"])
def test_per_shape_tensors_are_safe_on_another_stream(backend_name, nan_outputs):
    """A broadcast-Q shape's first call on a busy stream, then at once a call of that shape on another stream (inputs
    ready there): the second call's out == the float64 oracle. Probe of a cross-stream hazard (helper replay42; fixed
    by the lead, stop 42): ``scheduling.shape_constant`` kept the output offsets made on the first call's stream,
    behind its queued work, and the second stream's launch (full path or replay) read them without waiting on that
    stream: before they are written, what the allocator's block held (poisoned here). Now kept per stream."""
    from jfa_ops.backends.base import AttentionParams
    from jfa_ops.backends.triton import attn_fwd as triton_fwd
    from jfa_ops.backends.triton import launch
    from jfa_ops.testing import assert_attention_close

    case = AttentionCase((40,), (64, 17, 40, 5), heads_q=4, heads_kv=4, head_dim=128, dtype=torch.bfloat16,
                         device="cuda", broadcast_q=True)
    backend = _backend_or_skip(backend_name, case)
    x = case.make_inputs(0)
    params = AttentionParams(scale=case.head_dim ** -0.5, broadcast_q=True)
    backend.forward(x.q, x.k, x.v, None, x.kv_offsets, params)  # compiles (its offsets then dropped below)
    launch.clear_cache()
    triton_fwd.broadcast_offsets.cache_clear()
    torch.cuda.synchronize()
    busy, other = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(busy):
        poison = [torch.full((5,), -(1 << 20), dtype=torch.int32, device="cuda") for _ in range(64)]
        del poison  # the next small blocks of this stream hold it (the allocator's free blocks are per stream)
        torch.cuda._sleep(200_000_000)  # ~0.1 s of queued work before the offsets are made
        backend.forward(x.q, x.k, x.v, None, x.kv_offsets, params)
    with torch.cuda.stream(other):
        out, lse = backend.forward(x.q, x.k, x.v, None, x.kv_offsets, params)
    torch.cuda.synchronize()
    ref_out, ref_lse = x.oracle()
    assert_attention_close(out, ref_out, dtype=case.dtype, kind="forward", name="other stream's out",
                           zero_rows=~x.visibility()[0])
    assert_attention_close(lse, ref_lse, dtype=case.dtype, kind="lse", name="other stream's lse")
