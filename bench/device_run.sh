#!/usr/bin/env bash
# Run the bench on the lent GPU machine: `bash bench/device_run.sh [python -m bench args...]`, from the repo root.
#
# - FlashAttention-4: if this call carries .whlB and an earlier call on the same warm machine stashed .whlA's part in
#   /tmp/stash (see bench/README.md), installs FA4 into /tmp/fa4 first; whenever /tmp/fa4 exists, puts it on
#   PYTHONPATH. Without it the bench runs and lists fa4 as skipped.
# - Writes results to $OUT (what comes back from the device) or bench/results; the per-suite PNGs go into one
#   plots.tar, since at most 8 files come back from $OUT.
# - JFA_GIT_COMMIT=<sha> in the environment records the commit when the copy on the device has no .git.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ ! -d /tmp/fa4 ] && [ -f /tmp/stash/part.aa ] && [ -f .whlB/part.ab ]; then
  echo "device_run: installing FlashAttention-4 into /tmp/fa4"
  cat /tmp/stash/part.aa .whlB/part.ab > /tmp/stash/nvidia_cutlass_dsl_libs_cu13-4.8.1-cp312-cp312-manylinux_2_28_x86_64.whl &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/fa4 \
      /tmp/stash/*.whl .whlB/*.whl || echo "device_run: FA4 install failed; fa4 will be skipped"
fi
if [ -d /tmp/fa4 ]; then
  export PYTHONPATH=/tmp/fa4:/tmp/fa4/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}
fi
# Triton 3.8 + TLX plugin, if an earlier call installed it there (shared/device/tlx-triton38.sh). A warm machine keeps
# it between calls, so a later call meant for stock Triton gets 3.8 too unless it sets STOCK_TRITON=1 (stop 55's
# Flex run did: its meta says triton 3.8.0).
if [ -d /tmp/t38 ] && [ "${STOCK_TRITON:-0}" != 1 ]; then
  export PYTHONPATH=/tmp/t38:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1

out=${OUT:-bench/results}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader 2>/dev/null || true
"${PYTHON:-python3}" -m bench --out "$out" "$@" 2>&1 | tee "$out/bench.log"
rc=${PIPESTATUS[0]}
if ls "$out"/*.png >/dev/null 2>&1; then
  (cd "$out" && tar cf plots.tar ./*.png && rm -f ./*.png)
fi
exit "$rc"
