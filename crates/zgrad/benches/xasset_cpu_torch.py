#!/usr/bin/env python3
"""PyTorch eager on the CPU, the reference for `cargo run --release -p zgrad --example cpu_bench`:
the default XAsset (F=193, S=12, D=256, H=4, FF=1024; docs/xasset.md), float32, AdamW (lr 1e-3,
weight decay 0.01), timed the way the example times ours:

  batched:    zero_grad, forward and backward of the mean BCE over B samples, one AdamW step.
  per-sample: zero_grad, for each of P samples forward and backward of its loss / P (gradient
              accumulation), one AdamW step.

Prints `key=value` lines: torch, threads, batched_ms, batched_cpu_ms, batched_samples_per_s,
per_sample_ms, per_sample_cpu_ms, per_sample_samples_per_s: medians over --iters steps after
warm-up steps, wall-clock and (Linux) the CPU time of all the process's threads. --only runs
one schedule.

  python3 xasset_cpu_torch.py [--threads N] [--batch 256] [--per-sample 32] [--iters 10]
                              [--only all|batched|per-sample]
"""
import argparse
import glob
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class XAsset(nn.Module):
    """docs/xasset.md steps 1-9 with one block (the names of xasset_torch.py beside this file)."""

    def __init__(s, F_=193, D=256, H=4, FF=1024):
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
        h = s.emb(x)
        B, S, _ = h.shape
        q, k, v = s.qkv(s.ln1(h)).view(B, S, 3, s.H, -1).unbind(2)
        q = s.qn(q).transpose(1, 2)
        k = s.kn(k).transpose(1, 2)
        v = v.transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-1, -2) / (q.shape[-1] ** 0.5), dim=-1) @ v
        h = h + s.o(att.transpose(1, 2).reshape(B, S, -1))
        h = h + s.f2(torch.tanh(s.f1(s.ln2(h))))
        return s.head(h.mean(dim=1)).squeeze(-1)


def cpu_ms():
    """CPU time of every thread of this process so far (Linux), in milliseconds."""
    total = 0
    for f in glob.glob("/proc/self/task/*/schedstat"):
        try:
            total += int(open(f).read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total / 1e6


def median_ms(step, warm, iters):
    for _ in range(warm):
        step()
    wall, cpu = [], []
    for _ in range(iters):
        t, c = time.perf_counter(), cpu_ms()
        step()
        wall.append((time.perf_counter() - t) * 1e3)
        cpu.append(cpu_ms() - c)
    return statistics.median(wall), statistics.median(cpu)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--per-sample", type=int, default=32)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--only", choices=["all", "batched", "per-sample"], default="all")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = XAsset()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    X = torch.randn(a.batch, 12, 193)
    Y = (torch.rand(a.batch) > 0.5).float()

    def batched():
        opt.zero_grad(set_to_none=False)
        F.binary_cross_entropy_with_logits(model(X), Y).backward()
        opt.step()

    P = a.per_sample

    def per_sample():
        opt.zero_grad(set_to_none=False)
        for i in range(P):
            (F.binary_cross_entropy_with_logits(model(X[i:i + 1]), Y[i:i + 1]) / P).backward()
        opt.step()

    print(f"torch={torch.__version__}")
    print(f"threads={torch.get_num_threads()}")
    if a.only in ("all", "batched"):
        b, bc = median_ms(batched, 2, a.iters)
        print(f"batched_ms={b:.3f}")
        print(f"batched_cpu_ms={bc:.3f}")
        print(f"batched_samples_per_s={a.batch / b * 1e3:.1f}")
    if a.only in ("all", "per-sample"):
        p, pc = median_ms(per_sample, 2, a.iters)
        print(f"per_sample_ms={p:.3f}")
        print(f"per_sample_cpu_ms={pc:.3f}")
        print(f"per_sample_samples_per_s={P / p * 1e3:.1f}")


if __name__ == "__main__":
    main()
