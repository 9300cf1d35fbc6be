#!/bin/bash
# Call C (session 33, 2x H200): the bundle of 759cf6b: ztrain's per-sample schedule end to end in
# bf16 and float32 (every Linear backward of a sample now one zc_linear_backward_bf16 launch), then
# comm.sh (a kernel changed), every cell, both --last-bucket modes.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
mkdir -p /tmp/n && tar -xJf "$here/new33b.tar.xz" -C /tmp/n
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } | tee "$OUT/device.txt"
cd /tmp/n/gpu-bundle
for p in f32 bf16; do
  CUDA_VISIBLE_DEVICES=0 timeout 60 ./ztrain --device cuda --capture --schedule per-sample --precision $p > "$OUT/ps-$p.log" 2>&1
  echo "per-sample $p rc=$? : $(grep -E '^epoch [0-9]+/' "$OUT/ps-$p.log" | tail -1)"
done
echo "comm.sh from $(( $(date +%s) - start )) s"
OUT="$OUT/comm" GPUS=2 TIMEOUT=10 timeout $(( 575 - ($(date +%s) - start) )) ./comm.sh > "$OUT/comm.log" 2>&1
echo "comm.sh rc=$? after $(( $(date +%s) - start )) s"
cat "$OUT/comm/comm-results/summary.md" 2>/dev/null; tail -3 "$OUT/comm.log"
cd "$OUT" && tar -czf /tmp/logs.tgz --exclude='*.st' --exclude='*.safetensors' . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
