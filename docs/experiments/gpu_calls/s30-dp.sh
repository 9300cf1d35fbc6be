#!/bin/bash
# Call 2 (issue 45): comm.sh's eager cells; ddp_bench and ztrain --gpus 2 of cdd4cce (base,
# before issues 44/45) against this main, alternated; a SIGINT stop on two GPUs.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
left() { echo $((570 - ($(date +%s) - start))); }
mkdir -p /tmp/b && tar -xJf "$here/bundle.tar.xz" -C /tmp/b && tar -xJf "$here/base.tar.xz" -C /tmp/b
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; } | tee "$OUT/device.txt"
N=/tmp/b/gpu-bundle; B=/tmp/b/base/bin
export NCCL_NVLS_ENABLE=0
cd $N
echo "== comm.sh eager train cells"
OUT="$OUT/eager" GPUS=2 TIMEOUT=10 MODES=eager PHASES=train SOCKET=0 LAUNCHER=0 NCCL_TESTS=0 \
  timeout 150 ./comm.sh > "$OUT/comm-eager.log" 2>&1; echo "comm eager rc=$?"
cat "$OUT/eager/comm-results/summary.md"
echo "== ddp_bench (left $(left) s)"
for who in base new new base; do
  [ "$(left)" -lt 200 ] && { echo "skip ddp_bench $who: time"; continue; }
  bin=$N/bench/ddp_bench; [ $who = base ] && bin=$B/ddp_bench
  timeout 80 $bin --gpus 2 --iters 100 --rounds 5 --grad-sync overlapped > "$OUT/ddp-$who-$RANDOM.log" 2>&1
  echo "ddp_bench $who rc=$?"; grep -iE "round|median|weak|captured_ms" "$(ls -t $OUT/ddp-$who-*.log | head -1)" | tail -8
done
echo "== ztrain --gpus 2 (left $(left) s)"
for batch in 256 8192; do
  for who in base new new base; do
    [ "$(left)" -lt 90 ] && { echo "skip ztrain $who $batch: time"; continue; }
    bin=$N/ztrain; [ $who = base ] && bin=$B/ztrain
    log="$OUT/ztrain-$batch-$who-$RANDOM.log"
    timeout 60 $bin --device cuda --gpus 2 --capture --epochs 2 --data-on device --samples 163840 --batch $batch > "$log" 2>&1
    echo "ztrain $who batch $batch rc=$? : $(grep -E '^epoch 2/' "$log" | head -1)"
  done
done
echo "== SIGINT stop on two GPUs (left $(left) s)"
if [ "$(left)" -gt 50 ]; then
  mkdir -p "$OUT/stop"; log="$OUT/stop/ztrain.log"; ck="$OUT/stop/ck.safetensors"
  $N/ztrain --device cuda --gpus 2 --capture --epochs 3000 --samples 65536 --checkpoint "$ck" > "$log" 2>&1 &
  pid=$!
  for i in $(seq 300); do grep -q '^epoch 1/' "$log" && break; sleep 0.1; done
  t0=$(date +%s.%N); kill -INT $pid; wait $pid; rc=$?; t1=$(date +%s.%N)
  echo "first SIGINT: exit $rc after $(python3 -c "print(f'{$t1-$t0:.2f}')") s; checkpoint: $(ls -la "$ck" 2>&1)"
  tail -4 "$log"; ps aux | grep -c "[z]train --device" 
fi
echo "done after $(( $(date +%s) - start )) s"
cd "$OUT" && tar -czf /tmp/logs.tgz --exclude='*.st' --exclude='*.safetensors' . && find . -mindepth 1 -delete && mv /tmp/logs.tgz "$OUT/logs.tgz"
