#!/bin/bash
# Call B (session 32, 2x H200): the new draws test and the autocast test on CUDA (device::gpu),
# issue 42's two-GPU rows in bf16 (global batch 256 and 8,192 against one GPU), the default ztrain
# run on the GPU in f32 and bf16, ztrain bf16 beside the PyTorch user loop. Bundle of 9f33c3e.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
left() { echo $((570 - ($(date +%s) - start))); }
mkdir -p /tmp/n && tar -xJf "$here/new32b.tar.xz" -C /tmp/n
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; date -u; } | tee "$OUT/device.txt"
N=/tmp/n/gpu-bundle
export NCCL_NVLS_ENABLE=0
cd $N
echo "== autocast tests on CUDA"
ZGPU_FIXTURES=$N/tests/fixtures CUDA_VISIBLE_DEVICES=0 timeout 120 ./bin/zgrad-test-it --test-threads=1 device::gpu::a_bf16_step_is_within_twice_autocast --nocapture > "$OUT/autocast.log" 2>&1
echo "autocast rc=$?"; grep -E "over 32 draws|qn.bias mean|tensor by tensor|test result|^test " "$OUT/autocast.log" | cut -c1-400
echo "== default ztrain run on the GPU (left $(left) s)"
for p in f32 bf16; do
  CUDA_VISIBLE_DEVICES=0 timeout 60 ./ztrain --device cuda --capture --precision $p > "$OUT/default-$p.log" 2>&1
  echo "default $p rc=$? : $(grep -E '^epoch [0-9]+/' "$OUT/default-$p.log" | tail -1)"
done
echo "== bf16 on two GPUs against one (left $(left) s)"
for batch in 256 8192; do
  for g in 1 2; do
    [ "$(left)" -lt 120 ] && { echo "skip $g $batch: time"; continue; }
    log="$OUT/dp-$g-$batch.log"
    vis=0; [ $g = 2 ] && vis=0,1
    CUDA_VISIBLE_DEVICES=$vis timeout 60 ./ztrain --device cuda --gpus $g --capture --epochs 2 --data-on device --samples 163840 --batch $batch --precision bf16 > "$log" 2>&1
    echo "bf16 gpus $g batch $batch rc=$? : $(grep -E '^epoch 2/' "$log" | head -1)"
  done
done
echo "== ztrain bf16 beside the user loop (left $(left) s)"
zt() { local tag=$1; shift; [ "$(left)" -lt 35 ] && { echo "skip $tag"; return; }
  CUDA_VISIBLE_DEVICES=0 timeout 60 ./ztrain --device cuda --capture --epochs 2 --data-on device --samples 81920 "$@" > "$OUT/$tag.log" 2>&1
  echo "$tag rc=$? : $(grep -E '^epoch [0-9]+/' "$OUT/$tag.log" | tail -1)"; }
zt zt-bf16 --precision bf16
if [ "$(left)" -gt 110 ]; then
  CUDA_VISIBLE_DEVICES=0 timeout 100 python3 $N/bench/xasset_user_loop_torch.py --samples 65536 --only compiled_bf16,compiled --json "$OUT/loop.json" > "$OUT/loop.log" 2>&1; echo "user loop rc=$?"; cat "$OUT/loop.json"
fi
zt zt-f32
zt zt-bf16b --precision bf16
echo "done after $(( $(date +%s) - start )) s"
cd "$OUT" && tar -czf /tmp/logs.tgz --exclude='*.st' --exclude='*.safetensors' . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
