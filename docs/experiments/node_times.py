#!/usr/bin/env python3
"""Per-node start offsets and durations of the most replayed graph of each process, from
kernel_trace.c's CSV files (medians over the replays after the first 20): where a slower
replay loses its time.

    node_times.py DIR OUT.json      (prints the first process's nodes, writes all of them)
"""
import collections, csv, glob, statistics, sys, json
out = {}
for path in sorted(glob.glob(sys.argv[1] + "/trace-*.csv")):
    recs = [r for r in csv.DictReader(open(path)) if r["type"] == "K"]
    graphs = collections.Counter(r["graph"] for r in recs if r["graph"] != "0")
    if not graphs: continue
    g, cnt = graphs.most_common(1)[0]
    ks = sorted((r for r in recs if r["graph"] == g), key=lambda r: int(r["start"]))
    nodes = len(collections.Counter(r["node"] for r in ks))
    reps = [ks[i:i + nodes] for i in range(0, len(ks) - nodes + 1, nodes)][20:]
    rows = []
    for i in range(nodes):
        st = statistics.median((int(r[i]["start"]) - int(r[0]["start"])) / 1e3 for r in reps)
        du = statistics.median((int(r[i]["end"]) - int(r[i]["start"])) / 1e3 for r in reps)
        rows.append((round(st, 2), round(du, 2), reps[0][i]["stream"], reps[0][i]["name"][:38]))
    out[path.split("/")[-1]] = rows
json.dump(out, open(sys.argv[2], "w"))
for k, rows in out.items():
    print(k)
    for r in rows: print("   %8.2f %7.2f s%-3s %s" % r)
    break
