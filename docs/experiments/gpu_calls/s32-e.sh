#!/bin/bash
# Call E (session 32, 2x H200): comm.sh on the final tree (a68549c: the simulated communicator's
# relayed reason changed data-parallel code), every cell, both --last-bucket modes.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
mkdir -p /tmp/n && tar -xJf "$here/new32e.tar.xz" -C /tmp/n
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } | tee "$OUT/device.txt"
cd /tmp/n/gpu-bundle
OUT="$OUT/comm" GPUS=2 TIMEOUT=10 timeout 540 ./comm.sh > "$OUT/comm.log" 2>&1
echo "comm.sh rc=$? after $(( $(date +%s) - start )) s"
cat "$OUT/comm/comm-results/summary.md" 2>/dev/null; tail -3 "$OUT/comm.log"
cd "$OUT" && tar -czf /tmp/logs.tgz --exclude='*.st' --exclude='*.safetensors' . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
