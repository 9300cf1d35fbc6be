#!/usr/bin/env python3
"""What lies between two replays of a training loop's graph: reads the CSV files of
kernel_trace.c (one a process) and, for the most replayed graph of each, prints the median gap
from one replay's last node to the next one's first (and, within an epoch, their mean and
spread, and the replays' span), the host-to-device copies queued between
them (count, and each size's median duration), and how long after the replay the first copy
starts and before the next replay the last one ends.

    copy_gap.py DIR        (skips the first 20 replays)

Measured with it (2026-11-27, one H100, ztrain --capture --data-on device at 256 rows):
copies of 1,024 and 12 bytes take about 1 us each and the gap is 10.5 us; one copy of 1,036
bytes takes 2.7 us, starts 5 us after the replay and ends 9 us before the next: a 17 us gap.
"""
import collections
import csv
import glob
import statistics
import sys


def main(folder):
    for path in sorted(glob.glob(folder + "/trace-*.csv")):
        recs = [r for r in csv.DictReader(open(path)) if r["type"] in "KCS"]
        kernels = collections.Counter(
            r["graph"] for r in recs if r["graph"] != "0" and r["type"] == "K"
        )
        if not kernels:
            continue
        graph, _ = kernels.most_common(1)[0]
        replays = collections.defaultdict(list)
        for r in recs:
            if r["graph"] == graph:
                replays[r["correlation"]].append(r)
        spans = sorted(
            (min(int(x["start"]) for x in v), max(int(x["end"]) for x in v))
            for v in replays.values()
        )
        copies = sorted(
            (int(r["start"]), int(r["end"]), r["extra"])
            for r in recs
            if r["type"] == "C" and r["graph"] == "0"
        )
        gaps, before, after, counts = [], [], [], collections.Counter()
        durations = collections.defaultdict(list)
        for (_, end), (start, _) in zip(spans[20:], spans[21:]):
            between = [c for c in copies if c[0] >= end and c[1] <= start]
            gaps.append((start - end) / 1e3)
            counts[len(between)] += 1
            if between:
                before.append((between[0][0] - end) / 1e3)
                after.append((start - between[-1][1]) / 1e3)
                for s, e, size in between:
                    durations[size].append((e - s) / 1e3)
        name = path.split("/")[-1]
        print(f"{name}: graph {graph}, {len(spans)} replays")
        print(f"  gap between replays, median {statistics.median(gaps):.2f} us; copies between: {counts.most_common(3)}")
        # Within an epoch (a gap above 1 ms is an epoch's end: evaluation, the epoch line).
        near = [g for g in gaps if g < 1000]
        widths = [(e - s) / 1e3 for s, e in spans[20:]]
        print(
            f"  gaps under 1 ms: mean {statistics.mean(near):.2f} us, 90th percentile "
            f"{sorted(near)[int(len(near) * 0.9)]:.2f}, largest {max(near):.2f}; "
            f"replay span median {statistics.median(widths):.2f} us"
        )
        if before:
            print(
                f"  replay end to first copy {statistics.median(before):.2f} us; "
                f"last copy to next replay {statistics.median(after):.2f} us"
            )
        for size, v in sorted(durations.items(), key=lambda kv: int(kv[0])):
            print(f"  copies of {size} bytes: {len(v)}, median {statistics.median(v):.2f} us")


if __name__ == "__main__":
    main(sys.argv[1])
