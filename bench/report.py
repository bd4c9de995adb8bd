"""Results: one record per (case, peer, mode); the TFLOP/s tables, JSON, Markdown and one PNG per suite."""
from __future__ import annotations

import json
import math
import os
from typing import Dict, List, Optional

from bench import timing
from bench.peers import PEER_ORDER

MODES = ("fwd", "bwd", "fwdbwd")
YARDSTICK, FLEX = "fa4", "flex"
CHECK_TOLERANCE = 2e-2  # ||out - ref|| / ||ref|| for bf16 inputs


def peer_columns(records: List[dict]) -> List[str]:
    """FA4 first, then the jfa_ops backends, then the other peers."""
    names = {r["peer"] for r in records}
    jfa = sorted(n for n in names if n.startswith("jfa:"))
    rest = [n for n in PEER_ORDER if n in names and n != YARDSTICK]
    others = sorted(names - set(jfa) - set(rest) - {YARDSTICK})
    return ([YARDSTICK] if YARDSTICK in names else []) + jfa + rest + others


def ratio_backends(peers: List[str]) -> List[str]:
    """The jfa backends that get ratio columns: all but the reference, unless it is the only one."""
    jfa = [p for p in peers if p.startswith("jfa:")]
    return [p for p in jfa if p != "jfa:reference"] or jfa


def _fmt(x: Optional[float]) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def _gbps(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else _fmt(value)


def _cell(r: Optional[dict]) -> str:
    if r is None or r.get("skip"):
        return "—"
    mark = ""
    if r.get("rel_err") is not None and not r["rel_err"] <= r.get("tolerance", CHECK_TOLERANCE):
        mark = " (WRONG)"
    return _fmt(r.get("tflops", r.get("gbps"))) + mark


def _index(records):
    return {(r["case"]["name"], r["peer"], r["mode"]): r for r in records}


def _case_names(records):
    seen = []
    for r in records:
        if r["case"]["name"] not in seen:
            seen.append(r["case"]["name"])
    return seen


def _modes(records):
    return [m for m in MODES if any(r["mode"] == m for r in records)]


def tflops_table(records: List[dict]) -> str:
    """Markdown table: a row per case and mode, TFLOP/s per peer, then each jfa backend against FA4 and Flex.

    Peers skipped on every case of the table get no column (the skip list says why)."""
    peers = peer_columns([r for r in records if not r.get("skip")])
    ratio_cols = [(b, y) for b in ratio_backends(peers) for y in (YARDSTICK, FLEX) if y in peers]
    head = ["case", "mode"] + peers + [f"{b[4:]}/{y}" for b, y in ratio_cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    idx = _index(records)
    for name in _case_names(records):
        for mode in _modes(records):
            row = [idx.get((name, p, mode)) for p in peers]
            if all(r is None for r in row):
                continue
            cells = [name, mode] + [_cell(r) for r in row]
            for b, y in ratio_cols:
                rb, ry = idx.get((name, b, mode)), idx.get((name, y, mode))
                tb = rb and not rb.get("skip") and rb.get("tflops")
                ty = ry and not ry.get("skip") and ry.get("tflops")
                cells.append(f"{tb / ty:.2f}x" if tb and ty else "—")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def memory_table(records: List[dict]) -> str:
    peers = peer_columns([r for r in records if not r.get("skip")])
    idx = _index(records)
    head = ["case", "mode"] + peers
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    any_row = False
    for name in _case_names(records):
        for mode in _modes(records):
            row = [idx.get((name, p, mode)) for p in peers]
            vals = [None if (r is None or r.get("skip")) else r.get("peak_mib") for r in row]
            if all(v is None for v in vals):
                continue
            any_row = True
            lines.append("| " + " | ".join([name, mode] + [_fmt(v) for v in vals]) + " |")
    return "\n".join(lines) if any_row else ""


OVERHEAD_COLUMNS = (  # (record key, header): µs per call unless said otherwise
    ("fwd_wall_us", "eager fwd"), ("fwdbwd_wall_us", "eager fwd+bwd"), ("nograd_wall_us", "no_grad fwd"),
    ("inference_wall_us", "inference_mode fwd"), ("compiled_wall_us", "compiled fwd"),
    ("layer_fwd_us", "compiled fwd per layer"), ("layer_fwdbwd_us", "compiled fwd+bwd per layer"),
    ("fwd_kernel_us", "GPU µs fwd"), ("fwd_launches", "GPU ops fwd"), ("fwdbwd_kernel_us", "GPU µs fwd+bwd"),
    ("fwdbwd_launches", "GPU ops fwd+bwd"), ("graph_us", "CUDA graph fwd"),
)


def overhead_table(records: List[dict]) -> str:
    """A row per case and peer: the per-call columns of timing.overhead_record."""
    head = ["case", "peer"] + [h for _, h in OVERHEAD_COLUMNS] + ["compiled graphs / breaks"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = {p: i for i, p in enumerate(peer_columns(records))}
    for r in sorted(records, key=lambda r: (r["case"]["name"], order.get(r["peer"], 99))):
        if r.get("skip"):
            continue
        graphs = (f"{r['compiled_graphs']} / {r['compiled_graph_breaks']}" if r.get("compiled_graphs") is not None
                  else "—")
        lines.append("| " + " | ".join([r["case"]["name"], r["peer"]] + [_fmt(r.get(k)) for k, _ in OVERHEAD_COLUMNS]
                                       + [graphs]) + " |")
    return "\n".join(lines)


def overhead_column_skips(records: List[dict]) -> List[str]:
    """Why a column of the overhead table is empty for a peer (a compile that failed, a backward that cannot run)."""
    out = []
    for r in records:
        for key, header in OVERHEAD_COLUMNS:
            if r.get(key + "_skip"):
                out.append(f"{r['peer']} {header}: {r[key + '_skip']}")
    return out


def paired_cell(r: dict) -> str:
    """The paired figure of a model row: our step / the peer's in the same round, median (quartiles)."""
    if r.get("paired_ratio") is None:
        return r["timing"] if str(r.get("timing", "")).startswith("sequential") else "—"
    return (f"{r['paired_ratio']:.3f} ({r['paired_ratio_q1']:.3f}-{r['paired_ratio_q3']:.3f}) "
            f"vs {r['paired_peer']}, {r['paired_rounds']} rounds")


def model_table(records: List[dict]) -> str:
    head = ["batches", "attention", "step ms (median)", "tokens/s", "mean tokens/step",
            "warm-up step ms (first step on each batch)", "graphs compiled in warm-up", "graphs compiled while timed",
            "graph breaks", "loss", "step / peer's in the same round: median (IQR)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = {p: i for i, p in enumerate(peer_columns(records))}
    for r in sorted(records, key=lambda r: (r["case"]["name"], order.get(r["peer"], 99))):
        if r.get("skip"):
            continue
        lines.append("| " + " | ".join([
            r["case"]["label"], r["peer"], _fmt(r.get("step_ms")), f"{r['tokens_per_s']:.3g}",
            f"{r['mean_tokens']:.0f}", _fmt(r.get("warmup_step_ms")), str(r["compiles_warmup"]),
            str(r["compiles_timed"]), str(r["graph_breaks"]), f"{r['loss']:.3f}", paired_cell(r)]) + " |")
    return "\n".join(lines)


def _verdict(ok: Optional[bool]) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def target_lines(records: List[dict]) -> List[str]:
    """Issue 9's targets, one PASS/FAIL line per jfa GPU backend and target (n/a where a peer was not measured)."""
    out = []
    ovh = [r for r in records if r["case"]["suite"] == "overhead" and not r.get("skip")]
    for name in _case_names(ovh):
        rows = {r["peer"]: r for r in ovh if r["case"]["name"] == name}
        get = lambda peer, key: (rows.get(peer) or {}).get(key)  # noqa: E731
        for b in ratio_backends(peer_columns(list(rows.values()))):
            if b == "jfa:reference":
                continue
            for key, what in (("fwd_wall_us", "eager fwd (autograd recording)"), ("nograd_wall_us", "no_grad fwd")):
                ours, theirs = get(b, key), get("varlen", key)
                ok = None if ours is None else ours <= 80 and (theirs is None or ours <= theirs)
                out.append(f"{_verdict(ok)} {b} {what} {_fmt(ours)} us <= 80 and <= varlen's {_fmt(theirs)}")
            ours, fa4 = get(b, "fwdbwd_wall_us"), get("fa4", "fwdbwd_wall_us")
            ok = None if ours is None or fa4 is None else ours <= fa4
            out.append(f"{_verdict(ok)} {b} eager fwd+bwd {_fmt(ours)} us <= FA4's {_fmt(fa4)}")
            ours, fa4 = get(b, "fwd_kernel_us"), get("fa4", "fwd_kernel_us")
            ok = None if ours is None or fa4 is None else ours <= 2 * fa4
            out.append(f"{_verdict(ok)} {b} GPU time of the fwd {_fmt(ours)} us ({_fmt(get(b, 'fwd_launches'))} ops) "
                       f"<= 2x FA4's {_fmt(fa4)}")
            # "a compiled model pays no more per attention call than eager does": the one-call graph holds torch's
            # per-graph floor (a model pays it once a step), the per-layer columns what each further call adds
            ours, eager = get(b, "compiled_wall_us"), get(b, "fwd_wall_us")
            ok = None if ours is None or eager is None else ours <= eager
            out.append(f"{_verdict(ok)} {b} compiled fwd, one-call graph {_fmt(ours)} us per call <= eager "
                       f"{_fmt(eager)} (torch's per-graph floor included; varlen's "
                       f"{_fmt(get('varlen', 'compiled_wall_us'))})")
            for key, eager_key, what in (("layer_fwd_us", "fwd_wall_us", "fwd"),
                                         ("layer_fwdbwd_us", "fwdbwd_wall_us", "fwd+bwd")):
                ours, eager = get(b, key), get(b, eager_key)
                ok = None if ours is None or eager is None else ours <= eager
                out.append(f"{_verdict(ok)} {b} compiled {what} per layer of a {timing.LAYERS}-call graph "
                           f"{_fmt(ours)} us <= eager {_fmt(eager)} (varlen's {_fmt(get('varlen', key))})")
    mdl = [r for r in records if r["case"]["suite"] == "model" and not r.get("skip")]
    for name in _case_names(mdl):
        rows = {r["peer"]: r for r in mdl if r["case"]["name"] == name}
        large = "large" in name or "lognormal" in name
        for b in ratio_backends(peer_columns(list(rows.values()))):
            if b == "jfa:reference":
                continue
            ours, theirs = rows[b].get("step_ms"), (rows.get("varlen") or {}).get("step_ms")
            if rows[b].get("paired_peer") == "varlen":  # timed interleaved: the same-round ratio decides
                out.append(_paired_target(b, name, rows[b], theirs, large))
            elif large:
                ok = None if theirs is None else theirs >= 1.15 * ours
                out.append(f"{_verdict(ok)} {b} {name} step {_fmt(ours)} ms >= 1.15x faster than varlen_attn's "
                           f"{_fmt(theirs)} ms")
            else:
                ok = None if theirs is None else ours <= theirs
                out.append(f"{_verdict(ok)} {b} {name} step {_fmt(ours)} ms <= varlen_attn's {_fmt(theirs)} ms")
            if rows[b].get("compiles_timed"):
                out.append(f"FAIL {b} {name}: {rows[b]['compiles_timed']} recompiles while timed")
    return out


def _paired_target(b: str, name: str, row: dict, theirs: Optional[float], large: bool) -> str:
    """Issue 9's model target from the paired ratio (our step / varlen_attn's in the same round; host drift between
    rounds cancels in it): small batches PASS at a median <= 1.0, large ones at a speedup (1 / the median) >= 1.15."""
    ratio, q1, q3, n = row["paired_ratio"], row["paired_ratio_q1"], row["paired_ratio_q3"], row["paired_rounds"]
    ms = lambda x: "—" if x is None else f"{x:.2f}"  # noqa: E731
    steps = f"(median steps {ms(row.get('step_ms'))} vs {ms(theirs)} ms)"
    if large:
        return (f"{_verdict(1 / ratio >= 1.15)} {b} {name} paired speedup over varlen_attn {1 / ratio:.3f}x "
                f"(IQR {1 / q3:.3f}-{1 / q1:.3f}x, {n} rounds) >= 1.15 {steps}")
    return (f"{_verdict(ratio <= 1.0)} {b} {name} step / varlen_attn's in the same round {ratio:.3f} "
            f"(IQR {q1:.3f}-{q3:.3f}, {n} rounds) <= 1.0 {steps}")


def skip_lines(records: List[dict]) -> List[str]:
    """One line per distinct (peer, reason), with how many measurements it covers."""
    counts: Dict[tuple, int] = {}
    for r in records:
        if r.get("skip"):
            key = (r["peer"], r["skip"])
            counts[key] = counts.get(key, 0) + 1
    return [f"{peer}: {reason} (x{n})" for (peer, reason), n in sorted(counts.items())]


def note_lines(records: List[dict]) -> List[str]:
    seen = []
    for r in records:
        if r.get("note") and not r.get("skip"):
            line = f"{r['peer']} on {r['case']['name']}: {r['note']}"
            if line not in seen:
                seen.append(line)
    return seen


# (HBM spec, measured copy) GB/s by the device name's GPU, for issue 12's "80% of HBM bandwidth" (the spec) with the
# copy shown beside it; any other device is judged as the H200
HBM_GBPS = {
    "H100": (3350.0, 2960.0),  # HBM3; same-bytes copy (tools/mxfp8_quant_bandwidth.py, bench/NOTES.md "Stop 47")
    "H200": (4800.0, 4270.0),  # HBM3e; device copy (shared/device-facts.md)
}
QUANTIZE_TARGET = 0.8
# issue 12's targets: (case kind, mode) -> (min ratio vs our bf16, min ratio vs FA4 bf16)
MXFP8_TARGETS = {("memory", "fwd"): (1.6, 1.3), ("memory", "bwd"): (1.6, 1.3), ("compute", "fwd"): (1.2, 1.0),
                 ("compute", "bwd"): (1.0, None)}
FP8_PEER_PREFIXES = ("fa4 fp8", "flex fp8", "sdpa_fp8")  # per-tensor / per-head FP8 attention from peers (no targets)


def hbm_gbps(device: str = "") -> tuple:
    """(spec, measured copy) GB/s of the run's GPU (``meta["device"]``): stop 53 found an H100 run judged against
    the H200's 4.8 TB/s, so its quantize rows read 45% where they ran at 64% of the H100's own HBM."""
    return next((gbps for gpu, gbps in HBM_GBPS.items() if gpu in (device or "")), HBM_GBPS["H200"])


def _counts_quantization(peer: str) -> bool:
    """An MXFP8 row timed from bf16 inputs (quantization counted): ``jfa:mxfp8:B`` or ``jfa:mxfp8[variant]:B``, the
    rows issue 12's targets apply to (``-prequant`` rows are shown beside them)."""
    return peer.startswith("jfa:mxfp8:") or peer.startswith("jfa:mxfp8[")


def _our_bf16(peers: List[str]) -> List[str]:
    """Our bf16 attention rows among ``peers`` (``jfa:tlx``, ``jfa:triton``, ...: not MXFP8, not a variant row;
    the reference only where it is the only one, as ``ratio_backends``)."""
    return ratio_backends([p for p in peers if p.startswith("jfa:") and not p.startswith("jfa:mxfp8")
                           and " " not in p])


def _fastest(idx, name: str, mode: str, peers) -> tuple:
    """(peer, TFLOP/s) of the fastest of ``peers`` measured on (name, mode), or (None, None)."""
    rows = [(p, (idx.get((name, p, mode)) or {}).get("tflops")) for p in peers]
    rows = [(p, t) for p, t in rows if t]
    return max(rows, key=lambda pt: pt[1]) if rows else (None, None)


def _against(tflops: float, label: str, peer: Optional[str], base: Optional[float], target: Optional[float]):
    """("1.70x our bf16 (jfa:tlx 100.0; target 1.6x)", met: True/False, or None without a target or a base)."""
    if not base:
        return f"{label} not measured", None
    ratio = tflops / base
    want = "" if target is None else f"; target {target}x"
    return f"{ratio:.2f}x {label} ({peer} {_fmt(base)}{want})", None if target is None else ratio >= target


def mxfp8_lines(records: List[dict], unavailable: Optional[Dict[str, str]] = None, device: str = "") -> List[str]:
    """Issue 12's performance lines for the mxfp8 suite. Per case and mode, a PASS/FAIL line for the fastest MXFP8
    row that counts its quantization (``jfa:mxfp8:<backend>``) against the fastest of our bf16 rows in the run and
    FA4's bf16, with the targets of the case's kind (memory-bound: broadcast-Q, window; compute-bound: the rest);
    then every other MXFP8 row, pre-quantized row and FP8 peer row with its ratios (no verdict); then each quantize
    row's GB/s against the run's GPU's HBM bandwidth (``hbm_gbps(device)``; target 80% of the spec, the measured copy
    beside it); last, the FP8 peers that did not run and why (``unavailable``: the run's meta)."""
    hbm_spec, hbm_copy = hbm_gbps(device)
    idx = _index(records)
    out = []
    mx = [r for r in records if r["case"]["suite"] == "mxfp8"]
    measured = peer_columns([r for r in mx if not r.get("skip")])
    ours_bf16 = _our_bf16(measured)
    attention = [p for p in measured if (p.startswith("jfa:mxfp8") and not p.startswith("jfa:mxfp8-quantize"))
                 or p.startswith(FP8_PEER_PREFIXES)]
    for name in _case_names(mx):
        case = next(r["case"] for r in mx if r["case"]["name"] == name)
        kind = "memory" if case["broadcast_q"] or list(case["window"]) != [-1, -1] else "compute"
        for mode in MODES:
            base_peer, base = _fastest(idx, name, mode, ours_bf16)
            fa4 = (idx.get((name, YARDSTICK, mode)) or {}).get("tflops")
            want = MXFP8_TARGETS.get((kind, mode))
            graded = [p for p in attention if _counts_quantization(p)]
            best, best_tflops = _fastest(idx, name, mode, graded)
            for peer in sorted(attention, key=lambda p: p != best):
                tflops = (idx.get((name, peer, mode)) or {}).get("tflops")
                if not tflops:
                    continue
                verdict = peer == best and want is not None
                targets = want if verdict else (None, None)
                parts = [_against(tflops, "our bf16", base_peer, base, targets[0]),
                         _against(tflops, "FA4 bf16", YARDSTICK, fa4, targets[1])]
                text = f"{name} {mode} {peer}: {_fmt(tflops)} TFLOP/s, " + ", ".join(p[0] for p in parts)
                if verdict:
                    met = [m for (_, m), t in zip(parts, targets) if t is not None]
                    ok = False if False in met else (None if None in met else True)  # a miss fails; a gap is n/a
                    out.append(f"{_verdict(ok)} {kind}-bound {text}")
                else:
                    out.append(f"  {text}")
        for peer in [p for p in measured if p.startswith("jfa:mxfp8-quantize")]:
            q = idx.get((name, peer, "fwd")) or {}
            if q.get("gbps"):
                share, gbps = q["gbps"] / hbm_spec, _gbps(q["gbps"])
                out.append(f"{_verdict(share >= QUANTIZE_TARGET)} {name} quantize {peer}: {gbps} GB/s = "
                           f"{share:.0%} of the {hbm_spec:.0f} GB/s HBM (target {QUANTIZE_TARGET:.0%}); "
                           f"{q['gbps'] / hbm_copy:.0%} of the measured {hbm_copy:.0f} GB/s copy"
                           + (f"; eager calls {_gbps(q['eager_gbps'])} GB/s" if q.get("eager_gbps") else ""))
    if mx:
        fp8_seen = {r["peer"] for r in mx if r["peer"].startswith(FP8_PEER_PREFIXES)}
        missing = {n: why for n, why in (unavailable or {}).items() if n.startswith(FP8_PEER_PREFIXES)}
        out += [f"FP8 peer {n}: not measured ({why})" for n, why in missing.items()]
        if not fp8_seen and not missing:
            out.append("no FP8 peer in this run (add --peers ...,fa4_fp8,flex_fp8,sdpa_fp8)")
    return out


# issue 11's targets: keep_ratio -> (min speedup over our dense kernel, fwd, bwd), selection included
SPARSE_DENSE_TARGETS = {0.5: (1.7, 1.6), 0.25: (3.0, 3.0)}
SPARSE_FLEX_TARGET = 1.3  # over FlexAttention given the same BlockMask
FA4_PADDED = "fa4 padded"  # FA4's padded-batch block-sparse row (its only block-sparse backward)
# (peer, our speedup over it wanted): Flex given the same BlockMask, FA4's block-sparse path given the same selection
# ("ahead of", read as >= 1.0x: equal times are within noise)
SPARSE_PEER_TARGETS = ((FLEX, SPARSE_FLEX_TARGET), (YARDSTICK, 1.0), (FA4_PADDED, 1.0))
SELECT_SHARE_TARGET = 0.10  # selection's share of the sparse forward's time (selection included)


def _same_batch(case: dict) -> tuple:
    """The sparse cases that run our dense kernel on the same batch (every field but those that follow the keep
    ratio: the ratio, the label, the pairs and the kept blocks)."""
    keep = f"keep{case.get('keep_ratio')}"
    return tuple(sorted((k, " ".join(t for t in v.split() if t != keep) if k == "name" else str(v))
                        for k, v in case.items() if k not in ("label", "keep_ratio", "visible_pairs", "kv_blocks")))


def _dense_means(sparse: List[dict]) -> Dict[tuple, List[float]]:
    """(batch, dense row, mode) -> its times over the cases of that batch: each keep ratio's case times the same
    dense call, whose two timings in one run differ by 0-6% on the H100 (bench/NOTES.md "Stop 57")."""
    times: Dict[tuple, List[float]] = {}
    for r in sparse:
        if r["peer"].endswith(" dense") and r.get("ms"):
            times.setdefault((_same_batch(r["case"]), r["peer"], r["mode"]), []).append(r["ms"])
    return times


def clock_line(records) -> str:
    """One line on the SM clock the rows were timed at (``timing.GpuClocks``' fields), "" when none was read: the
    lowest and highest row median, the lowest sample, and any throttle reason seen."""
    timed = [r for r in records if r.get("sm_mhz")]
    if not timed:
        return ""
    lo = min(timed, key=lambda r: r["sm_mhz"])
    hi = max(timed, key=lambda r: r["sm_mhz"])
    reasons = sorted({t for r in timed for t in r.get("throttle", ())})
    return (f"SM clock over {len(timed)} timed rows: row medians {lo['sm_mhz']:.0f}-{hi['sm_mhz']:.0f} MHz (lowest: "
            f"{lo['peer']} {lo['mode']} on {lo['case']}), lowest sample {min(r['sm_mhz_min'] for r in timed)} MHz; "
            f"throttle reasons seen: {', '.join(reasons) or 'none'}")


def _block_ratio_part(dense_ms, ours, select_ms, mode, name, sparse) -> str:
    """The sparse row's block ratio (the dense kernel's visible block pairs over the kept ones: the speedup at the
    dense kernel's cost per block, ``Case.kv_blocks``) and the kernel's share of it: forward, the kernel alone (the
    selection's time taken out); backward, the row as timed (it reuses the forward's selection). "" for runs
    recorded before the counts were."""
    blocks = next((r["case"].get("kv_blocks") for r in sparse if r["case"]["name"] == name), None)
    if not blocks or not blocks[1] or mode == "fwdbwd" or (mode == "fwd" and not select_ms):
        return ""
    ratio = blocks[0] / blocks[1]
    kernel_ms = ours - select_ms if mode == "fwd" else ours
    alone = " alone" if mode == "fwd" else ""
    return (f"blocks {ratio:.2f}x fewer, kernel{alone} {dense_ms / kernel_ms:.2f}x = {dense_ms / kernel_ms / ratio:.0%} "
            f"of that")


def sparse_lines(records: List[dict]) -> List[str]:
    """Per sparse-suite case and mode, for each jfa backend with a sparse row: its time (forward: selection
    included), the speedup over our dense kernel on the same batch (``<backend> dense`` row) and over Flex given the
    same BlockMask and FA4's block-sparse rows given the same selection (``fa4``: varlen, forward; ``fa4 padded``),
    with issue 11's targets, and the selection's share (``<backend> select`` row over the forward;
    over fwd+bwd too when timed). From the times, not the TFLOP/s: the rows count different work. Our dense time is
    the mean over the cases of the same batch (the keep ratios' cases time the same dense call), said when it pools
    more than one."""
    idx = _index(records)
    out = []
    sparse = [r for r in records if r["case"]["suite"] == "sparse"]
    dense_means = _dense_means(sparse)
    backends = [p for p in peer_columns(sparse) if p.startswith("jfa:") and " " not in p]
    for name in _case_names(sparse):
        keep = next(r["case"].get("keep_ratio") for r in sparse if r["case"]["name"] == name)
        for b in backends:
            select = idx.get((name, f"{b} select", "fwd")) or {}
            select_ms = select.get("ms")
            # the row's timer: a graph replay (the GPU's time) since stop 28; its eager call's time beside it
            select_how = f" GPU (eager call {select['eager_ms']:.3f} ms)" if select.get("eager_ms") else ""
            for mode in MODES:
                ours = (idx.get((name, b, mode)) or {}).get("ms")
                if not ours:
                    continue
                parts = [f"{ours:.3f} ms"]
                dense = idx.get((name, f"{b} dense", mode)) or {}
                pooled = dense_means.get((_same_batch(dense["case"]), f"{b} dense", mode)) if dense.get("ms") else None
                dense_ms = sum(pooled) / len(pooled) if pooled else None
                want = SPARSE_DENSE_TARGETS.get(keep, (None, None))[0 if mode == "fwd" else 1]
                if dense_ms:
                    verdict = "" if mode == "fwdbwd" or want is None else \
                        f" (target {want}x: {_verdict(dense_ms / ours >= want)})"
                    mean = f" (mean of {len(pooled)} rows)" if len(pooled) > 1 else ""
                    parts.append(f"{dense_ms / ours:.2f}x our dense {dense_ms:.3f} ms{mean}{verdict}")
                    blocks = _block_ratio_part(dense_ms, ours, select_ms, mode, name, sparse)
                    if blocks:
                        parts.append(blocks)
                for peer, target in SPARSE_PEER_TARGETS:
                    peer_ms = (idx.get((name, peer, mode)) or {}).get("ms")
                    if peer_ms:
                        verdict = "" if mode == "fwdbwd" else \
                            f" (target {target}x: {_verdict(peer_ms / ours >= target)})"
                        parts.append(f"{peer_ms / ours:.2f}x {peer} {peer_ms:.3f} ms{verdict}")
                if select_ms and mode != "bwd":  # the backward reuses the forward's selection
                    share = select_ms / ours
                    verdict = f" (target < {SELECT_SHARE_TARGET:.0%}: {_verdict(share < SELECT_SHARE_TARGET)})" \
                        if mode == "fwd" else ""
                    parts.append(f"selection {select_ms:.3f} ms{select_how} = {share:.0%}{verdict}")
                out.append(f"{name} {mode} {b}: " + ", ".join(parts))
    return out


def check_lines(records: List[dict]) -> List[str]:
    out = []
    for r in records:
        if r.get("rel_err") is not None:
            verdict = "ok" if r["rel_err"] <= r.get("tolerance", CHECK_TOLERANCE) else "WRONG"
            out.append(f"{r['peer']} on {r['case']['name']}: rel err {r['rel_err']:.2e} {verdict}")
    return out


def summary_lines(records: List[dict]) -> List[str]:
    """Per suite and mode: each jfa backend's geometric-mean speed ratio against FA4 and Flex over shared cases."""
    out = []
    for suite, recs in by_suite(records).items():
        idx = _index(recs)
        peers = peer_columns([r for r in recs if not r.get("skip")])
        for b in ratio_backends(peers):
            for mode in _modes(recs):
                parts = []
                for y in (YARDSTICK, FLEX):
                    ratios = []
                    for name in _case_names(recs):
                        rb, ry = idx.get((name, b, mode)), idx.get((name, y, mode))
                        if rb and ry and rb.get("tflops") and ry.get("tflops"):
                            ratios.append(rb["tflops"] / ry["tflops"])
                    if ratios:
                        gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
                        parts.append(f"{gm:.2f}x {y} ({len(ratios)} cases)")
                if parts:
                    out.append(f"{suite:9s} {mode:6s} {b}: " + ", ".join(parts))
    return out


def by_suite(records: List[dict]) -> Dict[str, List[dict]]:
    suites: Dict[str, List[dict]] = {}
    for r in records:
        suites.setdefault(r["case"]["suite"], []).append(r)
    return suites


def suite_section(suite: str, records: List[dict], with_skips: bool = True) -> str:
    parts = [f"## {suite}", ""]
    if suite == "overhead":
        parts += ["µs per call, eager unless said (wall: many calls, one sync; eager columns: the median of 3 such windows); GPU µs / ops: the kernels, copies and "
                  "memsets torch.profiler records per call; compiled: `torch.compile(dynamic=True)`, default mode: "
                  "compiled fwd is a graph of one call (torch's per-graph floor included, which a model pays once a "
                  f"step); per layer: (graph of {timing.LAYERS} chained calls - graph of 1) / {timing.LAYERS - 1}, "
                  "each call's output the next one's q, as a model's layers. Each implementation is timed on a frozen heap "
                  "(`gc.collect(); gc.freeze()` first: what else the run imported costs none of them a collection); "
                  "`host` in the header gives the host's speed (a fixed loop's µs) and load at the run's start and "
                  "end, to compare runs.",
                  "", overhead_table(records), ""]
        column_skips = overhead_column_skips(records)
        if column_skips:
            parts += ["Empty columns:", ""] + [f"- {c}" for c in column_skips] + [""]
    elif suite == "model":
        parts += ["4-layer pre-LN causal jagged transformer, AdamW, `torch.compile(dynamic=True)`; a fresh batch from "
                  "a fixed pool each step, timed after a warm-up that runs every batch of the pool once "
                  "(bench/model.py; the warm-up column: a batch's first step, dearer for whichever implementation "
                  "meets a shape first in the process). Timed interleaved: each round one step of every "
                  "implementation on the same batch, in an order rotating from round to round; the last column "
                  "pairs our step with the peer's of the same round (host drift between rounds cancels).", "",
                  model_table(records), ""]
    else:
        parts += ["TFLOP/s of useful work (visible pairs only; padding and masked-out work count as zero).", "",
                  tflops_table(records), ""]
        mem = memory_table(records)
        if mem:
            parts += ["Peak memory above the inputs, MiB (one call).", "", mem, ""]
    notes = note_lines(records)
    if notes:
        parts += ["Notes:", ""] + [f"- {n}" for n in notes] + [""]
    skips = skip_lines(records) if with_skips else []
    if skips:
        parts += ["Skipped:", ""] + [f"- {s}" for s in skips] + [""]
    return "\n".join(parts)


def markdown(meta: dict, records: List[dict]) -> str:
    unavailable = meta.get("unavailable") or {}
    head = [f"# jfa_ops bench {meta['date']}", "",
            "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in meta.items()
                                  if k not in ("argv", "unavailable", "issue11", "issue12")] + [
            f"| not measured | {'; '.join(f'{n}: {r}' for n, r in unavailable.items()) or '-'} |",
            f"| command | `{' '.join(meta.get('argv', []))}` |", ""]
    body = [suite_section(s, rs) for s, rs in by_suite(records).items()]
    targets = target_lines(records)
    if targets:
        body.append("## Issue 9 targets\n\n" + "\n".join(f"- {t}" for t in targets) + "\n")
    sparse = sparse_lines(records)
    if sparse:
        body.append("## Issue 11 (block-sparse)\n\n" + "\n".join(f"- {t}" for t in sparse) + "\n")
    mxfp8 = mxfp8_lines(records, meta.get("unavailable"), meta.get("device", ""))
    if mxfp8:
        body.append("## Issue 12 (MXFP8)\n\n" + "\n".join(f"- {t.strip()}" for t in mxfp8) + "\n")
    checks = check_lines(records)
    if checks:
        body.append("## Output checks (forward vs the bench's float32 oracle)\n\n" + "\n".join(f"- {c}" for c in checks)
                    + "\n")
    return "\n".join(head + body)


def write_json(path: str, meta: dict, records: List[dict]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"meta": meta, "records": records}, f, indent=1, default=str)
    os.replace(tmp, path)


def plot_suite(path: str, suite: str, records: List[dict]) -> Optional[str]:
    """Grouped bars, one panel per mode (overhead: wall vs device time per peer). Returns None or why not drawn."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return f"no matplotlib ({e})"
    import numpy as np
    ok = [r for r in records if not r.get("skip")]
    if not ok:
        return "nothing measured"
    peers = peer_columns(ok)
    if suite == "overhead":
        rows = [r for r in ok if r.get("fwd_wall_us") is not None]
        x = np.arange(len(rows))
        fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4))
        bars = [("fwd_wall_us", "eager fwd"), ("compiled_wall_us", "compiled fwd"), ("fwd_kernel_us", "GPU fwd"),
                ("graph_us", "CUDA graph fwd")]
        for i, (key, label) in enumerate(bars):
            ax.bar(x + (i - 1.5) * 0.2, [r.get(key) or 0 for r in rows], 0.2, label=label)
        ax.set_xticks(x, [r["peer"] for r in rows], fontsize=7)
        ax.set_ylabel("µs per call")
        ax.legend(fontsize=7)
        ax.set_title(f"{suite}: {rows[0]['case']['name'] if rows else ''}")
    elif suite == "model":
        names = _case_names(ok)
        fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
        for ax, name in zip(axes[0], names):
            rows = [r for r in ok if r["case"]["name"] == name]
            ax.bar(np.arange(len(rows)), [r["step_ms"] for r in rows])
            ax.set_xticks(np.arange(len(rows)), [r["peer"] for r in rows], fontsize=7)
            ax.set_ylabel("ms per training step")
            ax.set_title(name, fontsize=9)
    else:
        modes = _modes(ok)
        names = _case_names(ok)
        idx = _index(ok)
        width_in = min(26.0, max(8.0, 0.22 * len(names) * max(1, len(peers)) + 2))
        fig, axes = plt.subplots(len(modes), 1, figsize=(width_in, 3.6 * len(modes)), squeeze=False)
        width = 0.8 / max(1, len(peers))
        x = np.arange(len(names))
        for ax, mode in zip(axes[:, 0], modes):
            for i, p in enumerate(peers):
                vals = [(idx.get((n, p, mode)) or {}).get("tflops") or 0 for n in names]
                ax.bar(x + (i - (len(peers) - 1) / 2) * width, vals, width, label=p)
            ax.set_xticks(x, [n.split(" ", 1)[1] for n in names], rotation=30, ha="right", fontsize=7)
            ax.set_ylabel(f"{mode} TFLOP/s")
            ax.grid(axis="y", alpha=0.3)
        axes[0, 0].legend(fontsize=7, ncol=min(len(peers), 6))
        axes[0, 0].set_title(f"{suite}: useful TFLOP/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def short_summary(records: List[dict], unavailable: Optional[Dict[str, str]] = None, device: str = "") -> str:
    """A few lines per suite for a device call's output: overhead and model rows, TFLOP/s summaries, the targets
    (``unavailable``: the run's meta, for issue 12's FP8 peers that did not run)."""
    out = []
    ovh = [r for r in records if r["case"]["suite"] == "overhead" and not r.get("skip")]
    if ovh:
        keys = ("fwd_wall_us", "fwdbwd_wall_us", "nograd_wall_us", "compiled_wall_us", "layer_fwd_us",
                "layer_fwdbwd_us", "fwd_kernel_us", "fwd_launches", "graph_us")
        out.append("overhead µs/call: eager fwd | fwd+bwd | no_grad fwd | compiled fwd | compiled per layer fwd | "
                   "fwd+bwd | GPU fwd | GPU ops | graph")
        out += [f"  {r['peer']:14s} " + " | ".join(_fmt(r.get(k)) for k in keys) for r in ovh]
    mdl = [r for r in records if r["case"]["suite"] == "model" and not r.get("skip")]
    if mdl:
        out.append("model: step ms | tokens/s | warm-up step ms | compiles warm-up/timed | graph breaks | "
                   "step / peer's in the same round: median (IQR)")
        out += [f"  {r['case']['label'][:22]:22s} {r['peer']:14s} {_fmt(r['step_ms'])} | {r['tokens_per_s']:.3g} | "
                f"{_fmt(r.get('warmup_step_ms'))} | {r['compiles_warmup']}/{r['compiles_timed']} | {r['graph_breaks']}"
                f" | {paired_cell(r)}" for r in mdl]
    rows = [r for r in records if r.get("tflops") and r["case"]["suite"] in ("dense", "broadcast")]
    if rows:
        out.append("TFLOP/s (fwd, bwd):")
        idx = _index(rows)
        for name in _case_names(rows):
            cells = []
            for p in peer_columns([r for r in rows if r["case"]["name"] == name]):
                vals = [(idx.get((name, p, m)) or {}).get("tflops") for m in ("fwd", "bwd")]
                cells.append(f"{p} {'/'.join(_fmt(v) for v in vals)}")
            out.append(f"  {name}: " + ", ".join(cells))
    out += summary_lines(records)
    targets = target_lines(records)
    if targets:
        out += ["issue 9 targets:"] + [f"  {t}" for t in targets]
    sparse = sparse_lines(records)
    if sparse:
        out += ["issue 11 (block-sparse):"] + [f"  {t}" for t in sparse]
    mxfp8 = mxfp8_lines(records, unavailable, device)
    if mxfp8:
        out += ["issue 12 (MXFP8):"] + [f"  {t}" for t in mxfp8]
    skips = skip_lines(records)
    if skips:
        out += ["skipped:"] + [f"  {s}" for s in skips]
    return "\n".join(out)


def upgrade_records(records: List[dict]) -> List[dict]:
    """Overhead records from before the per-call columns (one per mode, session 5) merged into today's one per peer:
    their fwd was timed under no_grad, so it becomes ``nograd_wall_us``; fwdbwd becomes ``fwdbwd_wall_us``."""
    out, merged = [], {}
    for r in records:
        if r["case"]["suite"] != "overhead" or "wall_us" not in r or r.get("skip"):
            out.append(r)
            continue
        key = (r["case"]["name"], r["peer"])
        if key not in merged:
            merged[key] = {"case": r["case"], "peer": r["peer"], "mode": "calls", "note": r.get("note", "")}
            out.append(merged[key])
        if r["mode"] == "fwd":
            merged[key].update(nograd_wall_us=r["wall_us"], fwd_kernel_us=r.get("kernel_us"),
                               graph_us=r.get("graph_us"), rel_err=r.get("rel_err"))
        elif r["mode"] == "fwdbwd":
            merged[key].update(fwdbwd_wall_us=r["wall_us"], fwdbwd_kernel_us=r.get("kernel_us"))
    return out


if __name__ == "__main__":  # python -m bench.report RESULTS.json: the short summary of a (possibly cut-short) run
    import sys
    for path in sys.argv[1:]:
        with open(path) as f:
            data = json.load(f)
        print(f"== {path}\n" + short_summary(upgrade_records(data["records"]), data["meta"].get("unavailable"),
                                                  data["meta"].get("device", "")))
