"""PyTorch at the shapes of benches/benches/unet_layers.rs: forward +
backward (the input's, the weight's and the bias's gradients) of
nn.ConvTranspose2d(64, 64, 2, stride=2) on [16, 64, 32, 32], of
nn.ConvTranspose2d(64, 64, 3, padding=1) and of nn.GroupNorm(32, 64) on
[16, 64, 64, 64], float32, the loss y.sum(), the gradients released after
each step. Prints the median and the range of --runs timed steps after
--warmup steps. The same-run baseline of the figures in docs/BENCHMARKS.md;
run by hand in a throwaway venv (never in CI):

    python benches/torch/unet_layers.py --threads 2 --runs 20
"""

import argparse
import statistics
import time

import torch


def timed(runs, warmup, f):
    for _ in range(warmup):
        f()
    t = []
    for _ in range(runs):
        s = time.perf_counter()
        f()
        t.append((time.perf_counter() - s) * 1e3)
    t.sort()
    return statistics.median(t), t[0], t[-1]


def case(layer, shape):
    x = torch.randn(shape, requires_grad=True)

    def f():
        y = layer(x)
        y.sum().backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)
    return f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--only", default=None, help="run the cases whose name contains this")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cases = [
        ("conv_transpose2d_2x2_s2_b16_64c_32to64",
         torch.nn.ConvTranspose2d(64, 64, 2, stride=2), (16, 64, 32, 32)),
        ("conv_transpose2d_3x3_s1_p1_b16_64c_64",
         torch.nn.ConvTranspose2d(64, 64, 3, padding=1), (16, 64, 64, 64)),
        ("group_norm_32g_b16_64c_64x64", torch.nn.GroupNorm(32, 64), (16, 64, 64, 64)),
    ]
    for name, layer, shape in cases:
        if a.only and a.only not in name:
            continue
        m, lo, hi = timed(a.runs, a.warmup, case(layer, shape))
        print(f"torch {name} fwd+bwd threads={a.threads}: median {m:.2f} ms [{lo:.2f}-{hi:.2f}]")
    print(f"torch {torch.__version__}, mkldnn {torch.backends.mkldnn.is_available()}")


if __name__ == "__main__":
    main()
