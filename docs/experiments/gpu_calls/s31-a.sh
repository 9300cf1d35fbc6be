#!/bin/bash
# Expects beside it (carry [".gpu"]): new31.tar.xz (the trimmed bundle of `cargo xtask test-gpu --bundle`:
# run.sh comm.sh ztrain bin/ tests/ bench/xasset_bench bench/*.py) and base31s.tar.xz (main's
# bench/xasset_bench and ztrain before the session, e39a3e2).
# Call A (session 31): the merged tree's GPU suites, the bench against main's binaries (e39a3e2)
# alternated, beside PyTorch's bf16 and float32 steps, in one call.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
left() { echo $((570 - ($(date +%s) - start))); }
mkdir -p /tmp/n /tmp/b && tar -xJf "$here/new31.tar.xz" -C /tmp/n && tar -xJf "$here/base31s.tar.xz" -C /tmp/b
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python3 -c "import torch; print('torch', torch.__version__)"; date -u; } | tee "$OUT/device.txt"
N=/tmp/n/gpu-bundle; B=/tmp/b/gpu-bundle
ours() { # TAG BIN ARGS...
  local tag=$1 bin=$2; shift 2
  [ "$(left)" -lt 40 ] && { echo "skip $tag: time"; return; }
  CUDA_VISIBLE_DEVICES=0 timeout 90 $bin "$@" > "$OUT/$tag.json" 2> "$OUT/$tag.err"; echo -n "$tag rc=$? "
  python3 - "$OUT/$tag.json" <<'PY'
import json,sys
try: d=json.load(open(sys.argv[1]))
except Exception as e: print("unreadable:", e); sys.exit()
keys=["batched_graph_ms","per_sample_graph_ms","per_sample_eager_ms","batched_step_peak_live_MiB"]
print({k: d.get(k) for k in keys if k in d})
PY
}
torch() { local tag=$1; shift; [ "$(left)" -lt 100 ] && { echo "skip $tag: time"; return; }
  CUDA_VISIBLE_DEVICES=0 timeout 150 python3 $N/bench/xasset_torch.py bench --compiled "$@" --json "$OUT/$tag.json" > "$OUT/$tag.log" 2>&1; echo -n "$tag rc=$? "
  python3 - "$OUT/$tag.json" <<'PY'
import json,sys
try: d=json.load(open(sys.argv[1]))
except Exception as e: print("unreadable:", e); sys.exit()
print({k: v for k, v in d.items() if isinstance(v,(int,float)) and ("graph" in k or "compiled" in k or "peak" in k)})
PY
}
echo "== bench, base (e39a3e2) and new alternated"
for r in 1 2; do
  ours new-bf16-$r $N/bench/xasset_bench --precision bf16
  ours base-bf16-$r $B/bench/xasset_bench --precision bf16
  ours base-f32-$r $B/bench/xasset_bench
  ours new-f32-$r $N/bench/xasset_bench
done
ours new-tf32 $N/bench/xasset_bench --precision tf32
ours new-bf16-L3 $N/bench/xasset_bench --precision bf16 --layers 3
torch torch-bf16 --bf16
echo "== run.sh gpu (left $(left) s)"
cd $N && OUT="$OUT/suite" timeout $(( $(left) - 60 )) ./run.sh gpu > "$OUT/suite.log" 2>&1; echo "run.sh rc=$?"
grep -E "GPU test|passed, .* failed|FAILED|panicked" "$OUT/suite.log" | tail -20
ZGPU_FIXTURES=$N/tests/fixtures timeout 50 ./bin/zgrad-test-it --test-threads=1 device::gpu::a_bf16_step_is_within_twice_autocast_error --nocapture > "$OUT/autocast.log" 2>&1
echo "autocast rc=$?"; grep -E "over twice|test result|within" "$OUT/autocast.log" | tail -12
echo "done after $(( $(date +%s) - start )) s"
cd "$OUT" && tar -czf /tmp/logs.tgz . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
