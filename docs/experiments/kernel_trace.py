#!/usr/bin/env python3
"""Reads the CSV files of kernel_trace.c (one a process) and prints where a replayed CUDA graph
spends its time: for every graph replayed often, its replays' median span; for the one-GPU step
and the N-GPU step (by default the most replayed graph without NCCL and the one with NCCL whose
non-NCCL nodes match it best), their nodes side by side, each at its median start within the
replay and with its median duration, aligned by name; and across the ranks' files, how far
apart the ranks' replays start and end.

    kernel_trace.py DIR [--min-replays 50] [--one GRAPH] [--many GRAPH] [--skip 10]
"""
import argparse
import csv
import difflib
import glob
import os
import statistics
from collections import defaultdict


def load(path):
    gpu, api = [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            rec = {
                "type": row["type"],
                "device": int(row["device"]),
                "stream": int(row["stream"]),
                "graph": int(row["graph"]),
                "node": int(row["node"]),
                "start": int(row["start"]),
                "end": int(row["end"]),
                "corr": int(row["correlation"]),
                "extra": row["extra"],
                "name": row["name"],
            }
            (api if rec["type"] == "A" else gpu).append(rec)
    return gpu, api


def short(name, width=44):
    name = name.split("(")[0]
    if "ncclDevKernel_" in name:
        name = "NCCL " + name.split("ncclDevKernel_")[1].split("ncclDevKernelArgs")[0].rstrip("0123456789")
    return name[:width]


def replays(gpu, skip):
    """graph id -> list of replays (each a list of records sorted by start), in launch order."""
    by = defaultdict(lambda: defaultdict(list))
    for r in gpu:
        if r["graph"]:
            by[r["graph"]][r["corr"]].append(r)
    out = {}
    for g, runs in by.items():
        ordered = sorted(runs.values(), key=lambda rs: min(x["start"] for x in rs))
        for rs in ordered:
            rs.sort(key=lambda x: (x["start"], x["end"]))
        # The replay's node count must be the graph's (a buffer cut mid-replay drops nodes).
        full = max(len(rs) for rs in ordered)
        out[g] = [rs for rs in ordered if len(rs) == full][skip:]
    return out


def span(rs):
    return (max(x["end"] for x in rs) - min(x["start"] for x in rs)) / 1e3


def profile(runs):
    """Per node id: name, stream, median start offset and median duration (us)."""
    nodes = defaultdict(lambda: {"off": [], "dur": []})
    meta = {}
    for rs in runs:
        t0 = min(x["start"] for x in rs)
        for x in rs:
            n = nodes[x["node"]]
            n["off"].append((x["start"] - t0) / 1e3)
            n["dur"].append((x["end"] - x["start"]) / 1e3)
            meta[x["node"]] = (short(x["name"]), x["stream"], x["type"])
    rows = []
    for node, n in nodes.items():
        name, stream, kind = meta[node]
        rows.append({
            "node": node,
            "name": name,
            "stream": stream,
            "kind": kind,
            "off": statistics.median(n["off"]),
            "dur": statistics.median(n["dur"]),
        })
    rows.sort(key=lambda r: r["off"])
    return rows


def is_nccl(row):
    return row["name"].startswith("NCCL")


def side_by_side(one, many):
    a = [r for r in one]
    b = [r for r in many if not is_nccl(r)]
    sm = difflib.SequenceMatcher(a=[r["name"] for r in a], b=[r["name"] for r in b], autojunk=False)
    streams = {}

    def sname(s):
        return streams.setdefault(s, f"s{len(streams)}")

    print(f"{'one GPU: start  dur':>22} | {'N GPUs: start  dur  late':>28} | stream | node")
    shown = set()
    nccl = [r for r in many if is_nccl(r)]
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        left = a[i1:i2]
        right = b[j1:j2]
        for k in range(max(len(left), len(right))):
            l = left[k] if k < len(left) else None
            r = right[k] if k < len(right) else None
            # NCCL nodes that start before this row's N-GPU node are printed first.
            if r is not None:
                for c in nccl:
                    if c["node"] not in shown and c["off"] <= r["off"]:
                        shown.add(c["node"])
                        print(f"{'':>22} | {c['off']:9.1f} {c['dur']:6.1f} {'':>6}   | {sname(c['stream']):>6} | {c['name']}")
            ls = f"{l['off']:9.1f} {l['dur']:6.1f}" if l else ""
            late = f"{r['off'] - l['off']:+6.1f}" if (l and r and op == 'equal') else ""
            rs = f"{r['off']:9.1f} {r['dur']:6.1f} {late:>6}" if r else ""
            name = (r or l)["name"]
            stream = sname(r["stream"]) if r else "-"
            print(f"{ls:>22} | {rs:>28} | {stream:>6} | {name}{'' if op == 'equal' else '  [' + op + ']'}")
    for c in nccl:
        if c["node"] not in shown:
            print(f"{'':>22} | {c['off']:9.1f} {c['dur']:6.1f} {'':>6}   | {sname(c['stream']):>6} | {c['name']}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--min-replays", type=int, default=50)
    ap.add_argument("--skip", type=int, default=10)
    ap.add_argument("--one", type=int)
    ap.add_argument("--many", type=int)
    args = ap.parse_args()
    procs = []
    for path in sorted(glob.glob(os.path.join(args.dir, "trace-*.csv"))):
        gpu, api = load(path)
        if not gpu:
            continue
        device = statistics.mode(r["device"] for r in gpu)
        procs.append({"path": path, "device": device, "gpu": gpu, "api": api,
                      "graphs": replays(gpu, args.skip)})
    procs.sort(key=lambda p: p["device"])
    for p in procs:
        print(f"== {os.path.basename(p['path'])}: device {p['device']}, {len(p['gpu'])} GPU records")
        launches = {a["corr"]: a for a in p["api"] if a["name"] in ("api514", "api515")}
        for g, runs in sorted(p["graphs"].items(), key=lambda kv: -len(kv[1])):
            if len(runs) < args.min_replays:
                continue
            spans = [span(rs) for rs in runs]
            nccl = sum(1 for x in runs[0] if "ncclDevKernel" in x["name"])
            lat = [(min(x["start"] for x in rs) - launches[rs[0]["corr"]]["end"]) / 1e3
                   for rs in runs if rs[0]["corr"] in launches]
            lat_s = f", launch end to first node median {statistics.median(lat):.1f} us" if lat else ""
            print(f"graph {g}: {len(runs)} replays of {len(runs[0])} nodes ({nccl} NCCL), span median "
                  f"{statistics.median(spans):.1f} us, min {min(spans):.1f}{lat_s}")
    if not procs:
        return
    # The one-GPU graph may come from another process (another run) on the same device.
    dev0 = procs[0]["device"]
    cands = [(p, g, rs) for p in procs if p["device"] == dev0
             for g, rs in p["graphs"].items() if len(rs) >= args.min_replays]
    has_nccl = lambda rs: any("ncclDevKernel" in x["name"] for x in rs[0])
    pick = lambda want, forced: max(
        (c for c in cands if has_nccl(c[2]) == want and (forced is None or c[1] == forced)),
        key=lambda c: len(c[2]), default=None)
    one_c, many_c = pick(False, args.one), pick(True, args.many)
    if one_c is None or many_c is None:
        print("no pair of graphs (one without NCCL, one with) replayed often enough")
        return
    p0, one, many = many_c[0], one_c[1], many_c[1]
    cands = {many: many_c[2]}
    print(f"\n== graph {one} (one GPU, {os.path.basename(one_c[0]['path'])}) against graph {many} "
          f"(N GPUs, {os.path.basename(p0['path'])}), us")
    side_by_side(profile(one_c[2]), profile(cands[many]))
    # Across ranks: the same N-GPU graph is the one with the same node count and names.
    sig = [short(x["name"]) for x in cands[many][0]]
    for p in (q for q in procs if q is not p0 and q["device"] != p0["device"]):
        match = [g for g, rs in p["graphs"].items()
                 if len(rs) == len(cands[many]) and sorted(short(x["name"]) for x in rs[0]) == sorted(sig)]
        if not match:
            print(f"{os.path.basename(p['path'])}: no graph matches graph {many}")
            continue
        other = p["graphs"][match[0]]
        d_start = [(min(x["start"] for x in b) - min(x["start"] for x in a)) / 1e3
                   for a, b in zip(cands[many], other)]
        d_end = [(max(x["end"] for x in b) - max(x["end"] for x in a)) / 1e3
                 for a, b in zip(cands[many], other)]
        q = lambda v: statistics.quantiles(v, n=10)
        print(f"\nrank on device {p['device']} (graph {match[0]}) minus device {p0['device']}: "
              f"first node's start median {statistics.median(d_start):+.1f} us "
              f"(deciles {', '.join(f'{v:+.1f}' for v in q(d_start))}); "
              f"last node's end median {statistics.median(d_end):+.1f} us")
        spans0 = [span(rs) for rs in cands[many]]
        late = sorted(zip(d_start, spans0))
        print("  the replay's span on device", p0["device"], "by the other rank's start:",
              "; ".join(f"{d:+.0f} us -> {s:.0f}" for d, s in late[:: max(1, len(late) // 8)]))


if __name__ == "__main__":
    main()
