"""Hardening review of the block-sparse selection and backward defaults (helper review47, stop 47;
bench/NOTES.md "Hardening review of the sparse selection and backward defaults"): what the review found that the
suites did not pin. Without CUDA the kernels run in Triton's CPU interpreter."""
from __future__ import annotations

import os
import time

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import jfa_ops  # noqa: E402
from jfa_ops.backends.triton.block_sparse_fwd import selected_blocks  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


@triton.jit
def _row_offset_kernel(BLOCK_INDEX, BLOCK_COUNT, OUT, seq, head, block, stride_ib, stride_ih, stride_in, stride_cb,
                       stride_ch):  # test_selected_row_offset_...: the row pointer's byte offset, never dereferenced
    row, _ = selected_blocks(BLOCK_INDEX, BLOCK_COUNT, seq, head, block, 1, stride_ib, stride_ih, stride_in,
                             stride_cb, stride_ch)
    tl.store(OUT, row.to(tl.int64, bitcast=True) - BLOCK_INDEX.to(tl.int64, bitcast=True))


@pytest.mark.xfail(strict=True, reason=(
    "review47: selected_blocks (and the select kernel's _select_q_block / _fill_row / _fill_past_end) form "
    "head * stride_ih in int32: a selection whose (Hkv - 1) * NQB * NKB >= 2**31 (e.g. Hkv 8, 1.2M rows at block 64: "
    "NQB = NKB = 18750, an 11 GB index, or the transposed one of the backward) reads and writes the wrong rows. The "
    "tlx forward and backward refuse such shapes and defer to backend='triton', which has no guard. Fix: head in "
    "int64 there (a PTX change of shipped kernels: the lead's call), or refuse the shape on the host"))
def test_selected_row_offset_of_a_large_index_does_not_wrap():
    """The row pointer of (sequence 0, kv head 7, Q block 0) in an index [1, 8, NQB, NKB] with NQB = NKB = 18750
    lies 7 * NQB * NKB int32 elements past the index (its head stride fits int32, the product does not). Only the
    pointer is computed (``_row_offset_kernel`` stores its offset), so no 11 GB index is needed; the count it loads
    is read from a small tensor at (0, 7, 0)."""
    n = 18750 * 18750  # NQB * NKB: < 2**31, the head stride's int32 argument
    index = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    count = torch.zeros(8, dtype=torch.int32, device=DEVICE)  # [1, 8, 1] strides (8, 1): the load stays in it
    out = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    _row_offset_kernel[(1,)](index, count, out, 0, 7, 0, 8 * n, n, 18750, 8, 1)
    assert int(out) == 7 * n * 4, (int(out), 7 * n * 4)


def test_selected_row_offset_below_the_bound_is_exact():
    """The control of the test above: below (Hkv - 1) * NQB * NKB < 2**31 (NQB = NKB = 17000, head 7: 2.02e9) the
    same pointer is exact, so that test's failure is the int32 product alone, not the harness."""
    n = 17000 * 17000
    index = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    count = torch.zeros(8, dtype=torch.int32, device=DEVICE)
    out = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    _row_offset_kernel[(1,)](index, count, out, 0, 7, 0, 8 * n, n, 17000, 8, 1)
    assert int(out) == 7 * n * 4, (int(out), 7 * n * 4)


def _wait_or_fail(events, seconds: float, what: str) -> None:
    """Polls CUDA events until all completed; fails the test (rather than hanging pytest) past ``seconds``."""
    deadline = time.monotonic() + seconds
    while not all(e.query() for e in events):
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not done after {seconds} s (programs spinning on a shared state?)")
        time.sleep(0.001)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("skip", [False, True], ids=["full", "pool_skip"])
def test_select_overlap_on_two_streams_at_once_gpu(skip, monkeypatch):
    """``KNOBS.sparse_select_overlap`` with two launches in flight at once: a captured selection replayed on the
    current stream while the same signature runs eagerly on a side stream, 50 rounds, each result bit for bit the
    two-launch selection's (overlap off). Each call zeroes its own ticket, lag word and counters (stop 47); a state
    shared by the two launches (stop 46's kept copy) lets a program take the other launch's tickets: items skipped
    or doubled, a wait that never ends (failed here by a deadline) or a select reading unpooled rows."""
    from jfa_ops.backends.triton import configs
    from tests.common import captured_after_warm_up

    gen = torch.Generator().manual_seed(47)
    lens = torch.randint(1, 16 * 128, (40,), generator=gen)
    lens[5] = 0
    q = torch.randn(int(lens.sum()), 8, 128, generator=gen).to("cuda", torch.bfloat16)
    k = torch.randn(int(lens.sum()), 4, 128, generator=gen).to("cuda", torch.bfloat16)
    q_off = torch.nn.functional.pad(lens.cumsum(0), (1, 0)).to(torch.int32).cuda()
    kv_off = q_off.clone()

    def select():
        return jfa_ops.select_kv_blocks(q, k, q_off, kv_off, 16 * 128, 16 * 128, backend="triton", block_q=128,
                                        block_kv=128, keep_ratio=0.25, causal=True)

    monkeypatch.setattr(configs.KNOBS, "sparse_pool_skip", skip)
    monkeypatch.setattr(configs.KNOBS, "sparse_select_overlap", False)
    want = select()
    monkeypatch.setattr(configs.KNOBS, "sparse_select_overlap", True)
    graph, got_graph = captured_after_warm_up(select)
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()
    for round_ in range(50):
        side.wait_stream(main)
        with torch.cuda.stream(side):
            got_eager = select()
            side_done = torch.cuda.Event()
            side_done.record(side)
        got_graph[0].fill_(-7)
        graph.replay()  # on the current stream, while the side stream's launch may still run
        main_done = torch.cuda.Event()
        main_done.record(main)
        _wait_or_fail([side_done, main_done], 30.0, f"round {round_}")
        for name, got in (("eager", got_eager), ("graph", got_graph)):
            assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0]), (name, round_)
