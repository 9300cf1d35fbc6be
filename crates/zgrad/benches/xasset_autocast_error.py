#!/usr/bin/env python3
"""PyTorch's own error under bf16 autocast on the oracle fixtures (issue 42, item 5).

One XAsset training step (docs/xasset.md), from the parameters and batch of each oracle fixture
in tests/fixtures (tiny and small: L = 1; deep2: L = 2; deep3: L = 3), in both schedules:

  batched:     one forward and backward over the fixture's whole batch (mean BCE);
  per_sample:  for each sample alone a forward and a backward of its loss / B, the gradients
               accumulated in the float32 .grad (docs/xasset.md, "per-sample");

then one AdamW step (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01, zero moments), as the
oracle takes it. Each run's loss, every parameter's gradient and every parameter after the step
is compared with the float64 oracle (xasset_*_oracle.safetensors: `loss`, `grad.<name>`,
`adamw.<name>`), per tensor:

  max_abs:  max |ours - oracle| over the elements;
  rel:      ||ours - oracle|| / ||oracle|| (2-norms), the measure of docs/xasset.md and of
            crates/zgrad/tests/it/oracle.rs; null where the oracle tensor is all zero.

Precisions: `bf16` (the forward under torch.autocast(device, dtype=torch.bfloat16), the loss in
float32 on the float32 logits, float32 parameters, gradients and AdamW: what a PyTorch user
runs, as xasset_torch.py's and xasset_user_loop_torch.py's bf16 variants do), `float32` (TF32
off) as the baseline, and on CUDA `tf32` (float32 with TF32 matrix products). The per-run
`summary` gives the largest `rel` over the gradients and over the parameters after the step,
leaving out each block's kn.bias: its gradient is zero in exact arithmetic (LayerNorm of k feeds
a softmax that is shift-invariant per query), so its `rel` is rounding noise over ~1e-17 and
its update is the sign of that noise (docs/xasset.md); its `max_abs` is still reported.

Runs wherever PyTorch and safetensors are installed, from a fresh clone (no other files):

  python3 crates/zgrad/benches/xasset_autocast_error.py [--device auto|cuda|cpu]
      [--fixtures DIR] [--configs tiny,small,deep2,deep3] [--json OUT.json]
      [--draws K --draws-out DIR]

--draws K also runs, per fixture, K draws of its batch (each element of x times 1 + 0.05 r, r
from splitmix64 seeded with the draw number: `drawn_x`), each draw's float64 oracle (loss and
gradients, written to DIR/xasset_<fixture>_draws.safetensors) and bf16 autocast's `rel` per
tensor in both schedules (the fixture's `draws` entry). One fixture is one draw of the rounding:
zgrad's test `a_bf16_step_is_within_twice_autocast_mean_error_over_draws` compares our mean
error over the same draws with autocast's (docs/precision.md).

--device auto takes the GPU when there is one (autocast "cuda"), else the CPU (autocast "cpu",
whose op lists differ: see the `autocast` entry of the output). Prints one JSON object.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
sys.path.insert(0, HERE)
from xasset_torch import XAsset, config_from  # noqa: E402  (the reference model, same folder)

FIXTURES = os.path.normpath(os.path.join(HERE, "..", "..", "..", "tests", "fixtures"))
CONFIGS = ["tiny", "small", "deep2", "deep3"]
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def loss_of(model, x, y, precision, device_type):
    """Mean BCE with logits; under bf16 the forward runs in autocast and the loss in float32."""
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        out = model(x)
    return F.binary_cross_entropy_with_logits(out.float(), y)


def one_step(t, cfg, schedule, precision, dev):
    """One training step from the fixture's tensors; returns (loss, grads, params after)."""
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = precision == "tf32"
    model = XAsset(*cfg).to(dev)
    names = [n for n, _ in model.named_parameters()]
    model.load_state_dict({n: t[n].float() for n in names})
    x, y = t["x"].float().to(dev), t["y"].float().to(dev)
    opt = torch.optim.AdamW(model.parameters(), foreach=False, **ADAMW)
    opt.zero_grad(set_to_none=False)
    if schedule == "batched":
        loss = loss_of(model, x, y, precision, dev.type)
        loss.backward()
        loss_value = loss.detach().double()
    else:
        batch = x.shape[0]
        total = torch.zeros((), dtype=torch.float64, device=dev)
        for i in range(batch):
            li = loss_of(model, x[i:i + 1], y[i:i + 1], precision, dev.type)
            (li / batch).backward()
            total += li.detach().double()
        loss_value = total / batch
    grads = {n: p.grad.detach().double().cpu() for n, p in model.named_parameters()}
    opt.step()
    after = {n: p.detach().double().cpu() for n, p in model.named_parameters()}
    return loss_value.reshape(1).cpu(), grads, after


def error(ours, oracle):
    d = (ours - oracle).abs()
    norm = oracle.norm().item()
    return {
        "max_abs": d.max().item(),
        "rel": (ours - oracle).norm().item() / norm if norm > 0 else None,
    }


def compare(oracle, loss, grads, after):
    tensors = {"loss": error(loss, oracle["loss"])}
    for n, g in grads.items():
        tensors["grad." + n] = error(g, oracle["grad." + n])
    for n, p in after.items():
        tensors["adamw." + n] = error(p, oracle["adamw." + n])

    def worst(prefix):
        return max(e["rel"] for k, e in tensors.items()
                   if k.startswith(prefix) and not k.endswith("kn.bias") and e["rel"] is not None)

    summary = {"loss_rel": tensors["loss"]["rel"], "grad_rel_max": worst("grad."),
               "adamw_rel_max": worst("adamw.")}
    return summary, tensors


MASK64 = (1 << 64) - 1


def splitmix64(state):
    """Yields splitmix64's outputs from `state` (the generator zgrad's draws test repeats)."""
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        yield z ^ (z >> 31)


def drawn_x(x, draw):
    """Draw `draw` (1, 2, ...) of the fixture's batch: each element of x times (1 + 0.05 r),
    r uniform in [-1, 1) from splitmix64 seeded with the draw number, in row-major order; the
    product in float64, rounded once to float32."""
    gen = splitmix64(draw)
    flat = x.double().reshape(-1).tolist()
    r = [((next(gen) >> 11) * 2.0 ** -53) * 2.0 - 1.0 for _ in flat]
    out = torch.tensor([a * (1.0 + 0.05 * b) for a, b in zip(flat, r)], dtype=torch.float64)
    return out.float().reshape(x.shape)


def f64_oracle(t, cfg):
    """The float64 step's loss and gradients on the CPU (xasset_torch.py's oracle, no AdamW)."""
    model = XAsset(*cfg).double()
    names = [n for n, _ in model.named_parameters()]
    model.load_state_dict({n: t[n].double() for n in names})
    loss = F.binary_cross_entropy_with_logits(model(t["x"].double()), t["y"].double())
    loss.backward()
    res = {"loss": loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        res["grad." + n] = p.grad.detach().clone()
    return res


def draws(name, t, cfg, count, dev, out_dir):
    """`count` draws of the fixture's batch (`drawn_x`): each one's float64 oracle (loss and
    gradients, written to `out_dir/xasset_<name>_draws.safetensors` as `<draw>.loss` (float64),
    `<draw>.grad.<param>` (float32), with `xsum` [count], each draw's batch summed in float64 so the reader
    can check it drew the same numbers) and autocast's `rel` per tensor in both schedules."""
    oracle_file, xsums, rels = {}, [], {}
    for draw in range(1, count + 1):
        td = dict(t)
        td["x"] = drawn_x(t["x"], draw)
        xsums.append(td["x"].double().sum().item())
        # Gradients stored as float32 (6e-8 relative, far below any bf16 error; the file is
        # half the size) and compared in that form here and in zgrad's test alike.
        oracle = {k: v if k == "loss" else v.float().double()
                  for k, v in f64_oracle(td, cfg).items()}
        for k, v in oracle.items():
            oracle_file[f"{draw}.{k}"] = (v if k == "loss" else v.float()).contiguous()
        for schedule in ["batched", "per_sample"]:
            loss, grads, _ = one_step(td, cfg, schedule, "bf16", dev)
            run = rels.setdefault(f"bf16/{schedule}", {})
            ours = {"loss": loss, **{"grad." + n: g for n, g in grads.items()}}
            for k, v in ours.items():
                e = error(v, oracle[k])["rel"]
                if e is not None:
                    run.setdefault(k, []).append(e)
    oracle_file["xsum"] = torch.tensor(xsums, dtype=torch.float64)
    save_file(oracle_file, os.path.join(out_dir, f"xasset_{name}_draws.safetensors"))
    summary = {}
    for run, tensors in rels.items():
        summary[run] = {k: {"mean": sum(v) / len(v), "rels": [float(f"{e:.4g}") for e in v]}
                        for k, v in tensors.items()}
    return summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    ap.add_argument("--fixtures", default=FIXTURES, help="folder of xasset_*_{in,oracle}.safetensors")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", help="also write the JSON object here")
    ap.add_argument("--draws", type=int, default=0,
                    help="also run K perturbed draws of each fixture's batch (bf16 only)")
    ap.add_argument("--draws-out", default=".", help="folder for the draws' float64 oracles")
    a = ap.parse_args()
    if a.device == "auto":
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(a.device)
    precisions = ["float32", "bf16"] + (["tf32"] if dev.type == "cuda" else [])
    out = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
        "autocast": {"device_type": dev.type, "dtype": "bfloat16",
                     "note": "forward under autocast; loss (BCE with logits) on the float32 "
                             "logits; float32 parameters, .grad and AdamW (foreach=False)"},
        "adamw": {**ADAMW, "betas": list(ADAMW["betas"])},
        "measures": {"max_abs": "max |ours - oracle|",
                     "rel": "||ours - oracle||_2 / ||oracle||_2 (null where the oracle is zero)",
                     "summary": "largest rel over grad.* and adamw.*, each block's kn.bias left "
                                "out (zero gradient in exact arithmetic)"},
        "fixtures": {},
    }
    for name in a.configs.split(","):
        t = load_file(os.path.join(a.fixtures, f"xasset_{name}_in.safetensors"))
        oracle = {k: v.double() for k, v in
                  load_file(os.path.join(a.fixtures, f"xasset_{name}_oracle.safetensors")).items()}
        cfg = config_from(t)
        runs = {}
        for precision in precisions:
            for schedule in ["batched", "per_sample"]:
                loss, grads, after = one_step(t, cfg, schedule, precision, dev)
                summary, tensors = compare(oracle, loss, grads, after)
                runs[f"{precision}/{schedule}"] = {"summary": summary, "tensors": tensors}
        out["fixtures"][name] = {
            "config": dict(zip(["F", "S", "D", "H", "FF", "L"], cfg)),
            "batch": t["x"].shape[0],
            "runs": runs,
        }
        if a.draws:
            out["fixtures"][name]["draws"] = draws(name, t, cfg, a.draws, dev, a.draws_out)
    text = json.dumps(out, indent=1)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
