"""Cost of ``JFA_MXFP8_BWD_EMPTY_ROWS`` (``jfa_ops.ops.mxfp8.MXFP8_BWD_EMPTY_ROWS``, on: dO's quantize pass reads
NaN/inf grad_out on rows that see no key as 0, lse loaded per row; bench/NOTES.md "NaN grad_out on rows that see no
key, helper nanrows46" (then an eager op) and "MXFP8 empty rows in dO's quantize pass, helper mxempty47"): the
mxfp8_attention backward (autograd, finite grad_out) with the knob off and on in one process, interleaved, and dO's
operand pass alone off and on (tlx: ``mxfp8_bwd.mx_values``; triton: ``mxfp8_quantize.quantize``); checks that the
gradients are the same bits both ways (beside an A/A pair: the tlx backward's dQ atomics differ run to run).

    python tools/mxfp8_bwd_empty_rows_probe.py [backend]   # backend: the op's choice when left out (tlx, triton)

CUDA: the bench's dense B8 S4096 H16 D128 causal and jagged T32768 causal cases, bf16. CPU (a smoke run): one tiny
case on the reference backend.
"""
from __future__ import annotations

import math
import statistics
import sys
import time

import torch

import jfa_ops
from jfa_ops.ops import mxfp8 as mxfp8_ops


def _cases(dev, g):
    if dev.type != "cuda":
        yield "cpu tiny causal", torch.tensor([40, 30], device=dev), torch.tensor([30, 30], device=dev), 2, 32
        return
    yield "dense B8 S4096 causal", torch.full((8,), 4096, device=dev), None, 16, 128
    lens = torch.randint(512, 7680, (8,), generator=g, device=dev)
    lens = (lens * 32768 // lens.sum()).clamp(min=1)
    yield f"jagged T{int(lens.sum())} causal", lens, None, 16, 128


def _time_ms(fn, dev) -> float:
    if dev.type == "cuda":
        import triton

        return triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median")
    times = []
    for _ in range(5):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def _do_pass_ms(grad_out, lse, out_offsets, dev):
    """dO's operand pass alone, (off, on): the one-pass MX values (the tlx backward's, KNOBS.mxfp8_bwd_one_pass),
    interleaved three times, medians."""
    import meta_kernels.mxfp8 as mx
    from jfa_ops.backends import mxfp8_bwd

    off_on = ([], [])
    for _ in range(3):
        for i, lse_arg in enumerate((None, lse)):
            off_on[i].append(_time_ms(lambda: mxfp8_bwd.mx_values(grad_out, out_offsets.int(), mx.GRAD_BLOCK, "rceil",
                                                                  empty_rows_lse=lse_arg), dev))
    return statistics.median(off_on[0]), statistics.median(off_on[1])


def main(backend=None) -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    g = torch.Generator(device=dev).manual_seed(0)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    backend = backend or (None if dev.type == "cuda" else "reference")
    knob = mxfp8_ops.MXFP8_BWD_EMPTY_ROWS
    print(f"{'case':26} {'off ms':>8} {'on ms':>8} {'on/off':>7} {'dO pass off/on ms':>18}  same bits (off vs off)")
    for name, q_lens, kv_lens, heads, dim in _cases(dev, g):
        kv_lens = q_lens if kv_lens is None else kv_lens
        q_off = torch.cat([q_lens.new_zeros(1), q_lens.cumsum(0)])
        kv_off = torch.cat([kv_lens.new_zeros(1), kv_lens.cumsum(0)])
        q = torch.randn(int(q_lens.sum()), heads, dim, device=dev, generator=g).to(dtype).requires_grad_()
        k = torch.randn(int(kv_lens.sum()), heads, dim, device=dev, generator=g).to(dtype).requires_grad_()
        v = torch.randn(k.shape, device=dev, generator=g).to(dtype).requires_grad_()
        out, lse = jfa_ops.mxfp8_attention(q, k, v, q_off, kv_off, causal=True, return_lse=True, backend=backend)
        grad_out = torch.randn(out.shape, device=dev, generator=g).to(out.dtype)

        def grads(knob):
            mxfp8_ops.MXFP8_BWD_EMPTY_ROWS = knob
            return torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)

        # an A/A pair first: a backward whose dQ is reduced by atomics (tlx) differs from itself run to run, and then
        # the knob's pair can only be read against the A/A
        same_aa = all(torch.equal(a, b) for a, b in zip(grads(False), grads(False)))
        same = all(torch.equal(a, b) for a, b in zip(grads(False), grads(True)))
        off, on = [], []
        for _ in range(3):  # interleaved: drift hits both
            off.append(_time_ms(lambda: grads(False), dev))
            on.append(_time_ms(lambda: grads(True), dev))
        off_ms, on_ms = statistics.median(off), statistics.median(on)
        passes = _do_pass_ms(grad_out, lse, q_off, dev) if dev.type == "cuda" else (math.nan, math.nan)
        print(f"{name:26} {off_ms:8.3f} {on_ms:8.3f} {on_ms / off_ms:7.3f} {passes[0]:8.4f} / {passes[1]:7.4f}  "
              f"{same} ({same_aa})")
    mxfp8_ops.MXFP8_BWD_EMPTY_ROWS = knob


if __name__ == "__main__":
    main(*sys.argv[1:2])
