"""MXFP8 quantize bandwidth on the bench's batches: what the GPU does vs what the host does (bench/NOTES.md "MXFP8
quantize bandwidth, helper mxquantbw, stop 27"). `PYTHONPATH=$PWD python tools/mxfp8_quant_bandwidth.py` prints one
line per row; `--smoke` runs tiny cases on the CPU (interpreter; no graph or host rows).

Per case (the bench's mxfp8 suite, D128 bf16: bcast Lq128 H4 B512, B8 S4096, jagged T32768 n27; the window and
causal cases quantize the same tensors as jagged / B8), each timed with ``triton.testing.do_bench`` (median, L2
flushed), GB/s = the bench's bytes (``bench.peers._quantize_bytes``):
- ``op x3``: three ``jfa_ops.mxfp8_quantize`` calls eagerly (the bench row of 2026-12-03), ``KNOBS.mxfp8_quant_direct``
  off / on;
- ``fwd x3``: the three calls the bf16-in forward makes (the backend's quantize function), off / on, then on with
  ``KNOBS.mxfp8_quant_v_columns`` 64 (v's (32, 1) kernel in 64-column iterations) and with
  ``KNOBS.mxfp8_quant_v_layout`` "column" (whole columns a thread);
- ``fwd x3 graph``: the same replayed from a CUDA graph (the kernels' time: what the fixed bench row reports), then
  with v in 64 columns, in whole columns;
- ``q / k / v graph``: each kernel alone from a graph ((1, 32), (1, 32), (32, 1)), GB/s of its tensor's bytes;
  then v in whole columns (with 3 copy stages, with 8 heads a program), v with 2 warps per 128 columns, with the old
  head split and in 64 / 32-column iterations (the (32, 1) A/B; ``same``: v's bits vs the default's); ``column
  kernel``: registers, spills, shuffles and lanes of the whole-column kernels this Triton compiled;
- ``host us``: Python per three calls, enqueued behind a sleeping GPU (nothing waits: the host's time alone);
- ``same-bytes copy``: after each ``q / k / v graph`` row, a copy moving the same bytes (half read, half written)
  replayed from a graph in the same harness: the denominator that pays the same per-call cost (bench/NOTES.md "The
  16-head quantize loss (issue 12), helper quant16h37");
- ``--fit``: only K's (1, 32) and V's (32, 1) kernels and their same-bytes copies on synthetic sizes (203 MB and
  ~820 MB at 4 and 16 heads), each row with quant16h37's prediction t = bytes / 4370 GB/s + 13.6 us (its
  falsification run); K again with ``QUANT_GROUPS`` (head groups a program) whole rows / 2 / 8 instead of 4 (a
  graph captures the geometry: read at launch).
Every row's data and scale bits are compared with the first's (``same``).
"""
from __future__ import annotations

import argparse
import contextlib
import time
from unittest import mock

import torch

import jfa_ops
import meta_kernels.mxfp8 as mx
from bench import suites
from bench.peers import _quantize_bytes
from jfa_ops.backends import select_backend
from jfa_ops.backends.triton import mxfp8_quantize as mq
from jfa_ops.backends.triton.configs import KNOBS
from jfa_ops.ops import mxfp8 as mxfp8_ops

HBM_SPEC_GBPS = 4800.0
CASES = ("bcast Lq128 H4 B512", "B8 S4096", "jagged T32768 n27")
SMOKE_CASES = ("bcast Lq16 H2 B3", "B2 S64")


def quant_direct(on: bool) -> None:
    """KNOBS.mxfp8_quant_direct and ops.mxfp8.QUANTIZE_DIRECT (env JFA_MXFP8_QUANT_DIRECT sets both at import)."""
    KNOBS.mxfp8_quant_direct = mxfp8_ops.QUANTIZE_DIRECT = on


def median_ms(fn, device) -> float:
    if device.type != "cuda":
        fn()
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def host_us(fn, calls: int = 30) -> float:
    """Host time per ``fn()``: enqueued behind a ~0.2 s sleep kernel, so that no call waits for the GPU."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)  # cycles: ~0.2 s at the H200's clocks, longer than the calls' Python
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return host


def graph_of(fn):
    from bench.timing import graph_replay
    return graph_replay(fn)


def graph_row(row, label, fn) -> bool:
    """``row(label, ...)`` of ``fn`` replayed from a CUDA graph (its outputs compared); False if not captured."""
    out = {}
    replay = graph_of(lambda: out.update(r=fn()))
    if replay is None:
        return False
    replay()
    torch.cuda.synchronize()
    row(label, lambda: (replay(), out["r"])[1], False)
    return True


def v_columns(columns: int, fn):
    """``fn`` run with ``KNOBS.mxfp8_quant_v_columns`` = ``columns`` (read at launch: a graph captures it)."""
    return mock.patch.object(KNOBS, "mxfp8_quant_v_columns", columns)(fn)


def v_layout(layout: str, fn):
    """``fn`` run with ``KNOBS.mxfp8_quant_v_layout`` = ``layout`` (read at launch: a graph captures it)."""
    return mock.patch.object(KNOBS, "mxfp8_quant_v_layout", layout)(fn)


def column_kernels() -> list:
    """(registers, spills, shuffles, lanes along the columns, shared bytes) of each whole-column quantize kernel in
    Triton's cache (``_encode_packed``'s 0x7f7f7f7f in its PTX): what this Triton made of the layout (the sm_90
    compile test checks triton 3.9's: 183 registers, no shuffles, [1, 32] lanes)."""
    out = []
    try:  # Triton's cache layout is internal: (kernel cache, ...) per device in 3.6 to 3.9
        kernels = [k for entry in mq.mxfp8_quantize_kernel.device_caches.values() for k in list(entry[0].values())]
    except (AttributeError, TypeError, IndexError) as e:
        return [f"not read: {e!r}"]
    for k in kernels:
        asm = getattr(k, "asm", None) or {}
        if "0x7f7f7f7f" in asm.get("ptx", ""):
            out.append(dict(registers=getattr(k, "n_regs", None), spills=getattr(k, "n_spills", None),
                            shfl=asm["ptx"].count("shfl.sync"),
                            lanes_along_columns="threadsPerWarp = [1, 32]" in asm.get("ttgir", ""),
                            shared=getattr(getattr(k, "metadata", None), "shared", None)))
    return out


def same_bytes_copy_ms(nbytes: int, device) -> float | None:
    """A copy moving ``nbytes`` (half read, half written) replayed from a CUDA graph, timed like the kernels' rows."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    g = graph_of(lambda: dst.copy_(src))
    return None if g is None else median_ms(g, device)


# quant16h37's fit (bench/NOTES.md): every graph row at t = bytes / 4370 GB/s + 13.6 us
FIT_GBPS, FIT_CALL_US = 4370.0, 13.6
FIT_SHAPES = (("H4 131072 rows (203 MB)", 131072, 4, 512), ("H16 B8 S4096 (203 MB)", 32768, 16, 4096),
              ("H16 B32 S4096 (814 MB)", 131072, 16, 4096), ("H4 533504 rows (828 MB)", 533504, 4, 512))


def fit_rows(device) -> None:
    """K's and V's kernels on synthetic sizes against the same-bytes copy and the fit's prediction."""
    for label, rows, heads, seq in FIT_SHAPES:
        x = torch.randn(rows, heads, 128, device=device, dtype=torch.bfloat16)
        offsets = torch.arange(0, rows + 1, seq, device=device, dtype=torch.int32)
        quantize = mxfp8_ops._quantizer(select_backend("triton", mxfp8_ops._x_problem(x), family=mxfp8_ops.QUANTIZE))
        for n, block, offs in (("k", mx.K_BLOCK, None), ("v", mx.V_BLOCK, offsets)):
            nbytes = _quantize_bytes((x,), list(quantize(x, offs, block, "rceil")))
            g = graph_of(lambda: quantize(x, offs, block, "rceil"))
            copy_ms = same_bytes_copy_ms(nbytes, device)
            if g is None or copy_ms is None:
                print(f"{label:26} {n}: not captured", flush=True)
                continue
            ms = median_ms(g, device)
            predicted_us = nbytes / FIT_GBPS / 1e3 + FIT_CALL_US
            print(f"{label:26} {n} {nbytes / 1e6:6.1f} MB {ms * 1e3:8.1f} us {nbytes / ms / 1e6:6.0f} GB/s | "
                  f"predicted {predicted_us:7.1f} us {nbytes / predicted_us / 1e3:6.0f} GB/s | same-bytes copy "
                  f"{copy_ms * 1e3:8.1f} us {nbytes / copy_ms / 1e6:6.0f} GB/s | kernel / copy {copy_ms / ms:5.1%}",
                  flush=True)
            if n == "k":  # the head split's A/B: a program reads 1 KB of each 4 KB row at 16 heads (QUANT_GROUPS 4)
                want = [t.view(torch.uint8).clone() for t in quantize(x, offs, block, "rceil")]
                for groups in (1 << 20, 2, 8):
                    with mock.patch.object(mq, "QUANT_GROUPS", groups):
                        same = all(map(torch.equal, [t.view(torch.uint8) for t in quantize(x, offs, block, "rceil")],
                                       want))
                        g = graph_of(lambda: quantize(x, offs, block, "rceil"))
                    if g is not None:
                        ms = median_ms(g, device)
                        print(f"{label:26} {n} QUANT_GROUPS {groups:<8} {ms * 1e3:8.1f} us "
                              f"{nbytes / ms / 1e6:6.0f} GB/s | kernel / copy {copy_ms / ms:5.1%}  same={same}",
                              flush=True)
        del x
        torch.cuda.empty_cache()


def bits(pairs) -> list:
    return [t.view(torch.uint8).clone() for pair in pairs for t in pair]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny cases on the CPU (interpreter)")
    parser.add_argument("--fit", action="store_true", help="only quant16h37's falsification rows (GPU)")
    args = parser.parse_args()
    device = torch.device("cpu" if args.smoke else "cuda")
    if args.fit:
        fit_rows(device)
        return
    names = SMOKE_CASES if args.smoke else CASES
    cases = {c.label: c for c in suites.build_cases(["mxfp8"], [64 if args.smoke else 128],
                                                     "smoke" if args.smoke else "full")}
    if device.type == "cuda":
        src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        copy_gbps = 2 * src.numel() / median_ms(lambda: dst.copy_(src), device) / 1e6
        del src, dst
        print(f"device copy {copy_gbps:.0f} GB/s; {torch.cuda.get_device_name()}", flush=True)
    for name in names:
        case = cases[name]
        inp = suites.make_inputs(case, device)
        quantize = mxfp8_ops._quantizer(select_backend("triton", mxfp8_ops._x_problem(inp.q),
                                                       family=mxfp8_ops.QUANTIZE))
        calls = {"q": lambda: quantize(inp.q, None, mx.Q_BLOCK, "rceil"),
                 "k": lambda: quantize(inp.k, None, mx.K_BLOCK, "rceil"),
                 "v": lambda: quantize(inp.v, inp.kv_offsets, mx.V_BLOCK, "rceil")}

        def fwd3():
            return calls["q"](), calls["k"](), calls["v"]()

        def op3():
            return (jfa_ops.mxfp8_quantize(inp.q, backend="triton"), jfa_ops.mxfp8_quantize(inp.k, backend="triton"),
                    jfa_ops.mxfp8_quantize(inp.v, inp.kv_offsets, block=mx.V_BLOCK, backend="triton"))

        quant_direct(False)
        want = bits(fwd3())
        moved = _quantize_bytes((inp.q, inp.k, inp.v), [t for pair in fwd3() for t in pair])
        tensor_bytes = {n: _quantize_bytes((t,), list(calls[n]())) for n, t in (("q", inp.q), ("k", inp.k),
                                                                                ("v", inp.v))}

        def row(label, fn, on, nbytes=moved, check=True, same=None):
            quant_direct(on)
            if check:
                same = all(map(torch.equal, bits(fn()), want))
            ms = median_ms(fn, device)
            gbps = nbytes / ms / 1e6
            print(f"{name:22} {label:28} {ms * 1e3:9.1f} us {gbps:7.0f} GB/s {gbps / HBM_SPEC_GBPS:5.0%} of 4.8 TB/s"
                  f"{'' if same is None else f'  same={same}'}", flush=True)
            return ms

        row("op x3", op3, False)
        row("op x3, quant_direct", op3, True)
        row("fwd x3", fwd3, False)
        row("fwd x3, quant_direct", fwd3, True)
        fwd3_v64 = v_columns(64, fwd3)
        row("fwd x3, v 64 columns", fwd3_v64, True)
        fwd3_vcol = v_layout("column", fwd3)
        row("fwd x3, v column", fwd3_vcol, True)
        if device.type == "cuda":
            quant_direct(False)
            if graph_row(row, "fwd x3 graph", fwd3):
                graph_row(row, "fwd x3 graph, v 64 columns", fwd3_v64)
                graph_row(row, "fwd x3 graph, v column", fwd3_vcol)
                # V's kernel with the head split of Q's and K's (mq.V_QUANT_GROUPS None: the geometry before stop 33)
                graph_row(row, "fwd x3 graph, v head split", mock.patch.object(mq, "V_QUANT_GROUPS", None)(fwd3))
                graph_row(row, "fwd x3 graph'", fwd3)  # the default again: the A/A gauge of the two rows above
                for n in "qkv":
                    g = graph_of(calls[n])
                    if g is not None:
                        ms = row(f"{n} {'(32, 1)' if n == 'v' else '(1, 32)'} graph", g, False, tensor_bytes[n],
                                 check=False)
                        copy_ms = same_bytes_copy_ms(tensor_bytes[n], device)
                        if copy_ms is not None:
                            print(f"{name:22} {n} same-bytes copy graph    {copy_ms * 1e3:9.1f} us "
                                  f"{tensor_bytes[n] / copy_ms / 1e6:7.0f} GB/s  kernel / copy {copy_ms / ms:5.1%}",
                                  flush=True)
                # (32, 1)'s A/B (module constants and KNOBS, read at launch, as tools/mxfp8_quant_probe.py sets them;
                # bit-exact by construction: tests/backends/test_triton_mxfp8.py's head-group, v-columns and
                # column-layout tests): whole columns a thread (KNOBS.mxfp8_quant_v_layout; bench/NOTES.md "MXFP8
                # (32, 1) quantize in whole columns, helper quantv36"), with the copy two groups ahead, with 8 heads
                # a program (2 programs a row tile at H16); 2 warps per 128 columns (v12's "cols2": 59% vs 48% of the copy on
                # 16 heads), the head split of Q's and K's kernels (the default before stop 33: the 16-head grid reads
                # 1 KB of each 4 KB row per split), 64 / 32 columns per iteration (16 / 23 one-warp
                # programs per SM instead of 9: bench/NOTES.md "MXFP8 (32, 1) quantize bandwidth, helper quant32")
                v_want = [t.view(torch.uint8).clone() for t in calls["v"]()]
                for label, patches in (
                        ("v graph, column", (((KNOBS, "mxfp8_quant_v_layout"), "column"),)),
                        ("v graph, column, 3 stages", (((KNOBS, "mxfp8_quant_v_layout"), "column"),
                                                       ((mq, "V_COLUMN_STAGES"), 3))),
                        ("v graph, column, 8 heads", (((KNOBS, "mxfp8_quant_v_layout"), "column"),
                                                      ((mq, "V_COLUMN_GROUPS"), 8))),
                        ("v graph, 2 warps", (((mq, "QUANT_WARPS"), {**mq.QUANT_WARPS, "cols": 2}),)),
                        ("v graph, head split (old)", (((mq, "V_QUANT_GROUPS"), None),)),
                        ("v graph, 64 columns", (((KNOBS, "mxfp8_quant_v_columns"), 64),)),
                        ("v graph, 32 columns", (((KNOBS, "mxfp8_quant_v_columns"), 32),))):
                    with contextlib.ExitStack() as patched:
                        for (owner, attr), value in patches:  # pairs: KNOBS is not hashable
                            patched.enter_context(mock.patch.object(owner, attr, value))
                        same = all(map(torch.equal, [t.view(torch.uint8) for t in calls["v"]()], v_want))
                        g = graph_of(calls["v"])
                        if g is not None:
                            row(label, g, False, tensor_bytes["v"], check=False, same=same)
                print(f"{name:22} column kernel {column_kernels()}", flush=True)
            else:
                print(f"{name}: the three calls could not be captured in a CUDA graph", flush=True)
            for label, fn, on in (("host us: op x3", op3, False), ("host us: op x3, quant_direct", op3, True),
                                  ("host us: fwd x3", fwd3, False), ("host us: fwd x3, quant_direct", fwd3, True)):
                quant_direct(on)
                us = host_us(fn)
                print(f"{name:22} {label:28} {us:9.1f} us of host per three calls", flush=True)
        quant_direct(False)
        del inp
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
