#!/bin/bash
# Call D (session 33, 2x H200): the bundle of f420efe (linear.cu's k-contiguous product reads its
# staged A with lds4, so its PTX is reproducible): float32 per-sample and batched graphs against
# the bundle before it (759cf6b, same call, alternated), the bf16 rows, compute-sanitizer over the
# fused bf16 backward's GPU tests, then the whole GPU suite.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
left() { echo $((575 - ($(date +%s) - start))); }
mkdir -p /tmp/n && tar -xJf "$here/new33d.tar.xz" -C /tmp/n
xz -dc "$here/xasset_bench.759cf6b.xz" > /tmp/n/xasset_bench.759cf6b && chmod +x /tmp/n/xasset_bench.759cf6b
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } | tee "$OUT/device.txt"
N=/tmp/n/gpu-bundle
cd $N
bench() { local tag=$1 bin=$2; shift 2; CUDA_VISIBLE_DEVICES=0 timeout 90 $bin "$@" > "$OUT/$tag.json" 2>"$OUT/$tag.err"; echo -n "$tag rc=$?: "
  python3 -c "import json;d=json.load(open('$OUT/$tag.json'));print({k:d.get(k) for k in ['batched_graph_ms','per_sample_graph_ms','batched_step_peak_live_MiB']})"; }
echo "== float32 against 759cf6b, alternated"
for r in 1 2; do
  bench old-f32-$r /tmp/n/xasset_bench.759cf6b
  bench new-f32-$r ./bench/xasset_bench
done
bench old-f32-L3 /tmp/n/xasset_bench.759cf6b --layers 3
bench new-f32-L3 ./bench/xasset_bench --layers 3
bench new-bf16 ./bench/xasset_bench --precision bf16
echo "== compute-sanitizer over the fused bf16 backward (left $(left) s)"
OUT="$OUT/san" CUDA_VISIBLE_DEVICES=0 timeout 150 ./sanitize.sh --run "zcompute:linear_backward_bf16::gpu=memcheck,racecheck,initcheck,synccheck" > "$OUT/sanitize.log" 2>&1
echo "sanitize rc=$?"; grep -E "^sanitize:|control" "$OUT/sanitize.log" | head -12
echo "== run.sh gpu (left $(left) s)"
OUT="$OUT/suite" timeout $(( $(left) - 20 )) ./run.sh gpu > "$OUT/suite.log" 2>&1; echo "run.sh rc=$?"
grep -E "GPU test|passed, .* failed|FAILED|panicked" "$OUT/suite.log" | tail -20
echo "done after $(( $(date +%s) - start )) s"
cd "$OUT" && tar -czf /tmp/logs.tgz . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
