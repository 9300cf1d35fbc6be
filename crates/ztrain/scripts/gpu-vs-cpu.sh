#!/usr/bin/env bash
# ztrain on the GPU against the CPU backend: the default XAsset model, both schedules, capture
# off and on, the first 10 optimiser steps; prints each run's summary and the worst relative
# loss difference per step (OK at 1e-3 or less).
#
#   ZTRAIN=path/to/ztrain crates/ztrain/scripts/gpu-vs-cpu.sh
#
# ZTRAIN defaults to target/release/ztrain (on a GPU machine without Rust: the `ztrain` the
# `cargo xtask test-gpu --bundle DIR` bundle carries). Logs go to ${OUT:-/tmp}/ztrain.
set -u
ztrain="${ZTRAIN:-target/release/ztrain}"
out="${OUT:-/tmp}/ztrain"; mkdir -p "$out"
run() { # name, options...
  local name=$1; shift
  local t0=$SECONDS
  "$ztrain" --epochs 1 --stop-after 10 --checkpoint "$out/$name.ck" --log debug "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? $((SECONDS - t0)) s"
  grep -E "^ztrain:|^summary|^arena" "$out/$name.log" | sed "s/^/  /"
  sed -nE 's/.*zgrad.trainer.step: step step=([0-9]+) loss=([0-9.eE+-]+).*captured=([a-z]+).*/\1 \2 \3/p' "$out/$name.log" > "$out/$name.losses"
}
run cpu_batched --device cpu --schedule batched &
run cpu_per_sample --device cpu --schedule per-sample &
run cuda_batched --device cuda --schedule batched
run cuda_batched_capture --device cuda --schedule batched --capture
run cuda_per_sample --device cuda --schedule per-sample --memory-report "$out/report_per_sample.html"
run cuda_per_sample_capture --device cuda --schedule per-sample --capture
wait
python3 - "$out" <<'PY'
import sys, os
out = sys.argv[1]
def load(n):
    return [(int(s), float(l), c) for s, l, c in (line.split() for line in open(os.path.join(out, n + ".losses")))]
for sched in ["batched", "per_sample"]:
    ref = load("cpu_" + sched)
    for cap in ["", "_capture"]:
        got = load("cuda_" + sched + cap)
        worst = max(abs(a[1] - b[1]) / abs(b[1]) for a, b in zip(got, ref)) if got and ref else float("nan")
        ok = len(got) == len(ref) == 10 and worst <= 1e-3
        print(f"{sched}{cap or ' eager'}: {len(got)} steps, captured={sorted(set(c for _,_,c in got))}, worst relative loss difference vs CPU {worst:.2e} -> {'OK' if ok else 'FAIL'}")
        print("   cuda:", " ".join(f"{l:.6f}" for _, l, _ in got))
        print("   cpu :", " ".join(f"{l:.6f}" for _, l, _ in ref))
PY
