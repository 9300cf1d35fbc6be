#!/usr/bin/env python3
"""One table from the XAsset benchmark's three JSON objects of one device call (bench.sh):

  python3 compare.py --ours OURS.json --torch TORCH.json [--e2e E2E.json] [--ztrain LOG]
                     [--json OUT.json] [--precision f32|tf32|bf16]

OURS is `xasset_bench`'s object, TORCH `xasset_torch.py bench --compiled --json`'s, E2E
`xasset_e2e_torch.py --compiled --json`'s, LOG the output of a `ztrain` run (its samples/s).
Prints a Markdown table: ours, PyTorch, torch.compile and ours / best for every row (best:
the lower of PyTorch and torch.compile where both exist; every row is lower-is-better).
A missing file or field shows as a dash; bad JSON is an error naming the file. With
`--precision tf32` or `bf16` (OURS from `xasset_bench --precision P`, TORCH from
`xasset_torch.py bench --compiled --tf32` / `--bf16`) the title names the policy and rows with
no number on either side are left out; f32 (the default) prints the float32 table as before.
Standard library only: runs wherever python3 does.
"""
import argparse, json, math, re, sys

# (label, ours key, PyTorch key, torch.compile key, number format). Torch keys are looked up
# in the reference script's object first, then in the end-to-end script's.
ROWS = [
    ("batched, whole step as one graph (ms, CUDA events, data on device)",
     "batched_graph_ms", "batched_graph_ms", "compiled_batched_graph_ms", "{:.3f}"),
    ("per-sample, each sample's forward+backward captured (ms)",
     "per_sample_graph_ms", "per_sample_graph_ms", "compiled_per_sample_graph_ms", "{:.2f}"),
    ("batched, eager (ms, median of runs)", "batched_eager_ms", "batched_eager_ms", None, "{:.3f}"),
    ("per-sample, eager (ms, median of runs)",
     "per_sample_eager_ms", "per_sample_eager_ms", None, "{:.1f}"),
    ("batched graph end to end: pinned copy in, replay, loss read back (ms)",
     "batched_graph_e2e_ms", "batched_graph_e2e_ms", "compiled_batched_graph_e2e_ms", "{:.3f}"),
    ("batched graph end to end from a host slice (ms; ours: staged into pinned memory first)",
     "batched_graph_e2e_host_slice_ms", None, None, "{:.3f}"),
    ("peak live memory of an eager batched step (MiB; torch: max_memory_allocated)",
     "batched_step_peak_live_MiB", "batched_step_peak_MiB", None, "{:.1f}"),
    ("peak reserved memory of an eager batched step (MiB; torch: max_memory_reserved)",
     "batched_step_peak_reserved_MiB", "batched_step_peak_reserved_MiB", None, "{:.1f}"),
    ("graph nodes per captured batched step",
     "batched_graph_nodes", "batched_graph_nodes", "compiled_batched_graph_nodes", "{:.0f}"),
    ("graph nodes per captured per-sample step (one sample)",
     "per_sample_graph_nodes", "per_sample_graph_nodes", "compiled_per_sample_graph_nodes", "{:.0f}"),
    ("time to the first captured batched step (ms: warm-up, capture, instantiate)",
     "batched_first_step_ms", "batched_first_step_ms", "compiled_batched_first_step_ms", "{:.1f}"),
    ("time to the first captured per-sample step (ms)",
     "per_sample_first_step_ms", "per_sample_first_step_ms", None, "{:.1f}"),
]


def load(path):
    if not path:
        return {}
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        print(f"compare.py: {path}: {e.strerror}; its columns show as -", file=sys.stderr)
        return {}
    # A log may carry lines before the object: the last line that parses as an object counts.
    for line in reversed([text] + text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return obj
    raise SystemExit(f"compare.py: {path} holds no JSON object")


def number(obj, key):
    if key is None:
        return None
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def ztrain_rate(path):
    """The last `N samples/s` a ztrain log printed."""
    if not path:
        return None
    try:
        with open(path) as f:
            rates = re.findall(r"([0-9]+(?:\.[0-9]+)?) samples/s", f.read())
    except OSError:
        return None
    return float(rates[-1]) if rates else None


def table(ours, torch, e2e, ztrain=None):
    """The rows as (label, ours, torch, compiled, ratio) strings, and the rows as a dict."""
    theirs = dict(e2e)
    theirs.update(torch)
    out, merged = [], {}
    for label, ok, tk, ck, fmt in ROWS:
        o, t, c = number(ours, ok), number(theirs, tk), number(theirs, ck)
        best = min((v for v in (t, c) if v is not None), default=None)
        ratio = o / best if o is not None and best else None
        show = lambda v, f=fmt: "-" if v is None else f.format(v)
        out.append((label, show(o), show(t), show(c), show(ratio, "{:.2f}")))
        merged[ok] = {"ours": o, "torch": t, "compiled": c, "ours_over_best": ratio}
    if ztrain is not None:
        out.append(("ztrain samples/s (its own summary)", f"{ztrain:.0f}", "-", "-", "-"))
        merged["ztrain_samples_per_s"] = ztrain
    return out, merged


PRECISIONS = {
    "f32": "float32 TF32 off",
    "tf32": "TF32 products (ours: --precision tf32; torch: allow_tf32)",
    "bf16": "bf16 products, float32 accumulation (ours: --precision bf16; torch: autocast bf16)",
}


def markdown(rows, ours, torch, precision="f32"):
    head = f"{ours.get('device', '?')} / {torch.get('device', '?')}, torch {torch.get('torch', '?')}"
    if precision != "f32":
        rows = [r for r in rows if r[1] != "-" or r[2] != "-" or r[3] != "-"]
    lines = [f"XAsset default size, batch {ours.get('batch', 256)}, {PRECISIONS[precision]} ({head})", "",
             "| row | ours | PyTorch | torch.compile | ours / best |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {' | '.join(r)} |" for r in rows]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description="one table from the XAsset benchmark's JSON")
    ap.add_argument("--ours", required=True)
    ap.add_argument("--torch", required=True)
    ap.add_argument("--e2e")
    ap.add_argument("--ztrain")
    ap.add_argument("--json", help="also write every row's numbers to this file")
    ap.add_argument("--precision", choices=sorted(PRECISIONS), default="f32",
                    help="the policy both sides ran under (names the table)")
    a = ap.parse_args(argv)
    ours, torch, e2e = load(a.ours), load(a.torch), load(a.e2e)
    rows, merged = table(ours, torch, e2e, ztrain_rate(a.ztrain))
    print(markdown(rows, ours, torch, a.precision))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(merged, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
