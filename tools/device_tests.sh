#!/usr/bin/env bash
# The GPU test suites on the lent machine: `bash tools/device_tests.sh [SHARDS] [pytest args...]` from the repo
# root, carrying .whl (expecttest, absent there; see README "Testing on a GPU"). Runs SHARDS pytest processes side by
# side (JFA_TEST_SHARD, tests/conftest.py) since kernel compiles, one CPU core each, dominate the wall time; prints
# each shard's summary and the slowest tests. Each shard stops after SHARD_TIMEOUT_S (default 240) seconds. Exit
# status: nonzero if any shard failed or timed out (its log goes into $OUT/failed_shards.tgz). Memory: each shard hands its cached
# GPU blocks back after a test once it caches > 2 GiB (tests/conftest.py); stop 43's H100 (78 GiB) still ran 16 and 8
# shards out of memory before that fixture (4 passed, 280 s warm); untested with it: prefer 8 there.
set -uo pipefail
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
shards=${1:-4}; shift || true
log=/tmp/gpu_tests  # shard logs stay there (at most 8 files come back from $OUT); failures are copied to $OUT
mkdir -p "$log"
pids=()
for ((i = 0; i < shards; i++)); do
  # Each shard under its own limit (a hung kernel fails one shard, not the report); faulthandler names the test.
  # PYTEST_PRELOAD: a module imported before pytest and triton (the TLX plugin's _utlx_autoregister)
  JFA_TEST_LOG_FAILURES=1 JFA_TEST_SHARD=$i/$shards timeout "${SHARD_TIMEOUT_S:-240}" python3 -c \
    "import sys, ${PYTEST_PRELOAD:-os}, pytest; sys.exit(pytest.main(sys.argv[1:]))" -q -m gpu tests \
    -p no:cacheprovider --durations=5 -o faulthandler_timeout=120 "$@" >"$log/shard$i.log" 2>&1 &
  pids+=($!)
done
rc=0
failed=()
for ((i = 0; i < shards; i++)); do
  if ! wait "${pids[$i]}"; then
    rc=1
    failed+=("shard$i.log")
  fi
  echo "== shard $i/$shards"; grep -E "passed|failed|error|FAILED|ERROR" "$log/shard$i.log" | grep -v "^FAILED-NOW" | tail -15
  grep "^FAILED-NOW" "$log/shard$i.log" | cut -c1-300 | head -20  # failures named as they happened (a cut shard too)
done
# the failed shards' logs in one file: at most 8 files come back from $OUT, and stop 43's 15 failed logs crowded out
# the compile manifest (tools/triton_cache_pack.py's input)
[ ${#failed[@]} -eq 0 ] || tar czf "${OUT:-/tmp}/failed_shards.tgz" -C "$log" "${failed[@]}"
exit $rc
