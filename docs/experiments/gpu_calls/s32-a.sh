#!/bin/bash
# Call A (session 32): main's GPU suites (b0553a8 had not run on a GPU), PyTorch autocast over 32
# draws of each oracle fixture (xasset_autocast_error.py --draws 32), the bench beside PyTorch.
# Expects beside it (carry [".gpu"]): new32.tar.xz (trimmed bundle of main), the script pair
# xasset_autocast_error.py + xasset_torch.py of branch s32-draws.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
left() { echo $((570 - ($(date +%s) - start))); }
mkdir -p /tmp/n && tar -xJf "$here/new32.tar.xz" -C /tmp/n
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; date -u; } | tee "$OUT/device.txt"
N=/tmp/n/gpu-bundle
echo "== autocast draws"
mkdir -p "$OUT/draws"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 "$here/xasset_autocast_error.py" --device cuda --fixtures $N/tests/fixtures \
  --draws 32 --draws-out "$OUT/draws" --json "$OUT/draws/xasset_autocast_error.h200.json" > "$OUT/draws.log" 2>&1
echo "draws rc=$? after $(( $(date +%s) - start )) s"; tail -3 "$OUT/draws.log" | cut -c1-300; ls -la "$OUT/draws"
echo "== bench"
for a in "--precision bf16" "" "--precision bf16 --layers 3"; do
  CUDA_VISIBLE_DEVICES=0 timeout 90 $N/bench/xasset_bench $a > "$OUT/bench.json" 2>/dev/null; echo -n "ours $a: "
  python3 -c "import json;d=json.load(open('$OUT/bench.json'));print({k:d.get(k) for k in ['batched_graph_ms','per_sample_graph_ms','batched_step_peak_live_MiB']})"
done
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 $N/bench/xasset_torch.py bench --compiled --bf16 --json "$OUT/torch.json" > "$OUT/torch.log" 2>&1; echo -n "torch bf16 rc=$? "
python3 -c "import json;d=json.load(open('$OUT/torch.json'));print({k:v for k,v in d.items() if isinstance(v,(int,float)) and ('graph' in k or 'peak' in k)})"
echo "== run.sh gpu (left $(left) s)"
cd $N && OUT="$OUT/suite" timeout $(( $(left) - 30 )) ./run.sh gpu > "$OUT/suite.log" 2>&1; echo "run.sh rc=$?"
grep -E "GPU test|passed, .* failed|FAILED|panicked" "$OUT/suite.log" | tail -20
echo "done after $(( $(date +%s) - start )) s"
cd "$OUT" && tar -czf /tmp/logs.tgz --exclude=./draws . && find . -mindepth 1 -maxdepth 1 ! -name draws -exec rm -rf {} + && mv /tmp/logs.tgz "$OUT/logs.tgz"
