# Checks the two rebuilt kernels on the GPU against numpy (CuPy loads the committed PTX).
# Usage (on a GPU machine with CuPy, from the repository root): put the PTX before 358c269 in
# OLD_PTX_DIR (git show 358c269~1:kernels/ptx/rows.ptx > OLD_PTX_DIR/rows.ptx, same for select.ptx).
import numpy as np, cupy as cp, sys
print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
def mod(name, ptx):
    return cp.RawModule(path=ptx).get_function(name)
for tag, d in (("old", "OLD_PTX_DIR"), ("new", "kernels/ptx")):
    sm = mod("zc_softmax_rows_f32", f"{d}/rows.ptx")
    rng = np.random.default_rng(40)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    mask = rng.random((3, 5)) < 0.4; mask[:, 0] = False
    x[mask] = -np.inf
    xi = cp.asarray(x); out = cp.zeros_like(xi)
    sm((3,), (128,), (out, xi, np.uint64(3), np.uint64(5)))
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True)); want = e / e.sum(1, keepdims=True)
    got = out.get()
    print(tag, "softmax with -inf: NaN in output:", bool(np.isnan(got).any()), "max abs err:", float(np.nanmax(np.abs(got - want))))
    sel = mod("zc_select_f32", f"{d}/select.ptx")
    c = cp.asarray(np.array([1, 0, np.nan, -3], np.float32)); a = cp.ones(4, cp.float32); b = cp.zeros(4, cp.float32); o = cp.zeros(4, cp.float32)
    sel((1,), (32,), (o, c, a, b, np.uint64(4)))
    print(tag, "select NaN bits:", [hex(v) for v in o.get().view(np.uint32)])
