"""Compile every TLX kernel specialization (``jfa_ops.backends.tlx.specializations``) for sm_90 without a GPU and
check what a GPU run depends on: it compiles, shared memory within sm_90's 232448 bytes per block, 12 warps (producer
+ two consumer warpgroups) with register reallocation (setmaxnreg: consumers up, producer down), spills small (from
the ptxas log).

TLX needs triton 3.8 + triton-utlx, which clash with the test environment's triton, so the compiles run in a
subprocess with those first on its path: ``JFA_TLX_SITE`` (a ``pip install --target`` directory or a venv's
site-packages), else ``.ci-tlx`` in the repo root (``.ci/run`` makes it). Skipped when neither exists.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = os.environ.get("JFA_TLX_SITE") or os.path.join(ROOT, ".ci-tlx")
SM90_SHARED_MEMORY = 232448
# bytes per thread, stores + loads. Measured: 0 unpipelined at D64/D128, 80 pipelined (v2) at D128, 200-232 at D256
# (unpipelined); the TLX tutorial's pipelined D128: 80.
# The backward (experimental, off by default): D128 1464-1636 (full 1464, causal 1604; two [64, 128] fp32
# accumulators take 128 of a consumer's 240 registers, see bench/NOTES.md "TLX backward: register budget"), D64
# 184-244. Before its consumers ran one loop over the three stages: 1964 (full) to 6140 (causal).
MAX_SPILL_BYTES = {"fwd": 512, "bwd": 1800}
# The v4 forward consumers (configs.ONE_LOOP, D64/D128), stores + loads: D64 0; D128 56-192 (full 80, causal 56-76,
# windowed 72, broadcast-Q 80, from offsets 192; per work item: none in the block loops). With STORE_TMA (the default
# since stop 40; sm_90 ptxas, helper flip40, 2026-12-05): D64 0; D128 44-228 (full 44, causal 116-164, windowed
# 136-228, from offsets 176; the bound was 276 for ROWSUM_ONCE + PACK_P's fp16 causal + left window kernel until
# they were culled in stop 41).
MAX_SPILL_BYTES_ONE_LOOP = {64: 0, 128: 228}
# The block-sparse forward ("sparse-fwd-*": SPARSE on the v4 consumers), stores + loads: D64 0; D128 full 24,
# broadcast-Q 24, causal 112, blocks 256 160 (per work item, around its first block: none in the block loop), from
# offsets without FMA 352, fp16 causal + left window 420 (11-14 registers spilled inside the block loop's masked
# branch; bench/NOTES.md "TLX block-sparse forward v1"). With the uniform walk ("-uniform", off by default): D64 0,
# D128 full 64, broadcast-Q 64, causal 292-312, blocks 256 232, from offsets without FMA 276, fp16 causal + left
# window 300 (bench/NOTES.md "TLX block-sparse forward: uniform walk"). With STORE_TMA (the default since stop 40;
# sm_90 ptxas, helper flip40, 2026-12-05): D64 20 without the uniform walk (full and causal 8 + 12: the epilogue in
# the item's branch; 0 with it, the default walk), D128 20-420 (fp16 causal + left window 420, uniform walk 64-236).
MAX_SPILL_BYTES_SPARSE = {64: 20, 128: 448}
# The MXFP8 forward ("mxfp8-fwd-*", v3 consumers), stores + loads: 0 but D128 with a left window 400 (the key
# interval mask; ``visible`` spilled 800 there).
MAX_SPILL_BYTES_MXFP8 = {64: 0, 128: 448}
# The backward's v2 consumers ("bwd-*-v2"), stores + loads: D64 0; D128 320-904 (full 320,
# broadcast-Q 380, causal 724, fp16 causal + left window 760, from offsets 904: per work item, in the consumer
# prologue, the row zeroing at a sequence's end and the dK/dV epilogue; at most 4 STL/LDL per query block;
# bench/NOTES.md "TLX backward v2"). v2 with dQ split between the consumers ("-v2-dqshared"): D64 0,
# D128 300-692 (full 328, broadcast-Q 300, causal 500, fp16 causal + left window 612, from offsets 692).
MAX_SPILL_BYTES_BWD_V2 = {64: 0, 128: 1024}
# The block-sparse backward ("sparse-bwd-*": SPARSE on the v2 consumers), stores + loads: D64 56-68 (68 since the dQ
# rows past a sequence's end are zeroed); D128 688-960 (full
# 688, causal 804, broadcast-Q 688, 256-blocks 804, fp16 causal + left window 960, from offsets 860, without the dQ
# split 784): per work item (the selection walk, the prologue and epilogue); in the block loop 3-6 STL/LDL per
# consumer, about the dense v2's (bench/NOTES.md "TLX block-sparse backward v1").
MAX_SPILL_BYTES_SPARSE_BWD = {64: 96, 128: 1152}
# STATS_AHEAD forced at D128 ("-statsahead": configs.BACKWARD_STATS_AHEAD), stores + loads: D64 0; D128 388-756 (full,
# causal) (per work item and in the masked blocks; bench/NOTES.md "TLX backward v3 knobs").
MAX_SPILL_BYTES_BWD_EXPERIMENTS = {64: 192, 128: 1024}

pytestmark = pytest.mark.skipif(not os.path.isdir(os.path.join(SITE, "utlx_plugin")),
                                reason=f"no triton 3.8 + triton-utlx at {SITE} (set JFA_TLX_SITE)")


def _tlx_env(*unset: str) -> dict:
    """The environment of a subprocess that imports TLX: SITE and the repo first on the path, the interpreter off,
    ``unset`` (switches the subprocess sets itself) removed."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", *unset)}
    env["PYTHONPATH"] = os.pathsep.join([SITE, ROOT])
    return env


@pytest.fixture(scope="module")
def compiled():
    env = _tlx_env()
    jobs = str(max(2, os.cpu_count() or 1))  # ~2-5 s per kernel on an idle core; 65 kernels took > 20 min on a loaded 2-core box
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tlx_compile.py"), "--jobs", jobs], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=2400)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert rows, f"no kernel compiled (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    return rows


def test_every_specialization_compiles_for_sm90(compiled):
    errors = [f"{r['name']}: {r['error']}" for r in compiled if "error" in r]
    assert not errors, "\n".join(errors)
    assert {r["target"] for r in compiled} == {"sm_90a"}
    for d in (64, 128, 256):  # tlx.configs.HEAD_DIMS (importing it needs TLX, absent in this process)
        assert any(r["name"].startswith(f"fwd-d{d}-") for r in compiled), f"forward head_dim {d} not compiled"
    for d in (64, 128):  # the TLX backward's and the block-sparse forward's and backward's head dims
        assert any(r["name"].startswith(f"bwd-d{d}-") for r in compiled), f"backward head_dim {d} not compiled"
        assert any(r["name"].startswith(f"sparse-fwd-d{d}-") for r in compiled), f"sparse head_dim {d} not compiled"
        assert any(r["name"].startswith(f"sparse-bwd-d{d}-") for r in compiled), f"sparse bwd {d} not compiled"


def test_shared_memory_warps_registers_spills(compiled):
    for r in compiled:
        assert r["shared"] <= SM90_SHARED_MEMORY, f"{r['name']}: {r['shared']} B of shared memory"
        assert r["num_warps"] == 12, r
        kind = "bwd" if r["name"].startswith(("bwd", "sparse-bwd")) else "fwd"
        want = {"232", "40"} if kind == "fwd" else {"240", "24"}  # consumers up, producer down
        assert want <= set(r["setmaxnreg"]), f"{r['name']}: no register reallocation {r['setmaxnreg']}"
        assert r["registers"] is not None and r["spill_stores"] is not None, f"{r['name']}: no ptxas log"
        assert r["spill_stores"] + r["spill_loads"] <= MAX_SPILL_BYTES[kind], f"{r['name']}: spills {r}"


def test_one_loop_consumer_keeps_wgmma_in_flight(compiled):
    """The v4 consumer issues block j's QK^T, then block j-1's PV, and waits for the QK^T alone (wait 1): two wgmma
    groups in flight. Triton's pipeliner puts a wait 0 after every dot of a loop unless it has num_stages=0 (the
    pipelined v2 consumer, and the TLX tutorial, lost their overlap that way)."""
    rows = [r for r in compiled if "-oneloop" in r["name"]]
    assert rows, "no one-loop specialization compiled"
    for r in rows:
        assert r["wgmma_overlap"], f"{r['name']}: every wgmma waited for before the next is issued"
        head_dim = int(re.search(r"-d(\d+)-", r["name"]).group(1))
        bound = (MAX_SPILL_BYTES_SPARSE if r["name"].startswith("sparse") else MAX_SPILL_BYTES_ONE_LOOP)[head_dim]
        assert r["spill_stores"] + r["spill_loads"] <= bound, f"{r['name']}: spills {r}"


def test_zigzag_order_costs_the_kernel_nothing_per_block(compiled):
    """configs.FORWARD_ZIGZAG (helper tlxcausal: ``common.zigzag_item`` under the snake; D64/D128): its
    specializations compile, the v4 ones keep two wgmma groups in flight, and each spills at most 32 B per thread
    more than the kernel of the same features in another order (the order is a few integer ops per work item;
    measured D128 causal +4 B, full and broadcast-Q 0, causal + left window -16, D64 0; D256's v3 consumers
    spilled 40-68 B more, so D256 keeps the default order)."""
    by_name = {r["name"]: r for r in compiled}
    rows = [r for r in compiled if r["name"].endswith("-zigzag")]
    assert {int(re.search(r"-d(\d+)-", r["name"]).group(1)) for r in rows} == {64, 128}, "no zigzag compiled"
    for r in rows:
        base = by_name.get(r["name"].replace("-zigzag", "-tilemajor")) or by_name[r["name"].replace("-zigzag", "")]
        extra = r["spill_stores"] + r["spill_loads"] - base["spill_stores"] - base["spill_loads"]
        # STORE_TMA (on since stop 40) moves the causal + left window pair to +48 B (CI's sm_90 ptxas, stop 40)
        assert extra <= (48 if "-causal-left-" in r["name"] else 32), f"{r['name']}: {extra} B more spills than " \
                                                                       f"{base['name']}"
        assert r["wgmma_overlap"] == base["wgmma_overlap"], r["name"]


def test_dynamic_work_costs_the_consumers_nothing(compiled):
    """configs.FORWARD_DYNAMIC (helper bcast31: the v3 consumers' items from an atomic counter, handed over with the
    Q slots): its specializations compile with at most 256 B more shared memory (an int32 per Q slot and the
    counter's broadcast; measured +28-124 B) and spill no more than the same features' static kernel (measured:
    broadcast-Q 80 = 80, fp16 causal + left window 92 < 116, D256 216 < 232 B per thread; D64, not shipped: 0)."""
    by_name = {r["name"]: r for r in compiled}
    rows = [r for r in compiled if r["name"].endswith("-dynamic")]
    assert {int(re.search(r"-d(\d+)-", r["name"]).group(1)) for r in rows} == {128, 256}, "no dynamic compiled"
    for r in rows:
        base = by_name[r["name"].removesuffix("-dynamic")]
        assert r["spill_stores"] + r["spill_loads"] <= base["spill_stores"] + base["spill_loads"], (r, base)
        assert r["shared"] <= min(base["shared"] + 256, SM90_SHARED_MEMORY), (r, base)


def test_sparse_zigzag_order_costs_the_block_loop_nothing(compiled):
    """configs.SPARSE_FORWARD_ZIGZAG (helper sparsefwd: the block-sparse forward in the dense forward's ZIGZAG order,
    on the uniform walk): its D64/D128 specializations compile, keep two wgmma groups in flight, the block loops'
    unmasked paths within 8 instructions of the same kernel in its static striding with no spill there, and at most
    64 B per thread more spills (per work item: measured D128 full +24, causal +44, D64 0; bench/NOTES.md "TLX
    sparse forward vs FA4, helper sparsefwd, stop 26"), 96 B on the masked kernels with FIRST_UNMASKED (the default
    since stop 57; sm_90: D128 causal +92 over the tile-major kernel, whose spills it cut to 152 B, left window +64)."""
    by_name = {r["name"]: r for r in compiled}
    rows = [r for r in compiled if r["name"].startswith("sparse-fwd-") and "-zigzag" in r["name"]]
    assert {int(re.search(r"-d(\d+)-", r["name"]).group(1)) for r in rows} == {64, 128}, "no sparse zigzag compiled"
    for r in rows:
        base = by_name.get(r["name"].replace("-zigzag", "-tilemajor")) or by_name[r["name"].replace("-zigzag", "")]
        extra = r["spill_stores"] + r["spill_loads"] - base["spill_stores"] - base["spill_loads"]
        assert extra <= (96 if "-firstunmasked" in r["name"] else 64), f"{r['name']}: {extra} B more spills than " \
                                                                         f"{base['name']}"
        assert r["wgmma_overlap"] and base["wgmma_overlap"], r["name"]
        for got, want in zip(r["block_loop_path"], base["block_loop_path"]):
            assert abs(got - want) <= 8, f"{r['name']}: block loop paths {r['block_loop_path']} vs {base}"
        assert not any(r["block_loop_path_spill_ops"]), r["name"]


def test_sparse_walk_ahead_leaves_the_consumers_alone(compiled):
    """configs.SPARSE_FORWARD_WALK_AHEAD (helper sparsefwd: the producer reads the next item's walk after the first
    NUM_BUFFERS_KV tiles; every walk reads its row's first ids beside the count): per item only, so the consumers'
    block loops are those of the same kernel without it (unmasked paths within 2, whole loops within 10
    instructions: register choices move; measured paths equal or 4 shorter before STORE_TMA; with it, the default
    since stop 40, sm_90 2026-12-05: D128 causal zigzag consumer 0's path 506 vs 504 and its loop 709 vs 699, the
    others' paths equal or shorter and loops within 6), two wgmma groups stay in flight and spills grow by at most
    32 B per thread (measured equal or fewer). With FIRST_UNMASKED (the default on masked kernels since stop 57) the
    tile-major D128 causal kernel's loops come within 11 and its spills grow by 72 B (sm_90: 224 vs 152 B; zigzag
    +0, left window +24, D64 +0): 80 B and 12 instructions there."""
    by_name = {r["name"]: r for r in compiled}
    rows = [r for r in compiled if "-walkahead" in r["name"]]
    assert {int(re.search(r"-d(\d+)-", r["name"]).group(1)) for r in rows} == {64, 128}, "no walk ahead compiled"
    for r in rows:
        base = by_name[r["name"].replace("-walkahead", "")]
        extra = r["spill_stores"] + r["spill_loads"] - base["spill_stores"] - base["spill_loads"]
        first_unmasked = "-firstunmasked" in r["name"]
        assert extra <= (80 if first_unmasked else 32), f"{r['name']}: {extra} B more spills than {base['name']}"
        assert r["wgmma_overlap"] and base["wgmma_overlap"], r["name"]
        for got, want in zip(r["block_loop_path"], base["block_loop_path"]):
            assert got <= want + 2, (r["name"], r["block_loop_path"], base)
        for got, want in zip(r["block_loop_instructions"], base["block_loop_instructions"]):
            assert abs(got - want) <= (12 if first_unmasked else 10), (r["name"], r["block_loop_instructions"], base)


def test_sparse_peel_compiles_a_mask_free_loop(compiled):
    """configs.SPARSE_FORWARD_PEEL (helper peeldiag38; off by default, so its kernels are not shipped: compiled here,
    ~40 s on one core): each consumer walks its tiles in two loops, one mask-free (on its path only the softmax's
    two per-row guards, FSEL: no key mask; P carried packed: no PRMT), one masked (the key mask's FSEL), neither
    with a spill instruction; two wgmma groups stay in flight, registers stay at the consumers' 168; against the
    same kernel without the peel (shipped), each consumer's mask-free loop is no longer than its one loop's unmasked
    path (measured 468 / 468 vs 507 / 481 causal, 468 / 469 vs 507 / 478 full, 475 / 477 vs 507 / 480 fp16 left
    window) and spills do not grow (measured stores 156 -> 116, 32 -> 20, 168 -> 152 B) but with a left window, where
    STORE_TMA (the default since stop 40) gives the peeled kernel 96 B more (sm_90, helper flip40, 2026-12-05:
    fp16 causal + left window 332 vs 236 B stores + loads; full 68 = 68, causal 188 < 204, walk ahead 180 < 220).
    Since stop 57 the masked ones carry FIRST_UNMASKED as shipped (the peel's kernels are the launch's under
    JFA_TLX_SPARSE_FWD_PEEL=1): fp16 causal + left window 356 vs 244 B (112 more), causal 100 < 244, walk ahead
    84 < 244."""
    env = _tlx_env()
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tlx_compile.py"), "--jobs", "1",
                           "zigzag-uniform-peel", "zigzag-uniform-walkahead-peel"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 4, f"exit {proc.returncode}: {[r['name'] for r in rows]}\n{proc.stderr[-3000:]}"
    by_name = {r["name"]: r for r in compiled}
    for r in rows:
        assert "error" not in r, r
        assert r["name"].startswith("sparse-fwd-") and "-peel" in r["name"], r["name"]
        assert r["wgmma_overlap"] and r["registers"] == 168, r
        fsel = r["block_loop_path_fsel"]
        assert len(fsel) == 4 and all(h == 16 for h in r["block_loop_hgmma"]), r  # two loops per consumer
        for consumer in (fsel[:2], fsel[2:]):
            assert sorted(f > 8 for f in consumer) == [False, True], r  # one mask-free, one masked
        free = [i for i, f in enumerate(fsel) if f <= 8]
        assert not any(r["block_loop_prmt"][i] for i in free) and not any(r["block_loop_spill_ops"]), r
        base = by_name.get(r["name"].replace("-peel", ""))
        if base is not None:  # the shipped kernel it peels (all four are shipped today)
            extra = r["spill_stores"] + r["spill_loads"] - base["spill_stores"] - base["spill_loads"]
            allowed = 112 if "-left-" in r["name"] else 0  # (STORE_TMA with a left window: see above)
            assert extra <= allowed, f"{r['name']}: {extra} B more spills (stores + loads) than {base['name']}"
            for i, want in zip(free, base["block_loop_path"]):
                assert r["block_loop_path"][i] <= want, (r["name"], r["block_loop_path"], base["block_loop_path"])


def test_sparse_first_unmasked_keeps_the_block_loop():
    """configs.SPARSE_FORWARD_FIRST_UNMASKED (helper itemcost, stop 56; "masked" by default since stop 57, so the
    causal and windowed kernels below are shipped with it and their twins without it are not: all compiled here,
    ~2 min on two cores): only each item's first block changes (the mask under the block loop's runtime test, so a
    mask-free first tile skips it; helper itemcost measured consumer 0's prologue 889 -> 464 instructions, FSEL 194
    -> 2 on its straight path): the kernels compile with two wgmma groups in flight and the consumers' 168
    registers, each block loop keeps its length (within 2 instructions), its FSEL, its HGMMA and its spill
    instructions, and the whole kernel's spills (stores + loads) stay within the sparse forward's budget and at most
    64 B over the kernel without it (the masked first block's branch; sm_90 ptxas, stop 56: full 68 -> 68, causal
    204 -> 244, causal walk ahead 220 -> 244, fp16 causal + left window 236 -> 244 B; block loops 506 / 482, 504 /
    481-482 as before)."""
    env = _tlx_env("JFA_TLX_SPARSE_FWD_FIRST_UNMASKED")
    bases = [f"sparse-fwd-d128-{kind}-oneloop-storetma-zigzag-uniform" for kind in
             ("bf16-full", "bf16-causal", "fp16-causal-left")] + \
        ["sparse-fwd-d128-bf16-causal-oneloop-storetma-zigzag-uniform-walkahead"]
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tlx_compile.py"), "--jobs", "2",
                           *(f"{name}{suffix}$" for name in bases for suffix in ("", "-firstunmasked"))],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    by_name = {r["name"]: r for r in (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))}
    rows = [r for name, r in by_name.items() if name.endswith("-firstunmasked")]
    assert len(rows) == 4 and len(by_name) == 8, f"exit {proc.returncode}: {sorted(by_name)}\n{proc.stderr[-3000:]}"
    for r in rows:
        base = by_name.get(r["name"].removesuffix("-firstunmasked"))
        assert base is not None and "error" not in base, (r["name"], sorted(by_name))
        assert "error" not in r, r
        assert r["name"].startswith("sparse-fwd-d128-"), r["name"]
        assert r["wgmma_overlap"] and r["registers"] == base["registers"] == 168, r
        spills = r["spill_stores"] + r["spill_loads"]
        assert spills <= MAX_SPILL_BYTES_SPARSE[128], r
        extra = spills - base["spill_stores"] - base["spill_loads"]
        assert extra <= 64, f"{r['name']}: {extra} B more spills (stores + loads) than {base['name']}"
        for key in ("block_loop_hgmma", "block_loop_path_fsel", "block_loop_path_spill_ops"):
            assert r[key] == base[key], (r["name"], key, r[key], base[key])
        assert len(r["block_loop_path"]) == len(base["block_loop_path"]), (r, base)
        for got, want in zip(r["block_loop_path"], base["block_loop_path"]):
            assert abs(got - want) <= 2, (r["name"], r["block_loop_path"], base["block_loop_path"])


def test_mxfp8_forward_runs_both_matmuls_as_e4m3_wgmma(compiled):
    """The TLX MXFP8 forward (issue 12): S = Q K^T with A from shared memory and P V with A (the quantized P) from
    registers, both E4M3 x E4M3 wgmma in the SASS (``QGMMA...E4M3.E4M3``), at D64 and D128, spills bounded."""
    rows = [r for r in compiled if r["name"].startswith("mxfp8-fwd-")]
    assert {int(re.search(r"-d(\d+)-", r["name"]).group(1)) for r in rows} == {64, 128}, [r["name"] for r in rows]
    for r in rows:
        assert r["qgmma_e4m3_smem_a"] > 0 and r["qgmma_e4m3_reg_a"] > 0, r
        # exp2(s - m) of the rounded scores m came from, not of a fused product (bench/NOTES.md "MXFP8 NaN on the GPU")
        assert r["exp2_of_fma"] == 0, f"{r['name']}: {r['exp2_of_fma']} exp2 of fused (unrounded) scores"
        head_dim = int(re.search(r"-d(\d+)-", r["name"]).group(1))
        assert r["spill_stores"] + r["spill_loads"] <= MAX_SPILL_BYTES_MXFP8[head_dim], f"{r['name']}: spills {r}"


def test_backward_v2_keeps_wgmma_in_flight_within_its_spill_budget(compiled):
    """The v2 backward consumer (``attn_bwd._consume_rows_v2``) overlaps S with dP, dV with dS, dK with dQ's staging:
    wgmma groups in flight (its loop has num_stages=0), and its spills stay within their budget."""
    rows = [r for r in compiled if r["name"].startswith(("bwd-", "sparse-bwd-")) and "-v2" in r["name"]]  # also
    # "-v2-dqshared" and the block-sparse backward (SPARSE on the v2 consumers)
    assert {int(re.search(r"-d(\d+)-", r["name"]).group(1)) for r in rows} == {64, 128}, "no v2 backward compiled"
    for r in rows:
        assert r["wgmma_overlap"], f"{r['name']}: every wgmma waited for before the next is issued"
        head_dim = int(re.search(r"-d(\d+)-", r["name"]).group(1))
        experiment = "-statsahead" in r["name"]
        bound = (MAX_SPILL_BYTES_SPARSE_BWD if r["name"].startswith("sparse") else
                 MAX_SPILL_BYTES_BWD_EXPERIMENTS if experiment else MAX_SPILL_BYTES_BWD_V2)[head_dim]
        assert r["spill_stores"] + r["spill_loads"] <= bound, f"{r['name']}: spills {r}"


def _uniform_walk_rows(compiled, prefix):
    """(row, the default kernel of the same features) of every ``prefix`` specialization with UNIFORM_WALK (the
    forward's zigzag order on it has its own test: no non-uniform twin)."""
    by_name = {r["name"]: r for r in compiled}
    rows = [r for r in compiled
            if r["name"].startswith(prefix) and "-uniform" in r["name"] and "-zigzag" not in r["name"]]
    assert {int(re.search(r"-d(\d+)-", r["name"]).group(1)) for r in rows} == {64, 128}, f"no {prefix} uniform walk"
    return [(r, by_name[re.sub(r"-(headgroup|uniform|itemorder|walkahead)|-kvearly(-storetma)?", "", r["name"])])
            for r in rows]


def test_block_sparse_backward_uniform_walk_spills_less(compiled):
    """UNIFORM_WALK (helper sparsebwd2, ``attn_bwd._selected_rows``): with the walk's bounds uniform, ptxas keeps the
    block loop in uniform registers as in the dense loop, which frees registers: every specialization with it (and
    the experiments that ride on it: head groups, Q/dO first, item order) spills no more than the default kernel of
    the same features (D128 full: 156 / 208 B instead of 336 / 400)."""
    for r, base in _uniform_walk_rows(compiled, "sparse-bwd-"):
        assert r["spill_stores"] + r["spill_loads"] <= base["spill_stores"] + base["spill_loads"], (r, base)


def test_block_sparse_uniform_walk_keeps_the_block_loop_uniform(compiled):
    """UNIFORM_WALK, forward (helper fwduniform, ``attn_fwd._selected_item``) and backward: the consumers' block
    loops (``specializations.block_loop_counts``, sm_90 SASS) move at most a tenth as many values from vector to
    uniform registers as the default's (R2UR: the default builds every wgmma descriptor per lane; forward 32-48 per
    loop -> 0-1, backward D64 98 -> 1-5), and their unmasked path is shorter (forward D128 full 507 / 478
    instructions instead of 593 / 564, dense 498 / 470; backward D64 full 442 / 434 instead of 598 / 595). Its spills are not fewer, unlike the backward's: D128 full / causal +40 / +180-200 B per
    thread, per item and in consumer 0's masked branch; fewer with a window or from offsets (bench/NOTES.md "TLX
    block-sparse forward: uniform walk"); the sparse bound (MAX_SPILL_BYTES_SPARSE) holds them."""
    for prefix in ("sparse-fwd-", "sparse-bwd-"):
        for r, base in _uniform_walk_rows(compiled, prefix):
            assert len(r["block_loop_r2ur"]) == len(base["block_loop_r2ur"]) == 2, (r, base)  # one per consumer
            assert 10 * max(r["block_loop_r2ur"]) <= min(base["block_loop_r2ur"]), (r, base)
            assert all(a < b for a, b in zip(r["block_loop_path"], base["block_loop_path"])), (r, base)


def test_backward_v2_takes_its_operands_from_shared_memory(compiled):
    """The default backward kernels (v2 with the dQ split): every wgmma A operand from shared memory, and no
    named-barrier arrives (the consumers meet at full barriers)."""
    for r in compiled:
        if r["name"].startswith("bwd-") and r["name"].endswith("-v2-dqshared"):
            assert r["wgmma_register_a"] == 0, r
            assert r["named_barrier_arrives"] == 0, r


def _check_per_switch(code: str, switch: str, expected) -> None:
    """Run ``code`` in a TLX subprocess once per value of the env var ``switch`` (None: unset) and check the one word
    it prints: ``expected`` = ((value, word), ...)."""
    env = _tlx_env(switch)
    for value, word in expected:
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env=env if value is None else {**env, switch: value})
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split() == [word], (value, proc.stdout)


def test_block_sparse_routing_rules():
    """The block-sparse forward's rules (``configs.sparse_reason``) and its rank in the automatic choice:
    above triton (10) unless JFA_TLX_SPARSE=0 (the default since its GPU check). Needs TLX importable (the subprocess), not a GPU."""
    code = (
        "from jfa_ops.backends.tlx import BACKEND, configs\n"
        "r = configs.sparse_reason\n"
        "assert r(128, 128, 128) is None and r(64, 256, 128) is None and r(128, 256, 512) is None\n"
        "assert 'head_dim' in r(256, 128, 128) and 'head_dim' in r(96, 128, 128)\n"
        "assert 'multiples' in r(128, 64, 128) and 'multiples' in r(128, 128, 64)\n"
        "print(BACKEND.family_priority('block_sparse'))\n"
        "assert BACKEND.family_priority('mxfp8_attention') == (20 if configs.MXFP8_AUTO else 5)  # since its GPU run\n")
    _check_per_switch(code, "JFA_TLX_SPARSE", (("0", "5"), ("1", "20"), (None, "20")))


def test_block_sparse_backward_rules_and_switch():
    """The block-sparse backward's rules (``configs.sparse_backward_reason``: head_dim 64/128, blocks of whole
    64-row query blocks and 128-key tiles) and its switch: on unless JFA_TLX_SPARSE_BWD=0 (since its GPU check).
    Needs TLX importable (the subprocess), not a GPU."""
    code = (
        "from jfa_ops.backends.tlx import configs\n"
        "r = configs.sparse_backward_reason\n"
        "assert r(128, 128, 128) is None and r(64, 64, 128) is None and r(128, 256, 512) is None\n"
        "assert 'head_dim' in r(256, 128, 128) and 'head_dim' in r(96, 128, 128)\n"
        "assert 'multiples' in r(128, 32, 128) and 'multiples' in r(128, 128, 64)\n"
        "h = configs.head_group\n"  # helper sparsebwd2's BACKWARD_HEAD_GROUP: a divisor of the kv heads, 0 = tile-major
        "assert h(16, 4) == 4 and h(16, 3) == 2 and h(16, 16) == 0 and h(16, 0) == 0 and h(2, 4) == 0 and h(6, 4) == 3\n"
        "assert h(16, 1) == 1 and h(1, 1) == 0 and h(16) == 0  # dense: tile-major by default\n"
        "assert h(16, sparse=True) == 2  # block-sparse: groups of 2 since their H200 sweep (bench/NOTES.md v16)\n"
        "assert h(4, sparse=True) == 2 and h(2, sparse=True) == 0 and h(16, 0, sparse=True) == 0 and h(16) == 0\n"
        "assert configs.SPARSE_BACKWARD_UNIFORM_WALK  # on by default (bench/NOTES.md v14)\n"
        "assert configs.BACKWARD_GROUP_ORDER and configs.SPARSE_FORWARD_UNIFORM_WALK  # on since v15\n"
        "print(configs.SPARSE_BACKWARD)\n")
    _check_per_switch(code, "JFA_TLX_SPARSE_BWD", (("0", "False"), ("1", "True"), (None, "True")))


def test_causal_order_kernels_spill_as_the_default(compiled):
    """CAUSAL_ORDER (helper tlxbwdcausal, ``configs.BACKWARD_CAUSAL_ORDER``): the dense backward reading its items
    from a list (ITEM_LIST, one more load per item) under the snake spills what the default kernel of the same
    features spills, within 16 B per thread (sm_90 ptxas at stop 23: D128 causal 184 / 260 both, fp16 causal + left
    window 244 / 320 both, D64 0); head dims below ``configs.CAUSAL_ORDER_MIN_HEAD_DIM`` (D64) never take it, so
    only D128 compiles it (helper causalorder2)."""
    by_name = {r["name"]: r for r in compiled}
    # kvearly rows under the causal order compare with the causal-order kernel in the test below, not here
    # (and peel37's "-kvearly-peel" rows: test_peel_drops_the_ds_guard_from_the_bulk_loop)
    # (and lsedelta40's "-statssmem" rows: test_stats_smem_takes_the_global_loads_off_the_block_loops)
    # (and dkvtma40's "-storetma" rows: test_store_tma_leaves_the_block_loops_as_they_were)
    rows = [r for r in compiled if "-causalorder" in r["name"]
            and not r["name"].endswith(("-kvearly", "-peel", "-statssmem", "-storetma"))]
    assert {int(re.search(r"-d(\d+)-", r["name"]).group(1)) for r in rows} == {128}, "no causal order compiled"
    for r in rows:
        base = by_name[r["name"].replace("-causalorder", "")]
        assert (r["spill_stores"] + r["spill_loads"]
                <= base["spill_stores"] + base["spill_loads"] + 16), (r, base)


def test_kv_early_kernels_spill_as_the_default(compiled):
    """KV_EARLY (helper window31, ``configs.BACKWARD_KV_EARLY``) moves the K/V release before the dK/dV epilogue and
    the epilogue's tiles into the dQ staging buffer: same shared memory, no new spills, the same block loops as the
    kernel without it (sm_90 ptxas, stop 31: D128 full 152 / 200 B both, causal 184 / 260, fp16 causal + left window
    under the causal order 244 / 320, broadcast-Q 140 / 184; D64 0). The block-sparse default's with it (helper
    sparsebwd45, ``configs.SPARSE_BACKWARD_KV_EARLY``): the same shared memory and block loops, spills (stores +
    loads) within + 64 B a thread (stop 45, D128: full 188 / 256 -> 196 / 264, causal 224 / 312 both)."""
    by_name = {r["name"]: r for r in compiled}
    rows = [r for r in compiled if r["name"].endswith("-kvearly")]
    assert len([r for r in rows if not r["name"].startswith("sparse-")]) == 8, [r["name"] for r in rows]
    assert len([r for r in rows if r["name"].startswith("sparse-")]) == 4, [r["name"] for r in rows]
    for r in rows:
        name = r["name"].removesuffix("-kvearly")
        base = by_name.get(name) or by_name[name.removesuffix("-statsahead")]  # D64's default compiles without it
        sparse = r["name"].startswith("sparse-")
        assert r["shared"] == base["shared"], (r, base)
        assert (r["spill_stores"] + r["spill_loads"]
                <= base["spill_stores"] + base["spill_loads"] + (64 if sparse else 0)), (r, base)
        if sparse:
            assert r["block_loop_instructions"] == base["block_loop_instructions"], (r, base)


def test_stats_smem_takes_the_global_loads_off_the_block_loops():
    """STATS_SMEM (helper lsedelta40, ``configs.BACKWARD_STATS_SMEM``): the producer loads each block's lse and delta
    into shared memory by TMA with its Q / dO, so the consumers' block loops issue no global loads (the default: 4
    LDG per block and consumer, lse's waited for inside dP's wgmma issue; D64's with STATS_AHEAD's prefetch), shared
    memory + 1 KiB (lse and delta, 256 B each, per ring slot), the same HGMMA, MUFU and dS guard, straight paths no
    longer, no spill instruction added to a loop path, per-item spills within + 160 B a thread (sm_90 ptxas, stop 40,
    stores / loads: D128 full paths 535 / 516 -> 519 / 507, spills 152 / 200 -> 144 / 184; causal 535 / 518 -> 521 /
    511, 184 / 260 -> 244 / 336, the loop's 3 spill instructions gone; D64 causal 513 / 506 -> 472 / 467, 0)."""
    names, rows = _shipped_and_compiled(
        "-statssmem", "[s.bwd_specialization(d, 'bf16', c, dq_shared=True, kv_early=True, stats_ahead=d <= 64 and not"
        " on, stats_smem=on) for d, c in ((128, False), (128, True), (64, True)) for on in (False, True)]",
        "JFA_TLX_BWD_STATS_SMEM", 6)
    assert sorted(names) == sorted([
        "bwd-d64-bf16-full-v2-dqshared-kvearly-statssmem", "bwd-d64-bf16-causal-v2-dqshared-kvearly-statssmem",
        "bwd-d128-bf16-full-v2-dqshared-kvearly-statssmem", "bwd-d128-bf16-causal-v2-dqshared-kvearly-statssmem",
        "bwd-d128-bf16-causal-v2-dqshared-causalorder-kvearly-statssmem",
        "bwd-d128-fp16-causal-left-v2-dqshared-causalorder-kvearly-statssmem"])
    for base, r in zip(rows[0::2], rows[1::2]):
        assert r["name"] == base["name"].replace("-statsahead", "") + "-statssmem", (base["name"], r["name"])
        assert base["block_loop_path_ldg"] == [4, 4] and r["block_loop_path_ldg"] == [0, 0], (base, r)
        assert r["shared"] == base["shared"] + 1024 <= SM90_SHARED_MEMORY, (base, r)
        for key in ("block_loop_hgmma", "block_loop_mufu", "block_loop_path_fsel"):
            assert r[key] == base[key], (key, base, r)
        assert all(p <= q for p, q in zip(r["block_loop_path"], base["block_loop_path"])), (base, r)
        assert all(p <= q for p, q in zip(r["block_loop_path_spill_ops"], base["block_loop_path_spill_ops"])), r
        assert r["spill_stores"] + r["spill_loads"] <= base["spill_stores"] + base["spill_loads"] + 160, (base, r)


def test_mxfp8_factors_tma_takes_the_global_loads_off_the_block_loops():
    """``configs.MXFP8_FACTORS_TMA`` (helper mxbcast48; on since stop 49): the producer loads each key block's key and
    column factors by TMA with its K and V^T tiles, so the MXFP8 forward's consumer block loops issue no global loads
    (the knob off: 2 LDG a block, the key factors' waited for before the K tile's barrier) and no layout conversion
    through shared memory (off: 2 STS + 3 BAR.SYNC a block; the factors now read by 32 LDS.64 in the accumulator's
    layout);
    shared memory + 3 KiB ((128 + D) x 4 B per ring slot, 3 slots), the same QGMMA and MUFU, straight paths no longer,
    no spill added (sm_90 ptxas, stop 48: broadcast-Q D128 consumer paths 771 / 960 -> 767 / 959, 168 registers,
    0 spills)."""
    names, rows = _shipped_and_compiled(
        "-factorstma", "[s.mxfp8_fwd_specialization(128, c, broadcast_q=b, kv_major=km, factors_tma=on) for c, b, km"
        " in ((False, False, True), (False, True, False), (True, False, False)) for on in (False, True)]",
        "JFA_TLX_MXFP8_FACTORS_TMA", 6)
    assert sorted(names) == sorted(SHIPPED_MXFP8_FORWARD_TMA)
    for base, r in zip(rows[0::2], rows[1::2]):
        assert r["name"] == base["name"] + "-factorstma", (base["name"], r["name"])
        assert all(n == 2 for n in base["block_loop_path_ldg"]) and base["block_loop_path_ldg"], base
        assert r["block_loop_path_ldg"] == [0] * len(base["block_loop_path_ldg"]), r
        assert r["shared"] == base["shared"] + 3 * (128 + 128) * 4 <= SM90_SHARED_MEMORY, (base, r)
        for key in ("qgmma_e4m3_smem_a", "qgmma_e4m3_reg_a", "block_loop_mufu", "block_loop_path_spill_ops"):
            assert r[key] == base[key], (key, base, r)
        assert all(p <= q for p, q in zip(r["block_loop_path"], base["block_loop_path"])), (base, r)
        assert r["spill_stores"] + r["spill_loads"] <= base["spill_stores"] + base["spill_loads"], (base, r)


# Every shipped MXFP8 forward with the default's factors by TMA (qk2 included) and lq from one column
# (configs.MXFP8_ROWSUM_ONE_COLUMN: on since stop 51; MXFP8_PERMUTED_V_KEYS off again since stop 53); the factors by
# loads are shipped for every shape but qk2
SHIPPED_MXFP8_FORWARD_TMA = [name + "-factorstma-onecolumn" for name in (
    "mxfp8-fwd-d64-bf16-full", "mxfp8-fwd-d64-bf16-causal-tilemajor", "mxfp8-fwd-d128-bf16-full",
    "mxfp8-fwd-d128-bf16-causal-tilemajor", "mxfp8-fwd-d128-fp16-causal-left-tilemajor",
    "mxfp8-fwd-d128-bf16-full-bcast-tilemajor", "mxfp8-fwd-d128-fp32-causal-fromoffsets-nofma-tilemajor",
    "mxfp8-fwd-d64-bf16-full-qk2", "mxfp8-fwd-d128-bf16-full-qk2", "mxfp8-fwd-d128-bf16-causal-tilemajor-qk2")]
SHIPPED_MXFP8_FORWARD_LOADS = [name.replace("-factorstma", "") for name in SHIPPED_MXFP8_FORWARD_TMA
                               if "-qk2" not in name]


def test_mxfp8_permuted_v_keys_drops_the_p_layout_conversion():
    """``configs.MXFP8_PERMUTED_V_KEYS`` (helper mxfmul49; on in stops 51-52, off since stop 53, so no shipped
    kernel has it): with V^T's keys in the accumulator's register order and P's columns renamed to it
    (``mxfp8_rebase.p_in_v_key_order``), P enters P V's and the ones' wgmma without Triton's layout conversion:
    per consumer block loop 16 SHFL.IDX + 16 SEL + 16 PRMT fewer (SHFL 28 -> 12, PRMT 32 -> 16: the byte packing
    stays), the straight path >= 40 shorter (sm_90 ptxas, stop 49: D128 dense 766 / 958 -> 718 / 909, causal 766 /
    1091 -> 718 / 1043, D64 693 / 885 -> 645 / 837), the same QGMMA and MUFU, no spill added (0 / 0), the factors
    by TMA (the default) either way (~60 s)."""
    names, rows = _shipped_and_compiled(
        "-permkeys", "[s.mxfp8_fwd_specialization(d, c, kv_major=km, factors_tma=True, permuted_v_keys=on) for d, c, km"
        " in ((128, False, True), (128, True, False), (64, False, True)) for on in (False, True)]",
        "JFA_TLX_MXFP8_PERMUTED_V_KEYS", 6)
    assert names == []  # off by default: no shipped kernel reads permuted keys
    for base, r in zip(rows[0::2], rows[1::2]):
        assert r["name"] == base["name"] + "-permkeys", (base["name"], r["name"])
        for key in ("qgmma_e4m3_smem_a", "qgmma_e4m3_reg_a", "block_loop_mufu", "shared"):
            assert r[key] == base[key], (key, base, r)
        assert len(r["block_loop_path"]) == len(base["block_loop_path"]) == 4, r  # 2 loops per consumer
        assert all(b - n == 16 for n, b in zip(r["block_loop_shfl"], base["block_loop_shfl"])), (base, r)
        assert all(b - n == 16 for n, b in zip(r["block_loop_prmt"], base["block_loop_prmt"])), (base, r)
        assert all(b - n >= 40 for n, b in zip(r["block_loop_path"], base["block_loop_path"])), (base, r)
        assert r["spill_stores"] + r["spill_loads"] <= base["spill_stores"] + base["spill_loads"], (base, r)
        assert not any(r["block_loop_path_spill_ops"]), r


def test_mxfp8_rowsum_one_column_drops_the_row_max():
    """``configs.MXFP8_ROWSUM_ONE_COLUMN`` (helper mxexact50, on since stop 51): lq's block term from one column of
    P x ones (``mxfp8_rebase.first_column``: a reduce whose combine keeps its first operand) instead of ``tl.max``:
    ptxas drops the dead shuffles, so per consumer block loop 4 SHFL.BFLY and 18 FMNMX fewer, the straight path 22
    shorter (sm_90 ptxas, stop 49: D128 dense 766 / 958 -> 744 / 936, causal 766 / 1091 -> 744 / 1069, D64 693 /
    885 -> 671 / 863; with PERMUTED_V_KEYS 718 / 909 -> 696 / 887), the same QGMMA, MUFU, PRMT, registers and
    shared memory, no spill; the factors by TMA (the default) either way (~60 s)."""
    names, rows = _shipped_and_compiled(
        "-onecolumn", "[s.mxfp8_fwd_specialization(d, c, kv_major=km, factors_tma=True, permuted_v_keys=pk,"
        " rowsum_one_column=on) for d, c, km, pk in ((128, False, True, False), (128, True, False, False),"
        " (64, False, True, False), (128, False, True, True)) for on in (False, True)]",
        "JFA_TLX_MXFP8_ROWSUM_ONE_COLUMN", 8)
    assert sorted(names) == sorted(SHIPPED_MXFP8_FORWARD_TMA + SHIPPED_MXFP8_FORWARD_LOADS)  # every shipped one
    for base, r in zip(rows[0::2], rows[1::2]):
        assert r["name"] == base["name"] + "-onecolumn", (base["name"], r["name"])
        for key in ("qgmma_e4m3_smem_a", "qgmma_e4m3_reg_a", "block_loop_mufu", "block_loop_prmt", "shared",
                    "registers"):
            assert r[key] == base[key], (key, base, r)
        assert len(r["block_loop_path"]) == len(base["block_loop_path"]) == 4, r  # 2 loops per consumer
        assert all(b - n == 4 for n, b in zip(r["block_loop_shfl"], base["block_loop_shfl"])), (base, r)
        assert all(b - n == 22 for n, b in zip(r["block_loop_path"], base["block_loop_path"])), (base, r)
        assert r["spill_stores"] + r["spill_loads"] <= base["spill_stores"] + base["spill_loads"], (base, r)
        assert not any(r["block_loop_path_spill_ops"]), r

SPILL_SLACK = 96  # STORE_TMA's per-item spill bytes a thread over the default's (+68 at most here, stop 40)


def test_store_tma_leaves_the_block_loops_as_they_were():
    """STORE_TMA (helper dkvtma40, ``configs.BACKWARD_STORE_TMA``) changes KV_EARLY's dK/dV epilogue only (whole
    half-tiles by one TMA store each from the dQ staging buffer): the consumers' block loops as the default's (same
    straight paths, wgmma, MUFU, spill instructions), shared memory within 16 B, per-item spills within SPILL_SLACK
    bytes a thread (sm_90 ptxas, stop 40, stores / loads: broadcast-Q D128 140 / 184 -> 176 / 216, the most; causal
    184 / 260 -> 208 / 276; D64 0 / 0 both; bench/NOTES.md "helper dkvtma40" has every kernel's)."""
    names, rows = _shipped_and_compiled(
        "-storetma", "[s.bwd_specialization(d, 'bf16', c, broadcast_q=b, dq_shared=True, kv_early=True,"
        " stats_ahead=d <= 64, store_tma=on) for d, c, b in ((128, False, True), (128, True, False), (64, True, False))"
        " for on in (False, True)]", "JFA_TLX_BWD_STORE_TMA", 6)
    names = [n for n in names if n.startswith("bwd-")]  # (the forward's v4 kernels are -storetma too: flip40)
    assert sorted(names) == sorted([
        "bwd-d64-bf16-full-v2-dqshared-statsahead-kvearly-storetma",
        "bwd-d64-bf16-causal-v2-dqshared-statsahead-kvearly-storetma",
        "bwd-d128-bf16-full-v2-dqshared-kvearly-storetma", "bwd-d128-bf16-causal-v2-dqshared-kvearly-storetma",
        "bwd-d128-bf16-causal-v2-dqshared-causalorder-kvearly-storetma",
        "bwd-d128-fp16-causal-left-v2-dqshared-causalorder-kvearly-storetma",
        "bwd-d128-bf16-full-bcast-v2-dqshared-kvearly-storetma",
        "bwd-d128-bf16-causal-fromoffsets-v2-dqshared-kvearly-storetma"])
    for base, r in zip(rows[0::2], rows[1::2]):
        assert r["name"] == base["name"] + "-storetma", (base["name"], r["name"])
        assert base["shared"] <= r["shared"] <= base["shared"] + 16 <= SM90_SHARED_MEMORY, (base, r)
        for key in ("block_loop_hgmma", "block_loop_mufu", "block_loop_path_fsel"):
            assert r[key] == base[key], (key, base, r)
        for key in ("block_loop_path", "block_loop_path_spill_ops"):  # no longer (the epilogue's test as written
            # ``k0 + HALF_N <= len_k`` made ptxas build the causal mask by 36 PLOP3: consumer 1's path 518 -> 554)
            assert all(p <= q for p, q in zip(r[key], base[key])), (key, base, r)
        assert r["spill_stores"] + r["spill_loads"] <= base["spill_stores"] + base["spill_loads"] + SPILL_SLACK, r


def _shipped_and_compiled(name_part: str, specs: str, unset: str, expect: int) -> tuple:
    """In a TLX subprocess (env ``unset`` removed): the names of the shipped specializations containing
    ``name_part``, and the sm_90 rows (``compile_sm90`` with loop counts, each in a fresh cache so ptxas runs) of
    ``specs``, a Python expression over ``s`` (the specializations module) giving ``expect`` of them."""
    code = ("import _utlx_autoregister, json, tempfile\n"
            "import triton\n"
            "from jfa_ops.backends.tlx import specializations as s\n"
            "triton.knobs.nvidia.dump_ptxas_log = True\n"
            f"print(json.dumps([sp.name for sp in s.shipped_specializations() if {name_part!r} in sp.name]))\n"
            f"for sp in {specs}:\n"
            "    with tempfile.TemporaryDirectory() as cache:\n"
            "        triton.knobs.cache.dir = cache\n"
            "        print(json.dumps(s.compile_sm90(sp, loop_counts=True)))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env=_tlx_env(unset))
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(lines) == 1 + expect, proc.stderr[-3000:]
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def _compile_matching(name_part: str, expect: int, timeout: int) -> list:
    """tools/tlx_compile.py's sm_90 rows (one core) for the specializations, shipped or not, whose names contain
    ``name_part``; exactly ``expect`` of them."""
    env = _tlx_env()
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "tlx_compile.py"), "--jobs", "1", name_part],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == expect, f"exit {proc.returncode}: {[r['name'] for r in rows]}\n{proc.stderr[-3000:]}"
    return rows


def test_mxfp8_ablations_remove_only_their_stage():
    """The MXFP8 forward's ablations (``configs.MXFP8_ABLATION_RUNS``, TIMING ONLY: wrong results; not shipped, so
    the ``compiled`` fixture skips them), dense D128: each compiles without spills and keeps S's wgmma (smem-A QGMMA:
    4 per block loop, 4 loops; a stage whose output nothing reads is dropped as dead code, which would time another
    kernel), and drops P V's / the ones wgmma (register-A QGMMA, 4 each per loop) only where asked (~30 s)."""
    rows = _compile_matching("mxfp8-fwd-d128-bf16-full-ablate", expect=9, timeout=900)
    for r in rows:
        assert "error" not in r, r
        assert r["spill_stores"] + r["spill_loads"] == 0, r
        assert r["qgmma_e4m3_smem_a"] == 16, f"{r['name']}: S's wgmma dropped"
        stages = r["name"].split("-ablate-")[1].split("-")
        assert r["qgmma_e4m3_reg_a"] == 16 * (("pv" not in stages) + ("rowsum" not in stages)), r


def test_shipped_kernels_carry_no_ablation():
    """No shipped specialization (what CI compiles and the backend launches) removes a stage: ABLATE 0 in every
    backward and MXFP8 forward kernel, SPARSE_ABLATE 0 in every block-sparse forward, no "-ablate" name; the
    ablations are listed apart (``backward_ablation_specializations``, ``mxfp8_ablation_specializations``,
    ``sparse_ablation_specializations``); FIRST_UNMASKED on exactly the causal and windowed block-sparse forwards
    (``configs.SPARSE_FORWARD_FIRST_UNMASKED`` "masked", stop 57), the other setting listed apart. Needs TLX
    importable (the subprocess), not a GPU."""
    code = (
        "import _utlx_autoregister\n"
        "from jfa_ops.backends.tlx import specializations as s\n"
        "shipped = list(s.shipped_specializations())\n"
        "assert all(sp.constexprs.get('ABLATE', 0) == 0 and sp.constexprs.get('SPARSE_ABLATE', 0) == 0\n"
        "           and '-ablate' not in sp.name for sp in shipped)\n"
        "assert sum(sp.kernel == 'attn_bwd_tlx_kernel' for sp in shipped) > 0\n"
        "assert all(sp.constexprs['ABLATE'] for sp in s.backward_ablation_specializations())\n"
        "assert all(sp.constexprs['SPARSE_ABLATE'] == 1 for sp in s.sparse_ablation_specializations())\n"
        "assert not any(sp.constexprs.get('SPARSE_PEEL', False) for sp in shipped)\n"
        "first = {sp.name: sp.constexprs.get('FIRST_UNMASKED', False) for sp in shipped}\n"
        "masked = lambda sp: sp.constexprs['HAS_RIGHT'] or sp.constexprs['HAS_LEFT']\n"
        "assert all(first[sp.name] == (sp.kernel == 'attn_fwd_tlx_kernel' and sp.constexprs['SPARSE'] and masked(sp))\n"
        "           for sp in shipped)\n"
        "assert all(sp.constexprs['FIRST_UNMASKED'] != masked(sp) and sp.constexprs['SPARSE_ABLATE'] == 0\n"
        "           and sp.name not in first for sp in s.sparse_first_unmasked_specializations())\n"
        "print('ok')\n")
    env = _tlx_env("JFA_TLX_BWD_ABLATE", "JFA_TLX_MXFP8_ABLATE", "JFA_TLX_SPARSE_FWD_FIRST_UNMASKED")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=env)
    assert proc.returncode == 0 and proc.stdout.split() == ["ok"], proc.stderr[-3000:]


def test_backward_ablations_remove_only_their_stage():
    """The TLX backward's ablations (``configs.BACKWARD_ABLATION_RUNS``, TIMING ONLY: wrong gradients; not shipped, so
    the ``compiled`` fixture skips them; helper bwdablate), dense D128: each compiles within the default's spill
    budget, and each consumer's block loop keeps S's and dP's wgmma (8 HGMMA each; a stage whose output nothing reads
    is dropped as dead code, which would time another kernel) and loses only the asked-for ones (dQ 8, dK 4, dV 4:
    32 in the shipped loop; dqadd keeps dQ's; sdphalf runs S and dP over half of head_dim: 4 k-steps each, not 8)
    and, with exp2, the 32 MUFU per thread. The MXFP8 stand-ins (helper mxbwd): mxquant adds the rounding of P and
    dS to MXFP8 values, 192-320 instructions on each consumer loop's path (sm_90 ptxas at stop 26: sdphalf's 511 /
    494 -> 769 / 773 with mxquant; the shipped 535 / 516 -> 791 / 797), no spill instruction on it; dkvstore (helper
    bcastbwd39: the item's dK/dV stores skipped) keeps every loop's wgmma: dK and dV are kept alive (~75 s)."""
    rows = _compile_matching("bwd-d128-bf16-full-v2-dqshared-ablate", expect=15, timeout=1200)
    by_stages = {}
    for r in rows:
        assert "error" not in r, r
        assert r["spill_stores"] + r["spill_loads"] <= MAX_SPILL_BYTES_BWD_V2[128], r
        stages = r["name"].split("-ablate-")[1].split("-")
        by_stages[tuple(stages)] = r
        hgmma = (32 - 8 * ("dq" in stages) - 4 * ("dk" in stages) - 4 * ("dv" in stages)
                 - 8 * ("sdphalf" in stages))
        assert r["block_loop_hgmma"] == [hgmma, hgmma], r
        assert r["block_loop_mufu"] == [0 if "exp2" in stages else 32] * 2, r
    base, quantized = by_stages[("sdphalf",)], by_stages[("mxquant", "sdphalf")]
    added = [q - b for q, b in zip(quantized["block_loop_path"], base["block_loop_path"])]
    assert all(192 <= a <= 320 for a in added), (added, quantized, base)
    assert by_stages[("mxquant",)]["block_loop_path_spill_ops"] == quantized["block_loop_path_spill_ops"] == [0, 0]


def test_design_a_promotion_does_not_fit_the_registers():
    """The MXFP8 backward's design (A) (all five GEMMs FP8), its register stand-in (helper mxbcast48: the ``promote``
    ablation bit on ``mxquant,sdphalf``, dV and dK each into a fresh accumulator per query block folded by an FFMA,
    the promotion FP8 dV/dK need): it compiles with the same wgmma as (B)'s stand-in, and ptxas spills it: > 1.5 KB
    a thread and >= 100 local-memory instructions on each consumer loop's straight path, where (B) has none (sm_90
    ptxas, stop 48: 1,928 + 2,008 B, 162 / 158 against 172 + 228 B, 0 / 0). (A) is excluded by this compile, not
    only by bench/NOTES.md's count (276 > 240 registers)."""
    names, rows = _shipped_and_compiled(
        "-ablate-", "[s.bwd_specialization(128, 'bf16', False, dq_shared=True, ablate=s.backward_ablation_mask(n))"
        " for n in ('mxquant,sdphalf', 'mxquant,sdphalf,promote')]", "JFA_TLX_BWD_ABLATE", 2)
    assert not names  # ablations are never shipped
    b, a = rows
    assert a["name"].endswith("-ablate-mxquant-sdphalf-promote") and a["block_loop_hgmma"] == b["block_loop_hgmma"]
    assert b["block_loop_path_spill_ops"] == [0, 0], b
    assert all(n >= 100 for n in a["block_loop_path_spill_ops"]), a
    assert a["spill_stores"] > 1500 and a["spill_stores"] > 4 * b["spill_stores"], (a, b)


# The MXFP8 backward's kernels (design (D), helper mxbwdd, stop 27; on by default since stop 28;
# ``specializations.mxfp8_backward_specializations``) against the ``mxquant`` ablation kernel of the same features,
# whose roundings they carry (sm_90 ptxas at stop 26-27): spill bytes, stores + loads (mxquant D128 full 204 + 268,
# causal 180 + 256; MXFP8 full 188 + 244, causal 188 + 264: per work item, not on the block loops' straight path),
# and the block-loop path (mxquant 791 / 797 full, 818 / 796 causal; MXFP8 + the clamp's 32 FMNMX per thread and the
# masked-tile test: 848 / 829, 853 / 830).
MXFP8_BWD_ABLATION_SPILLS = {"full": 204 + 268, "causal": 180 + 256}
MXFP8_BWD_ABLATION_PATH = {"full": [791, 797], "causal": [818, 796]}


def test_mxfp8_backward_kernels_compile_within_the_ablation_budget():
    """The MXFP8 backward's kernels (the TLX backward with MXFP8: P clamped to <= 1, P and dS rounded to MXFP8
    values; on by default, compiled here rather than in the ``compiled`` fixture's shipped list, once): each
    compiles within sm_90's shared memory (the default's 213,384 B at D128), at the default's 168 registers, within
    32 spill bytes per thread of the ``mxquant`` ablation kernel (D128 full / causal; D64 0), with no more spill
    instructions on its block loops' straight path than the default kernel (D128 full 1 / 0, causal 2 / 0), the
    default's wgmma and MUFU per loop, and at D128 the ablation's path + 24..64 instructions (the clamp's 32; ~60 s)."""
    rows = {r["name"]: r for r in _compile_matching("-mxfp8", expect=5, timeout=1200)}
    for name, r in rows.items():
        assert "error" not in r, r
        assert r["shared"] <= SM90_SHARED_MEMORY and r["registers"] == 168, r
        assert r["block_loop_path_spill_ops"][0] <= 2 and r["block_loop_path_spill_ops"][1] == 0, r
        assert r["block_loop_mufu"] == [32, 32], r
        head_dim = int(re.search(r"-d(\d+)-", name).group(1))
        assert r["block_loop_hgmma"] == [32 if head_dim == 128 else 24] * 2, r
        spills = r["spill_stores"] + r["spill_loads"]
        if head_dim == 64:
            assert spills == 0, r
            continue
        kind = "full" if "-full" in name else "causal"
        assert spills <= MXFP8_BWD_ABLATION_SPILLS[kind] + 32, r  # broadcast-Q: 196 + 264
        if "-bcast" not in name:
            added = [p - a for p, a in zip(r["block_loop_path"], MXFP8_BWD_ABLATION_PATH[kind])]
            assert all(24 <= a <= 64 for a in added), (added, r)
    assert {"bwd-d128-bf16-full-v2-dqshared-mxfp8", "bwd-d128-bf16-causal-v2-dqshared-causalorder-mxfp8"} <= set(rows)


def test_peel_drops_the_ds_guard_from_the_bulk_loop():
    """PEEL (helper peel37, ``configs.BACKWARD_PEEL``): the v2 consumers' block loop peeled per stage. The default
    D128 kernels (KV_EARLY, as shipped) have one block loop per consumer whose straight path issues the masked
    blocks' dS guard (34 FSEL per thread, if-converted, and as many FSETP); with PEEL each consumer has a bulk loop
    (the one with the fewest FSEL: at most 2, the lse -inf guard) and one masked loop (full: the tail; causal,
    windowed: the lead and the tail in one loop taken twice), the bulk's path >= 40 instructions shorter than the
    default loop's, with its wgmma and MUFU and no more spill instructions; the same shared memory, spills within
    320 B per thread of the default's (sm_90 ptxas at stop 37: full 352 -> 444, causal 444 -> 608, fp16 causal +
    left window 564 -> 660: per work item; bench/NOTES.md "helper peel37").
    Also: the shipped peel kernels are listed. ~60 s."""
    kinds = "(dict(), dict(causal=True), dict(causal=True, has_left=True, dtype='fp16'))"
    names, rows = _shipped_and_compiled(
        "-peel", "[s.bwd_specialization(128, kw.pop('dtype', 'bf16'), kw.pop('causal', False), "
        "dq_shared=True, kv_early=True, peel=peel, **kw) for kw0 in " + kinds + " for peel in (False, True) "
        "for kw in [dict(kw0)]]", "JFA_TLX_BWD_PEEL", 6)
    assert sorted(names) == sorted([
        "bwd-d64-bf16-full-v2-dqshared-statsahead-kvearly-peel",
        "bwd-d64-bf16-causal-v2-dqshared-statsahead-kvearly-peel",
        "bwd-d128-bf16-full-v2-dqshared-kvearly-peel", "bwd-d128-bf16-causal-v2-dqshared-kvearly-peel",
        "bwd-d128-bf16-causal-v2-dqshared-causalorder-kvearly-peel",
        "bwd-d128-fp16-causal-left-v2-dqshared-causalorder-kvearly-peel"])
    for base, peel in zip(rows[0::2], rows[1::2]):
        assert peel["name"] == base["name"] + "-peel", (base["name"], peel["name"])
        assert len(base["block_loop_path"]) == 2 and base["block_loop_path_fsel"] == [34, 34], base
        assert len(peel["block_loop_path"]) == 4, peel  # per consumer: the masked loop and the bulk loop
        assert peel["shared"] == base["shared"], (base, peel)
        assert (peel["spill_stores"] + peel["spill_loads"]
                <= base["spill_stores"] + base["spill_loads"] + 320), (base, peel)
        for c in range(2):
            loops = range(2 * c, 2 * c + 2)
            bulk = min(loops, key=lambda i: peel["block_loop_path_fsel"][i])
            assert peel["block_loop_path_fsel"][bulk] <= 2, peel
            assert peel["block_loop_path"][bulk] <= base["block_loop_path"][c] - 40, (c, base, peel)
            for key in ("block_loop_hgmma", "block_loop_mufu"):
                assert peel[key][bulk] == base[key][c], (key, c, base, peel)
            assert peel["block_loop_path_spill_ops"][bulk] <= base["block_loop_path_spill_ops"][c], (c, base, peel)


def test_forward_store_tma_drops_the_epilogue_conversion():
    """configs.FORWARD_STORE_TMA (helper item39, bench/NOTES.md "item39"; on by default since stop 40): out through
    the consumer's Q slot and one TMA store. The off switch's kernels (``store_tma_off_specializations``: the bench's
    dense D128 kernel, D128 causal (tile-major), D64 causal (zigzag) and the block-sparse causal kernel; not shipped,
    so compiled here) against their shipped "-storetma" twins: the compiler's layout-conversion scratch goes (shared
    memory -15,872 B at D128: 213,128 -> 197,256; -15,872 at D64: 147,648 -> 131,776), the consumers' block loops keep
    their HGMMA, MUFU and wgmma overlap with no spill instruction on their straight path and the path within 3 of the
    off kernel's (sm_90 at stop 39: [497, 470] vs [498, 470]; within 4 on the block-sparse causal kernel with
    FIRST_UNMASKED, the default since stop 57: [504, 482] vs [504, 478], and its spills 12 B over the off kernel's,
    244 vs 232: 16 allowed there); spills no more than the off kernel's on the unmasked
    and the block-sparse kernels (D128 40 -> 16/28 B stores/loads, sparse causal 156/180 -> 92/112), and within 80 B
    more on the masked dense ones (D128 causal 32/44 -> 52/96: consumer 0's masked branch, 6 spill instructions per
    masked block; D64 none). ~3 min."""
    names, rows = _shipped_and_compiled(
        "-storetma", "[sp for pair in zip(s.store_tma_off_specializations(), (s.fwd_specialization(**kw) for kw in"
        " s.STORE_TMA_OFF_CASES)) for sp in pair]", "JFA_TLX_FWD_STORE_TMA", 8)  # (off, as launched by default)
    for base, r in zip(rows[0::2], rows[1::2]):
        assert "-storetma" not in base["name"] and base["name"] not in names, base["name"]  # the off kernel
        assert r["name"] == base["name"].replace("-oneloop", "-oneloop-storetma") and r["name"] in names, r["name"]
        assert r["shared"] <= base["shared"] - 15 * 1024 and r["shared"] <= SM90_SHARED_MEMORY, (base, r)
        assert r["wgmma_overlap"], r["name"]
        for key in ("block_loop_hgmma", "block_loop_mufu"):
            assert r[key] == base[key], (key, base, r)
        assert r["block_loop_path_spill_ops"] == [0, 0], r
        slack = 4 if "-firstunmasked" in r["name"] else 3
        assert all(p - b <= slack for b, p in zip(base["block_loop_path"], r["block_loop_path"])), (base, r)
        spills, base_spills = r["spill_stores"] + r["spill_loads"], base["spill_stores"] + base["spill_loads"]
        masked_dense = "-causal-" in r["name"] and not r["name"].startswith("sparse-")
        assert spills <= base_spills + (80 if masked_dense else 16 if "-firstunmasked" in r["name"] else 0), (base, r)


def test_forward_store_tma_switch():
    """configs.FORWARD_STORE_TMA: on unless JFA_TLX_FWD_STORE_TMA=0 (since its H200 timing, stop 40), and the shipped
    list follows it (the v4 kernels "-storetma" only while on; v3 never). Needs TLX importable, not a GPU."""
    code = (
        "import _utlx_autoregister\nfrom jfa_ops.backends.tlx import configs, specializations as s\n"
        "names = [sp.name for sp in s.shipped_specializations() if 'fwd-' in sp.name and 'mxfp8' not in sp.name]\n"
        "v4 = [n for n in names if '-oneloop' in n]\n"
        "assert v4 and all(('-storetma' in n) == configs.FORWARD_STORE_TMA for n in v4), v4\n"
        "assert not any('-storetma' in n for n in names if n not in v4), names\n"
        "print(configs.FORWARD_STORE_TMA)\n")
    _check_per_switch(code, "JFA_TLX_FWD_STORE_TMA", (("0", "False"), ("1", "True"), (None, "True")))


def test_gqa_split_kernels_add_partials_from_registers():
    """GROUP_SPLIT (helper gqabwd, ``configs.BACKWARD_GQA_SPLIT``): the D128 causal kernel with the q-head groups in
    4 parts (with the snake, as the backend launches it; and without) fits the default's shared memory and spills (the partial
    dK/dV go out as 256 relaxed fp32 ``red`` per consumer pair, 2 x 64 per thread, straight from the accumulators:
    ``tl.atomic_add`` took 64 KiB of shared memory for a layout change, 278,600 B in all), and keeps the default's
    block loop (its HGMMA and MUFU; the path within 16 instructions of the default's: +7 / +10 at stop 25). The
    shipped split kernels are the snake's (D128, and D64 since helper gqarule's rule splits D64 calls). ~30 s."""
    names, (default, *split) = _shipped_and_compiled(
        "-split", "[s.bwd_specialization(128, 'bf16', True, dq_shared=True, **kw)"
        " for kw in (dict(), dict(group_split=4), dict(group_split=4, item_order=True))]", "JFA_TLX_BWD_GQA_SPLIT", 3)
    assert sorted(names) == ["bwd-d128-bf16-causal-v2-dqshared-itemorder-split4",
                             "bwd-d64-bf16-causal-v2-dqshared-statsahead-itemorder-split4"]  # gqarule's D64
    assert "red_f32" not in default
    for r in split:
        assert r["shared"] == default["shared"] <= SM90_SHARED_MEMORY, r
        assert r["spill_stores"] + r["spill_loads"] <= default["spill_stores"] + default["spill_loads"] + 16, r
        assert r["red_f32"] == 256, r
        for key in ("block_loop_hgmma", "block_loop_mufu"):
            assert r[key] == default[key], (key, default, r)
        assert all(p - b <= 16 for b, p in zip(default["block_loop_path"], r["block_loop_path"])), (default, r)


_LATE_IMPORT = r"""
import json
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def fill(X, N: tl.constexpr):
    tl.store(X + tl.arange(0, N), tl.arange(0, N).to(tl.float32))


def compiles(n):
    try:
        triton.compile(ASTSource(fn=fill, signature={"X": "*fp32", "N": "constexpr"}, constexprs={"N": n}),
                       target=GPUTarget("cuda", 90, 32))
        return "ok"
    except Exception as e:
        return f"{type(e).__name__}: {e}"[:300]


before = compiles(16)
from jfa_ops.backends import tlx
print(json.dumps({"before": before, "reason": tlx._import_reason(), "after": compiles(32)}))
"""


def test_tlx_declined_not_imported_when_triton_loaded_first(tmp_path):
    """A process that imported triton before the uTLX plugin registered (a ``pip install --target`` runs no .pth):
    the tlx backend declines with the reason, and triton still compiles. Importing TLX there failed and left every
    later triton compile raising (the H200's fresh-process model rows of 2026-12-03, bench/NOTES.md v20), the
    triton backend's kernels included."""
    script = tmp_path / "late_import.py"  # @triton.jit needs its source in a file
    script.write_text(_LATE_IMPORT)
    env = _tlx_env("TRITON_PLUGIN_PATHS", "UTLX_NO_AUTOREGISTER")
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["before"] == "ok" and result["after"] == "ok", result
    assert "before triton was imported" in result["reason"], result
