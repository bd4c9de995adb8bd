"""One-call GPU check of the Triton backend: correctness on the benchmark shapes, then TFLOP/s against SDPA.

    python tools/devcheck.py [--quick] [--sweep] [--variants [--only TEXT]] [--out DIR]   (or python -m tools.devcheck)

--variants: compiles every entry of VARIANTS in parallel processes first (Triton's disk cache), then times each
(knob/config variant x case) in one process and prints one table: same-run before/after comparisons.

Useful FLOPs: 4*D per visible (query, key) pair per head forward, 2.5x that backward. Medians of
``triton.testing.do_bench``. Prints a table last. A development tool: it lives in tools/, outside the package, and
its measurement log is bench/NOTES.md ("Kernel development log").
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

if __package__ in (None, ""):  # run as `python tools/devcheck.py`: import jfa_ops, bench and tools from the repo root
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402

from bench.flops import visible_pairs  # noqa: E402  (the bench's exact count of useful work)
from jfa_ops.backends.base import AttentionParams  # noqa: E402
from jfa_ops.backends import triton as tb  # noqa: E402


def skewed_lengths(n, mean, max_len, total, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.empty(n).log_normal_(0.0, 1.0, generator=g)
    x = (x / x.sum() * total).clamp(1, max_len).round().long()
    x[torch.argmax(x)] += total - int(x.sum())  # exact total
    return x.clamp(1, max_len).tolist()


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def run_case(name, len_q, len_k, heads, heads_kv, d, causal, broadcast_q=False, sdpa=False, dtype=torch.bfloat16,
             time_sdpa=True):
    dev = "cuda"
    kv_off = torch.tensor([0] + len_k, device=dev).cumsum(0).to(torch.int32)
    q_off = None if broadcast_q else torch.tensor([0] + len_q, device=dev).cumsum(0).to(torch.int32)
    t_q = len_q[0] if broadcast_q else sum(len_q)
    q = torch.randn(t_q, heads, d, device=dev, dtype=dtype)
    k = torch.randn(sum(len_k), heads_kv, d, device=dev, dtype=dtype)
    v = torch.randn(sum(len_k), heads_kv, d, device=dev, dtype=dtype)
    params = AttentionParams(scale=d ** -0.5, causal=causal, broadcast_q=broadcast_q)
    lq_all = len_q * len(len_k) if broadcast_q else len_q
    flops = 4 * d * heads * visible_pairs(lq_all, len_k, causal)
    out, lse = tb.forward(q, k, v, q_off, kv_off, params)
    do = torch.randn_like(out)
    t_fwd = bench(lambda: tb.forward(q, k, v, q_off, kv_off, params))
    t_bwd = bench(lambda: tb.backward(do, None, q, k, v, out, lse, q_off, kv_off, params))
    row = dict(case=name, fwd_ms=t_fwd, bwd_ms=t_bwd, fwd_tflops=flops / t_fwd * 1e-9,
               bwd_tflops=2.5 * flops / t_bwd * 1e-9)
    if sdpa:  # dense peer: equal lengths, [B, H, S, D]
        b, s = len(len_q), len_q[0]
        qd, kd, vd = (t.view(b, s, -1, d).transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, scale=params.scale)
        dod = do.view(b, s, heads, d).transpose(1, 2)
        gq, gk, gv = torch.autograd.grad(ref, (qd, kd, vd), dod)
        dq, dk, dv = tb.backward(do, None, q, k, v, out, lse, q_off, kv_off, params)
        dense = lambda t: t.view(b, s, -1, d).transpose(1, 2)  # noqa: E731
        row["err"] = max(rel(dense(out), ref), rel(dense(dq), gq), rel(dense(dk), gk), rel(dense(dv), gv))
        if not time_sdpa:
            return row
        t_sf = bench(lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=causal,
                                                                               scale=params.scale))
        ref = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, scale=params.scale)
        t_sb = bench(lambda: torch.autograd.grad(ref, (qd, kd, vd), dod, retain_graph=True))
        row.update(sdpa_fwd_tflops=flops / t_sf * 1e-9, sdpa_bwd_tflops=2.5 * flops / t_sb * 1e-9)
    return row


def sweep(rows_out):
    """One config change at a time on the dense shapes (fwd TMA on/off, block shapes); prints TFLOP/s."""
    from jfa_ops.backends.triton import attn_fwd, configs

    K = configs.KernelConfig
    variants = [
        ("fwd no-TMA", "tma", False),
        ("fwd causal BN128", "_fwd", lambda *a: K(128, 128, 8, 3)),
        ("fwd causal BN64 s4", "_fwd", lambda *a: K(128, 64, 8, 4)),
        ("dkdv 64x128 s3", "_dkdv", lambda *a: K(64, 128, 8, 3)),
        ("dkdv 128x128 s2", "_dkdv", lambda *a: K(128, 128, 8, 2)),
        ("dq 128x128 s2", "_dq", lambda *a: K(128, 128, 8, 2)),
        ("dq 128x64 s3", "_dq", lambda *a: K(128, 64, 8, 3)),
    ]
    for label, attr, value in variants:
        saved = attn_fwd.TMA_ENABLED if attr == "tma" else getattr(configs, attr)
        try:
            if attr == "tma":
                attn_fwd.TMA_ENABLED = value
            else:
                setattr(configs, attr, value)
            for causal in (False, True):
                row = run_case(f"{label} {'causal' if causal else 'full'}", [4096] * 8, [4096] * 8, 16, 16, 128,
                               causal, False, True, time_sdpa=False)
                rows_out.append(row)
                print(f"SWEEP {row['case']:32s} fwd {row['fwd_tflops']:6.1f} bwd {row['bwd_tflops']:6.1f}"
                      f" err {row['err']:.1e}", flush=True)
        except Exception as e:  # e.g. out of shared memory: report and go on
            print(f"SWEEP {label}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        finally:
            if attr == "tma":
                attn_fwd.TMA_ENABLED = saved
            else:
                setattr(configs, attr, saved)


# --------------------------------------------------------------------------------- same-run variant comparison
# (name, knob overrides, config overrides {kernel: (block_m, block_n, warps, stages)}, cases, passes)
_FIVE = ("dense", "causal", "jagged", "jcausal", "bcast")
# Session 5 candidates (measured 2026-11-30, bench/results/devcheck_variants_*session5*); older: bench/NOTES.md
VARIANTS = [
    ("new (defaults)", {}, {}, _FIVE, "fb"),
    # (the warp-specialized forward and dQ variants live at the git tag experiment/warp-specialize)
    ("fwd: atomic work counter", dict(fwd_schedule="atomic"), {}, _FIVE, "f"),
    ("fwd: static striding", dict(fwd_schedule="static"), {}, _FIVE, "f"),
    ("sorted tile lists even in one wave", dict(one_wave_unsorted=False), {}, _FIVE, "fb"),
    ("bwd: one program per item", dict(bwd_schedule="grid"), {}, _FIVE, "b"),
    ("bwd: atomic work counter", dict(bwd_schedule="atomic"), {}, _FIVE, "b"),
]


_CPU_DRY_RUN = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")  # fp16 on CPU: checks this script only


def _cases():
    skew = skewed_lengths(28, 1170, 8192, 32768, 0)
    kv = skewed_lengths(128, 964, 8192, 128 * 964, 1)
    return {"dense": ([4096] * 8, [4096] * 8, 16, 16, 128, False, False),
            "causal": ([4096] * 8, [4096] * 8, 16, 16, 128, True, False),
            "jagged": (skew, skew, 16, 16, 128, False, False),
            "jcausal": (skew, skew, 16, 16, 128, True, False),
            "bcast": ([512], kv, 4, 4, 128, False, True)}


def _apply(knobs, cfgs):
    """Set the variant's knobs and config overrides; returns an undo function."""
    from jfa_ops.backends.triton import configs

    saved_knobs = dataclasses.asdict(configs.KNOBS)
    saved_fns = {name: getattr(configs, "_" + name) for name in cfgs}
    for k, v in knobs.items():
        if not k.startswith("_"):
            setattr(configs.KNOBS, k, v)
    for name, c in cfgs.items():
        setattr(configs, "_" + name, (lambda c: lambda *a: configs.KernelConfig(*c))(c))

    def undo():
        for k, v in saved_knobs.items():
            setattr(configs.KNOBS, k, v)
        for name, fn in saved_fns.items():
            setattr(configs, "_" + name, fn)
    return undo


def _inputs(case, seed=0):
    len_q, len_k, heads, heads_kv, d, causal, bq = case
    dev, dt = ("cpu", torch.float16) if _CPU_DRY_RUN else ("cuda", torch.bfloat16)
    g = torch.Generator(device=dev).manual_seed(seed)
    kv_off = torch.tensor([0] + list(len_k), device=dev).cumsum(0).to(torch.int32)
    q_off = None if bq else torch.tensor([0] + list(len_q), device=dev).cumsum(0).to(torch.int32)
    t_q = len_q[0] if bq else sum(len_q)
    q = torch.randn(t_q, heads, d, device=dev, generator=g).to(dt)
    k = torch.randn(sum(len_k), heads_kv, d, device=dev, generator=g).to(dt)
    v = torch.randn(sum(len_k), heads_kv, d, device=dev, generator=g).to(dt)
    lq_all = list(len_q) * len(len_k) if bq else list(len_q)
    flops = 4 * d * heads * visible_pairs(lq_all, list(len_k), causal)
    return q, k, v, q_off, kv_off, flops


def _run_variant(index, small=False):
    """Run variant ``index`` on its cases; small=True only compiles (tiny lengths, same specializations)."""
    name, knobs, cfgs, case_names, passes = VARIANTS[index]
    undo = _apply(knobs, cfgs)
    rows = []
    try:
        for cn in case_names:
            case = _cases()[cn]
            if small:
                case = ([40] * 2, [70] * 2) + case[2:] if not case[6] else ([40], [70, 3]) + case[2:]
            q, k, v, q_off, kv_off, flops = _inputs(case)
            params = AttentionParams(scale=case[4] ** -0.5, causal=case[5], broadcast_q=case[6],
                                     deterministic=bool(knobs.get("_deterministic")))
            out, lse = tb.forward(q, k, v, q_off, kv_off, params)
            do = torch.randn_like(out)
            grads = tb.backward(do, None, q, k, v, out, lse, q_off, kv_off, params)
            # error against the deterministic (separate dQ pass, no atomics) gradients of the same inputs
            ref_params = dataclasses.replace(params, deterministic=True)
            ref = tb.backward(do, None, q, k, v, out, lse, q_off, kv_off, ref_params)
            row = dict(variant=name, case=cn, err_vs_det=max(rel(a, b) for a, b in zip(grads, ref)))
            if "f" in passes:  # the forward against the exact reference backend (a forward variant's own check)
                from jfa_ops.backends.reference import forward as reference_forward

                row["err_fwd_vs_ref"] = rel(out, reference_forward(q, k, v, q_off, kv_off, params)[0])
            if small:
                continue
            if "f" in passes:
                row["fwd"] = flops / bench(lambda: tb.forward(q, k, v, q_off, kv_off, params)) * 1e-9
            if "b" in passes:
                row["bwd"] = 2.5 * flops / bench(lambda: tb.backward(do, None, q, k, v, out, lse, q_off, kv_off,
                                                                        params)) * 1e-9
            rows.append(row)
            print(json.dumps(row), flush=True)
            del q, k, v, out, lse, do, grads, ref
    finally:
        undo()
    return rows


def _prewarm(index):
    _run_variant(index, small=True)
    return index


def _prewarm_safe(index):
    try:
        return _prewarm(index)
    except Exception as e:  # a variant that does not compile or launch is reported when it is timed
        print(f"prewarm {VARIANTS[index][0]}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return index


def variants(out_dir, workers=12, only=None):
    """Compile every variant in parallel processes (Triton's disk cache), then time them one by one. ``only``: the
    variants whose name contains this text (run a risky one alone under ``timeout``: a kernel hang ends the call).
    A variant that raises is reported and skipped."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.time()
    from tools import devcheck  # pickle by module name, also when run as __main__

    chosen = [i for i, v in enumerate(VARIANTS) if only is None or only in v[0]]
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(devcheck._prewarm_safe, chosen))
    print(f"prewarm {time.time() - t0:.0f}s", flush=True)
    rows = []
    for i in chosen:
        try:
            rows += _run_variant(i)
        except Exception as e:
            print(f"variant {VARIANTS[i][0]}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    with open(os.path.join(out_dir, "variants.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\n{'variant':34s} {'case':8s} {'fwd':>6s} {'bwd':>6s} {'err_vs_det':>10s} {'err_fwd':>8s}")
    for r in rows:
        print(f"{r['variant']:34s} {r['case']:8s} {r.get('fwd', math.nan):6.1f} {r.get('bwd', math.nan):6.1f}"
              f" {r['err_vs_det']:10.1e} {r.get('err_fwd_vs_ref', math.nan):8.1e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="also time one-change config variants (dense shapes)")
    ap.add_argument("--variants", action="store_true", help="only the same-run variant table (VARIANTS)")
    ap.add_argument("--only", default=None, help="with --variants: the variants whose name contains this text")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__, flush=True)
    if args.variants:
        variants(args.out, only=args.only)
        return
    rows = []
    cases = [("dense B8 H16 S4096 D128", [4096] * 8, [4096] * 8, 16, 16, 128, False, False, True),
             ("dense causal", [4096] * 8, [4096] * 8, 16, 16, 128, True, False, True)]
    skew = skewed_lengths(28, 1170, 8192, 32768, 0)
    cases += [("jagged 28 lognormal T32768", skew, skew, 16, 16, 128, False, False, False),
              ("jagged causal", skew, skew, 16, 16, 128, True, False, False)]
    kv = skewed_lengths(128, 964, 8192, 128 * 964, 1)
    cases += [("broadcast-Q 128x512 H4", [512], kv, 4, 4, 128, False, True, False)]
    if args.quick:
        cases = cases[:1]
    for c in cases:
        t0 = time.time()
        row = run_case(*c)
        row["wall_s"] = round(time.time() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.sweep:
        sweep(rows)
    with open(os.path.join(args.out, "devcheck.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\n{'case':32s} {'fwd TF/s':>9s} {'bwd TF/s':>9s} {'sdpa fwd':>9s} {'sdpa bwd':>9s} {'err':>8s}")
    for r in rows:
        print(f"{r['case']:32s} {r['fwd_tflops']:9.1f} {r['bwd_tflops']:9.1f} {r.get('sdpa_fwd_tflops', math.nan):9.1f}"
              f" {r.get('sdpa_bwd_tflops', math.nan):9.1f} {r.get('err', math.nan):8.1e}")


if __name__ == "__main__":
    main()
