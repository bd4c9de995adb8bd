#!/usr/bin/env bash
# The GPU tests and the bench in one device call, inside its 600 s limit: `bash tools/device_session.sh [tests]
# [bench]` from the repo root (both when no step is named). Ends with a short table (python -m bench.report).
#
# - FA4: when this call carries .whlA, its part is stashed in /tmp/stash (call 1 of bench/README.md's recipe); when
#   it carries .whlB and the part is stashed, bench/device_run.sh installs FA4 (call 2); without both, fa4 is skipped.
# - tests: tools/device_tests.sh with SHARDS (8) shards, each stopped after TEST_S seconds (450 alone, 200 when the
#   bench follows in the same call); carry .whl.
# - bench: `--quick --suite $SUITES --modes fwd,bwd`; its --budget-s is what is left of SESSION_S (570) less 60 s
#   (the last case started may run past the budget), and a hard stop 10 s before SESSION_S. The JSON is rewritten
#   after every case, so a cut-short run still prints its table. Extra bench arguments: BENCH_ARGS.
# - JFA_GIT_COMMIT=<sha> records the commit (the copy on the device has no .git).
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
session_s=${SESSION_S:-570}
left() { echo $((session_s - ($(date +%s) - start))); }
steps=" ${*:-tests bench} "
out=${OUT:-bench/results}
mkdir -p "$out"
rc=0

if [ -f .whlA/part.aa ]; then
  mkdir -p /tmp/stash && cp .whlA/part.aa /tmp/stash/ && echo "session: FA4 part A stashed in /tmp/stash"
fi
if [[ $steps == *" tests "* ]]; then
  echo "session: GPU tests ($(left) s left)"
  # alone, a shard may take what device_tests.sh's runbook allows (450 s); before the bench, the bench comes first
  if [[ $steps == *" bench "* ]]; then test_s=${TEST_S:-200}; else test_s=${TEST_S:-450}; fi
  SHARD_TIMEOUT_S=$test_s bash tools/device_tests.sh "${SHARDS:-8}" || rc=1
fi
if [[ $steps == *" bench "* ]]; then
  budget=$(($(left) - 60))
  if [ "$budget" -lt 60 ]; then
    echo "session: no time left for the bench ($(left) s)"; exit 1
  fi
  echo "session: bench, budget $budget s"
  # shellcheck disable=SC2086 # BENCH_ARGS is a list of arguments
  timeout -k 5 $(($(left) - 10)) bash bench/device_run.sh --quick --suite "${SUITES:-overhead,model,dense,broadcast}" \
    --modes fwd,bwd --budget-s "$budget" --no-plots ${BENCH_ARGS:-} >/dev/null 2>&1 || rc=1
  tail -3 "$out/bench.log"
  latest=$(ls -t "$out"/bench_*.json 2>/dev/null | head -1)
  if [ -n "$latest" ]; then
    PYTHONPATH=$PWD python3 -m bench.report "$latest"
  else
    echo "session: no bench JSON; the log's end:"; tail -30 "$out/bench.log"
  fi
fi
echo "session: done in $(($(date +%s) - start)) s, rc $rc"
exit $rc
