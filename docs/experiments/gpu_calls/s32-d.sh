#!/bin/bash
# Call D (session 32): the draws of call A again after the missing save_file import (A's draws step failed).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
mkdir -p /tmp/n && tar -xJf "$here/new32.tar.xz" -C /tmp/n gpu-bundle/tests
{ nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__)"; date -u; } | tee "$OUT/device.txt"
N=/tmp/n/gpu-bundle
mkdir -p "$OUT/draws"
CUDA_VISIBLE_DEVICES=0 timeout 400 python3 "$here/xasset_autocast_error.py" --device cuda --fixtures $N/tests/fixtures \
  --draws 32 --draws-out "$OUT/draws" --json "$OUT/draws/xasset_autocast_error.h200.json" > "$OUT/draws.log" 2>&1
echo "draws rc=$? after $(( $(date +%s) - start )) s"; tail -3 "$OUT/draws.log" | cut -c1-300; ls -la "$OUT/draws"; rm -f "$OUT/draws.log"
