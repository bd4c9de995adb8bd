"""Per-iteration SASS instruction mix of the TLX kernels the bench's dense D128 bf16 non-causal case runs on sm_90
(bench/NOTES.md "Issue 10 from the profile, helper ncu37"): compiles them without a GPU and prints, for every
innermost loop that issues wgmma or TMA (the producer's and each consumer warpgroup's block loop), its straight
path (what a forward branch inside the loop jumps over, the masked branch, left out) by instruction class and its
HGMMA shapes.

    TRITON_INTERPRET=0 PYTHONPATH=.ci-tlx:. python -c "import _utlx_autoregister, runpy; \
        runpy.run_path('tools/sass_mix.py', run_name='__main__')" [fwd|bwd ...] [--dump DIR]
"""
from __future__ import annotations

import collections
import importlib
import os
import re
import sys

CLASSES = [
    ("HGMMA", r"^HGMMA"), ("WARPGROUP arrive/depbar", r"^WARPGROUP"),
    ("FFMA", r"^FFMA"), ("FMUL", r"^FMUL"), ("FADD", r"^FADD"), ("FMNMX", r"^FMNMX"),
    ("FSETP/FSEL", r"^FSETP|^FSEL"), ("MUFU.EX2", r"^MUFU\.EX2"), ("MUFU other", r"^MUFU"),
    ("F2FP (bf16 pack)", r"^F2FP|^F2F"), ("PRMT", r"^PRMT"), ("SHFL", r"^SHFL"),
    ("STSM/STS", r"^STSM|^STS"), ("LDSM/LDS", r"^LDSM|^LDS"), ("SYNCS (mbarrier)", r"^SYNCS"),
    ("BAR (named)", r"^BAR"), ("UTMA (TMA)", r"^UTMA|^UBLK"), ("LDG/STG/RED", r"^LDG|^STG|^RED"),
    ("STL/LDL (spill)", r"^STL|^LDL"), ("MEMBAR/FENCE", r"^MEMBAR|^FENCE"),
    ("uniform datapath (U*, R2UR, S2R)", r"^U|^R2UR|^S2UR|^S2R|^CS2R|^VOTEU"),
    ("integer ALU", r"^IMAD|^IADD|^LEA|^LOP|^SHF|^IMNMX|^SEL|^MOV|^IABS|^VIADD|^VIMNMX|^SGXT|^BMSK"),
    ("predicates (ISETP/PLOP)", r"^ISETP|^PLOP|^P2R|^R2P"),
    ("control (BRA, ELECT, DEPBAR, ...)", r"."),
]


def classify(op: str) -> str:
    return next(name for name, pattern in CLASSES if re.match(pattern, op))


def loop_mix(sass: str) -> list:
    """[(first, last, path length, whole length, Counter of classes, Counter of HGMMA shapes)] per innermost loop with
    wgmma or TMA, in code order (as specializations.block_loop_counts finds loops)."""
    from jfa_ops.backends.tlx.specializations import innermost_loops
    insts, loops = innermost_loops(sass, ("HGMMA", "UTMA"))
    out = []
    for a, b, skipped in loops:
        path = [insts[j] for j in range(a, b + 1) if j not in skipped]
        shapes = collections.Counter(
            re.match(r"HGMMA\.(\d+x\d+x\d+)", op).group(1) + (" A=reg" if re.match(r"\s*R\d+, R\d+", rest) else " A=smem")
            for op, rest in path if op.startswith("HGMMA"))
        out.append((a, b, len(path), b + 1 - a, collections.Counter(classify(op) for op, _ in path), shapes))
    return out


def main(argv) -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from jfa_ops.backends.tlx import specializations as S
    from jfa_ops.backends.tlx.configs import backward_options

    dump = None
    if "--dump" in argv:
        i = argv.index("--dump")
        dump = argv[i + 1]
        del argv[i:i + 2]
    o = backward_options(128, 16)
    specs = {"fwd": lambda: S.fwd_specialization(128, "bf16", False, uniform=True),
             "bwd": lambda: S.bwd_specialization(128, "bf16", False, dq_shared=o["dq_shared"],
                                                 stats_ahead=o["stats_ahead"], kv_early=o["kv_early"],
                                                 peel=o["peel"])}
    for which in argv or list(specs):
        spec = specs[which]()
        kernel = getattr(importlib.import_module(spec.module), spec.kernel)
        compiled = triton.compile(ASTSource(fn=kernel, signature=spec.signature, constexprs=spec.constexprs,
                                            attrs=spec.attrs), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
        sass = S.sass_of(compiled.asm["cubin"])
        if dump:
            os.makedirs(dump, exist_ok=True)
            with open(os.path.join(dump, f"{which}.sass"), "w") as f:
                f.write(sass)
        print(f"== {spec.name}: {len(sass.splitlines())} SASS lines, shared {compiled.metadata.shared} B")
        for a, b, n, whole, mix, shapes in loop_mix(sass):
            print(f"loop [{a}, {b}]: path {n} (whole {whole}); HGMMA {dict(shapes)}")
            for name, count in mix.most_common():
                print(f"    {count:5d} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
