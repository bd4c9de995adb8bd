"""Results: one record per (case, peer, mode); the TFLOP/s tables, JSON, Markdown and one PNG per suite."""
from __future__ import annotations

import json
import math
import os
from typing import Dict, List, Optional

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


def _cell(r: Optional[dict]) -> str:
    if r is None or r.get("skip"):
        return "—"
    mark = ""
    if r.get("rel_err") is not None and not r["rel_err"] <= CHECK_TOLERANCE:
        mark = " (WRONG)"
    return _fmt(r.get("tflops")) + mark


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


def overhead_table(records: List[dict]) -> str:
    head = ["case", "peer", "mode", "eager wall µs/call", "device µs/call", "host overhead µs",
            "CUDA graph µs/call"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = {p: i for i, p in enumerate(peer_columns(records))}
    for r in sorted(records, key=lambda r: (r["case"]["name"], order.get(r["peer"], 99), r["mode"])):
        if r.get("skip"):
            continue
        lines.append("| " + " | ".join([r["case"]["name"], r["peer"], r["mode"], _fmt(r.get("wall_us")),
                                        _fmt(r.get("kernel_us")), _fmt(r.get("overhead_us")),
                                        _fmt(r.get("graph_us"))]) + " |")
    return "\n".join(lines)


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


def check_lines(records: List[dict]) -> List[str]:
    out = []
    for r in records:
        if r["mode"] == "fwd" and r.get("rel_err") is not None:
            verdict = "ok" if r["rel_err"] <= CHECK_TOLERANCE else "WRONG"
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
        parts += [overhead_table(records), ""]
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
            "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in meta.items() if k not in ("argv", "unavailable")] + [
            f"| not measured | {'; '.join(f'{n}: {r}' for n, r in unavailable.items()) or '-'} |",
            f"| command | `{' '.join(meta.get('argv', []))}` |", ""]
    body = [suite_section(s, rs) for s, rs in by_suite(records).items()]
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
        rows = [r for r in ok if r.get("wall_us") is not None]
        labels = [f"{r['peer']}\n{r['mode']}" for r in rows]
        x = np.arange(len(rows))
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 4))
        ax.bar(x - 0.2, [r["wall_us"] for r in rows], 0.4, label="eager wall")
        ax.bar(x + 0.2, [r.get("kernel_us") or 0 for r in rows], 0.4, label="device")
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel("µs per call")
        ax.legend()
        ax.set_title(f"{suite}: {rows[0]['case']['name'] if rows else ''}")
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
