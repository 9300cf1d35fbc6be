#!/usr/bin/env python3
"""What a PyTorch user gets for a whole XAsset training epoch (the user-level anchor for ztrain).

python3 xasset_user_loop_torch.py [--samples N] [--layers L] [--only a,b] [--json FILE]
Trains the default-size XAsset (xasset_torch.py, beside this file) for one epoch over N random
samples (batch 256, shuffled), timing the epoch's training steps (wall clock, synchronised at
the end) in several ways a user would write it:
  typical:   data in pinned host memory, X[idx] gathered on the CPU, .cuda(non_blocking=True),
             eager model, fused AdamW, loss.item() every step (a progress bar needs it)
  resident:  the data set on the GPU, X[idx] gathered there, eager, loss read every 50 steps
  graph:     the data set on the GPU, the whole step (gather, forward, backward, capturable
             AdamW) as one CUDA graph; loss accumulated on the device, read at the end
  compiled:  as graph, with the model under torch.compile (Inductor)
  compiled_bf16: as compiled, under torch.autocast(bfloat16) (mixed precision; not f32)
Prints one JSON object: samples/s per variant and the device. Compare with `ztrain --capture
--epochs 2 --samples M` (M = N / (1 - validate fraction)): its second epoch's samples/s.
"""
import argparse, json, os, sys, time
import torch, torch.nn.functional as F
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xasset_torch import XAsset

ap = argparse.ArgumentParser()
ap.add_argument("--samples", type=int, default=65536)
ap.add_argument("--json")
ap.add_argument("--only", default="")
ap.add_argument("--layers", type=int, default=1)
a = ap.parse_args()
dev = torch.device("cuda")
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
N, B = a.samples, 256
steps = N // B
g = torch.Generator().manual_seed(0)
Xh = torch.randn(N, 12, 193, generator=g).pin_memory()
Yh = (torch.rand(N, generator=g) > 0.5).float().pin_memory()
out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "samples": N, "batch": B,
       "layers": a.layers}


def fresh():
    torch.manual_seed(0)
    m = XAsset(L=a.layers).to(dev)
    return m


def timed(fn):
    torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize()
    return time.perf_counter() - t


def typical():
    m = fresh(); opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, fused=True)
    def epoch():
        perm = torch.randperm(N)
        for i in range(steps):
            idx = perm[i * B:(i + 1) * B]
            x = Xh[idx].to(dev, non_blocking=True); y = Yh[idx].to(dev, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = F.binary_cross_entropy_with_logits(m(x), y); loss.backward(); opt.step()
            loss.item()
    epoch()  # warm
    return timed(epoch)


def resident():
    m = fresh(); opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, fused=True)
    X, Y = Xh.to(dev), Yh.to(dev)
    def epoch():
        perm = torch.randperm(N, device=dev)
        for i in range(steps):
            idx = perm[i * B:(i + 1) * B]
            opt.zero_grad(set_to_none=True)
            loss = F.binary_cross_entropy_with_logits(m(X[idx]), Y[idx]); loss.backward(); opt.step()
            if i % 50 == 0:
                loss.item()
    epoch()
    return timed(epoch)


def graphed(compiled=False, bf16=False):
    m = fresh()
    fwd = torch.compile(m) if compiled else m
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, capturable=True, fused=True)
    X, Y = Xh.to(dev), Yh.to(dev)
    idx = torch.zeros(B, dtype=torch.long, device=dev)
    acc = torch.zeros((), device=dev)
    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            logit = fwd(X[idx])
        loss = F.binary_cross_entropy_with_logits(logit.float(), Y[idx]); loss.backward(); opt.step()
        acc.add_(loss.detach())
    side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        step()
    def epoch():
        perm = torch.randperm(N, device=dev)
        for i in range(steps):
            idx.copy_(perm[i * B:(i + 1) * B]); gr.replay()
        acc.item()
    epoch()
    return timed(epoch)


variants = {
    "typical": typical,
    "resident": resident,
    "graph": lambda: graphed(),
    "compiled": lambda: graphed(compiled=True),
    "compiled_bf16": lambda: graphed(compiled=True, bf16=True),
}
for name, fn in variants.items():
    if a.only and name not in a.only.split(","):
        continue
    try:
        s = fn()
        out[name + "_samples_per_s"] = round(steps * B / s)
        out[name + "_ms_per_step"] = round(1000 * s / steps, 4)
    except Exception as e:  # report and go on
        out[name + "_error"] = repr(e)[:300]
    print(name, out.get(name + "_samples_per_s"), out.get(name + "_ms_per_step"), flush=True)
print(json.dumps(out))
if a.json:
    json.dump(out, open(a.json, "w"), indent=1)
