#!/usr/bin/env python3
"""Writes one synthetic data set in every format `ztrain --data` reads, for trying the
formats and checking that they train alike:

    python3 crates/ztrain/scripts/write_data_files.py OUT_DIR [--samples N] [--scales S]
        [--features F] [--bars ROWS] [--seed SEED]

writes OUT_DIR/data.csv, data.parquet (pyarrow's default snappy pages), data.arrow (Arrow IPC
file, uncompressed), data.npz (np.savez_compressed: x [N, S, F], y [N]), x.npy and y.npy, and
data.safetensors (tensors x and y), all holding the same float32 values; and bars.parquet and
bars.csv, a series of ROWS time steps of F features and a 0/1 label, for `--window`. Then, on
the CPU, each of

    ztrain --device cpu --scales S --features F --data OUT_DIR/data.csv --metrics m.csv ...

ends at the same validation loss, bit for bit (the metrics file prints it exactly).

Needs numpy and pyarrow (`pip install numpy pyarrow`); safetensors is written by hand (an
8-byte header length, a JSON header, the raw little-endian data), so that package is not
needed. The values are float32 throughout: the CSV prints each as the shortest text that reads
back as the same float32, so every format holds the same numbers.
"""

import argparse
import json
import os
import struct

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq


def synthetic(n, scales, features, rng):
    """Features from a normal distribution, labels from the sign of a fixed linear score (so a
    model has something to learn)."""
    x = rng.standard_normal((n, scales, features)).astype(np.float32)
    w = rng.standard_normal((scales, features)).astype(np.float32)
    y = ((x * w).sum(axis=(1, 2)) > 0).astype(np.float32)
    return x, y


def table(x2d, y, names):
    cols = {name: pa.array(x2d[:, i], type=pa.float32()) for i, name in enumerate(names)}
    cols["label"] = pa.array(y, type=pa.float32())
    return pa.table(cols)


def write_csv(path, x2d, y, names):
    with open(path, "w") as f:
        f.write(",".join(names + ["label"]) + "\n")
        for row, label in zip(x2d, y):
            # str(np.float32) is the shortest text that parses back to the same float32.
            f.write(",".join(str(v) for v in row) + "," + str(int(label)) + "\n")


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        data = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--samples", type=int, default=400)
    p.add_argument("--scales", type=int, default=3)
    p.add_argument("--features", type=int, default=6)
    p.add_argument("--bars", type=int, default=500)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rng = np.random.default_rng(a.seed)
    x, y = synthetic(a.samples, a.scales, a.features, rng)
    x2d = x.reshape(a.samples, a.scales * a.features)
    names = [f"x_{s}_{f}" for s in range(a.scales) for f in range(a.features)]
    out = lambda name: os.path.join(a.out, name)
    write_csv(out("data.csv"), x2d, y, names)
    pq.write_table(table(x2d, y, names), out("data.parquet"))
    feather.write_feather(table(x2d, y, names), out("data.arrow"), compression="uncompressed")
    np.savez_compressed(out("data.npz"), x=x, y=y)
    np.save(out("x.npy"), x)
    np.save(out("y.npy"), y)
    write_safetensors(out("data.safetensors"), {"x": x, "y": y})
    # A series of bars for --window: a random walk per feature, labelled by whether the first
    # feature rises at the next bar.
    walk = np.cumsum(rng.standard_normal((a.bars + 1, a.features)), axis=0).astype(np.float32)
    bars, rises = walk[:-1], (walk[1:, 0] > walk[:-1, 0]).astype(np.float32)
    bar_names = [f"f{f}" for f in range(a.features)]
    pq.write_table(table(bars, rises, bar_names), out("bars.parquet"))
    write_csv(out("bars.csv"), bars, rises, bar_names)
    for name in sorted(os.listdir(a.out)):
        print(f"{out(name)}: {os.path.getsize(out(name))} bytes")


if __name__ == "__main__":
    main()
