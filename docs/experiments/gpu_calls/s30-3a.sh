#!/bin/bash
# Call 3a: the final tree's GPU tests (every test with "gpu" in its name, both GPUs) and
# comm.sh's train cells in both --last-bucket modes.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
left() { echo $((520 - ($(date +%s) - start))); }
mkdir -p /tmp/f && tar -xJf "$here/final.tar.xz" -C /tmp/f
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } | tee "$OUT/device.txt"
cd /tmp/f/gpu-bundle
echo "== run.sh gpu"
OUT="$OUT/suite" timeout $(( $(left) - 110 )) ./run.sh gpu > "$OUT/suite.log" 2>&1; echo "run.sh rc=$?"
grep -E "^== |GPU test|passed, .* failed|FAILED|panicked" "$OUT/suite.log" | grep -v "^== .*lib-" | tail -30
echo "== comm.sh train cells (left $(left) s)"
OUT="$OUT/comm" GPUS=2 TIMEOUT=10 PHASES=train SOCKET=0 LAUNCHER=0 NCCL_TESTS=0 timeout $(( $(left) - 5 )) ./comm.sh > "$OUT/comm.log" 2>&1; echo "comm rc=$?"
cat "$OUT/comm/comm-results/summary.md"
echo "done after $(( $(date +%s) - start )) s"
cd "$OUT" && tar -czf /tmp/logs.tgz --exclude='*.st' . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
