"""PyTorch at the shapes of benches/benches/sequence_layers.rs, the
same-run baseline of its figures in docs/BENCHMARKS.md: forward + backward of
a 2-layer nn.LSTM (input and hidden 256, sequence 128, batch 32) and of a
self-attention nn.MultiheadAttention (embed 256, 8 heads, sequence 128, batch
16, batch_first, need_weights=False), each with the input's gradient, then
the gradients cleared. Prints the median and range of --runs timed runs after
a warm-up. Run by hand in a throwaway venv (never in CI):

    python benches/torch/sequence_layers.py --threads 2 --runs 10
"""

import argparse

import torch

from layers_step import timed  # the same warm-up + median timer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--only", choices=["lstm", "mha"], default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    th = a.threads
    if a.only in (None, "lstm"):
        lstm = torch.nn.LSTM(256, 256, num_layers=2)
        x = torch.randn(128, 32, 256, requires_grad=True)

        def step():
            y, _ = lstm(x)
            y.sum().backward()
            x.grad = None
            lstm.zero_grad(set_to_none=True)
        m, lo, hi = timed(a.runs, step)
        print(f"torch lstm_2x256_seq128_b32_fwd_bwd_t{th}: median {m:.2f} ms [{lo:.2f}-{hi:.2f}]")
    if a.only in (None, "mha"):
        mha = torch.nn.MultiheadAttention(256, 8, batch_first=True)
        q = torch.randn(16, 128, 256, requires_grad=True)

        def step():
            y, _ = mha(q, q, q, need_weights=False)
            y.sum().backward()
            q.grad = None
            mha.zero_grad(set_to_none=True)
        m, lo, hi = timed(a.runs, step)
        print(f"torch mha_e256_h8_seq128_b16_fwd_bwd_t{th}: median {m:.2f} ms [{lo:.2f}-{hi:.2f}]")
    print(f"torch {torch.__version__}, mkldnn {torch.backends.mkldnn.is_available()}, "
          f"threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
