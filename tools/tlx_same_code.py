"""Prove that a change to the TLX backend's kernels generates the same code: compile every TLX specialization of a
checkout for sm_90a without a GPU (line info off, so that moved source lines do not count), one PTX file each, and
compare two such dumps.

    PYTHONPATH=.ci-tlx python tools/tlx_same_code.py dump --root /tmp/base --out /tmp/ptx-base --jobs 2 [--ablations]
    PYTHONPATH=.ci-tlx python tools/tlx_same_code.py dump --root . --out /tmp/ptx-new --jobs 2 [--ablations]
    python tools/tlx_same_code.py compare /tmp/ptx-base /tmp/ptx-new
    PYTHONPATH=.ci-tlx python tools/tlx_same_code.py collect --root . [--ablations]   # the names, one a line

``--root``: the checkout whose ``jfa_ops`` is compiled (e.g. ``git worktree add /tmp/base <commit>``), put first on
the path. The specializations are that checkout's own (``specializations.shipped_specializations``; with
``--ablations`` also every off-by-default set: the MXFP8 forward's, the backward's and the block-sparse forward's
ablations, the MXFP8 backward's kernels, the sparse PEEL's and STORE_TMA off's). ``dump``
skips names whose PTX is already in ``--out`` (so a stopped dump resumes), skips ptxas (the cubin stage: PTX comes
before it) unless ``--cubin``, and writes ``errors.json`` for compiles that failed. ``compare`` exits 1 unless both
dumps hold the same names with byte-identical PTX. Needs triton 3.8 + triton-utlx importable (``pip install
--target .ci-tlx triton==3.8.0 triton-utlx==3.8.0.post16``); the plugin is registered before triton is imported.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def _setup(root: str) -> None:
    """The plugin first (a ``pip --target`` install skips its .pth file), line info off, ``root`` first on the path."""
    try:
        import _utlx_autoregister  # noqa: F401
    except ImportError:
        pass
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    sys.path.insert(0, os.path.abspath(root))


def _specs(ablations: bool) -> list:
    """The shipped specializations; with ``ablations`` also the ablations and the MXFP8 backward's kernels (not
    shipped: ``specializations.main`` compiles them on request)."""
    from jfa_ops.backends.tlx import specializations as s

    specs = list(s.shipped_specializations())
    if ablations:  # every off-by-default set specializations.py lists (getattr: a base checkout may predate one)
        for name in ("mxfp8_ablation_specializations", "backward_ablation_specializations",
                     "mxfp8_backward_specializations", "sparse_ablation_specializations",
                     "sparse_peel_specializations", "store_tma_off_specializations",
                     "sparse_first_unmasked_specializations"):
            specs += list(getattr(s, name, lambda: [])())
    return specs


def _compile(args) -> tuple:
    """Worker: compile one specialization in a fresh cache; (name, ptx or None, error or None)."""
    index, ablations, out, cubin = args
    import importlib
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if not cubin:  # PTX is all that is compared: skip ptxas (the cubin stage) to save time
        from triton.backends.nvidia.compiler import CUDABackend
        CUDABackend.make_cubin = lambda self, src, metadata, opt, capability: b""
    spec = _specs(ablations)[index]
    try:
        with tempfile.TemporaryDirectory() as cache:
            triton.knobs.cache.dir = cache
            kernel = getattr(importlib.import_module(spec.module), spec.kernel)
            compiled = triton.compile(ASTSource(fn=kernel, signature=spec.signature, constexprs=spec.constexprs,
                                                attrs=spec.attrs), target=GPUTarget("cuda", 90, 32),
                                      options={"num_warps": spec.num_warps, "num_stages": spec.num_stages})
        ptx = compiled.asm["ptx"]
        with open(os.path.join(out, spec.name + ".ptx"), "w") as f:
            f.write(ptx)
        return spec.name, None
    except Exception as e:  # report and go on
        return spec.name, f"{type(e).__name__}: {str(e)[-2000:]}"


def dump(root: str, out: str, jobs: int, ablations: bool, only: list, cubin: bool = False) -> int:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    _setup(root)
    os.makedirs(out, exist_ok=True)
    names = [s.name for s in _specs(ablations)]
    assert len(names) == len(set(names)), "duplicate specialization names"
    todo = [i for i, n in enumerate(names) if (not only or any(o in n for o in only))
            and not os.path.exists(os.path.join(out, n + ".ptx"))]
    print(f"{len(names)} specializations, {len(todo)} to compile", flush=True)
    with open(os.path.join(out, "names.json"), "w") as f:
        json.dump(names, f, indent=0)
    errors = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        for k, (name, error) in enumerate(pool.map(_compile, [(i, ablations, out, cubin) for i in todo]), 1):
            if error:
                errors[name] = error
            print(f"[{k}/{len(todo)}] {name}{' ERROR ' + error[:200] if error else ''}", flush=True)
    with open(os.path.join(out, "errors.json"), "w") as f:
        json.dump(errors, f, indent=1)
    return 1 if errors else 0


def compare(a: str, b: str) -> int:
    def ptx(d):
        return {f[:-4] for f in os.listdir(d) if f.endswith(".ptx")}

    names_a, names_b = ptx(a), ptx(b)
    same = [n for n in sorted(names_a & names_b)
            if open(os.path.join(a, n + ".ptx")).read() == open(os.path.join(b, n + ".ptx")).read()]
    differ = sorted(names_a & names_b - set(same))
    for n in differ:
        print("DIFFERENT", n)
    for n in sorted(names_a - names_b):
        print("ONLY IN", a, n)
    for n in sorted(names_b - names_a):
        print("ONLY IN", b, n)
    print(f"identical {len(same)}/{len(names_a | names_b)}; different {len(differ)}; "
          f"only in one {len(names_a ^ names_b)}")
    return 0 if len(same) == len(names_a | names_b) and same else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--root", default=".")
    d.add_argument("--out", required=True)
    d.add_argument("--jobs", type=int, default=2)
    d.add_argument("--ablations", action="store_true")
    d.add_argument("--cubin", action="store_true", help="also run ptxas (the full compile; PTX is the same)")
    d.add_argument("only", nargs="*", help="substrings of the names to compile (default: all)")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    n = sub.add_parser("collect")
    n.add_argument("--root", default=".")
    n.add_argument("--ablations", action="store_true")
    args = p.parse_args(argv)
    if args.cmd == "dump":
        return dump(args.root, args.out, args.jobs, args.ablations, args.only, args.cubin)
    if args.cmd == "compare":
        return compare(args.a, args.b)
    _setup(args.root)
    for s in _specs(args.ablations):
        print(s.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
