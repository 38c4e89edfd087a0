"""PyTorch at the shapes of benches/examples/layers_step.rs (forward +
backward of conv_transpose2d at U-Net shapes and of a 2-layer LSTM), the
same-run baseline of its figures in docs/BENCHMARKS.md. Run by hand in a
throwaway venv (never in CI):

    python benches/torch/layers_step.py --threads 2 --runs 7
"""

import argparse
import statistics
import time

import torch


def timed(runs, f):
    f()
    t = []
    for _ in range(runs):
        s = time.perf_counter()
        f()
        t.append((time.perf_counter() - s) * 1e3)
    t.sort()
    return statistics.median(t), t[0], t[-1]


def conv_case(x, w, **kw):
    x = torch.randn(x, requires_grad=True)
    w = (torch.randn(w) * 0.05).requires_grad_()
    b = torch.zeros(w.shape[1], requires_grad=True)

    def f():
        y = torch.nn.functional.conv_transpose2d(x, w, b, **kw)
        y.sum().backward()
        for t in (x, w, b):
            t.grad = None
    return f


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    th = a.threads
    m, lo, hi = timed(a.runs, conv_case((16, 64, 32, 32), (64, 64, 2, 2), stride=2))
    print(f"torch conv_transpose2d 2x2 s2 [16,64,32,32]->[16,64,64,64] fwd+bwd threads={th}: median {m:.2f} ms [{lo:.2f}-{hi:.2f}]")
    m, lo, hi = timed(a.runs, conv_case((16, 64, 64, 64), (64, 64, 3, 3), padding=1))
    print(f"torch conv_transpose2d 3x3 s1 p1 [16,64,64,64]->[16,64,64,64] fwd+bwd threads={th}: median {m:.2f} ms [{lo:.2f}-{hi:.2f}]")
    lstm = torch.nn.LSTM(256, 256, num_layers=2)
    x = torch.randn(128, 32, 256, requires_grad=True)

    def step():
        y, _ = lstm(x)
        y.sum().backward()
        x.grad = None
        lstm.zero_grad(set_to_none=True)
    m, lo, hi = timed(a.runs, step)
    print(f"torch LSTM 2x256 seq 128 batch 32 fwd+bwd threads={th}: median {m:.2f} ms [{lo:.2f}-{hi:.2f}]")
    print(f"torch {torch.__version__}, mkldnn {torch.backends.mkldnn.is_available()}")


if __name__ == "__main__":
    main()
