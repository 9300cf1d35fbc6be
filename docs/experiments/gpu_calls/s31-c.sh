#!/bin/bash
# Expects beside it (carry [".gpu"]): new31.tar.xz and base31s.tar.xz, as s31-a.sh.
# Call C (session 31): L = 3 beside torch.compile's bf16 step in one call, and the per-sample
# bf16 graph of base and new alternated three times more (the 3% of call A).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
mkdir -p /tmp/n /tmp/b && tar -xJf "$here/new31.tar.xz" -C /tmp/n && tar -xJf "$here/base31s.tar.xz" -C /tmp/b
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; date -u; } | tee "$OUT/device.txt"
N=/tmp/n/gpu-bundle; B=/tmp/b/gpu-bundle
export CUDA_VISIBLE_DEVICES=0
ours() { local tag=$1 bin=$2; shift 2
  timeout 120 $bin "$@" > "$OUT/$tag.json" 2> "$OUT/$tag.err"; echo -n "$tag rc=$? "
  python3 -c "import json; d=json.load(open('$OUT/$tag.json')); print({k: d.get(k) for k in ['batched_graph_ms','per_sample_graph_ms','batched_step_peak_live_MiB'] if k in d})"; }
ours new-bf16-L3 $N/bench/xasset_bench --precision bf16 --layers 3 --only batched
ours base-bf16-L3 $B/bench/xasset_bench --precision bf16 --layers 3 --only batched
timeout 200 python3 $N/bench/xasset_torch.py bench --compiled --bf16 --layers 3 --json "$OUT/torch-L3.json" > "$OUT/torch-L3.log" 2>&1; echo -n "torch-bf16-L3 rc=$? "
python3 -c "import json; d=json.load(open('$OUT/torch-L3.json')); print({k: v for k, v in d.items() if isinstance(v,(int,float)) and ('graph' in k or 'peak' in k)})"
for r in 1 2 3; do
  ours ps-base-$r $B/bench/xasset_bench --precision bf16 --only per-sample
  ours ps-new-$r $N/bench/xasset_bench --precision bf16 --only per-sample
done
echo "done after $(( $(date +%s) - start )) s"
