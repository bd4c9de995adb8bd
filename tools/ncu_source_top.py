"""The SASS lines an Nsight Compute report's warps stalled at most, by one stall reason (default: long scoreboard),
from the report's source page as CSV (issue 10: which loads the TLX backward's long-scoreboard stalls wait for;
bench/NOTES.md "helper lsedelta40"):

    ncu --import REPORT.ncu-rep --page source --csv --print-source sass > SRC.csv
    python3 tools/ncu_source_top.py SRC.csv [--reason long] [--top 30]

(``NCU_MODE=source bash tools/ncu_attention.sh`` makes both and runs this.) The sampled warp stalls are charged to
the instruction that waits (the first user of a load's scoreboard, e.g. the FMUL of lse; for an mbarrier wait the
``@!P0 BRA`` after ``SYNCS.PHASECHK...TRYWAIT``), not to the load. Prints the top lines (address, samples, share,
the warp role, the SASS) and the samples summed by what the line waits on: an mbarrier (SYNCS try-wait and its
branch), a wgmma (WARPGROUP.DEPBAR), a named barrier (BAR), else its opcode. Roles come from the SASS order alone:
each USETMAXREG starts a region (TLX's warp tasks: the producer deallocates to its few registers, each consumer
replica allocates up), so "producer" / "consumer N" / "setup" are a heuristic of that layout.

The column names differ between ncu versions: the address column is the first whose name contains "Address", the
SASS the first named "Source", and the reason's column the first whose name matches ``--reason`` among the stall
sampling columns (``long``: "stall_long_sb", "Long Scoreboard", "...long_scoreboard..."); without one, the all-samples
column ("Warp Stall Sampling (All Samples)").
"""
from __future__ import annotations

import argparse
import csv
import re
import sys

REASONS = {"long": r"long.?(sb|scoreboard)", "barrier": r"(stall_)?barrier", "short": r"short.?(sb|scoreboard)",
           "wait": r"stall_wait|\bwait\b", "mio": r"mio", "gmma": r"gmma", "all": r"all samples"}


def _number(text: str) -> float:
    try:
        return float(text.replace(",", "").strip() or 0)
    except ValueError:
        return 0.0


def read_rows(path: str) -> tuple:
    """(header, rows) of the source page's table: the first row naming an address and a source column starts it."""
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    for k, row in enumerate(lines):
        names = [c.strip().lstrip("#").strip() for c in row]
        if any("Address" in n for n in names) and any(n == "Source" for n in names):
            return names, [r for r in lines[k + 1:] if len(r) == len(row)]
    raise ValueError(f"{path}: no header with an Address and a Source column")


def stall_column(header: list, reason: str) -> int:
    """The column of ``reason``'s samples (``REASONS`` key or a regex), else the all-samples column."""
    pattern = re.compile(REASONS.get(reason, reason), re.IGNORECASE)
    sampling = [i for i, n in enumerate(header) if re.search(r"stall|sampl|scoreboard", n, re.IGNORECASE)]
    for i in sampling:  # all samples first: a "not issued" twin column counts only part of them
        if pattern.search(header[i]) and not re.search(r"not.?issued", header[i], re.IGNORECASE):
            return i
    for i in sampling:
        if re.search(r"all samples", header[i], re.IGNORECASE):
            return i
    raise ValueError(f"no stall sampling column for {reason!r} in {header}")


def opcode(sass: str) -> str:
    m = re.match(r"\s*(?:@!?U?P\w+\s+)?(\S+)", sass)
    return m.group(1) if m else ""


def roles(sources: list) -> list:
    """Per line, its warp role from the USETMAXREG regions (see the module's docstring)."""
    out, role, consumers = [], "setup", 0
    for sass in sources:
        op = opcode(sass)
        if op.startswith("USETMAXREG"):
            count = int((re.findall(r"0x[0-9a-f]+|\d+", sass.split(",")[-1]) or ["0"])[-1], 0)
            if "DEALLOC" in op and count <= 64:
                role = "producer"
            elif "ALLOC" in op and "DEALLOC" not in op and 128 < count < 256:
                role = f"consumer {consumers}"
                consumers += 1
        out.append(role)
    return out


def waits_on(sources: list, k: int) -> str:
    """What line k waits on, as far as its text and the line before tell."""
    op = opcode(sources[k])
    before = opcode(sources[k - 1]) if k else ""
    if op.startswith("SYNCS.PHASECHK") or (op.startswith("BRA") and before.startswith("SYNCS.PHASECHK")):
        return "mbarrier (SYNCS try-wait)"
    if op.startswith("WARPGROUP.DEPBAR"):
        return "wgmma wait"
    if op.startswith("BAR"):
        return "named barrier"
    return op.split(".")[0]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--reason", default="long", help=f"{', '.join(REASONS)} or a regex over the column names")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args(argv)
    header, rows = read_rows(args.csv)
    address = next(i for i, n in enumerate(header) if "Address" in n)
    source = header.index("Source")
    column = stall_column(header, args.reason)
    sources = [r[source] for r in rows]
    samples = [_number(r[column]) for r in rows]
    role = roles(sources)
    total = sum(samples) or 1.0
    print(f"{args.csv}: {len(rows)} SASS lines, column {header[column]!r}: {total:.0f} samples")
    order = sorted(range(len(rows)), key=lambda k: -samples[k])[:args.top]
    print(f"{'address':>10s} {'samples':>9s} {'share':>6s}  {'role':11s} sass")
    for k in order:
        if samples[k] <= 0:
            break
        print(f"{rows[k][address]:>10s} {samples[k]:9.0f} {100 * samples[k] / total:5.1f}%  {role[k]:11s} "
              f"{sources[k].strip()[:90]}")
    by = {}
    for k, s in enumerate(samples):
        key = (role[k], waits_on(sources, k))
        by[key] = by.get(key, 0.0) + s
    print("by warp role and what the line waits on:")
    for (r, w), s in sorted(by.items(), key=lambda kv: -kv[1]):
        if s > 0:
            print(f"  {r:11s} {w:28s} {s:9.0f} {100 * s / total:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
