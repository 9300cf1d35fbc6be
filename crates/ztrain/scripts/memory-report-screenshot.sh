#!/usr/bin/env bash
# Views a ztrain memory report in a real browser (headless Chromium) and saves a screenshot.
#
#   crates/ztrain/scripts/memory-report-screenshot.sh [REPORT.html] [OUT.png]
#
# Without REPORT.html it first makes one: a small run of the XAsset model on the CUDA backend
# over the simulated driver (--device sim, no GPU needed) with a deliberately small arena cap,
# so the timeline shows growth, resets, the high-water mark and the first overflow.
# Needs Chromium (Debian: `apt-get install chromium`); the PNG path is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/../../.."

report=${1:-target/memory-report/report.html}
out=${2:-${report%.html}.png}

if [[ $# -lt 1 ]]; then
    mkdir -p "$(dirname "$report")"
    cargo run --release -p ztrain -- --device sim --sim-memory 512M \
        --samples 512 --epochs 2 --batch 64 --width 64 --heads 4 --ff 256 \
        --schedule per-sample --arena-bytes 256K --segment-bytes 256K --arena-cap 2M \
        --overflow-reserve 4M --memory-report "$report"
fi

browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [[ -z "$browser" ]]; then
    echo "no Chromium found: apt-get install chromium" >&2
    exit 1
fi

# --no-sandbox: Chromium refuses to run as root with its sandbox (containers, CI).
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --window-size=1100,1000 --screenshot="$(realpath -m "$out")" \
    "file://$(realpath "$report")" 2>/dev/null
test -s "$out"
echo "screenshot: $out"
