#!/bin/bash
# Call 3d: the final tree's GPU suites (every test with "gpu" in its name, both GPUs).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
mkdir -p /tmp/h && tar -xJf "$here/final.tar.xz" -C /tmp/h
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } | tee "$OUT/device.txt"
cd /tmp/h/gpu-bundle
OUT="$OUT/suite" timeout 300 ./run.sh gpu > "$OUT/suite.log" 2>&1; echo "run.sh rc=$?"
grep -E "GPU test|passed, .* failed|FAILED|panicked" "$OUT/suite.log" | tail -12
for f in "$OUT"/suite/logs/*.log; do r=$(grep -oE "test result: [a-zA-Z]+\. [0-9]+ passed; [0-9]+ failed" "$f" | awk '{p+=$4; q+=$6} END {print p" passed "q" failed"}'); echo "$(basename "$f" .log): $r"; done
echo "done after $(( $(date +%s) - start )) s"
cd "$OUT" && tar -czf /tmp/logs.tgz . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
