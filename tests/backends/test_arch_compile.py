"""Compile the shipped Triton kernel specializations for sm_80, sm_86, sm_89 and sm_90 on a machine without a GPU,
each with the launch config chosen for that architecture's shared-memory limit (``configs.SHARED_MEMORY_LIMITS``).

Catches what the CPU interpreter cannot: kernels that fail to lower for a GPU, shared memory over an architecture's
budget (227 KiB per program on sm_90, 163 KiB on sm_80, 99 KiB on sm_86/sm_89), TMA on a GPU without it, loops that
stopped being software-pipelined, missing tensor-core code. sm_90 compiles every shipped specialization; sm_8x a
representative subset (``specializations.arch_specializations``: each distinct 16-bit config, broadcast-Q, fp32 on
sm_86).

TRITON_INTERPRET=1 (set for the interpreter tests of this same pytest process) makes ``@triton.jit`` build
interpreter objects at import time, so the compiles run in a subprocess with that variable removed; one per
architecture, on first use (``-k sm86`` compiles only sm_86).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from jfa_ops.backends.triton.configs import SHARED_MEMORY_LIMITS  # noqa: E402

ARCHS = (80, 86, 89, 90)

_WORKER = r"""
import dataclasses, importlib, json, sys, time
from concurrent.futures import ProcessPoolExecutor

def specs(cc, inductor_floats):
    # arch_specializations(cc); inductor_floats: one per kernel taking a float, typed fp64 as Inductor types a
    # Python float argument of a user kernel (wrap_triton)
    from jfa_ops.backends.triton.specializations import arch_specializations
    if not inductor_floats:
        return list(arch_specializations(cc))
    out, seen = [], set()
    for s in arch_specializations(cc):
        if s.kernel not in seen and "fp32" in s.signature.values():
            seen.add(s.kernel)
            out.append(dataclasses.replace(s, signature={k: "fp64" if v == "fp32" else v for k, v in s.signature.items()}))
    return out

def compile_one(args):
    cc, index, inductor_floats = args
    import triton
    from triton.backends.compiler import GPUTarget
    from jfa_ops.backends.triton.specializations import exp2_of_fma_count
    s = specs(cc, inductor_floats)[index]
    fn = getattr(importlib.import_module(s.module), s.kernel)
    t0 = time.time()
    try:
        k = triton.compile(triton.compiler.ASTSource(fn=fn, signature=s.signature, constexprs=s.constexprs,
                                                     attrs=s.attrs),
                           target=GPUTarget("cuda", cc, 32),
                           options={"num_warps": s.num_warps, "num_stages": s.num_stages})
    except Exception as e:  # reported per specialization
        return {"name": s.name, "error": f"{type(e).__name__}: {e}"[:2000]}
    ttgir = k.asm["ttgir"]
    return {"name": s.name, "shared": k.metadata.shared, "seconds": round(time.time() - t0, 2),
            "wgmma": ttgir.count("warp_group_dot "), "mma": ttgir.count("tt.dot "),
            "fp8_wgmma": sum("wgmma" in line and "e4m3.e4m3" in line for line in k.asm["ptx"].splitlines()),
            "e4m3_cvt": k.asm["ptx"].count("cvt.rn.satfinite.e4m3x2.f32"),
            "fma_f32": k.asm["ptx"].count("fma.rn.f32"), "ex2_of_fma": exp2_of_fma_count(k.asm["ptx"]),
            "mul_rn_f32": k.asm["ptx"].count("mul.rn.f32"), "st_global_b8": k.asm["ptx"].count("st.global.b8 "),
            "st_global_v4": k.asm["ptx"].count("st.global.v4."),
            "async_copies": ttgir.count("copy_global_to_local"), "tma": ttgir.count("tensordesc"),
            "num_stages": s.num_stages, "kernel": s.kernel}

if __name__ == "__main__":
    cc, workers, inductor_floats = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "fp64"
    n = len(specs(cc, inductor_floats))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        print(json.dumps(list(pool.map(compile_one, [(cc, i, inductor_floats) for i in range(n)]))))
"""

_RESULTS = {}


def _compiled(cc, floats="fp32"):
    if (cc, floats) not in _RESULTS:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        workers = str(max(1, min(4, os.cpu_count() or 1)))
        proc = subprocess.run([sys.executable, "-c", _WORKER, str(cc), workers, floats], env=env, cwd=root,
                              capture_output=True, text=True, timeout=1200)
        assert proc.returncode == 0, proc.stderr[-4000:]
        _RESULTS[cc, floats] = {r["name"]: r for r in json.loads(proc.stdout.strip().splitlines()[-1])}
    return _RESULTS[cc, floats]


def _cases():
    from jfa_ops.backends.triton.specializations import arch_specializations

    return [pytest.param(cc, s.name, id=f"sm{cc}-{s.name}") for cc in ARCHS for s in arch_specializations(cc)]


_ELEMENTWISE = ("attn_bwd_delta_kernel", "attn_bwd_dq_finalize_kernel", "tile_slots_kernel", "rank_tiles_kernel",
                "offsets_ok_kernel", "causal_streams_kernel", "causal_items_kernel", "section_keys_kernel",
                "section_places_kernel",
                "block_pool_kernel", "block_pool_pair_kernel", "block_pool_pair_skip_kernel", "block_select_kernel",
                "block_select_overlap_kernel",
                "transpose_selection_kernel", "transpose_mark_kernel", "transpose_lists_kernel",
                "mxfp8_quantize_kernel", "rebase_rows_kernel", "rebase_v_tiles_kernel", "rebase_key_tiles_kernel",
                "_mx_values_kernel")  # the last four: the tlx MXFP8 forward's operand stage (mxfp8_rebase.py) and
# its backward's dequantize (mxfp8_bwd.py): per-row/-tile scaling, no matmul


@pytest.mark.parametrize("cc, name", _cases())
def test_compiles_within_the_shared_memory_budget(cc, name):
    r = _compiled(cc)[name]
    assert "error" not in r, r["error"]
    assert r["shared"] <= SHARED_MEMORY_LIMITS[cc], f"sm_{cc} {name}: {r['shared']} bytes of shared memory"
    if r["kernel"] in _ELEMENTWISE or "fp32" in name:  # no matmuls; fp32 uses exact FMA dots
        return
    if cc >= 90:
        assert r["wgmma"] > 0, f"{name}: no Hopper tensor-core (wgmma) ops"
    else:
        assert r["mma"] > 0 and r["tma"] == 0, f"sm_{cc} {name}: no tensor-core dots, or TMA descriptors"
    if r["num_stages"] > 1:
        assert r["async_copies"] > 0, f"sm_{cc} {name}: inner loops not software-pipelined"
    if name.startswith("mxfp8-") and ("-fp8dot-" in name or "-rebase-" in name):  # Hopper fast paths: E4M3 wgmma
        assert r["fp8_wgmma"] >= 2, f"{name}: no FP8 (e4m3) wgmma in the PTX"


def _compiled_named(prefix: str, at_least: int = 1) -> list:
    """The sm_90 compile results of the specializations named ``prefix...`` (at least ``at_least``), each compiled."""
    r = _compiled(90)
    results = [r[n] for n in r if n.startswith(prefix)]
    assert len(results) >= at_least, (prefix, len(results))
    for result in results:
        assert "error" not in result, result["error"]
    return results


def test_sm90_mxfp8_quantize_rounds_with_the_gpu_conversion():
    """The quantize kernels round to E4M3 with the hardware conversion on sm_90 (the integer emulation the
    interpreter needs cost ~45 instructions per element and held the kernels to ~30% of HBM bandwidth), and, with
    ``KNOBS.mxfp8_quant_pipelined``, keep loads in flight through async copies."""
    for r in _compiled_named("mxfp8-quantize-"):
        assert r["e4m3_cvt"] > 0, f"{r['name']}: E4M3 rounding not by cvt.rn.satfinite.e4m3x2.f32"
        # the head loop's load pipelined as async copies: with register loads ptxas placed the next head's load
        # behind the arithmetic, one tile in flight per program (36% of HBM on the H200; bench/NOTES.md v4)
        if r["name"].endswith("-pipelined"):  # configs.KNOBS.mxfp8_quant_pipelined
            assert r["async_copies"] > 0, f"{r['name']}: the head loop's load is not pipelined"


def test_sm90_permuted_v_tiles_store_as_the_natural_order():
    """``rebase_v_tiles`` in tlx ``configs.MXFP8_PERMUTED_V_KEYS``' key order stores V^T as the natural order does:
    16-byte stores, no one-byte ones. Stop 53 found it storing at permuted column offsets, which the compiler could
    not vectorize (128 ``st.global.b8`` a thread against 8 ``st.global.v4.b32``): the bf16-in MXFP8 call was 1.5x
    (dense B8 S4096) to 4.8x (broadcast-Q) slower on the H100. The rows are now renamed in registers first
    (``p_in_v_key_order``), so the store's offsets are the natural ones."""
    for head_dim in (64, 128):
        natural, permuted = (_compiled(90)[f"mxfp8-rebase-v-tiles-d{head_dim}{part}"] for part in ("", "-permkeys"))
        assert "error" not in natural and "error" not in permuted, (natural, permuted)
        assert permuted["st_global_b8"] == natural["st_global_b8"] == 0, (natural, permuted)
        assert permuted["st_global_v4"] == natural["st_global_v4"] > 0, (natural, permuted)
        assert permuted["shared"] == natural["shared"], (natural, permuted)


def test_sm90_selection_scores_are_contraction_free():
    """The block selection's scores have no fp32 FMA: the compiler contracts a multiply and the add after it per
    register, not per row (sm_90 PTX of the old fp32 scores: p0 * q0 fused in some rows of a thread, p1 * q1 in
    others), so two equal KV blocks got different scores by their position in the tile and a tie went to the higher
    index (H200, triton 3.8, ``test_selection_ties_and_many_blocks[rows-cuda]``; the CPU interpreter never
    contracts, so only the compiled code shows it). Scores are fp64 sums of exact fp32 x fp32 products
    (``block_sparse_select._exact_dot``): an fp64 FMA there rounds as the add alone."""
    # scratch and rows, causal or not, broadcast Q; KNOBS.sparse_select_overlap's one launch
    for r in _compiled_named("bs_select-", at_least=4) + _compiled_named("bs_select_overlap", at_least=5):
        assert r["fma_f32"] == 0, f"{r['name']}: {r['fma_f32']} fp32 FMAs (position-dependent scores)"


def test_sm90_mxfp8_forward_exponents_read_rounded_scores():
    """The MXFP8 forward's exp2(s - m) reads the rounded scores its running maximum m came from: no ex2 of an fma.
    With s = x * scale the compiler fused the multiply into exp2(fma(x, scale, -m)) in the mask-free blocks; past
    |s| = 2**31 the unrounded product exceeds m by more than 128, P = inf and the lse NaN (H200, 2**+-30 inputs,
    ``test_kernels_no_nan_at_wide_range_on_the_gpu``; the interpreter never fuses). ``mxfp8_attn_fwd._scores``."""
    for r in _compiled_named("mxfp8-fwd-", at_least=25):  # five variants, six shapes each
        assert r["ex2_of_fma"] == 0, f"{r['name']}: {r['ex2_of_fma']} exp2 of fused (unrounded) scores"


def test_sm90_mxfp8_backward_scores_are_rounded_alone():
    """The MXFP8 backward's P = exp2(min(s * scale - lse2, 0)) from the scores rounded on their own, as the forward's
    lse was made (``_scores``'s mul.rn.f32, which PTX never fuses; a plain multiply became fma(s, scale, -lse2):
    P off the forward's once |s| > 2**24). Every sm_90 MXFP8 backward kernel carries the rounded multiply."""
    for r in _compiled_named("mxfp8-bwd-"):
        assert r["mul_rn_f32"] > 0, f"{r['name']}: no rounded score multiply"


def test_compiles_with_inductor_float_arguments():
    """Inductor launches our kernels (JFA_COMPILE_PATH=inductor) with Python float arguments typed fp64; every
    kernel taking a float casts it to fp32 first, or a dot's accumulator type mismatches (the H200 failure of
    2026-12-01: "CompilationError at 34:14", the PV dot of attn_fwd_kernel) and the math runs in fp64. sm_90."""
    results = _compiled(90, "fp64")
    assert len(results) >= 8  # fwd, dkdv, dq, finalize, the block-sparse and MXFP8 attention kernels
    errors = {name: r["error"][:300] for name, r in results.items() if "error" in r}
    assert not errors, errors


_PTXAS_WORKER = r"""
import importlib, json, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from jfa_ops.backends.triton import specializations

out = []
cc = int(sys.argv[3]) if len(sys.argv) > 3 else 90
for s in getattr(specializations, sys.argv[1])():
    if not s.name.startswith(sys.argv[2]):
        continue
    fn = getattr(importlib.import_module(s.module), s.kernel)
    k = triton.compile(triton.compiler.ASTSource(fn=fn, signature=s.signature, constexprs=s.constexprs,
                                                 attrs=s.attrs),
                       target=GPUTarget("cuda", cc, 32), options={"num_warps": s.num_warps, "num_stages": s.num_stages})
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(k.asm["ptx"])
        f.flush()
        log = subprocess.run([get_ptxas(cc).path, f"-arch=sm_{cc}{'a' if cc == 90 else ''}", "-v", f.name, "-o",
                              "/dev/null"], capture_output=True, text=True).stderr
    out.append(dict(name=s.name, shared=k.metadata.shared, warps=s.num_warps,
                    registers=max(int(x) for x in re.findall(r"Used (\d+) registers", log)),
                    spills=max(int(x) for x in re.findall(r"(\d+) bytes spill stores", log)),
                    async_copies=k.asm["ttgir"].count("async_copy_global_to_local"), shfl=k.asm["ptx"].count("shfl.sync"),
                    lanes_along_columns="threadsPerWarp = [1, 32]" in k.asm["ttgir"],
                    packed_encode=k.asm["ptx"].count("0x7f7f7f7f")))
print(json.dumps(out))
"""


_PTXAS_RESULTS = {}


def _ptxas_stats(source: str, prefix: str, cc: int = 90) -> list:
    """sm_``cc`` (90 unless told) compiles of ``specializations.<source>()``'s entries named ``prefix...``, each with
    ptxas -v's registers and spill bytes, shared memory, warps and async copies (a subprocess without
    TRITON_INTERPRET; once per source, prefix and architecture)."""
    if (source, prefix, cc) in _PTXAS_RESULTS:
        return _PTXAS_RESULTS[source, prefix, cc]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _PTXAS_WORKER, source, prefix, str(cc)], env=env, cwd=root,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    _PTXAS_RESULTS[source, prefix, cc] = json.loads(proc.stdout.strip().splitlines()[-1])
    return _PTXAS_RESULTS[source, prefix, cc]


@pytest.mark.parametrize("cc", [80, 90])
def test_transpose_scatter_kernels_fit(cc):
    """``KNOBS.sparse_transpose_scatter``'s mark and list kernels (bench/NOTES.md "Transposed selection, helper
    transpose46") on sm_80 and sm_90, ptxas -v: no spills, no shared memory beyond the list pass's prefix sum, and
    registers for >= 8 programs of 4 warps per SM (<= 64; 32 at the shipped tile sizes: 16 programs)."""
    results = {r["name"]: r for r in _ptxas_stats("transpose_scatter_specializations", "bs_transpose-scatter", cc)}
    assert sorted(results) == ["bs_transpose-scatter-lists", "bs_transpose-scatter-mark"], sorted(results)
    print(cc, {n: (r["registers"], r["shared"]) for n, r in results.items()})
    for r in results.values():
        assert r["spills"] == 0 and r["shared"] <= 16384 and r["registers"] <= 64, r


def test_sm90_pool_variants_keep_loads_in_flight():
    """Selection pool v6 (bench/NOTES.md "selection pool v6") on sm_90, ptxas -v: no spills, shared memory within the
    budget; ``KNOBS.sparse_pool_stream``'s loop pipelined by async copies (3 [32, D] steps in flight: >= 24 KB of
    shared memory) at <= 80 registers (>= 6 programs of 4 warps per SM: >= 144 KB in flight per SM, 3x the ~45 KB
    4 TB/s needs); every pooling kernel (the default, whole-block, both sides in one launch) <= 144 registers.
    ``KNOBS.sparse_pool_skip``'s pair kernel (causal and not) streams too, under the same bounds."""
    results = _ptxas_stats("block_sparse_specializations", "bs_pool")
    streams = [r for r in results if r["name"].endswith("-stream")]
    assert len(results) >= 8 and len(streams) == 4, [r["name"] for r in results]
    for r in results:
        assert r["spills"] == 0 and r["shared"] <= SHARED_MEMORY_LIMITS[90] and r["registers"] <= 144, r
    for r in streams:
        assert r["async_copies"] > 0 and r["shared"] >= 3 * 32 * 128 * 2 and r["registers"] <= 80, r
        assert 65536 // (r["registers"] * 32 * r["warps"]) >= 6, r


def test_sm90_select_overlap_keeps_the_pools_occupancy():
    """``KNOBS.sparse_select_overlap`` (bench/NOTES.md "Selection overlap, helper selover46") on sm_90, ptxas -v: the
    one launch of pools and select (causal and not, with the pool skip, broadcast Q) keeps the streaming pool's
    async-copy loop and fits 7 programs of 4 warps per SM as the shipped pooling (<= 72 registers: its pool items
    must not lose bandwidth to the select's code), shared memory within the budget; spills only the select path's
    few bytes (16 at most: ptxas 12.x/13.x, 2026-12-06)."""
    results = _ptxas_stats("select_overlap_specializations", "bs_select_overlap")
    # + KNOBS.sparse_select_overlap_tail's order on the skip kernels (helper seltail47): the same bounds
    assert len(results) == 7 and sum(r["name"].endswith("-order") for r in results) == 2, [r["name"] for r in results]
    for r in results:
        assert r["async_copies"] > 0 and r["shared"] <= SHARED_MEMORY_LIMITS[90] and r["spills"] <= 16, r
        assert 65536 // (r["registers"] * 32 * r["warps"]) >= 7, r


def test_sm90_mxfp8_quantize_v_columns_fit_twice_the_programs():
    """``KNOBS.mxfp8_quant_v_columns`` 64 (bench/NOTES.md "MXFP8 (32, 1) quantize bandwidth, helper quant32") on
    sm_90, ptxas -v: the (32, 1) kernel in 64-column iterations is one warp at <= 128 registers (>= 16 programs per
    SM, the default's 213 fit 9) with its loads pipelined by async copies, no spills, shared memory within the
    budget; the default (32, 1) kernels spill nothing either."""
    results = {r["name"]: r for r in _ptxas_stats("mxfp8_specializations", "mxfp8-quantize-32x1-")}
    assert len(results) == 4, sorted(results)  # with the column layout's (the test below)
    for r in results.values():
        assert r["spills"] == 0 and r["shared"] <= SHARED_MEMORY_LIMITS[90], r
    narrow = results["mxfp8-quantize-32x1-bf16-cols64-pipelined"]
    assert narrow["warps"] == 1 and narrow["registers"] <= 128 and narrow["async_copies"] > 0, narrow
    assert 65536 // (narrow["registers"] * 32) >= 16, narrow


def test_sm90_mxfp8_quantize_v_column_layout():
    """``KNOBS.mxfp8_quant_v_layout`` "column" (bench/NOTES.md "MXFP8 (32, 1) quantize in whole columns, helper
    quantv36") on sm_90, ptxas -v: V's (32, 1) kernel with a thread's lanes along the columns ([1, 32]: all 32 rows
    of 4 columns a thread) takes no shuffles (the default's column max does), encodes through the packed words
    (``_encode_packed``), is one warp at <= 184 registers (>= 11 programs per SM; the default's 213 fit 9) with no
    spills, and copies one head group ahead in 8 KB of shared memory (registers, not shared memory, bound it)."""
    results = {r["name"]: r for r in _ptxas_stats("mxfp8_specializations", "mxfp8-quantize-32x1-")}
    column, default = results["mxfp8-quantize-32x1-bf16-column-pipelined"], results["mxfp8-quantize-32x1-fp16-pipelined"]
    assert column["lanes_along_columns"] and column["shfl"] == 0 and default["shfl"] > 0, (column, default)
    assert column["packed_encode"] > 0 and default["packed_encode"] == 0, (column, default)
    assert column["warps"] == 1 and column["spills"] == 0 and column["registers"] <= 184, column
    assert 65536 // ((column["registers"] + 7) // 8 * 8 * 32) >= 11, column
    assert column["async_copies"] > 0 and column["shared"] <= 8 * 1024, column


def test_sm90_mxfp8_key_tile_launches_fit_as_the_shipped_ones():
    """tlx ``configs.MXFP8_TILED_KEY_FACTORS`` (helper kfold50): K's one-launch forms on sm_90, ptxas -v, against
    the shipped launches they replace: ``rebase_key_tiles_kernel`` (pre-quantized K) and the quantize kernel with
    KEY_TILE 128 (bf16 K), D64 and D128: no spills, shared memory within the budget, registers no more than the
    shipped kernel's + 16 (the sequence search and the tile's key range per program), and the quantize kernel's
    loads still pipelined by async copies as the shipped rows kernel's."""
    results = {r["name"]: r for r in _ptxas_stats("mxfp8_specializations", "mxfp8-")}
    for dim in (64, 128):
        for new, old in ((f"mxfp8-rebase-key-tiles-d{dim}", f"mxfp8-rebase-rows-d{dim}"),
                         (f"mxfp8-quantize-rebased-key-tiles-d{dim}-bf16-pipelined",
                          f"mxfp8-quantize-rebased-rows-d{dim}-bf16-pipelined")):
            r, base = results[new], results[old]
            print(new, {k: r[k] for k in ("registers", "shared", "spills")}, old,
                  {k: base[k] for k in ("registers", "shared", "spills")})
            assert r["spills"] == 0 and r["shared"] <= SHARED_MEMORY_LIMITS[90], r
            assert r["registers"] <= base["registers"] + 16 and r["warps"] == base["warps"], (r, base)
            assert (r["async_copies"] > 0) == (base["async_copies"] > 0), (r, base)
