"""Prefill and decode throughput of a Hugging Face model directory in PyTorch +
`transformers` on the CPU: the anchor of fucina-llm's `bench` example
(crates/fucina-llm/examples/bench.rs). Not part of CI.

    python3 -m venv /tmp/venv-llm && /tmp/venv-llm/bin/pip install torch transformers safetensors
    /tmp/venv-llm/bin/python benches/llm/transformers_decode.py --model DIR --threads 1 --dtype bf16

Measures, with `torch.set_num_threads(--threads)` and `torch.inference_mode()`:
- prefill tokens/s: one forward pass over a prompt of --prefill tokens (each
  length given), median of --reps;
- decode tokens/s at each batch size of --batch: after a 16-token prompt per
  sequence, --decode steps of one token per sequence through the KV cache
  (`past_key_values`), greedy; tokens/s counts every sequence's token.
The prompts are random ids from a fixed seed. Prints one line per measurement.
"""

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def timed(fn, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), max(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--prefill", default="128,512")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    model.eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)

    with torch.inference_mode():
        for t in [int(v) for v in args.prefill.split(",")]:
            ids = torch.randint(0, vocab, (1, t), generator=gen)
            model(ids, use_cache=False)  # warm-up
            med, lo, hi = timed(lambda: model(ids, use_cache=False), args.reps)
            print(f"prefill {t}: {t / med:.1f} tokens/s (median {med * 1e3:.1f} ms, "
                  f"min {lo * 1e3:.1f}, max {hi * 1e3:.1f}; {args.dtype}, {args.threads} threads)")

        for b in [int(v) for v in args.batch.split(",")]:
            ids = torch.randint(0, vocab, (b, 16), generator=gen)

            def decode():
                out = model(ids, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1, :].argmax(-1, keepdim=True)
                t0 = time.perf_counter()
                for _ in range(args.decode):
                    out = model(nxt, past_key_values=past, use_cache=True)
                    past = out.past_key_values
                    nxt = out.logits[:, -1, :].argmax(-1, keepdim=True)
                return time.perf_counter() - t0

            decode()  # warm-up
            times = [decode() for _ in range(args.reps)]
            med = statistics.median(times)
            print(f"decode batch {b}: {b * args.decode / med:.1f} tokens/s (median "
                  f"{med / args.decode * 1e3:.2f} ms/step, min {min(times) / args.decode * 1e3:.2f}, "
                  f"max {max(times) / args.decode * 1e3:.2f}; {args.dtype}, {args.threads} threads)")


if __name__ == "__main__":
    main()
