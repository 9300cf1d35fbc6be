#!/bin/bash
# Call 1 (issue 45): comm.sh on two GPUs, captured steps, both --last-bucket modes, all phases,
# the socket cells, the launcher cells and zcomm's NCCL tests.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
mkdir -p /tmp/b && tar -xJf "$here/bundle.tar.xz" -C /tmp/b
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } | tee "$OUT/device.txt"
cd /tmp/b/gpu-bundle
OUT="$OUT" GPUS=2 TIMEOUT=10 timeout $((560 - ($(date +%s) - start))) ./comm.sh > "$OUT/comm-captured.log" 2>&1
echo "comm.sh captured rc=$? after $(( $(date +%s) - start )) s"
cat "$OUT/comm-results/summary.md"
tail -5 "$OUT/comm-captured.log"
