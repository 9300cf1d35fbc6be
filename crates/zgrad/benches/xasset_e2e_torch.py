#!/usr/bin/env python3
"""PyTorch's end-to-end, first-step and memory rows of the XAsset benchmark, beside
`xasset_torch.py bench` (this folder's; it times the graphs with the data already on the device)
and our `xasset_bench` (see docs/benchmarks.md). The model is docs/xasset.md's, written out here so
that the bundle needs nothing else; it matches the reference script's.

  python3 xasset_e2e_torch.py [--json FILE] [--compiled] [--iters N]

Default size (F=193, S=12, D=256, H=4, FF=1024), batch 256, float32, TF32 off. One JSON object:
  batched_graph_e2e_ms      host wall-clock per step of the captured batched step (zero_grad,
                            forward, backward, capturable AdamW) fed end to end:
                            X.copy_(pinned, non_blocking=True), Y likewise, g.replay(),
                            loss.item() (the loss read back); median after 5 warm steps.
                            xasset_bench's row of the same name times train_batch_pinned
                            from a PinnedBatch filled once, with the same boundaries
  batched_graph_e2e_gpu_ms  CUDA events around the copies and the replay of the same steps
  batched_first_step_ms     host wall-clock from the model on the device to the graph ready:
                            3 warm-up steps on a side stream, capture, instantiation
  batched_graph_nodes       nodes of the captured graph (cudaGraphDebugDotPrint; null when
                            this PyTorch cannot dump it)
  per_sample_graph_nodes    nodes of one sample's captured forward+backward, likewise
  batched_step_peak_MiB, batched_step_peak_reserved_MiB
                            max_memory_allocated / max_memory_reserved over one eager batched
                            step (foreach AdamW) after a warm one, before any capture
  compiled_*                the same graph rows with the model under torch.compile (--compiled)
"""
import argparse, json, os, re, statistics, tempfile, time
import torch, torch.nn as nn, torch.nn.functional as F

B, S, FEAT = 256, 12, 193


class XAsset(nn.Module):
    def __init__(s, F_=193, S_=12, D=256, H=4, FF=1024):
        super().__init__()
        s.H = H
        s.emb = nn.Linear(F_, D)
        s.ln1 = nn.LayerNorm(D, eps=1e-5)
        s.qkv = nn.Linear(D, 3 * D)
        s.qn = nn.LayerNorm(D // H, eps=1e-5)
        s.kn = nn.LayerNorm(D // H, eps=1e-5)
        s.o = nn.Linear(D, D)
        s.ln2 = nn.LayerNorm(D, eps=1e-5)
        s.f1 = nn.Linear(D, FF)
        s.f2 = nn.Linear(FF, D)
        s.head = nn.Linear(D, 1)

    def forward(s, x):
        b, n, _ = x.shape
        h = s.emb(x)
        q, k, v = s.qkv(s.ln1(h)).view(b, n, 3, s.H, -1).unbind(2)
        q = s.qn(q).transpose(1, 2)
        k = s.kn(k).transpose(1, 2)
        v = v.transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5), dim=-1) @ v
        h = h + s.o(att.transpose(1, 2).reshape(b, n, -1))
        h = h + s.f2(torch.tanh(s.f1(s.ln2(h))))
        return s.head(h.mean(dim=1)).squeeze(-1)


def count_nodes(dot_text):
    """Node definitions in a cudaGraphDebugDotPrint dump: lines opening `"graph_N_node_M"[`."""
    return len(set(re.findall(r'^"(graph_\d+_node_\d+)"\s*\[', dot_text, re.M)))


def graph_nodes(g):
    try:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "graph.dot")
            g.debug_dump(path)
            with open(path) as f:
                n = count_nodes(f.read())
        return n or None
    except Exception:  # an older PyTorch, or debug mode unavailable
        return None


def memory(model, X, Y):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad(set_to_none=False)
        F.binary_cross_entropy_with_logits(model(X), Y).backward()
        opt.step()

    step(); torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step(); torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20, torch.cuda.max_memory_reserved() / 2**20


def captured_rows(fwd, params, X, Y, Xp, Yp, iters, prefix, r):
    """Captures the whole batched step of `fwd` and times it end to end into r[prefix + ...]."""
    t0 = time.perf_counter()
    opt = torch.optim.AdamW(params, lr=1e-3, capturable=True)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = F.binary_cross_entropy_with_logits(fwd(X), Y)
        loss.backward()
        opt.step()
        return loss

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    try:
        g.enable_debug_mode()
    except Exception:
        pass
    with torch.cuda.graph(g):
        loss = step()
    torch.cuda.synchronize()
    r[prefix + "batched_first_step_ms"] = (time.perf_counter() - t0) * 1e3
    r[prefix + "batched_graph_nodes"] = graph_nodes(g)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    wall, gpu = [], []
    for i in range(5 + iters):
        t = time.perf_counter()
        s.record()
        X.copy_(Xp, non_blocking=True)
        Y.copy_(Yp, non_blocking=True)
        g.replay()
        e.record()
        loss.item()
        dt = (time.perf_counter() - t) * 1e3
        if i >= 5:
            wall.append(dt)
            gpu.append(s.elapsed_time(e))
    r[prefix + "batched_graph_e2e_ms"] = statistics.median(wall)
    r[prefix + "batched_graph_e2e_gpu_ms"] = statistics.median(gpu)


def per_sample_nodes(fwd, X, Y):
    """Nodes of one sample's captured forward+backward (the reference's per-sample graph)."""
    xs, ys = X[:1].clone(), Y[:1].clone()

    def one():
        (F.binary_cross_entropy_with_logits(fwd(xs), ys) / B).backward()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            one()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    try:
        g.enable_debug_mode()
    except Exception:
        pass
    with torch.cuda.graph(g):
        one()
    torch.cuda.synchronize()
    return graph_nodes(g)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the JSON object to this file")
    ap.add_argument("--compiled", action="store_true", help="also the torch.compile rows")
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    model = XAsset().to(dev)
    Xp = torch.randn(B, S, FEAT).pin_memory()
    Yp = (torch.rand(B) > 0.5).float().pin_memory()
    X, Y = Xp.to(dev), Yp.to(dev)
    r = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "iters": a.iters}
    r["batched_step_peak_MiB"], r["batched_step_peak_reserved_MiB"] = memory(model, X, Y)
    captured_rows(model, model.parameters(), X, Y, Xp, Yp, a.iters, "", r)
    r["per_sample_graph_nodes"] = per_sample_nodes(model, X, Y)
    if a.compiled:
        cm = torch.compile(model)
        captured_rows(cm, model.parameters(), X, Y, Xp, Yp, a.iters, "compiled_", r)
    print(json.dumps(r))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
