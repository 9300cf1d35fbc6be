#!/bin/bash
# Call C (session 32, 2x H200): the bundle of the final tree (tests added since 9f33c3e: bf16 on a
# model of the user's own, the device gate under bf16): its new GPU tests first, TF32 and L = 3
# rows beside PyTorch's in the same call, then the whole GPU suite.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
left() { echo $((570 - ($(date +%s) - start))); }
mkdir -p /tmp/n && tar -xJf "$here/new32c.tar.xz" -C /tmp/n
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; date -u; } | tee "$OUT/device.txt"
N=/tmp/n/gpu-bundle
cd $N
echo "== the new GPU tests"
for t in users_own non_finite_step_is_skipped a_bf16_step_is_within_twice_autocast; do
  ZGPU_FIXTURES=$N/tests/fixtures CUDA_VISIBLE_DEVICES=0 timeout 120 ./bin/zgrad-test-it --test-threads=1 device::gpu::$t --nocapture > "$OUT/t-$t.log" 2>&1
  echo "$t rc=$?"; grep -E "largest error|over 32 draws|test result|^test " "$OUT/t-$t.log" | cut -c1-300
done
ours() { local tag=$1; shift; CUDA_VISIBLE_DEVICES=0 timeout 90 ./bench/xasset_bench "$@" > "$OUT/$tag.json" 2>/dev/null; echo -n "$tag: "
  python3 -c "import json;d=json.load(open('$OUT/$tag.json'));print({k:d.get(k) for k in ['batched_graph_ms','per_sample_graph_ms','batched_step_peak_live_MiB']})"; }
torch() { local tag=$1; shift; [ "$(left)" -lt 330 ] && { echo "skip $tag: time"; return; }
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 bench/xasset_torch.py bench --compiled "$@" --json "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1; echo -n "$tag rc=$? "
  python3 -c "import json;d=json.load(open('$OUT/$tag.json'));print({k:v for k,v in d.items() if isinstance(v,(int,float)) and ('graph' in k or 'peak' in k)})"; }
echo "== TF32 and L = 3 beside PyTorch (left $(left) s)"
ours ours-tf32 --precision tf32
ours ours-bf16 --precision bf16
torch torch-tf32 --tf32
ours ours-bf16-L3 --precision bf16 --layers 3
torch torch-bf16-L3 --bf16 --layers 3
CUDA_VISIBLE_DEVICES=0 timeout 60 ./ztrain --device cuda --capture --epochs 2 --data-on device --samples 81920 --precision tf32 > "$OUT/zt-tf32.log" 2>&1
echo "ztrain tf32 rc=$? : $(grep -E '^epoch 2/' "$OUT/zt-tf32.log")"
echo "== run.sh gpu (left $(left) s)"
OUT="$OUT/suite" timeout $(( $(left) - 20 )) ./run.sh gpu > "$OUT/suite.log" 2>&1; echo "run.sh rc=$?"
grep -E "GPU test|passed, .* failed|FAILED|panicked" "$OUT/suite.log" | tail -20
echo "done after $(( $(date +%s) - start )) s"
cd "$OUT" && tar -czf /tmp/logs.tgz . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
