#!/usr/bin/env bash
# Nsight Compute counters of our TLX kernels beside FlashAttention-4's on the same bench cases (issue 10 asks why we
# trail FA4 "from a profile"; until now only ablations said it). Run on the device from the repo root, after the TLX
# install (tools/tlx_device.sh none) and the FA4 install (bench/device_run.sh does it); writes $OUT/ncu_*.csv (ncu's
# details page: SpeedOfLight, compute and memory workload, scheduler, warp states, occupancy, launch) and
# $OUT/ncu_summary.txt (a few lines per kernel). ncu reads counters on Firecracker machines only (KINDS.md); it
# leaves the clocks alone here (--clock-control none, METHOD.md).
#   NCU_CASES: ';'-separated "suite|case|mode" (default: dense B8 S4096 fwd and bwd); NCU_IMPLS: "jfa:tlx fa4".
#   NCU_MODE=source: per SASS line instead (issue 10's long-scoreboard stalls, bench/NOTES.md "helper lsedelta40"):
#   one launch of the kernels named by NCU_KERNEL (a regex; default the TLX backward's) with the source counters and
#   warp states (PC sampling), saved as $OUT/ncu_src_*.ncu-rep, its source page as $OUT/ncu_src_*.csv, and the lines
#   the warps stalled at most (tools/ncu_source_top.py: NCU_REASON, default long scoreboard) in ncu_summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/ncu}; mkdir -p "$out"
# NCU_TAG: appended to every file name (a second run in the same $OUT, e.g. with a knob set, keeps the first's files)
summary="$out/ncu_summary${NCU_TAG:+_$NCU_TAG}.txt"
export PYTHONPATH=${PYTHONPATH:-$PWD}
[ -d /tmp/fa4 ] && export PYTHONPATH=/tmp/fa4:/tmp/fa4/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "ncu: not found" | tee "$summary"; exit 2; }
"$ncu" --version | tail -1 | tee "$summary"
# Hopper's tensor-pipe counters by name where this ncu has them (an unknown --metrics name stops ncu).
extra=$("$ncu" --query-metrics --chip gh100 2>/dev/null | awk '{print $1}' |
        grep -E '^(sm__pipe_tensor_op_gmma_cycles_active|sm__inst_executed_pipe_tensor_op_gmma)$' |
        sed 's/cycles_active$/cycles_active.avg.pct_of_peak_sustained_active/; s/gmma$/gmma.sum/' | paste -sd, -)
# NCU_METRICS: more names (e.g. instruction counts by pipe, regex:...stall reasons); if ncu refuses them, the case
# runs again without them
extra_more=$extra${NCU_METRICS:+${extra:+,}$NCU_METRICS}
echo "extra metrics: ${extra_more:-none}" >> "$summary"
# one case under ncu with the metrics list $1 (the loop's impl, suite, case, mode and tag)
profile() {
  timeout -k 10 "${NCU_TIMEOUT_S:-240}" "$ncu" --profile-from-start off --clock-control none --target-processes all \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats \
    ${1:+--metrics "$1"} --csv --page details \
    python3 tools/ncu_attention.py --impl "$impl" --suite "$suite" --case "$case" --mode "$mode" \
    > "$out/ncu_$tag.csv" 2> "$out/ncu_$tag.err"
}
# NCU_MODE=source: one launch of NCU_KERNEL's kernels with per-instruction counters, then its source page (SASS)
profile_source() {
  timeout -k 10 "${NCU_TIMEOUT_S:-240}" "$ncu" --profile-from-start off --clock-control none --target-processes all \
    --kernel-name "regex:${NCU_KERNEL:-attn_bwd_tlx}" --launch-count 1 --import-source yes \
    --section SourceCounters --section WarpStateStats -f -o "$out/ncu_src_$tag" \
    python3 tools/ncu_attention.py --impl "$impl" --suite "$suite" --case "$case" --mode "$mode" \
    > "$out/ncu_src_$tag.log" 2>&1 || return $?
  "$ncu" --import "$out/ncu_src_$tag.ncu-rep" --page source --csv --print-source sass > "$out/ncu_src_$tag.csv" \
    2>> "$out/ncu_src_$tag.log"
}
IFS=';' read -ra cases <<< "${NCU_CASES:-dense|B8 S4096|fwd;dense|B8 S4096|bwd}"
for spec in "${cases[@]}"; do
  IFS='|' read -r suite case mode <<< "$spec"
  for impl in ${NCU_IMPLS:-jfa:tlx fa4}; do
    tag=$(echo "${impl}_${suite}_${case}_${mode}${NCU_TAG:+_$NCU_TAG}" | tr -c 'A-Za-z0-9_\n' '_')
    if [ "${NCU_MODE:-}" = source ]; then
      profile_source; rc=$?
      echo "== $impl $suite $case $mode (source): rc $rc" >> "$summary"
      python3 tools/ncu_source_top.py "$out/ncu_src_$tag.csv" --reason "${NCU_REASON:-long}" \
        --top "${NCU_TOP:-40}" >> "$summary" 2>&1
      continue
    fi
    profile "$extra_more"; rc=$?
    if [ $rc -ne 0 ] && [ -n "${NCU_METRICS:-}" ]; then
      echo "== $impl $suite $case $mode: rc $rc with NCU_METRICS; again without" >> "$summary"
      profile "$extra"; rc=$?
    fi
    echo "== $impl $suite $case $mode: rc $rc" >> "$summary"
    # one line per kernel and metric of interest (the CSV has one row per kernel x metric)
    python3 - "$out/ncu_$tag.csv" >> "$summary" <<'PY'
import csv, sys
keep = ("Duration", "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput", "Registers Per Thread",
        "Issue Slots Busy", "No Eligible", "Active Warps Per Scheduler", "Eligible Warps Per Scheduler",
        "Warp Cycles Per Issued Instruction", "Executed Ipc Active", "L2 Hit Rate", "Achieved Occupancy",
        "Dynamic Shared Memory Per Block", "gmma", "inst_executed", "stalled", "SM Frequency", "Elapsed Cycles")
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print("  (no counters: see the .err file)"); sys.exit()
head, body = rows[0], rows[1:]
col = {name: i for i, name in enumerate(head)}
for r in body:
    name, value = r[col["Metric Name"]], r[col["Metric Value"]]
    if any(k in name for k in keep):
        print(f"  {r[col['Kernel Name']][:60]:60s} {name[:44]:44s} {value} {r[col['Metric Unit']]}")
PY
  done
done
cat "$summary"
