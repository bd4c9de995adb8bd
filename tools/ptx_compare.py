"""Prove a refactor of the Triton backend changes no generated code: dump the PTX of every specialization
``specializations.arch_specializations(cc)`` lists, on two checkouts, and compare them byte for byte.

    # on each checkout (a base: ``git worktree add /tmp/base <commit>``), no GPU needed
    PYTHONPATH=$PWD python tools/ptx_compare.py dump OUT_DIR [--arch 90 80] [--jobs N] [--only REGEX]
    # then
    python tools/ptx_compare.py compare BASE_DIR NEW_DIR [--specs]

``dump`` compiles each specialization with ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cc, 32))`` as
``tests/backends/test_arch_compile.py`` does (TRITON_INTERPRET removed, in worker processes), with
TRITON_DISABLE_LINE_INFO=1 (line info names source lines and files, which a refactor moves) and a fresh Triton
cache, and writes ``OUT_DIR/sm{cc}/{name}.ptx`` per specialization (``{name}.error`` where it fails to compile) and
``OUT_DIR/sm{cc}/specs.txt``: each specialization's repr, one a line. The compile stops after the PTX stage
(ptxas's cubin is a function of the PTX and the same ptxas). ``compare`` counts the identical PTX files per
architecture and names any that differ or stand on one side only; ``--specs`` also compares the reprs. Exit status 0
when everything compared is identical.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import sys
import tempfile


class _PtxDone(Exception):
    def __init__(self, ptx):
        super().__init__("ptx")
        self.ptx = ptx


def _specs(cc):
    from jfa_ops.backends.triton.specializations import arch_specializations

    return list(arch_specializations(cc))


def _stop_after_ptx():
    from triton.backends.nvidia.compiler import CUDABackend

    add_stages = CUDABackend.add_stages
    if getattr(add_stages, "_ptx_compare", False):
        return

    def patched(self, stages, options, *args, **kwargs):
        add_stages(self, stages, options, *args, **kwargs)

        def done(src, metadata):
            raise _PtxDone(src)

        stages["cubin"] = done

    patched._ptx_compare = True
    CUDABackend.add_stages = patched


def _compile_one(args):
    cc, index, out = args
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget

    _stop_after_ptx()
    s = _specs(cc)[index]
    fn = getattr(importlib.import_module(s.module), s.kernel)
    path = pathlib.Path(out) / f"sm{cc}"
    try:
        triton.compile(triton.compiler.ASTSource(fn=fn, signature=s.signature, constexprs=s.constexprs,
                                                 attrs=s.attrs),
                       target=GPUTarget("cuda", cc, 32),
                       options={"num_warps": s.num_warps, "num_stages": s.num_stages})
    except _PtxDone as done:
        (path / f"{s.name}.ptx").write_text(done.ptx)
        return s.name, True
    except Exception as e:  # noqa: BLE001 - reported per specialization
        (path / f"{s.name}.error").write_text(f"{type(e).__name__}: {e}\n")
        return s.name, False
    (path / f"{s.name}.error").write_text("compiled past the PTX stage without reaching cubin\n")
    return s.name, False


def _init_worker(cache):
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    os.environ["TRITON_CACHE_DIR"] = cache


def dump(out, archs, jobs, only):
    from concurrent.futures import ProcessPoolExecutor

    with tempfile.TemporaryDirectory(prefix="ptx_compare_cache_") as cache:
        _init_worker(cache)  # before anything imports triton (this process lists the specializations)
        for cc in archs:
            path = pathlib.Path(out) / f"sm{cc}"
            path.mkdir(parents=True, exist_ok=True)
            specs = _specs(cc)
            (path / "specs.txt").write_text("".join(f"{s!r}\n" for s in specs))
            first = {}  # a name listed twice (a knob's default listed again as its variant): compiled once
            for i, s in enumerate(specs):
                assert first.setdefault(s.name, s) == s, f"two different specializations named {s.name}"
            todo = [i for i, s in enumerate(specs)
                    if first[s.name] is s and (not only or re.search(only, s.name))]
            with ProcessPoolExecutor(max_workers=jobs, initializer=_init_worker, initargs=(cache,)) as pool:
                results = list(pool.map(_compile_one, [(cc, i, out) for i in todo]))
            failed = [n for n, ok in results if not ok]
            print(f"sm_{cc}: {len(results) - len(failed)}/{len(results)} specializations compiled to PTX"
                  + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)


def compare(base, new, specs):
    same = True
    for arch in sorted(p.name for p in pathlib.Path(base).iterdir() if p.is_dir()):
        a, b = pathlib.Path(base) / arch, pathlib.Path(new) / arch
        if not b.is_dir():
            print(f"{arch}: missing in {new}")
            same = False
            continue
        files = lambda d: {p.name for p in d.iterdir() if p.suffix in (".ptx", ".error")}  # noqa: E731
        fa, fb = files(a), files(b)
        both = sorted(fa & fb)
        identical = [n for n in both if (a / n).read_bytes() == (b / n).read_bytes()]
        differ = sorted(set(both) - set(identical))
        ptx = [n for n in identical if n.endswith(".ptx")]
        print(f"{arch}: {len(ptx)}/{len(fa | fb)} PTX byte-identical"
              + (f"; differ: {', '.join(differ)}" if differ else "")
              + (f"; only in base: {', '.join(sorted(fa - fb))}" if fa - fb else "")
              + (f"; only in new: {', '.join(sorted(fb - fa))}" if fb - fa else ""))
        errors = [n for n in fa | fb if n.endswith(".error")]
        same = same and not differ and fa == fb and not errors
        if errors:
            print(f"{arch}: compile errors: {', '.join(sorted(errors))}")
        if specs:
            sa, sb = (a / "specs.txt").read_text(), (b / "specs.txt").read_text()
            print(f"{arch}: specialization reprs {'identical' if sa == sb else 'DIFFER'} "
                  f"({len(sa.splitlines())} vs {len(sb.splitlines())})")
            same = same and sa == sb
    return same


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="write the PTX of every specialization of this checkout")
    d.add_argument("out")
    d.add_argument("--arch", type=int, nargs="+", default=[90, 80])
    d.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    d.add_argument("--only", default="", help="a regex: only the specializations whose name matches")
    c = sub.add_parser("compare", help="compare two dumps")
    c.add_argument("base")
    c.add_argument("new")
    c.add_argument("--specs", action="store_true", help="also compare the specializations' reprs")
    args = parser.parse_args(argv)
    if args.command == "dump":
        dump(args.out, args.arch, args.jobs, args.only)
        return 0
    return 0 if compare(args.base, args.new, args.specs) else 1


if __name__ == "__main__":
    sys.exit(main())
