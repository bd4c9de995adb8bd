"""python -m bench: measure every jfa_ops backend against its peers; print a TFLOP/s table, write JSON/MD/PNG.

    python -m bench                      # all suites, full shapes (~8 min on the H200)
    python -m bench --quick              # a representative subset (~3 min): D=128, S in {2k, 8k}
    python -m bench --smoke              # tiny shapes; runs on the CPU with the reference backend
    python -m bench --suite dense,jagged --head-dims 128 --modes fwd,bwd --peers fa4,flex --backends triton

See bench/README.md for the device recipe (FA4 carried in two calls).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import os
import platform
import re
import subprocess
import sys
import time
from typing import Optional

try:  # the TLX plugin installed with pip --target skips its .pth: register it before anything imports triton
    import _utlx_autoregister  # noqa: F401
except ImportError:
    pass

import torch

from bench import model, report, suites, timing
from bench import peers as bench_peers
from bench.peers import (EXTRA_PEERS, MXFP8_KINDS, PEER_ORDER, FlashAttention4, JfaBackend, JfaMxfp8, Skip,
                         jfa_available_backends, mxfp8_variants, make_peers, one_line, oracle_output, rel_error)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PEERS = ",".join(PEER_ORDER)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--suite", default=",".join(suites.ALL_SUITES),
                   help=f"comma list of {', '.join(suites.ALL_SUITES)}")
    p.add_argument("--quick", action="store_true", help="representative subset: D=128, S in {2k, 8k}")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, output checks on; runs on the CPU")
    p.add_argument("--head-dims", default=None, help="comma list (default 64,128,256; quick: 128; smoke: 64)")
    p.add_argument("--backends", default=None, help="jfa_ops backends (default: jfa_ops.available_backends()); "
                   "NAME@opaque keeps the op one opaque node in compiled graphs (JFA_COMPILE_PATH; default inductor), e.g. triton,triton@opaque; "
                   "NAME@split: traced kernels below TMA_MIN_ROWS rows, the opaque op above, in one graph (torch.cond); "
                   "auto: the library's automatic choice (backend=None)")
    p.add_argument("--peers", default=DEFAULT_PEERS, help=f"comma list of {', '.join(PEER_ORDER + EXTRA_PEERS)}, "
                                                           "or none")
    p.add_argument("--modes", default="fwd,bwd,fwdbwd", help="comma list of fwd, bwd, fwdbwd")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="directory for JSON, Markdown and PNG")
    p.add_argument("--device", default=None, help="cuda if available, else cpu")
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--budget-s", type=float, default=None,
                   help="stop starting new measurements after this many seconds (default: full 450, quick 210)")
    p.add_argument("--check", action="store_true", help="compare each forward with the float32 oracle (small cases)")
    p.add_argument("--no-flex-compile", action="store_true", help="run FlexAttention eagerly (debugging)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--model-kinds", default="small,large",
                   help="model suite: comma list of its batch kinds, small (B8 lengths 1-64) and large (T32768)")
    p.add_argument("--mxfp8-variants", action="store_true",
                   help="mxfp8 suite: one row per triton MXFP8 forward variant (default: the default variant only)")
    return p.parse_args(argv)


def git_commit() -> str:
    # The environment wins: on the device the copy has no .git of its own, and git may find an unrelated repository
    # above it (a run once recorded that one's commit).
    if os.environ.get("JFA_GIT_COMMIT"):
        return os.environ["JFA_GIT_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=HERE, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if sha:
            return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def package_version(dist: str) -> str:
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # noqa: BLE001
        return "absent"


def run_meta(device: torch.device, args) -> dict:
    now = datetime.datetime.now()
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"cpu ({platform.processor() or platform.machine()})"
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = "absent"
    return {
        "date": now.strftime("%Y-%m-%d %H:%M:%S"), "device": name, "torch": torch.__version__,
        "cuda": torch.version.cuda or "-", "triton": triton_version, "git_commit": git_commit(),
        "flash_attn_4": package_version("flash-attn-4"), "python": platform.python_version(),
        "timer": "triton.testing.do_bench median" if device.type == "cuda" else "perf_counter median (CPU)",
        "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms, "argv": sys.argv,
    }


def free_memory(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class _NoProgress:
    """Stands in for tqdm where it is not installed: the run's output is the same, without a progress bar."""

    def __init__(self, **_):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False

    def update(self, n=1):
        pass

    def set_postfix_str(self, *_, **__):
        pass


def progress_bar(**kw):
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoProgress(**kw)
    return tqdm(**kw)


def measure_peer(peer, case, inputs, device, modes, args, oracle, clocks: Optional[timing.GpuClocks] = None) -> list:
    """All modes of one peer on one case (``inputs``: the rotated input sets): a record per mode, with the GPU's
    clocks during its timing where ``clocks`` can read them (``timing.GpuClocks``).

    A skip record carries the one-line reason."""
    clocks = clocks or timing.GpuClocks("cpu")
    base = {"case": case.describe(), "peer": peer.name}
    only = getattr(peer, "only_suite", None)
    if only and case.suite != only:  # before the sparse rule: MXFP8 rows are not skipped as "dense attention"
        return [dict(base, mode=m, skip=f"the {only} suite only") for m in modes]
    if case.keep_ratio is not None and not getattr(peer, "handles_sparse", False):
        return [dict(base, mode=m, skip="computes dense attention (see the jfa dense row)") for m in modes]
    try:
        preps = [peer.prepare(case, inp) for inp in inputs]
    except Skip as e:
        return [dict(base, mode=m, skip=str(e)) for m in modes]
    except Exception as e:  # noqa: BLE001 - a peer that fails to set up is skipped with its error
        free_memory(device)
        return [dict(base, mode=m, skip=f"prepare failed: {one_line(e)}") for m in modes]
    note = preps[0].note
    if case.suite == "overhead":
        return [overhead_measurement(peer, case, preps[0], device, oracle, base, note)]
    records = []
    for mode in modes:
        rec = dict(base, mode=mode, note=note)
        if mode != "fwd" and preps[0].no_backward:
            records.append(dict(base, mode=mode, skip=preps[0].no_backward))
            continue
        call = timed = None
        try:
            call = timing.mode_callable(mode, preps)
            call()  # compile / autotune outside the memory measurement
            rec["peak_mib"] = timing.peak_memory_mib(call, device)
            timed = call
            if preps[0].graph and mode == "fwd" and device.type == "cuda":  # the GPU's time, not the host's
                timed = timing.graph_replay(call) or call
                rec["timer"] = "cuda graph replay" if timed is not call else "eager (graph capture failed)"
            with clocks.window() as clock_fields:
                ms = timing.median_ms(timed, device, args.warmup_ms, args.rep_ms)
            rec["ms"] = ms
            rec.update(clock_fields)
            if preps[0].eager_fn is not None and mode == "fwd":  # a graph-timed row's eager call too
                eager = timing.mode_callable("fwd", [dataclasses.replace(preps[0], fn=preps[0].eager_fn)])
                rec["eager_ms"] = timing.median_ms(eager, device, args.warmup_ms, args.rep_ms)
            if preps[0].bytes_moved:  # a memory-bound kernel (MXFP8 quantize): GB/s, no TFLOP/s
                rec["gbps"] = preps[0].bytes_moved / (ms * 1e-3) / 1e9
                if "eager_ms" in rec:
                    rec["eager_gbps"] = preps[0].bytes_moved / (rec["eager_ms"] * 1e-3) / 1e9
            else:
                rec["tflops"] = case.flops(mode) / (ms * 1e-3) / 1e12
            if mode == "fwd" and oracle is not None and preps[0].exact:
                with torch.no_grad():
                    rec["rel_err"] = rel_error(preps[0].to_jagged(preps[0].fn()), oracle)
                if preps[0].tolerance is not None:
                    rec["tolerance"] = preps[0].tolerance
        except Exception as e:  # noqa: BLE001 - one failing mode does not stop the others
            rec = dict(base, mode=mode, skip=f"{mode} failed: {one_line(e)}")
        call = timed = None  # drops the retained graphs (autograd's, a CUDA graph's pool) before the next mode
        free_memory(device)
        records.append(rec)
    del preps
    free_memory(device)
    return derive_backward(case, records)


def overhead_measurement(peer, case, prep, device, oracle, base, note) -> dict:
    """The `overhead` suite's one record per peer (mode "calls"): every per-call column of timing.overhead_record."""
    # CUDA-graph replay for our GPU backends' forward only (the reference reads offsets on the host: no capture; a
    # peer's failed capture is not worth the risk to the run)
    graph = peer.name.startswith("jfa:") and peer.name != "jfa:reference" and device.type == "cuda"
    rec = dict(base, mode="calls", note=note)
    try:
        with timing.frozen_heap():  # every implementation timed on the same small heap, whatever the run imported
            rec.update(timing.overhead_record(prep, device, graph=graph))
        if oracle is not None and prep.exact:
            with torch.no_grad():
                rec["rel_err"] = rel_error(prep.to_jagged(prep.fn()), oracle)
    except Exception as e:  # noqa: BLE001
        rec = dict(base, mode="calls", skip=f"failed: {one_line(e)}")
    free_memory(device)
    return rec


def derive_backward(case, records: list) -> list:
    """Where the retained-graph backward failed but fwd and fwdbwd ran, report bwd as their difference (noted)."""
    by_mode = {r["mode"]: r for r in records}
    bwd, fwd, both = by_mode.get("bwd"), by_mode.get("fwd"), by_mode.get("fwdbwd")
    if not (bwd and bwd.get("skip") and fwd and fwd.get("ms") and both and both.get("ms")):
        return records
    ms = both["ms"] - fwd["ms"]
    if ms <= 0:
        return records
    derived = {k: v for k, v in bwd.items() if k != "skip"}
    derived.update(ms=ms, tflops=case.flops("bwd") / (ms * 1e-3) / 1e12,
                   note=f"bwd = fwdbwd - fwd ({bwd['skip'][:100]})")
    return [derived if r is bwd else r for r in records]


def mxfp8_peers(backends, all_variants: bool = False) -> list:
    """The mxfp8 suite's MXFP8 rows for our GPU backends. With ``JFA_TLX_MXFP8_BWD=0`` the tlx backend's MXFP8
    backward is the triton backend's (tlx/__init__.py): where both run, tlx's bwd is not timed again."""
    names = [b.split("@")[0] for b in backends]
    out = []
    for b in backends:
        if b in ("reference", "cpu"):
            continue
        shares = (b.split("@")[0] == "tlx" and "triton" in names and not bench_peers.tlx_mxfp8_backward()
                  and not all_variants)  # (variant rows: no plain one)
        backward_row = f"jfa:mxfp8:{backends[names.index('triton')]}" if shares else ""
        out += [JfaMxfp8(b, kind, variant, backward_row=backward_row if kind == "mxfp8" else "")
                for kind in MXFP8_KINDS for variant in mxfp8_variants(b, kind, all_variants)]
    return out



def device_tag(name: str) -> str:
    """The file-name tag of a GPU: its model ("NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA H200" -> "h200"), not the
    last word, which named memory ("hbm3") on the H100."""
    words = name.split()
    model = next((w for w in words if re.fullmatch(r"[A-Z]+\d+[A-Za-z]*", w) and w not in ("NVIDIA",)), words[-1])
    return model.lower()

def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    size = "smoke" if args.smoke else ("quick" if args.quick else "full")
    if args.head_dims:
        head_dims = [int(x) for x in args.head_dims.split(",")]
    else:
        head_dims = {"smoke": [64], "quick": [128], "full": list(suites.HEAD_DIMS)}[size]
    suite_names = [s for s in args.suite.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in report.MODES:
            raise SystemExit(f"unknown mode {m!r}; choose from {', '.join(report.MODES)}")
    budget = args.budget_s if args.budget_s is not None else {"smoke": 600, "quick": 210, "full": 450}[size]
    for kind in args.model_kinds.split(","):
        if kind and kind not in ("small", "large"):
            raise SystemExit(f"unknown model kind {kind!r}; choose from small, large")
    check = args.check or args.smoke

    if args.backends:
        backends = [b for b in args.backends.split(",") if b and b != "none"]
        if backends:
            jfa_available_backends(device)  # import check with a clear message
    else:
        backends = jfa_available_backends(device)
    peer_names = [p for p in args.peers.split(",") if p and p != "none"]
    if args.smoke and args.peers == DEFAULT_PEERS:
        peer_names.append("sdpa_math")  # runs anywhere: exercises the padding path the cuDNN/flash adapters share
    peers = [JfaBackend(b) for b in backends] + [peer for p in peer_names
                                                 for peer in make_peers(p, flex_compile=not args.no_flex_compile)]
    if "sparse" in suite_names:  # our dense kernel and the selection alone on the sparse cases' batches
        peers[len(backends):len(backends)] = [JfaBackend(b, variant) for b in backends
                                              for variant in ("dense", "select")]
        if "fa4" in peer_names:  # FA4's block-sparse backward: its padded-batch call (the varlen one has none)
            at = next(i for i, p in enumerate(peers) if p.name == "fa4") + 1
            peers[at:at] = [FlashAttention4(padded=True)]
    if "mxfp8" in suite_names:  # issue 12: MXFP8 beside our bf16 on the GPU backends (all three kinds); with
        # --mxfp8-variants, on triton one row per forward variant (mxfp8_attn_fwd.VARIANTS)
        peers[len(backends):len(backends)] = mxfp8_peers(backends, args.mxfp8_variants)
    # in the order asked for, so a run cut short by its budget has the suites named first; "model" is a training
    # loop (bench.model), not cases
    plan = []
    for suite in suite_names:
        plan += ["model"] if suite == "model" else suites.build_cases([suite], head_dims, size)
    cases = [c for c in plan if c != "model"]

    meta = run_meta(device, args)
    os.makedirs(args.out, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    dev_tag = "cpu" if device.type == "cpu" else device_tag(meta["device"])
    prefix = os.path.join(args.out, f"bench_{stamp}_{dev_tag}")
    print(f"bench: {len(cases)} cases x {len(peers)} implementations ({', '.join(p.name for p in peers)}), "
          f"modes {','.join(modes)}, device {meta['device']}, budget {budget:.0f} s", flush=True)
    unavailable = {p.name: p.unavailable(device) for p in peers}
    for name, reason in unavailable.items():
        if reason:
            print(f"  skipping {name}: {reason}", flush=True)
    meta["unavailable"] = {name: reason for name, reason in unavailable.items() if reason}
    live = [p for p in peers if not unavailable[p.name]]

    host_start = timing.host_state(device)
    clocks = timing.GpuClocks(device)
    meta["clocks"] = "nvml, every 20 ms of each row's timing" if clocks.nvml else "not read (no pynvml or no GPU)"
    start = time.perf_counter()
    records = []
    with progress_bar(total=len(cases) * len(live), desc="bench", unit="run", file=sys.stderr, dynamic_ncols=True,
              mininterval=0.5 if sys.stderr.isatty() else 15) as bar:
        for case in plan:
            if case == "model":
                names = model.model_peer_names(backends, peer_names, device)
                bar.set_postfix_str(f"model | {', '.join(names)}"[-60:], refresh=False)

                def save(new_records, done=records):
                    meta["elapsed_s"] = round(time.perf_counter() - start, 1)
                    report.write_json(prefix + ".json", meta, done + new_records)
                records += model.run(backends, peer_names, device, size, deadline=start + budget, progress=save,
                                     kinds=[k for k in args.model_kinds.split(",") if k])
                continue
            if time.perf_counter() - start > budget:
                records += [{"case": case.describe(), "peer": p.name, "mode": m,
                             "skip": f"time budget ({budget:.0f} s) spent"} for p in live for m in modes]
                bar.update(len(live))
                continue
            n_rot = 1 if case.suite == "overhead" else timing.rotations_for(suites.input_bytes(case), device)
            inputs = [suites.make_inputs(case, device, seed=i) for i in range(n_rot)]  # shared by all peers
            oracle = oracle_output(case, inputs[0]) if check else None
            for peer in live:
                bar.set_postfix_str(f"{case.name} | {peer.name}"[-60:], refresh=False)
                records += measure_peer(peer, case, inputs, device, modes, args, oracle, clocks)
                bar.update(1)
            del oracle, inputs
            free_memory(device)
            meta["elapsed_s"] = round(time.perf_counter() - start, 1)
            report.write_json(prefix + ".json", meta, records)  # after every case: a cut-short run keeps its data
    meta["elapsed_s"] = round(time.perf_counter() - start, 1)
    meta["host"] = f"start {host_start}; end {timing.host_state(device)}"
    meta["clock_line"] = report.clock_line(records)
    meta["issue11"] = report.sparse_lines(records)  # the sparse rows' speedups and selection share, in the JSON too
    # issue 12's PASS/FAIL lines, in the JSON too
    meta["issue12"] = report.mxfp8_lines(records, meta["unavailable"], meta["device"])
    report.write_json(prefix + ".json", meta, records)

    md = report.markdown(meta, records)
    with open(prefix + ".md", "w") as f:
        f.write(md)
    if not args.no_plots:
        for suite, recs in report.by_suite(records).items():
            why = report.plot_suite(f"{prefix}_{suite}.png", suite, recs)
            if why:
                print(f"  no plot for {suite}: {why}")
    print()
    for suite, recs in report.by_suite(records).items():
        print(report.suite_section(suite, recs, with_skips=False))
    skips = [f"{n}: {r} (everywhere)" for n, r in meta["unavailable"].items()] + report.skip_lines(records)
    for header, lines in (("skipped:", skips),
                          ("summary (geometric mean over a suite's cases):", report.summary_lines(records)),
                          ("issue 9 targets:", report.target_lines(records)),
                          ("issue 11 (block-sparse):", report.sparse_lines(records)),
                          ("issue 12 (MXFP8):", report.mxfp8_lines(records, meta["unavailable"], meta["device"]))):
        if lines:
            print(header)
            for line in lines:
                print("  " + line)
    if meta["clock_line"]:
        print(meta["clock_line"])
    checks = report.check_lines(records)
    wrong = [c for c in checks if c.endswith("WRONG")]
    if checks:
        print(f"output checks: {len(checks) - len(wrong)} ok, {len(wrong)} wrong")
        for c in wrong:
            print("  " + c)
    print(f"wrote {prefix}.json, .md and per-suite .png ({meta['elapsed_s']} s)")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
