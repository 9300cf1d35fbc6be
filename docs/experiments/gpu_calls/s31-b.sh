#!/bin/bash
# Expects beside it (carry [".gpu"]): new31.tar.xz (the trimmed bundle of `cargo xtask test-gpu --bundle`:
# run.sh comm.sh ztrain bin/ tests/ bench/xasset_bench bench/*.py) and base31s.tar.xz (main's
# bench/xasset_bench and ztrain before the session, e39a3e2).
# Call B (session 31): comm.sh on two GPUs (every cell, both --last-bucket modes) on the merged
# tree; ztrain beside the PyTorch user loop, new and main's (e39a3e2) binaries alternated.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
left() { echo $((575 - ($(date +%s) - start))); }
mkdir -p /tmp/n /tmp/b && tar -xJf "$here/new31.tar.xz" -C /tmp/n && tar -xJf "$here/base31s.tar.xz" -C /tmp/b
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; date -u; } | tee "$OUT/device.txt"
N=/tmp/n/gpu-bundle; B=/tmp/b/gpu-bundle
cd $N
OUT="$OUT/comm" GPUS=2 TIMEOUT=10 timeout 330 ./comm.sh > "$OUT/comm.log" 2>&1
echo "comm.sh rc=$? after $(( $(date +%s) - start )) s"
cat "$OUT/comm/comm-results/summary.md" 2>/dev/null; tail -3 "$OUT/comm.log"
echo "== ztrain and the user loop (left $(left) s)"
zt() { local tag=$1 bin=$2; shift 2; [ "$(left)" -lt 35 ] && { echo "skip $tag"; return; }
  CUDA_VISIBLE_DEVICES=0 timeout 60 $bin --device cuda --capture --epochs 2 --data-on device --samples 81920 "$@" > "$OUT/$tag.log" 2>&1
  echo "$tag rc=$? : $(grep -E '^epoch [0-9]+/' "$OUT/$tag.log" | tail -1)"; }
zt zt-new-bf16 $N/ztrain --precision bf16
zt zt-base-bf16 $B/ztrain --precision bf16
zt zt-base-f32 $B/ztrain
zt zt-new-f32 $N/ztrain
if [ "$(left)" -gt 110 ]; then
  CUDA_VISIBLE_DEVICES=0 timeout 100 python3 $N/bench/xasset_user_loop_torch.py --samples 65536 --only compiled_bf16,compiled --json "$OUT/loop.json" > "$OUT/loop.log" 2>&1; echo "user loop rc=$?"; cat "$OUT/loop.json"
fi
zt zt-new-bf16b $N/ztrain --precision bf16
echo "done after $(( $(date +%s) - start )) s"
cd "$OUT" && tar -czf /tmp/logs.tgz --exclude='*.st' --exclude='*.safetensors' . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
