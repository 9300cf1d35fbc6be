#!/usr/bin/env python3
"""PyTorch reference timings for examples/gpu_bench.rs: the same ops and shapes, CUDA events,
median of 5 rounds after 3 warm-ups, TF32 off. Prints one JSON object per line."""
import json

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")


def timed(iters, f):
    for _ in range(3):
        f()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rounds = []
    for _ in range(5):
        start.record()
        for _ in range(iters):
            f()
        end.record()
        end.synchronize()
        rounds.append(start.elapsed_time(end) / iters)
    rounds.sort()
    return rounds[2]


def emit(name, ms, rate, unit, of_copy=None):
    print(json.dumps({"name": name, "ms": round(ms, 4), "rate": round(rate, 2), "unit": unit,
                      "of_copy": None if of_copy is None else round(of_copy, 3)}), flush=True)


def memory_bound():
    n = 1 << 28
    gib = n * 4
    a = torch.full((n,), 0.5, device=dev)
    b = torch.full((n,), 0.25, device=dev)
    c = torch.empty_like(a)
    copy = timed(10, lambda: c.copy_(a))
    bw = 2 * gib / copy / 1e6
    emit("copy_dtod_1GiB", copy, bw, "GB/s", 1.0)
    t = timed(10, lambda: torch.tanh(a))
    emit("tanh_1GiB", t, 2 * gib / t / 1e6, "GB/s", 2 * gib / t / 1e6 / bw)
    t = timed(10, lambda: a + b)
    emit("add_1GiB", t, 3 * gib / t / 1e6, "GB/s", 3 * gib / t / 1e6 / bw)
    del a, b, c
    x = (torch.arange(65536 * 256, device=dev) % 251).float().mul(0.01).sub(1.0).reshape(65536, 256)
    y = torch.empty_like(x)
    nbytes = x.numel() * 4
    copy = timed(50, lambda: y.copy_(x))
    bw = 2 * nbytes / copy / 1e6
    emit("copy_dtod_64MiB", copy, bw, "GB/s", 1.0)
    t = timed(50, lambda: torch.softmax(x, dim=-1))
    emit("softmax_65536x256", t, 2 * nbytes / t / 1e6, "GB/s", 2 * nbytes / t / 1e6 / bw)
    w = torch.ones(256, device=dev)
    bias = torch.zeros(256, device=dev)
    t = timed(50, lambda: torch.nn.functional.layer_norm(x, (256,), w, bias, 1e-5))
    emit("layer_norm_65536x256", t, 2 * nbytes / t / 1e6, "GB/s", 2 * nbytes / t / 1e6 / bw)


def products():
    cases = [
        ("emb_3072x193_x_256x193T", (3072, 193), (256, 193), False, True, 50),
        ("qkv_3072x256_x_768x256T", (3072, 256), (768, 256), False, True, 50),
        ("o_3072x256_x_256x256T", (3072, 256), (256, 256), False, True, 50),
        ("f1_3072x256_x_1024x256T", (3072, 256), (1024, 256), False, True, 50),
        ("f2_3072x1024_x_256x1024T", (3072, 1024), (256, 1024), False, True, 50),
        ("f1_dw_3072x1024T_x_3072x256", (3072, 1024), (3072, 256), True, False, 50),
        ("attn_qk_1024x12x64_x_1024x12x64T", (1024, 12, 64), (1024, 12, 64), False, True, 50),
        ("attn_av_1024x12x12_x_1024x12x64", (1024, 12, 12), (1024, 12, 64), False, False, 50),
        ("emb_dw_3072x256T_x_3072x193", (3072, 256), (3072, 193), True, False, 50),
        ("mm_8192x8192x8192", (8192, 8192), (8192, 8192), False, False, 3),
    ]
    for name, sa, sb, ta, tb, iters in cases:
        a = torch.rand(sa, device=dev) - 0.5
        b = torch.rand(sb, device=dev) - 0.5
        opa = a.transpose(-1, -2) if ta else a
        opb = b.transpose(-1, -2) if tb else b
        f = (lambda: torch.bmm(opa, opb)) if a.dim() == 3 else (lambda: torch.mm(opa, opb))
        ms = timed(iters, f)
        batch = a.shape[0] if a.dim() == 3 else 1
        m, k = opa.shape[-2], opa.shape[-1]
        n = opb.shape[-1]
        emit(name, ms, 2 * batch * m * n * k / ms / 1e9, "TFLOP/s")


if __name__ == "__main__":
    print("# torch", torch.__version__, torch.cuda.get_device_name(0), flush=True)
    memory_bound()
    products()
