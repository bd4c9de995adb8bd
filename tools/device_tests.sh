#!/usr/bin/env bash
# The GPU test suites on the lent machine: `bash tools/device_tests.sh [SHARDS] [pytest args...]` from the repo
# root, carrying .whl (expecttest, absent there; see bench/README.md). Runs SHARDS pytest processes side by side
# (JFA_TEST_SHARD, tests/conftest.py) since kernel compiles, one CPU core each, dominate the wall time; prints each
# shard's summary and the slowest tests. Each shard stops after SHARD_TIMEOUT_S (default 240) seconds. Exit status:
# nonzero if any shard failed or timed out (its log goes into $OUT/failed_shards.tgz). Memory: each shard hands its
# cached GPU blocks back after a test once it caches > 2 GiB (tests/conftest.py); stop 43's H100 (78 GiB) still ran
# 16 and 8 shards out of memory before that fixture (4 passed, 280 s warm); untested with it: prefer 8 there.
# Across calls (no call finishes the whole suite; tests/device_record.py, bench/README.md "The whole GPU suite across
# calls"): every shard appends one line per finished test to $RECORD (default $OUT/gpu_record.jsonl, one file for
# all shards); RESUME=<an earlier call's record, carried in the checkout> deselects what passed there, balances the
# rest by its durations (SHARD_BY=modulo: every n-th test, as without a record; DURATIONS=<record>: another
# record's durations) and starts $RECORD with its lines, so the new record covers both calls.
set -uo pipefail
for name in RESUME DURATIONS RECORD; do  # paths as given from the caller's directory
  [[ -z "${!name:-}" || "${!name}" == /* ]] || printf -v "$name" '%s' "$PWD/${!name}"
done
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
shards=${1:-4}; shift || true
log=/tmp/gpu_tests  # shard logs stay there (at most 8 files come back from $OUT); failures are copied to $OUT
mkdir -p "$log"
record=${RECORD:-${OUT:-$log}/gpu_record.jsonl}
if [ -n "${RESUME:-}" ]; then
  [ -f "$RESUME" ] || { echo "RESUME=$RESUME: no such file (an earlier call's gpu_record.jsonl, carried)"; exit 2; }
  [ "$RESUME" -ef "$record" ] || cat "$RESUME" >>"$record"
fi
pids=()
for ((i = 0; i < shards; i++)); do
  # Each shard under its own limit (a hung kernel fails one shard, not the report); faulthandler names the test.
  # PYTEST_PRELOAD: a module imported before pytest and triton (the TLX plugin's _utlx_autoregister)
  JFA_TEST_LOG_FAILURES=1 JFA_TEST_SHARD=$i/$shards JFA_TEST_RECORD=$record JFA_TEST_RESUME=${RESUME:-} \
    JFA_TEST_DURATIONS=${DURATIONS:-} JFA_TEST_SHARD_BY=${SHARD_BY:-} timeout "${SHARD_TIMEOUT_S:-240}" python3 -c \
    "import sys, ${PYTEST_PRELOAD:-os}, pytest; sys.exit(pytest.main(sys.argv[1:]))" -q -m gpu tests \
    -p no:cacheprovider --durations=5 -o faulthandler_timeout=120 "$@" >"$log/shard$i.log" 2>&1 &
  pids+=($!)
done
rc=0
failed=()
for ((i = 0; i < shards; i++)); do
  wait "${pids[$i]}"; status=$?
  if [ $status -ne 0 ] && [ $status -ne 5 ]; then  # 5: nothing left to run in this shard (resumed, or a tiny -k)
    rc=1
    failed+=("shard$i.log")
  fi
  echo "== shard $i/$shards (exit $status)"  # 124: cut by SHARD_TIMEOUT_S
  grep -E "passed|failed|skipped|error|FAILED|ERROR|^shards:" "$log/shard$i.log" | grep -v "^FAILED-NOW" | tail -15
  grep "^FAILED-NOW" "$log/shard$i.log" | cut -c1-300 | head -20  # failures named as they happened (a cut shard too)
done
[ -f "$record" ] && python3 tests/device_record.py summary "$record"
# the failed shards' logs in one file: at most 8 files come back from $OUT, and stop 43's 15 failed logs crowded out
# the compile manifest (tools/triton_cache_pack.py's input)
[ ${#failed[@]} -eq 0 ] || tar czf "${OUT:-/tmp}/failed_shards.tgz" -C "$log" "${failed[@]}"
exit $rc
