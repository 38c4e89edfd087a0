"""One training step of the train_fashion CNN in PyTorch on the CPU: the
PyTorch baseline of the `fashion_step` bench
(crates/fucina/benches/fashion_step.rs). Not part of CI.

    python3 -m venv /work/venv-torch && /work/venv-torch/bin/pip install torch
    /work/venv-torch/bin/python benches/torch/fashion_step.py --threads 1
    /work/venv-torch/bin/python benches/torch/fashion_step.py --threads 2

The model is the one `cargo run --release -p fucina --example train_fashion`
trains (defaults): conv 3x3 1->32 (padding 1, no bias) -> batch norm -> ReLU ->
max pool 2x2 -> conv 3x3 32->64 (padding 1, no bias) -> batch norm -> ReLU -> max pool 2x2 ->
flatten -> linear 3136->128 -> ReLU -> linear 128->10, cross-entropy, AdamW
(lr 2e-3, weight decay 1e-4), batch 64 of 1x28x28 float32 images in training
mode. A step is zero_grad + forward + backward + optimizer step. Prints the
median step time in milliseconds (and the quartiles) over --steps timed steps
after --warmup steps, with `torch.set_num_threads(--threads)`.

`--epoch` also times one pass over 60,000 random images in batches of 64
(938 steps, the last one ragged), the training part of one train_fashion epoch.
"""

import argparse
import statistics
import time

import torch
from torch import nn

BATCH = 64


def model(c1, c2, hidden):
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1, bias=False),
        nn.BatchNorm2d(c1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1, bias=False),
        nn.BatchNorm2d(c2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * 7 * 7, hidden),
        nn.ReLU(),
        nn.Linear(hidden, 10),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--conv1", type=int, default=32)
    ap.add_argument("--conv2", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--epoch", action="store_true", help="also time a 60,000-image epoch")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    net = model(args.conv1, args.conv2, args.hidden)
    net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=2e-3, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand(BATCH, 1, 28, 28)
    y = torch.randint(0, 10, (BATCH,))

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step(x, y)
    times = []
    for _ in range(args.steps):
        t = time.perf_counter()
        step(x, y)
        times.append(time.perf_counter() - t)
    q = statistics.quantiles(times, n=4)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s): "
        f"step median {1e3 * statistics.median(times):.3f} ms "
        f"(quartiles {1e3 * q[0]:.3f} .. {1e3 * q[2]:.3f} ms, {args.steps} steps)"
    )
    if args.epoch:
        xs = torch.rand(60000, 1, 28, 28)
        ys = torch.randint(0, 10, (60000,))
        perm = torch.randperm(60000)
        t = time.perf_counter()
        for i in range(0, 60000, BATCH):
            idx = perm[i : i + BATCH]
            step(xs[idx], ys[idx])
        print(f"torch epoch (60,000 images, batch {BATCH}): {time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    main()
