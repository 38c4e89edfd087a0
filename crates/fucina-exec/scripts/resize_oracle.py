"""PyTorch reference values for fucina-exec's `pad` and `interpolate`
(crates/fucina-exec/tests/resize.rs reads the printed Rust constants).

Run in a throwaway venv with torch installed, never in CI:
    python crates/fucina-exec/scripts/resize_oracle.py > /tmp/resize_ref.rs
The input is x[i] = sin(0.7 i + 0.3) * 2 over [1, 2, 3, 4] (the 3-D pads:
[1, 2, 3, 4, 5]); the output
gradient g[j] = cos(0.37 j) (float64 throughout).
"""
import math
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)


def inp(shape):
    n = math.prod(shape)
    return torch.tensor([math.sin(0.7 * i + 0.3) * 2 for i in range(n)]).reshape(shape)


def run(name, shape, f):
    x = inp(shape).requires_grad_(True)
    y = f(x)
    g = torch.tensor([math.cos(0.37 * j) for j in range(y.numel())]).reshape(y.shape)
    (y * g).sum().backward()
    fmt = lambda t: ", ".join(repr(float(v)) for v in t.flatten().tolist())
    print(f"// {name}: output shape {list(y.shape)}")
    print(f"const {name}_Y: &[f64] = &[{fmt(y.detach())}];")
    print(f"const {name}_GX: &[f64] = &[{fmt(x.grad)}];")


S = [1, 2, 3, 4]
run("NEAREST_SIZE", S, lambda x: F.interpolate(x, size=(5, 7), mode="nearest"))
run("NEAREST_SCALE", S, lambda x: F.interpolate(x, scale_factor=(1.5, 0.75), mode="nearest"))
run("NEAREST_DOWN", S, lambda x: F.interpolate(x, size=(2, 3), mode="nearest"))
run("BILINEAR_SIZE", S, lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=False))
run("BILINEAR_ALIGNED", S, lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=True))
run("BILINEAR_SCALE", S, lambda x: F.interpolate(x, scale_factor=(2.0, 1.5), mode="bilinear", align_corners=False))
run("BILINEAR_DOWN", S, lambda x: F.interpolate(x, size=(2, 3), mode="bilinear", align_corners=False))
run("PAD_CONSTANT", S, lambda x: F.pad(x, (1, 2, 2, 0), mode="constant", value=0.5))
run("PAD_REFLECT", S, lambda x: F.pad(x, (3, 1, 2, 1), mode="reflect"))
run("PAD_REPLICATE", S, lambda x: F.pad(x, (2, 3, 1, 4), mode="replicate"))
run("PAD_REFLECT_1D", [2, 3, 4], lambda x: F.pad(x, (3, 2), mode="reflect"))
run("PAD_REPLICATE_1D", [2, 3, 4], lambda x: F.pad(x, (1, 5), mode="replicate"))
run("PAD_CROP_CONSTANT", S, lambda x: F.pad(x, (-1, 2, 1, -2), mode="constant", value=0.5))
run("PAD_CROP_REFLECT", S, lambda x: F.pad(x, (-2, 3, 2, -1), mode="reflect"))
run("PAD_CROP_REPLICATE_1D", [2, 3, 4], lambda x: F.pad(x, (2, -3), mode="replicate"))
S5 = [1, 2, 3, 4, 5]
run("PAD3D_CONSTANT", S5, lambda x: F.pad(x, (1, 2, 0, 1, 2, 1), mode="constant", value=-0.25))
run("PAD3D_REFLECT", S5, lambda x: F.pad(x, (4, 1, 2, 3, 2, 1), mode="reflect"))
run("PAD3D_REPLICATE", S5, lambda x: F.pad(x, (2, 3, 1, 4, 3, 2), mode="replicate"))
run("PAD3D_CROP", S5, lambda x: F.pad(x, (-2, 1, 1, -3, -1, 2), mode="constant", value=1.5))
run("PAD3D_CROP_REFLECT", S5, lambda x: F.pad(x, (-1, 2, 1, -1, -2, 1), mode="reflect"))
