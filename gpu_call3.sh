#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
( timeout 200 python3 probe_aoti2.py > $OUT/aoti2.txt 2>&1; echo "aoti2 rc=$?" >> $OUT/aoti2.txt ) &
timeout 200 python3 -m pytest -q -m gpu tests/backends/test_triton_mxfp8.py -k "bit_exact_on_the_gpu" -p no:cacheprovider 2>&1 | tail -3
wait
grep -v "Warning\|return cls" $OUT/aoti2.txt | tail -12
timeout 240 bash bench/device_run.sh --quick --suite mxfp8 --head-dims 128 --modes fwd,bwd --no-plots --budget-s 200 > $OUT/mx_bench.txt 2>&1
tail -45 $OUT/mx_bench.txt
for c in 0 2; do timeout 60 python3 tools/select_profile.py --case $c 2>&1 | tail -14; done
bash tools/tlx_device.sh backward-timing 2>&1 | tail -8
