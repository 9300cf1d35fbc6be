#!/bin/bash
# Call 3c: the final tree (s30-lin16 reverted): GPU tests, comm.sh's train cells, the per-sample
# bf16 step against cf39649's.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
left() { echo $((500 - ($(date +%s) - start))); }
mkdir -p /tmp/g && tar -xJf "$here/final.tar.xz" -C /tmp/g && tar -xJf "$here/cf.tar.xz" -C /tmp/g
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } | tee "$OUT/device.txt"
cd /tmp/g/gpu-bundle
echo "== run.sh gpu"
OUT="$OUT/suite" timeout $(( $(left) - 150 )) ./run.sh gpu > "$OUT/suite.log" 2>&1; echo "run.sh rc=$?"
grep -E "GPU test|passed, .* failed|FAILED|panicked" "$OUT/suite.log" | tail -20
ZGPU_FIXTURES=/tmp/g/gpu-bundle/tests/fixtures timeout 60 ./bin/zgrad-test-it --test-threads=1 device::gpu::a_bf16_step_is_within_twice_autocast_error --nocapture > "$OUT/autocast.log" 2>&1
echo "autocast rc=$?"; grep -vE "^\s*$" "$OUT/autocast.log" | tail -25
echo "== per-sample bf16 (left $(left) s)"
for who in new cf new; do
  bin=/tmp/g/gpu-bundle/bench/xasset_bench; [ $who = cf ] && bin=/tmp/g/cf/bin/xasset_bench
  CUDA_VISIBLE_DEVICES=0 timeout 60 $bin --precision bf16 --only per-sample > "$OUT/ps-$who-$RANDOM.json" 2>/dev/null
  echo "$who rc=$? per_sample_graph_ms=$(python3 -c "import json,sys,glob,os; f=max(glob.glob('$OUT/ps-$who-*.json'), key=os.path.getmtime); print(json.load(open(f)).get('per_sample_graph_ms'))")"
done
echo "== comm.sh train cells (left $(left) s)"
OUT="$OUT/comm" GPUS=2 TIMEOUT=10 PHASES=train SOCKET=0 LAUNCHER=0 NCCL_TESTS=0 timeout $(( $(left) - 5 )) ./comm.sh > "$OUT/comm.log" 2>&1; echo "comm rc=$?"
cat "$OUT/comm/comm-results/summary.md"
echo "done after $(( $(date +%s) - start )) s"
cd "$OUT" && tar -czf /tmp/logs.tgz --exclude='*.st' . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
