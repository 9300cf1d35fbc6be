#!/bin/bash
# Call B (session 33, 2x H200): the bundle of 759cf6b (call A found the fused bf16 backward's bias sums
# off the composite's bits: tanh's backward now with explicit roundings): the new and changed GPU
# tests first, the bench beside PyTorch's bf16 steps at L = 1 and 3, then the whole GPU suite.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
left() { echo $((575 - ($(date +%s) - start))); }
mkdir -p /tmp/n && tar -xJf "$here/new33b.tar.xz" -C /tmp/n
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; date -u; } | tee "$OUT/device.txt"
N=/tmp/n/gpu-bundle
cd $N
echo "== the new and changed GPU tests"
CUDA_VISIBLE_DEVICES=0 timeout 100 ./bin/zcompute-test-it --test-threads=1 cuda::linear_backward_bf16 cuda::linear_bf16::gpu cuda::linear_backward::gpu > "$OUT/t-zcompute.log" 2>&1
echo "zcompute rc=$?"; grep -E "test result|FAILED|panicked" "$OUT/t-zcompute.log" | cut -c1-300
for t in the_bf16_weight_copy captured_bf16_steps_equal_eager a_bf16_step_is_within_twice_autocast bf16_on_a_model_of_the_users_own a_captured_non_finite_step_is_skipped; do
  ZGPU_FIXTURES=$N/tests/fixtures CUDA_VISIBLE_DEVICES=0 timeout 120 ./bin/zgrad-test-it --test-threads=1 device::gpu::$t --nocapture > "$OUT/t-$t.log" 2>&1
  echo "$t rc=$?"; grep -E "over 32 draws|tensor by tensor|test result|^test |panicked" "$OUT/t-$t.log" | cut -c1-300
done
ours() { local tag=$1; shift; CUDA_VISIBLE_DEVICES=0 timeout 90 ./bench/xasset_bench "$@" > "$OUT/$tag.json" 2>"$OUT/$tag.err"; echo -n "$tag rc=$?: "
  python3 -c "import json;d=json.load(open('$OUT/$tag.json'));print({k:d.get(k) for k in ['batched_graph_ms','per_sample_graph_ms','batched_step_peak_live_MiB']})"; }
torch() { local tag=$1; shift; [ "$(left)" -lt 330 ] && { echo "skip $tag: time"; return; }
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 bench/xasset_torch.py bench --compiled "$@" --json "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1; echo -n "$tag rc=$? "
  python3 -c "import json;d=json.load(open('$OUT/$tag.json'));print({k:v for k,v in d.items() if isinstance(v,(int,float)) and ('graph' in k or 'peak' in k)})"; }
echo "== bench beside PyTorch (left $(left) s)"
ours ours-bf16 --precision bf16
ours ours-f32
ours ours-bf16-L3 --precision bf16 --layers 3
torch torch-bf16 --bf16
torch torch-bf16-L3 --bf16 --layers 3
echo "== run.sh gpu (left $(left) s)"
OUT="$OUT/suite" timeout $(( $(left) - 20 )) ./run.sh gpu > "$OUT/suite.log" 2>&1; echo "run.sh rc=$?"
grep -E "GPU test|passed, .* failed|FAILED|panicked" "$OUT/suite.log" | tail -20
echo "done after $(( $(date +%s) - start )) s"
cd "$OUT" && tar -czf /tmp/logs.tgz . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
