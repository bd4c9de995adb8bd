"""Where a TLX kernel's global, local and generic loads (LDG, LDL, LD) are waited for, from its sm_90 SASS (issue 10:
the backward's long-scoreboard stalls, bench/NOTES.md "helper lsedelta40"). Compiles the bench's dense kernels without
a GPU (as tools/sass_mix.py), disassembles them with their control bits (``nvdisasm -hex``) and inline line info
(``-gi``), and prints, per load: its warp role (producer / consumer N, from the USETMAXREG regions and the task's
source lines), whether it sits in a consumer block loop, what it reads (the innermost source function: lse/delta,
the work list, a spill reload), the scoreboard it sets and the first instruction that waits on that scoreboard
along the straight path (the masked branch skipped, as ``specializations.innermost_loops``; the loop's back edge
taken, so a load issued a block ahead is seen waited for in the next block), with the instructions, wgmma waits
(WARPGROUP.DEPBAR), named barriers and mbarrier waits (SYNCS) between.

    TRITON_INTERPRET=0 PYTHONPATH=/work/main/.ci-tlx:. python -c "import _utlx_autoregister, runpy; \
        runpy.run_path('tools/sass_loads.py', run_name='__main__')" [bwd bwd-causal bwd-d64 bwd-d64-causal fwd] \
        [--cubin FILE] [--all]

The control bits (Volta and later, the high word's bits 41-63): stall 4, yield 1, write scoreboard 3 (7: none), read
scoreboard 3, wait mask 6, reuse 4. A variable-latency instruction (a load, S2R, SYNCS, LDS) releases its write
scoreboard when its result lands; the first instruction with that bit in its wait mask (or a DEPBAR on it) is where
the warp stalls if it has not landed. ``--all``: every variable-latency instruction, not only the loads.
"""
from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
import tempfile
from typing import NamedTuple

LOAD = re.compile(r"^(LDG|LDL|LD)(\.|$)")  # global, local, generic: the long-scoreboard (L1TEX) loads
WGMMA_WAIT = re.compile(r"^WARPGROUP\.DEPBAR")
MAX_WALK = 20000  # instructions walked from a load before giving up


class Inst(NamedTuple):
    index: int
    addr: int
    pred: str
    op: str
    operands: str
    stall: int
    write_sb: int  # 7: none
    read_sb: int
    wait_mask: int
    where: tuple  # ((file path, line), ...) innermost first, the kernel's own line last


def control(hi: int) -> tuple:
    """(stall, write scoreboard, read scoreboard, wait mask) of an instruction's high encoding word."""
    c = hi >> 41
    return c & 0xF, (c >> 5) & 7, (c >> 8) & 7, (c >> 11) & 0x3F


def parse(text: str) -> tuple:
    """(instructions, labels -> index) of ``nvdisasm -c -gi -hex`` output."""
    insts, labels, where, pending_where = [], {}, (), []
    lines = text.splitlines()
    k = 0
    while k < len(lines):
        line = lines[k]
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?', line)
        if m:
            pending_where.append((m.group(1), int(m.group(2))))
            k += 1
            continue
        if pending_where:
            where, pending_where = tuple(pending_where), []
        m = re.match(r"(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(insts)
            k += 1
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?(\S+)(.*?);\s*/\* 0x([0-9a-f]{16}) \*/", line)
        if m:
            hi = int(re.search(r"/\* 0x([0-9a-f]{16}) \*/", lines[k + 1]).group(1), 16)
            stall, wr, rd, wait = control(hi)
            insts.append(Inst(len(insts), int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3),
                              m.group(4).strip(), stall, wr, rd, wait, where))
            k += 2
            continue
        k += 1
    return insts, labels


def branch_target(inst: Inst, labels: dict):
    if not inst.op.startswith("BRA"):
        return None
    m = re.search(r"`\((\.L_x_\d+)\)", inst.operands)
    return labels.get(m.group(1)) if m else None


def loops_of(insts: list, labels: dict) -> list:
    """Innermost loops holding wgmma, as ``specializations.innermost_loops`` (first, last)."""
    last_exit = max((i.index for i in insts if i.op == "EXIT"), default=len(insts))
    loops = [(branch_target(i, labels), i.index) for i in insts[:last_exit]
             if branch_target(i, labels) is not None and branch_target(i, labels) <= i.index]
    loops = [(a, b) for a, b in loops if any(x.op.startswith("HGMMA") for x in insts[a:b])]
    return sorted((a, b) for a, b in loops if not any(a <= a2 and b2 <= b and (a2, b2) != (a, b) for a2, b2 in loops))


@functools.lru_cache(maxsize=None)
def _functions(path: str) -> list:
    """[(first line, last line, name)] of a source file's functions."""
    try:
        tree = ast.parse(open(path).read())
    except OSError:
        return []
    return [(n.lineno, n.end_lineno, n.name) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


def _same_file(path: str, source: str) -> bool:
    """Whether a line-info path names ``source`` (its last two path parts: tlx/ and triton/ both hold attn_bwd.py)."""
    return os.path.normpath(path).split(os.sep)[-2:] == os.path.normpath(source).split(os.sep)[-2:]


def function_at(where: tuple, roots: list) -> str:
    """The innermost function of an instruction's source position: the line-info path's file if it exists, else the
    file of that name and folder under ``roots`` (a cubin compiled elsewhere). Line numbers are the compile's: read a
    cubin against the source it was compiled from."""
    if not where:
        return "?"
    path, line = where[0]
    candidates = [path] + [os.path.join(root, os.path.basename(path)) for root in roots]
    for candidate in candidates:
        if os.path.exists(candidate) and _same_file(candidate, path):
            best = [f for f in _functions(candidate) if f[0] <= line <= f[1]]
            if best:
                return f"{min(best, key=lambda f: f[1] - f[0])[2]}:{line}"
    return f"{os.path.basename(path)}:{line}"


def task_lines(source: str, kernel: str) -> dict:
    """{role: (first, last line)} of the kernel's ``with tlx.async_task(...)`` blocks: "producer" (the default task),
    "consumer" (the replicated one)."""
    tree = ast.parse(open(source).read())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == kernel)
    out = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.With) and "async_task(" in ast.unparse(node.items[0].context_expr):
            role = "producer" if "default" in ast.unparse(node.items[0].context_expr) else "consumer"
            out[role] = (node.lineno, node.end_lineno)
    return out


def roles(insts: list, source: str, tasks: dict) -> list:
    """Per instruction: "producer", "consumer N" (N counts the consumers' USETMAXREG.TRY_ALLOC regions) or "other"."""
    allocs = [i.index for i in insts if i.op.startswith("USETMAXREG.TRY_ALLOC")]
    consumer_count = insts[allocs[-1]].operands.split(",")[-1].strip() if allocs else None
    starts = [a for a in allocs if insts[a].operands.split(",")[-1].strip() == consumer_count]
    out = []
    for i in insts:
        line = next((ln for f, ln in reversed(i.where) if _same_file(f, source)), None)
        role = "other"
        for name, (a, b) in tasks.items():
            if line is not None and a <= line <= b:
                role = name
        if role == "consumer":
            role = f"consumer {max(0, sum(s <= i.index for s in starts) - 1)}"
        out.append(role)
    return out


def first_wait(insts: list, labels: dict, loops: list, start: int, sb: int):
    """(index of the first instruction waiting on scoreboard ``sb`` after ``start``, the walked path) along the
    straight path: inside a wgmma loop a forward branch to a target in the loop is taken (the masked branch skipped)
    and the back edge is taken once; elsewhere conditional branches fall through; an unconditional branch is
    followed; EXIT ends the walk."""
    j, path, wrapped = start + 1, [], set()
    while j < len(insts) and len(path) < MAX_WALK:
        inst = insts[j]
        path.append(j)
        if inst.wait_mask >> sb & 1 or (inst.op.startswith("DEPBAR") and f"SB{sb}" in inst.operands):
            return j, path
        if inst.op == "EXIT" and not inst.pred:
            return None, path
        t = branch_target(inst, labels)
        if t is not None:
            loop = next(((a, b) for a, b in loops if a <= j <= b), None)
            if not inst.pred:
                j = t
                continue
            if loop and t <= j and loop[0] <= t and (j not in wrapped):  # the back edge: once
                wrapped.add(j)
                j = t
                continue
            if loop and j < t <= loop[1]:  # a forward branch inside the loop: the straight path skips its body
                j = t
                continue
        j += 1
    return None, path


def kind_of(inst: Inst, func: str) -> str:
    if inst.op.startswith("LDL"):
        return "spill reload"
    name = func.split(":")[0]
    return {"_row_stats": "lse/delta", "_tile_sequence": "work list", "_bwd_item": "work list",
            "_tile_count": "work list", "selected_tile_start": "selection id", "selected_walk": "selection",
            "_selected_rows": "selection"}.get(name, name)


def report(sass_hex: str, source: str, kernel: str, roots: list, all_var: bool = False) -> list:
    """One dict per load (``all_var``: per variable-latency instruction with a write scoreboard)."""
    insts, labels = parse(sass_hex)
    loops = loops_of(insts, labels)
    role = roles(insts, source, task_lines(source, kernel))
    rows = []
    for i in insts:
        if not (LOAD.match(i.op) or (all_var and i.write_sb != 7)):
            continue
        func = function_at(i.where, roots)
        loop = next((n for n, (a, b) in enumerate(loops) if a <= i.index <= b), None)
        if i.write_sb == 7:
            rows.append(dict(inst=i, role=role[i.index], loop=loop, func=func, kind=kind_of(i, func), wait=None))
            continue
        w, path = first_wait(insts, labels, loops, i.index, i.write_sb)
        between = [insts[p] for p in path[:-1]] if w is not None else []
        rows.append(dict(inst=i, role=role[i.index], loop=loop, func=func, kind=kind_of(i, func), wait=w,
                         wait_inst=insts[w] if w is not None else None,
                         wait_func=function_at(insts[w].where, roots) if w is not None else "",
                         gap=len(between), wgmma_waits=sum(bool(WGMMA_WAIT.match(x.op)) for x in between),
                         hgmma=sum(x.op.startswith("HGMMA") for x in between),
                         bars=sum(x.op.startswith("BAR") for x in between),
                         syncs=sum(x.op.startswith("SYNCS") for x in between),
                         wrapped=w is not None and w < i.index))
    return rows, loops, insts


def print_report(rows: list, loops: list, insts: list) -> None:
    print("loops (wgmma): " + ", ".join(f"#{n} [{insts[a].addr:#x}, {insts[b].addr:#x}] ({b + 1 - a} instr.)"
                                        for n, (a, b) in enumerate(loops)))
    print(f"{'addr':>7s} {'role':11s} {'loop':4s} {'op':14s} {'kind':14s} {'source':24s} {'sb':>2s} "
          f"{'waited at':>9s} {'gap':>5s} {'wg.dep':>6s} {'hgmma':>5s} {'bar':>3s} {'syncs':>5s}  waiting instruction")
    for r in rows:
        i = r["inst"]
        loop = "-" if r["loop"] is None else f"#{r['loop']}"
        head = (f"{i.addr:#7x} {r['role']:11s} {loop:4s} {(i.pred + ' ' if i.pred else '') + i.op:14s} "
                f"{r['kind'][:14]:14s} {r['func'][:24]:24s} {i.write_sb if i.write_sb != 7 else '-':>2}")
        if r.get("wait") is None:
            print(head + f" {'(none)':>9s}")
            continue
        w = r["wait_inst"]
        print(head + f" {w.addr:#9x} {r['gap']:5d} {r['wgmma_waits']:6d} {r['hgmma']:5d} {r['bars']:3d} "
                     f"{r['syncs']:5d}  {w.op} {w.operands[:40]}{' (next block)' if r['wrapped'] else ''}"
                     f" [{r['wait_func']}]")


def summary(rows: list) -> dict:
    """Counts per (role, in a block loop, kind)."""
    out = {}
    for r in rows:
        key = (r["role"], "loop" if r["loop"] is not None else "item", r["kind"])
        out[key] = out.get(key, 0) + 1
    return out


def disassemble(cubin: bytes) -> str:
    import triton.backends.nvidia as nvidia

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([os.path.join(os.path.dirname(nvidia.__file__), "bin", "nvdisasm"), "-c", "-gi", "-hex",
                               f.name], capture_output=True, text=True, check=True).stdout


def compile_cubin(which: str) -> tuple:
    """(cubin, specialization) of one of the bench's kernels as the configs set them."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from jfa_ops.backends.tlx import specializations as S
    from jfa_ops.backends.tlx.configs import backward_options

    if which == "fwd":
        spec = S.fwd_specialization(128, "bf16", False, uniform=True)
    else:
        head_dim = 64 if "d64" in which else 128
        o = backward_options(head_dim, 16)
        spec = S.bwd_specialization(head_dim, "bf16", "causal" in which, dq_shared=o["dq_shared"],
                                    stats_ahead=o["stats_ahead"], kv_early=o["kv_early"], peel=o["peel"],
                                    **_extra_options(o))
    kernel = getattr(importlib.import_module(spec.module), spec.kernel)
    compiled = triton.compile(ASTSource(fn=kernel, signature=spec.signature, constexprs=spec.constexprs,
                                        attrs=spec.attrs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
    return compiled.asm["cubin"], spec


def _extra_options(o: dict) -> dict:
    """bwd_specialization's keywords for backward_options' switches beyond those named above, where it takes them."""
    import inspect

    from jfa_ops.backends.tlx import specializations as S

    params = inspect.signature(S.bwd_specialization).parameters
    return {k: v for k, v in o.items() if k in params and k not in (
        "dq_shared", "stats_ahead", "kv_early", "peel", "head_group", "causal_order", "item_order",
        "ablate", "gqa_split")}


def main(argv) -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    roots = [os.path.join(root, "jfa_ops", "backends", "tlx"), os.path.join(root, "jfa_ops", "backends", "triton")]
    all_var = "--all" in argv
    argv = [a for a in argv if a != "--all"]
    cubin_file = None
    if "--cubin" in argv:
        k = argv.index("--cubin")
        cubin_file = argv[k + 1]
        del argv[k:k + 2]
    for which in argv or ["bwd"]:
        if cubin_file:
            cubin, name = open(cubin_file, "rb").read(), cubin_file
        else:
            cubin, spec = compile_cubin(which)
            name = spec.name
        kernel, source = (("attn_fwd_tlx_kernel", "attn_fwd.py") if which == "fwd"
                          else ("attn_bwd_tlx_kernel", "attn_bwd.py"))
        rows, loops, insts = report(disassemble(cubin), os.path.join(roots[0], source), kernel, roots, all_var)
        print(f"== {name}: {len(insts)} instructions")
        print_report(rows, loops, insts)
        for (role, where, kind), n in sorted(summary(rows).items()):
            print(f"   {role:11s} {where:4s} {kind:16s} {n:4d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
