"""One training step of a 784-256-10 MLP (batch 64, ReLU, cross-entropy,
backward, plain SGD) compiled with jax.jit on the CPU: the JAX baseline of the
step benchmark (benches/benches/train_step.rs). Not part of CI.

    python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install 'jax[cpu]'
    /tmp/jaxenv/bin/python benches/jax/train_step.py [--steps N] [--threads T]

Prints the median step time in microseconds over N timed steps after warm-up
(the first call compiles). Data and parameters are float32, the SGD update runs
inside the jitted function, and every step ends with block_until_ready.
"""

import argparse
import os
import statistics
import sys
import time

BATCH, IN, HIDDEN, OUT, LR = 64, 784, 256, 10, 0.01


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="1: XLA's single-threaded CPU runtime (0: its default, all cores)",
    )
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="also print the process CPU time per step (all threads)",
    )
    ap.add_argument(
        "--serve",
        action="store_true",
        help="compile, print 'ready', then for each 'run N' line on stdin run N "
        "steps and print the mean step time in microseconds ('quit' ends); "
        "used by benches/benches/load.rs",
    )
    args = ap.parse_args()
    if args.threads == 1:
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "")
            + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        )
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_platforms", "cpu")

    key = jax.random.PRNGKey(0)
    kx, k1, k2 = jax.random.split(key, 3)
    x = jax.random.normal(kx, (BATCH, IN), jnp.float32)
    labels = jnp.arange(BATCH, dtype=jnp.int32) * 7 % OUT

    def linear_init(k, fan_out, fan_in):
        # nn.Linear's scheme: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), zero bias
        b = 1.0 / fan_in**0.5
        w = jax.random.uniform(k, (fan_out, fan_in), jnp.float32, -b, b)
        return w, jnp.zeros((fan_out,), jnp.float32)

    params = (*linear_init(k1, HIDDEN, IN), *linear_init(k2, OUT, HIDDEN))

    def loss_fn(p, x, y):
        w1, b1, w2, b2 = p
        h = jax.nn.relu(x @ w1.T + b1)
        logits = h @ w2.T + b2
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    @jax.jit
    def step(p, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        return tuple(w - LR * gw for w, gw in zip(p, g)), loss

    for _ in range(args.warmup):
        params, loss = step(params, x, labels)
    jax.block_until_ready(params)
    if args.serve:
        print("ready", flush=True)
        for line in sys.stdin:
            cmd = line.split()
            if not cmd or cmd[0] == "quit":
                break
            n = int(cmd[1])
            t0 = time.perf_counter()
            for _ in range(n):
                params, loss = step(params, x, labels)
                jax.block_until_ready((params, loss))
            print(f"{(time.perf_counter() - t0) / n * 1e6:.2f}", flush=True)
        return 0
    c0, w0 = time.process_time_ns(), time.perf_counter()
    for _ in range(args.steps):
        params, loss = step(params, x, labels)
        jax.block_until_ready((params, loss))
    if args.cpu_time:
        cpu = (time.process_time_ns() - c0) / 1e3 / args.steps
        wall = (time.perf_counter() - w0) * 1e6 / args.steps
        print(f"cpu time per step, jax: {cpu:.1f} us (wall {wall:.1f} us; {args.steps} steps)")
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        params, loss = step(params, x, labels)
        jax.block_until_ready((params, loss))
        times.append(time.perf_counter() - t0)
    med = statistics.median(times) * 1e6
    q = statistics.quantiles(times, n=10)
    print(
        f"jax {jax.__version__} jit step (784-256-10, batch 64, CPU, threads "
        f"{args.threads or 'default'}): median {med:.1f} us "
        f"(p10 {q[0] * 1e6:.1f}, p90 {q[-1] * 1e6:.1f}; {args.steps} steps; "
        f"final loss {float(loss):.4f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
