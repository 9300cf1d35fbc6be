#!/bin/bash
# Call E (session 33, one H200): the bundle of a4c7b70: the fused bf16 backward's tests with the
# new unaligned case (gy and y one element into their buffers: tanh's backward staged on the
# scalar path), the wide model's trainer test, and the per-sample bf16 row once more.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
mkdir -p /tmp/n && tar -xJf "$here/new33e.tar.xz" -C /tmp/n
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } | tee "$OUT/device.txt"
N=/tmp/n/gpu-bundle
cd $N
timeout 120 ./bin/zcompute-test-it --test-threads=1 cuda::linear_backward_bf16 > "$OUT/t-zcompute.log" 2>&1
echo "zcompute rc=$?"; grep -E "^test |test result|panicked" "$OUT/t-zcompute.log" | cut -c1-300
ZGPU_FIXTURES=$N/tests/fixtures timeout 120 ./bin/zgrad-test-it --test-threads=1 device::gpu::the_bf16_weight_copy > "$OUT/t-zgrad.log" 2>&1
echo "zgrad rc=$?"; grep -E "^test |test result|panicked" "$OUT/t-zgrad.log" | cut -c1-300
timeout 90 ./bench/xasset_bench --precision bf16 > "$OUT/bf16.json" 2>"$OUT/bf16.err"; echo -n "bench bf16 rc=$?: "
python3 -c "import json;d=json.load(open('$OUT/bf16.json'));print({k:d.get(k) for k in ['batched_graph_ms','per_sample_graph_ms','batched_step_peak_live_MiB']})"
echo "done after $(( $(date +%s) - start )) s"
cd "$OUT" && tar -czf /tmp/logs.tgz . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
