#!/bin/bash
# Call F (session 33, 2x H200): the bundle of a4c7b70 (kernels and code as main 074ab95; after
# that only docs): ztrain bf16 on the batched schedule, then comm.sh on the final kernels
# (call C's ran before f420efe changed linear.cu), every cell, both --last-bucket modes.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
mkdir -p /tmp/n && tar -xJf "$here/new33f.tar.xz" -C /tmp/n
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } | tee "$OUT/device.txt"
cd /tmp/n/gpu-bundle
CUDA_VISIBLE_DEVICES=0 timeout 40 ./ztrain --device cuda --capture --epochs 2 --data-on device --samples 81920 --precision bf16 > "$OUT/zt-bf16.log" 2>&1
echo "ztrain bf16 rc=$? : $(grep -E '^epoch 2/' "$OUT/zt-bf16.log")"
echo "comm.sh from $(el) s"
OUT="$OUT/comm" GPUS=2 TIMEOUT=10 timeout $(( 335 - $(el) )) ./comm.sh > "$OUT/comm.log" 2>&1
echo "comm.sh rc=$? after $(el) s"
cat "$OUT/comm/comm-results/summary.md" 2>/dev/null; tail -2 "$OUT/comm.log"
cd "$OUT" && tar -czf /tmp/logs.tgz --exclude='*.st' --exclude='*.safetensors' . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
