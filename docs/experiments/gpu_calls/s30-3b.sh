#!/bin/bash
# Call 3b (issue 42): our captured step and ztrain beside PyTorch in one call; f32 and bf16
# against cf39649's binaries (before this session's kernels).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
left() { echo $((560 - ($(date +%s) - start))); }
mkdir -p /tmp/f && tar -xJf "$here/final.tar.xz" -C /tmp/f && tar -xJf "$here/cf.tar.xz" -C /tmp/f
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; date -u; } | tee "$OUT/device.txt"
N=/tmp/f/gpu-bundle; C=/tmp/f/cf/bin
export CUDA_VISIBLE_DEVICES=0
ours() { # TAG BIN ARGS...
  local tag=$1 bin=$2; shift 2
  [ "$(left)" -lt 60 ] && { echo "skip $tag: time"; return; }
  timeout 90 $bin "$@" > "$OUT/$tag.json" 2> "$OUT/$tag.err"; echo "$tag rc=$?"
  python3 - "$OUT/$tag.json" <<'PY'
import json,sys
try: d=json.load(open(sys.argv[1]))
except Exception as e: print("  unreadable:", e); sys.exit()
keys=["batched_graph_ms","per_sample_graph_ms","batched_step_peak_live_MiB","batched_graph_nodes"]
print("  ", {k: d.get(k) for k in keys})
PY
}
torch() { # TAG ARGS...
  local tag=$1; shift
  [ "$(left)" -lt 100 ] && { echo "skip $tag: time"; return; }
  timeout 150 python3 $N/bench/xasset_torch.py bench --compiled "$@" --json "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1; echo "$tag rc=$?"
  python3 - "$OUT/$tag.json" <<'PY'
import json,sys
try: d=json.load(open(sys.argv[1]))
except Exception as e: print("  unreadable:", e); sys.exit()
print("  ", {k: v for k, v in d.items() if isinstance(v,(int,float)) and ("graph" in k or "compiled" in k or "peak" in k)})
PY
}
ours new-bf16-L1 $N/bench/xasset_bench --precision bf16
ours cf-bf16-L1 $C/xasset_bench --precision bf16
ours new-f32-L1 $N/bench/xasset_bench
ours cf-f32-L1 $C/xasset_bench
torch torch-bf16-L1 --bf16
ours new-bf16-L3 $N/bench/xasset_bench --precision bf16 --layers 3
torch torch-bf16-L3 --bf16 --layers 3
torch torch-f32-L1
ours new-tf32-L1 $N/bench/xasset_bench --precision tf32
echo "== ztrain and the user loop (left $(left) s)"
zt() { local tag=$1 bin=$2; shift 2; [ "$(left)" -lt 40 ] && { echo "skip $tag"; return; }
  timeout 60 $bin --device cuda --capture --epochs 2 --data-on device --samples 81920 "$@" > "$OUT/$tag.log" 2>&1
  echo "$tag rc=$? : $(grep -E '^epoch 2/' "$OUT/$tag.log" | head -1)"; }
zt zt-new-bf16 $N/ztrain --precision bf16
zt zt-cf-bf16 $C/ztrain --precision bf16
if [ "$(left)" -gt 130 ]; then
  timeout 120 python3 $N/bench/xasset_user_loop_torch.py --samples 65536 --only compiled_bf16,compiled --json "$OUT/loop.json" > "$OUT/loop.log" 2>&1; echo "user loop rc=$?"; cat "$OUT/loop.json"
fi
zt zt-new-bf16b $N/ztrain --precision bf16
zt zt-new-f32 $N/ztrain
zt zt-new-tf32 $N/ztrain --precision tf32
torch torch-tf32-L1 --tf32
echo "done after $(( $(date +%s) - start )) s"
cd "$OUT" && tar -czf /tmp/logs.tgz . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
