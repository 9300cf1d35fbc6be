#!/usr/bin/env python3
"""PyTorch reference for the XAsset workload (the model of docs/xasset.md, in this repository).

Two jobs, both runnable wherever PyTorch is installed (the GPU machine has it):

  oracle:  python3 xasset_torch.py oracle IN.safetensors OUT.safetensors
           IN holds every parameter (names as in docs/xasset.md), "x" [B,S,F] and "y" [B].
           OUT gets, computed in float64 on the CPU: "loss" (scalar, shape [1]),
           "grad.<param>" for every parameter (mean BCE over the batch), and
           "adamw.<param>" = the parameters after one AdamW step (lr 1e-3,
           betas 0.9/0.999, eps 1e-8, weight_decay 0.01) from zero moments.
           The sizes are read from the tensors' shapes (H = D / dh).
  init:    python3 xasset_torch.py init OUT.safetensors --config F,S,D,H,FF[,L] --batch B --seed N
           writes a random parameter set plus x and y in the IN format above (L blocks,
           default 1: docs/xasset.md, "Depth"). The oracle reads L from the parameter names.
  bench:   python3 xasset_torch.py bench [--json FILE] [--compiled] [--layers L] [--bf16 | --tf32]
           times the default-size workload on the GPU: batched step (B=256) eager and as a
           CUDA graph, and the per-sample gradient-accumulation step (256 samples of B=1,
           one optimizer step) eager and with the per-sample forward+backward captured.
           The batched graph holds zero_grad, forward, backward and a capturable AdamW step.
           Peak memory is that of one eager batched step, measured before any capture.
           --compiled adds the two captured schedules with the model under torch.compile
           (Inductor's fused kernels), the strongest PyTorch a user would pick.
           Prints one JSON object; medians of CUDA-event timings in milliseconds.
"""
import argparse, json, sys
import torch, torch.nn as nn, torch.nn.functional as F
from safetensors.torch import load_file, save_file


def make_block(m, D, H, FF):
    """One attention + feed-forward block's parameters (docs/xasset.md, steps 2-7) on module m."""
    m.ln1 = nn.LayerNorm(D, eps=1e-5)
    m.qkv = nn.Linear(D, 3 * D)
    m.qn = nn.LayerNorm(D // H, eps=1e-5)
    m.kn = nn.LayerNorm(D // H, eps=1e-5)
    m.o = nn.Linear(D, D)
    m.ln2 = nn.LayerNorm(D, eps=1e-5)
    m.f1 = nn.Linear(D, FF)
    m.f2 = nn.Linear(FF, D)


def block_forward(m, h, H):
    B, S, _ = h.shape
    q, k, v = m.qkv(m.ln1(h)).view(B, S, 3, H, -1).unbind(2)
    q = m.qn(q).transpose(1, 2)
    k = m.kn(k).transpose(1, 2)
    v = v.transpose(1, 2)
    att = torch.softmax(q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5), dim=-1) @ v
    h = h + m.o(att.transpose(1, 2).reshape(B, S, -1))
    return h + m.f2(torch.tanh(m.f1(m.ln2(h))))


class Block(nn.Module):
    def __init__(s, D, H, FF):
        super().__init__()
        make_block(s, D, H, FF)


class XAsset(nn.Module):
    """L blocks (docs/xasset.md, "Depth"): with L = 1 the block's parameters sit on the model itself
    (ln1.weight, ...); with L > 1 they are blocks.{i}.ln1.weight, ..."""

    def __init__(s, F_=193, S=12, D=256, H=4, FF=1024, L=1):
        super().__init__()
        s.H, s.L = H, L
        s.emb = nn.Linear(F_, D)
        if L == 1:
            make_block(s, D, H, FF)
        else:
            s.blocks = nn.ModuleList(Block(D, H, FF) for _ in range(L))
        s.head = nn.Linear(D, 1)

    def forward(s, x):
        h = s.emb(x)
        for b in ([s] if s.L == 1 else s.blocks):
            h = block_forward(b, h, s.H)
        return s.head(h.mean(dim=1)).squeeze(-1)


def loss_fn(model, x, y):
    return F.binary_cross_entropy_with_logits(model(x), y)


def config_from(tensors):
    D, F_ = tensors["emb.weight"].shape
    blocks = {int(n.split(".")[1]) for n in tensors if n.startswith("blocks.")}
    L = len(blocks) if blocks else 1
    pre = "blocks.0." if blocks else ""
    FF = tensors[pre + "f1.weight"].shape[0]
    dh = tensors[pre + "qn.weight"].shape[0]
    S = tensors["x"].shape[1]
    return F_, S, D, D // dh, FF, L


def oracle(inp, out):
    t = load_file(inp)
    F_, S, D, H, FF, L = config_from(t)
    model = XAsset(F_, S, D, H, FF, L).double()
    names = [n for n, _ in model.named_parameters()]
    model.load_state_dict({n: t[n].double() for n in names})
    x, y = t["x"].double(), t["y"].double()
    loss = loss_fn(model, x, y)
    loss.backward()
    res = {"loss": loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        res["grad." + n] = p.grad.detach().clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    opt.step()
    for n, p in model.named_parameters():
        res["adamw." + n] = p.detach().clone()
    save_file({k: v.contiguous() for k, v in res.items()}, out)
    print(json.dumps({"loss": loss.item(), "params": len(names), "config": [F_, S, D, H, FF, L]}))


def init(out, cfg, batch, seed):
    torch.manual_seed(seed)
    F_, S, D, H, FF = cfg[:5]
    L = cfg[5] if len(cfg) > 5 else 1
    model = XAsset(F_, S, D, H, FF, L)
    t = {n: p.detach().clone().contiguous() for n, p in model.named_parameters()}
    # LayerNorm parameters start at 1/0 in PyTorch; perturb them so their gradients are exercised.
    for n in list(t):
        if n.split(".")[-2] in ("ln1", "ln2", "qn", "kn"):
            t[n] = t[n] + 0.1 * torch.randn_like(t[n])
    t["x"] = torch.randn(batch, S, F_)
    t["y"] = (torch.rand(batch) > 0.5).float()
    save_file(t, out)


def bench(json_path, compiled=False, layers=1, bf16=False, tf32=False):
    dev = torch.device("cuda")
    # --tf32: float32 storage, matrix products on TF32 tensor cores (as `--precision tf32`).
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.manual_seed(0)
    model = XAsset(L=layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # default (foreach) eager implementation
    # --bf16: every forward under torch.autocast(bfloat16) (products and attention in bf16 on
    # tensor cores, LayerNorm/softmax/loss in float32; float32 parameters, gradients, AdamW).
    def lf(m, x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = m(x)
        return F.binary_cross_entropy_with_logits(out.float(), y)
    X = torch.randn(256, 12, 193, device=dev)
    Y = (torch.rand(256, device=dev) > 0.5).float()

    def med(fn, iters, warm):
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ts = []
        for _ in range(iters):
            s.record(); fn(); e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        return sorted(ts)[len(ts) // 2]

    def batched(o=opt):
        o.zero_grad(set_to_none=False)
        lf(model, X, Y).backward()
        o.step()

    def per_sample():
        opt.zero_grad(set_to_none=False)
        for i in range(256):
            (lf(model, X[i:i + 1], Y[i:i + 1]) / 256).backward()
        opt.step()

    r = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "layers": layers,
         "precision": "bf16 autocast" if bf16 else ("float32, TF32 on" if tf32 else "float32, TF32 off")}
    batched(); torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    batched(); torch.cuda.synchronize()
    r["batched_step_peak_MiB"] = torch.cuda.max_memory_allocated() / 2**20
    r["batched_eager_ms"] = med(batched, 30, 5)
    r["per_sample_eager_ms"] = med(per_sample, 5, 2)
    # whole batched step as one CUDA graph: zero_grad, forward, backward and a capturable AdamW inside
    opt_c = torch.optim.AdamW(model.parameters(), lr=1e-3, capturable=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            batched(opt_c)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        batched(opt_c)
    r["batched_graph_ms"] = med(g.replay, 50, 5)
    # per-sample schedule: one sample's forward+backward captured, replayed 256 times, eager AdamW step
    xs, ys = torch.empty(1, 12, 193, device=dev), torch.empty(1, device=dev)

    def one():
        (lf(model, xs, ys) / 256).backward()

    with torch.cuda.stream(side):
        for _ in range(3):
            one()
    torch.cuda.current_stream().wait_stream(side)
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        one()

    def per_sample_graph():
        opt.zero_grad(set_to_none=False)
        for i in range(256):
            xs.copy_(X[i:i + 1]); ys.copy_(Y[i:i + 1]); g2.replay()
        opt.step()

    r["per_sample_graph_ms"] = med(per_sample_graph, 5, 2)
    if compiled:
        # the same two captured schedules with the model compiled by torch.compile (Inductor's
        # default mode: fused Triton kernels, cuBLAS for the products); about 20 s to compile
        cm = torch.compile(model)

        def cbatched(o=opt_c):
            o.zero_grad(set_to_none=False)
            lf(cm, X, Y).backward()
            o.step()

        def cone():
            (lf(cm, xs, ys) / 256).backward()

        with torch.cuda.stream(side):
            for _ in range(3):
                cbatched()
                cone()
        torch.cuda.current_stream().wait_stream(side)
        g3 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g3):
            cbatched()
        r["compiled_batched_graph_ms"] = med(g3.replay, 50, 5)
        g4 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g4):
            cone()

        def cper_sample_graph():
            opt.zero_grad(set_to_none=False)
            for i in range(256):
                xs.copy_(X[i:i + 1]); ys.copy_(Y[i:i + 1]); g4.replay()
            opt.step()

        r["compiled_per_sample_graph_ms"] = med(cper_sample_graph, 5, 2)
    print(json.dumps(r))
    if json_path:
        json.dump(r, open(json_path, "w"), indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("job", choices=["oracle", "init", "bench"])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--config", default="193,12,256,4,1024")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--layers", type=int, default=1,
                    help="bench: XAsset blocks (docs/xasset.md, Depth)")
    ap.add_argument("--bf16", action="store_true",
                    help="bench: forward under torch.autocast(bfloat16), as mixed-precision users train")
    ap.add_argument("--tf32", action="store_true",
                    help="bench: float32 with TF32 matrix products (torch.backends.cuda.matmul.allow_tf32)")
    ap.add_argument("--compiled", action="store_true",
                    help="bench: also time both captured schedules with the model under torch.compile")
    a = ap.parse_args()
    if a.job == "oracle":
        oracle(a.paths[0], a.paths[1])
    elif a.job == "init":
        init(a.paths[0], [int(v) for v in a.config.split(",")], a.batch, a.seed)
    else:
        if a.bf16 and a.tf32:
            ap.error("--bf16 and --tf32 exclude each other")
        bench(a.json, a.compiled, a.layers, a.bf16, a.tf32)
