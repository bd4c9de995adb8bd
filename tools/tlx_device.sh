#!/usr/bin/env bash
# GPU check of the tlx backend on the lent H200:
# `bash tools/tlx_device.sh [all|tests|correctness|timing|v4|zigzag|backward|backward-timing|sparse|sparse-ablation|sparse-bwd|
# mxfp8|mxfp8-qk2|host|bench|mxfp8-bench|suite|tcache|env]`
# (`backward`: the TLX backward's sweep vs the oracle, the default (v2 without the dQ split too with
# BWD_BASELINES=1), <= 4 min;
# `backward-timing`: its TFLOP/s, columns triton / default (v2 + dQ split) / statsahead / causalorder,
# <= 4 min; TLX_BWD_TIMING_COLS=a,b: those experiments only)
# from the repo root, carrying .t38 (built by ../shared/device/tlx-triton38.sh: Triton 3.8 + triton-utlx; ~52 MB).
# Unpacks it into /tmp/t38 once per warm machine, then runs tools/tlx_check.py: `all` = correctness (sweep vs the
# float64 oracle), timing (forward, tlx vs triton), backward (the TLX backward's sweeps, see above) and its timings,
# each under its own limit (120 + 100 + 2 x 115 + 230 s), so a hung kernel ends one part.
# `v4`: the sweep with the forward's v4 consumers (JFA_TLX_FWD_ONE_LOOP=1), then the timings (v3, v4, triton
# columns). `bench` (not in `all`): the bench with a tlx column through bench/device_run.sh (FA4 beside it when an
# earlier call left it in /tmp/fa4; BENCH_ARGS overrides its arguments, BENCH_LIMIT_S its 170 s limit). `suite`
# (not in `all`; carry .whl too): the whole GPU test suite with the automatic choice preferring tlx
# (tools/device_tests.sh, $SUITE_SHARDS shards, 8).
# `mxfp8-bench` (not in `all`): issue 12's bench run, every row in one process (its branch below says what).
# `sparse` (not in `all`): the block-sparse forward (SPARSE): its sweep vs the float64 oracle in the zigzag order with
# the producer's walk one item ahead (JFA_TLX_SPARSE_FWD_ZIGZAG=1, JFA_TLX_SPARSE_FWD_WALK_AHEAD=1: helper
# sparsefwd's knobs; SPARSE_FWD_ZIGZAG=0 / SPARSE_FWD_WALK_AHEAD=0: the default's; 120 s), then timings on the
# bench's sparse batch: the default, each knob and both, the other static striding, triton sparse, tlx dense
# (150 s); FlexAttention given the same blocks with TLX_SPARSE_FLEX=1 (Inductor under triton 3.8 failed to
# compile it in v12, after a while). TLX_SPARSE_TESTS=1 (carry .whl): first the GPU tests that compare the zigzag
# order, the walk ahead and the uniform walk with the default bit for bit (120 s).
# `sparse-ablation` (not in `all`; helper sparse38): tools/tlx_check.py sparse-ablation, where the bench's causal
# sparse rows lose time (the walk ahead off / on, the masked branch never taken, the lowest blocks selected: TIMING
# ONLY; interleaved rounds; SPARSE_ABLATION_S, 300 s).
# `sparse-bwd` (not in `all`): the TLX block-sparse backward (JFA_TLX_SPARSE_BWD's switch set in-process): its sweep
# vs the float64 oracle with helper sparsebwd2's experiments on (uniform walk, Q/dO first, item order; 130 s;
# SPARSE_BWD_GROUP_ORDER=1: uniform walk and helper hgorder's group order instead), then backward timings on the
# bench's sparse batch: the default, the experiments, the TLX dense backward (170 s).
# `mxfp8` (not in `all`): the TLX MXFP8 forward (issue 12, mxfp8_attention(..., backend="tlx")): its sweep vs the
# float64 MXFP8 oracle (150 s; the oracle's float64 P round trips take a while at S4096), then TFLOP/s on dense B8 S4096
# D128 and broadcast-Q Lq128 H4 B512 beside triton-mxfp8 (bf16smem) and our bf16 tlx / triton (100 s); bf16 inputs
# through the fused quantize (checked equal to the two passes) and the two passes. TLX_MXFP8_TESTS=1 (carry .whl):
# the fused quantize's GPU tests first (60 s). `mxfp8-qk2`: the same sweep and timings with JFA_TLX_MXFP8_QK_CHUNKS=2.
# `zigzag` (not in `all`): the forward's work order of helper tlxcausal (configs.FORWARD_ZIGZAG): the correctness
# sweep with JFA_TLX_FWD_ZIGZAG=1 (its "waves:" cases exceed one wave of programs, where the order applies; 150 s),
# then `order-timing`: TFLOP/s default vs zigzag (and TLX_ZIGZAG_GROUPS=a,b: fixed head groups) vs triton on the
# bench's quick dense/jagged rows, GQA, broadcast-Q, a window, D64 (330 s; none when a sweep case failed).
# TLX_ZIGZAG_TESTS=1 (carry .whl): first the GPU tests that compare zigzag with the default bit for bit (120 s).
# Optional: TLX_GPU_TESTS=1 also runs the GPU test files that cover tlx (pytest -m gpu).
# `env`: only the setup, then the exports a later command of the same call needs, on stdout (the rest on stderr):
# `eval "$(bash tools/tlx_device.sh env)"; python3 tools/tlx_check.py ...` (Triton 3.8 + TLX on the path, the file
# cache at /tmp/tcache, the compile manifest under $OUT: what every part below gets).
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
if [ "$part" = env ]; then exec 3>&1 1>&2; fi
# helper tcache42: Triton's file cache at a fixed path (its group files name their entries by absolute path), filled
# first from a carried .tcache/tcache.tar.xz that tools/triton_cache_pack.py built on CPU from earlier calls'
# $OUT/triton_manifest.jsonl (every kernel the JIT compiles is appended there: tools/t38_site/sitecustomize.py).
# `tcache`: only that unpack, for a call of its own (.tcache with .t38 is over one call's 64 MiB carry);
# TCACHE_FRESH=1: the cache emptied first (a hit test on a warm machine, whose earlier calls filled it).
export TRITON_CACHE_DIR=/tmp/tcache
[ "${TCACHE_FRESH:-0}" = 1 ] && rm -rf /tmp/tcache /tmp/tcache.carried
mkdir -p /tmp/tcache
if [ -f .tcache/tcache.tar.xz ]; then
  tar xJf .tcache/tcache.tar.xz -C /tmp/tcache && ls /tmp/tcache > /tmp/tcache.carried &&
    echo "tcache: $(wc -l < /tmp/tcache.carried) entries unpacked into /tmp/tcache"
fi
[ "$part" = tcache ] && exit 0
export JFA_TRITON_MANIFEST=${JFA_TRITON_MANIFEST:-${OUT:+$OUT/triton_manifest.jsonl}}
if [ ! -d /tmp/t38/triton/_C ]; then
  mkdir -p /tmp/t38 && tar xJf .t38/triton38.tar.xz -C /tmp/t38 &&
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/t38 .t38/triton_utlx-*.whl || exit 2
fi
# the plugin's .pth in every interpreter that has /tmp/t38 on its path, Inductor's compile workers too
cp tools/t38_site/sitecustomize.py /tmp/t38/
export PYTHONPATH=/tmp/t38:$PWD:${PYTHONPATH:-}
timeout -k 10 120 python3 -c "import _utlx_autoregister, triton, triton.language.extra.tlx
print('triton', triton.__version__, 'TLX')"
if [ "$part" = env ]; then
  printf 'export PYTHONPATH=%q TRITON_CACHE_DIR=%q JFA_TRITON_MANIFEST=%q\n' "$PYTHONPATH" "$TRITON_CACHE_DIR" \
    "${JFA_TRITON_MANIFEST:-}" >&3
  exit 0
fi
rc=0
# every step under a limit; SIGKILL 10 s after the SIGTERM (a process stuck in a kernel may not stop on SIGTERM)
limit="timeout -k 10"
gpu_tests() {  # tests/backends/test_tlx_gpu.py's GPU tests matching -k "$1" (120 s; carry .whl: expecttest)
  $limit 120 python3 -c "import _utlx_autoregister, sys, pytest; sys.exit(pytest.main(['-q', '-m', 'gpu',
    '-p', 'no:cacheprovider', 'tests/backends/test_tlx_gpu.py', '-k', '$1']))"
}
if [ "$part" = tests ]; then  # GPU test groups, each in a process of its own (carry .whl too): a crash (a sticky CUDA
  # error) or a hang then costs its group only (stop 42 lost a call to one knob's illegal instruction failing 99 tests
  # after it). TLX_TEST_GROUPS: pytest -k expressions separated by ';'; TLX_TEST_FILES: the files (default the TLX GPU
  # tests and test_autocast.py); TLX_TEST_S: each group's limit (150 s: first-use compiles are most of it). Each
  # group's log goes to $OUT/tests_<n>.log with -rfE's failure list, so a group cut short still names what ran.
  n=0
  IFS=';' read -r -a groups <<< "${TLX_TEST_GROUPS:?set TLX_TEST_GROUPS to -k expressions separated by ;}"
  for group in "${groups[@]}"; do
    n=$((n + 1))
    log="${OUT:-/tmp}/tests_$n.log"
    group_start=$SECONDS
    # shellcheck disable=SC2086
    JFA_LAUNCH_VERIFY=1 $limit "${TLX_TEST_S:-150}" python3 -c "import _utlx_autoregister, sys, pytest
sys.exit(pytest.main(['-v', '-m', 'gpu', '-p', 'no:cacheprovider', '--tb=short', '-rfE', *sys.argv[2].split(),
                      '-k', sys.argv[1]]))" "$group" "${TLX_TEST_FILES:-tests/backends/test_tlx_gpu.py tests/test_autocast.py}" > "$log" 2>&1
    r=$?
    [ $r -eq 0 ] || rc=1
    echo "tests group $n (rc $r): $group :: $(grep -cE ' PASSED' "$log") passed, $(grep -cE ' FAILED| ERROR' "$log") failed/errors, $(grep -cE ' SKIPPED' "$log") skipped, $((SECONDS - group_start)) s"
    grep -E '^(FAILED|ERROR) ' "$log" | head -20
  done
fi
if [ "$part" = all ] || [ "$part" = correctness ]; then
  JFA_LAUNCH_VERIFY=1 $limit 120 python3 tools/tlx_check.py correctness || rc=1
fi
v4_ok=1
if [ "$part" = v4 ]; then  # the forward's v4 consumers (configs.ONE_LOOP): their sweep, then v3 / v4 / triton timings
  JFA_TLX_FWD_ONE_LOOP=1 JFA_LAUNCH_VERIFY=1 $limit 110 python3 tools/tlx_check.py correctness
  r=$?  # 1: a case failed or hung (then no v4 timings); 124: out of its time (v4 still timed)
  if [ $r -ne 0 ]; then rc=1; [ $r -eq 124 ] || v4_ok=0; fi
fi
if [ "$part" = zigzag ]; then  # helper tlxcausal's work order: its sweep, then default / zigzag / triton timings
  if [ "${TLX_ZIGZAG_TESTS:-0}" = 1 ]; then  # carry .whl (expecttest): zigzag == default bit for bit (GPU tests)
    gpu_tests zigzag || rc=1
  fi
  JFA_TLX_FWD_ZIGZAG=1 JFA_LAUNCH_VERIFY=1 $limit 150 python3 tools/tlx_check.py correctness
  r=$?  # 1: a case failed or hung (then no timings); 124: out of its time (timed still)
  [ $r -eq 0 ] || rc=1
  if [ $r -eq 0 ] || [ $r -eq 124 ]; then
    $limit 330 python3 tools/tlx_check.py order-timing || rc=1
  fi
fi
if [ "$part" = all ] || [ "$part" = timing ] || [ "$part" = v4 ]; then
  TLX_TIMING_V4=$v4_ok $limit 100 python3 tools/tlx_check.py timing || rc=1
fi
if [ "$part" = all ] || [ "$part" = backward ]; then  # the TLX backward's sweeps: v2 without the dQ split
  # (BWD_BASELINES=1; passed on 2026-12-02), then v2 with dQ split between the consumers (the default), <= 4 min
  if [ "${BWD_BASELINES:-0}" = 1 ]; then
    $limit 130 python3 tools/tlx_check.py backward-v2 || rc=1
  fi
  $limit 130 python3 tools/tlx_check.py backward-v2-dqshared || rc=1
fi
if [ "$part" = suite ]; then  # issue 10's full GPU suite with tlx: every GPU test under the default automatic choice
  # (JFA_TLX_AUTO=1: its size rule follows TMA_MIN_ROWS, which tests/conftest.py lowers to 0, so every eager call tlx
  # runs takes it; traced calls trace triton). SUITE_TLX_AUTO=always: traced calls too (tlx as an opaque op).
  # Carry .whl too (expecttest). SUITE_ARGS: extra pytest args.
  # shellcheck disable=SC2086
  PYTEST_PRELOAD=_utlx_autoregister JFA_TLX_AUTO=${SUITE_TLX_AUTO:-1} JFA_LAUNCH_VERIFY=1 \
    SHARD_TIMEOUT_S=${SHARD_TIMEOUT_S:-240} bash tools/device_tests.sh ${SUITE_SHARDS:-8} ${SUITE_ARGS:-} || rc=1
fi
if [ "$part" = all ] || [ "$part" = backward-timing ]; then  # TFLOP/s triton / default / the experiments; when
  # that run failed or hung (it prints each value as measured), once more without the experiments' columns
  if ! $limit 230 python3 tools/tlx_check.py backward-timing; then
    rc=1
    TLX_BWD_TIMING_NEW=0 $limit 100 python3 tools/tlx_check.py backward-timing
  fi
fi
if [ "$part" = sparse ]; then
  if [ "${TLX_SPARSE_TESTS:-0}" = 1 ]; then  # carry .whl: zigzag and uniform walk == the default bit for bit
    gpu_tests "block_sparse_forward and (zigzag or uniform_walk or walk_ahead)" || rc=1
  fi
  JFA_TLX_SPARSE_FWD_ZIGZAG=${SPARSE_FWD_ZIGZAG:-1} JFA_TLX_SPARSE_FWD_WALK_AHEAD=${SPARSE_FWD_WALK_AHEAD:-1} \
    JFA_LAUNCH_VERIFY=1 $limit 120 python3 tools/tlx_check.py sparse-correctness || rc=1
  TLX_SPARSE_FLEX=${TLX_SPARSE_FLEX:-0} $limit 150 python3 tools/tlx_check.py sparse-timing || rc=1
fi
if [ "$part" = sparse-ablation ]; then  # helper sparse38: where the causal rows' time goes (timing only)
  $limit "${SPARSE_ABLATION_S:-300}" python3 tools/tlx_check.py sparse-ablation || rc=1
fi
if [ "$part" = sparse-bwd ]; then  # the sweep with helper sparsebwd2's experiments on (SPARSE_BWD_KNOBS=0: the
  # default kernel's), then the timings' columns (tools/tlx_check.py SPARSE_BWD_DEFAULT_COLUMNS, or
  # TLX_SPARSE_BWD_COLS) (SPARSE_BWD_HEAD_GROUP=1: head groups of 1 instead of the item order, which overrides them;
  # SPARSE_BWD_GROUP_ORDER=1: the default's head groups of 4 in helper hgorder's group order instead of the item
  # order). SPARSE_BWD_SWEEP_S / SPARSE_BWD_TIMING_S: the two limits (130 / 170 s).
  if [ "${SPARSE_BWD_KNOBS:-1}" = 1 ]; then
    export JFA_TLX_SPARSE_BWD_UNIFORM=1
    if [ "${SPARSE_BWD_GROUP_ORDER:-0}" = 1 ]; then
      export JFA_TLX_BWD_GROUP_ORDER=1
    elif [ "${SPARSE_BWD_HEAD_GROUP:-0}" = 1 ]; then
      export JFA_TLX_BWD_HEAD_GROUP=1
    else
      export JFA_TLX_BWD_ITEM_ORDER=1
    fi
  fi
  TLX_SPARSE_RANDOM=${TLX_SPARSE_RANDOM:-2} JFA_LAUNCH_VERIFY=1 $limit "${SPARSE_BWD_SWEEP_S:-130}" \
    python3 tools/tlx_check.py sparse-backward || rc=1
  unset JFA_TLX_SPARSE_BWD_UNIFORM JFA_TLX_BWD_HEAD_GROUP JFA_TLX_BWD_ITEM_ORDER \
    JFA_TLX_BWD_GROUP_ORDER
  $limit "${SPARSE_BWD_TIMING_S:-170}" python3 tools/tlx_check.py sparse-backward-timing || rc=1
fi
if [ "$part" = host ]; then  # a small call's host cost, tlx vs triton vs the automatic choice in one process
  # (the automatic choice must cost it nothing: its row ~ triton's), and what it takes for it and a large call, ~1 min
  $limit 180 python3 tools/backend_host_cost.py --backends tlx,triton,auto || rc=1
fi
if [ "$part" = mxfp8 ]; then  # bf16 inputs through the fused quantize (== the two passes, checked per case)
  if [ "${TLX_MXFP8_TESTS:-0}" = 1 ]; then  # carry .whl (expecttest): the fused quantize's GPU tests, bit for bit
    $limit 60 python3 -c "import _utlx_autoregister, sys, pytest; sys.exit(pytest.main(['-q', '-m', 'gpu',
      '-p', 'no:cacheprovider', 'tests/backends/test_tlx_mxfp8.py', '-k', 'fused or bf16_inputs']))" || rc=1
  fi
  JFA_LAUNCH_VERIFY=1 $limit 150 python3 tools/tlx_check.py mxfp8-correctness || rc=1
  $limit 100 python3 tools/tlx_check.py mxfp8-timing || rc=1
fi
if [ "$part" = mxfp8-qk2 ]; then  # the same with S over head_dim halves promoted to fp32 (configs.MXFP8_QK_CHUNKS)
  JFA_TLX_MXFP8_QK_CHUNKS=2 JFA_LAUNCH_VERIFY=1 $limit 150 python3 tools/tlx_check.py mxfp8-correctness || rc=1
  JFA_TLX_MXFP8_QK_CHUNKS=2 $limit 100 python3 tools/tlx_check.py mxfp8-timing || rc=1
fi
if [ "$part" = bench ]; then
  # BENCH_LIMIT_S: the bench's own limit (a BENCH_ARGS budget past ~130 s needs more; stop 25 lost a case to it)
  # shellcheck disable=SC2086
  $limit "${BENCH_LIMIT_S:-170}" bash bench/device_run.sh ${BENCH_ARGS:---quick --suite dense,jagged,broadcast,gqa,window --head-dims 128 \
    --backends tlx,triton --peers fa4 --modes fwd,bwd --budget-s 140 --no-plots} || rc=1
fi
if [ "$part" = mxfp8-bench ]; then  # issue 12's performance section in one process (bench/NOTES.md "Issue 12 bench,
  # helper mxbench, stop 25"): the mxfp8 suite at D128 with our bf16 tlx/triton, MXFP8 on both, FA4 bf16 and the FP8
  # peers; FA4 from /tmp/fa4 (two earlier calls carrying .whlA then .whlB, bench/README.md). BENCH_BUDGET_S (170):
  # no new case after it (the causal pair comes last); BENCH_LIMIT_S (230): the hard stop, after which the JSON
  # written after each case still gives issue 12's lines (bench.report).
  if ! $limit "${BENCH_LIMIT_S:-230}" bash bench/device_run.sh --suite mxfp8 --head-dims 128 --backends tlx,triton \
    --peers fa4,fa4_fp8,flex_fp8,sdpa_fp8 --modes fwd,bwd --budget-s "${BENCH_BUDGET_S:-170}" --no-plots; then
    rc=1
    python3 -m bench.report "${OUT:-bench/results}"/bench_*.json | grep -A80 "issue 12"
  fi
fi
if [ "${TLX_GPU_TESTS:-0}" = 1 ]; then
  JFA_TLX_AUTO=1 $limit 300 python3 -c "import _utlx_autoregister, sys, pytest; sys.exit(pytest.main(
    ['-q', '-m', 'gpu', '-x', '-p', 'no:cacheprovider', 'tests/backends/test_tlx_gpu.py']))" || rc=1
fi
if [ -f /tmp/tcache.carried ] && [ -f "${JFA_TRITON_MANIFEST:-}" ]; then  # how many compiles the carried cache saved
  python3 tools/triton_cache_pack.py report "$JFA_TRITON_MANIFEST" --carried /tmp/tcache.carried
fi
exit $rc
