"""A bounded load generator for OpenAI-compatible completion servers
(fucina-serve, llama-cpp-python's server). Not part of CI; standard library
only.

Each of --clients threads sends --requests streaming `/v1/completions`
requests, one after the other: a prompt of --prompt-tokens random token ids
(seeded per client and request, so every server gets the same prompts) and
`max_tokens` = --max-tokens, greedy; with --system-tokens N every prompt
starts with the same N-token prefix (a shared system prompt, the same for
every client and request) before its own --prompt-tokens. It measures, per request, the time to the
first streamed token and the tokens received, and prints one line:

    clients C: N requests, T output tokens in S s = X tok/s aggregate;
    ttft p50 A s p99 B s; per-stream decode D tok/s (median)

Every request has a timeout (--timeout) and the whole run a deadline
(--deadline): the run is bounded in count and in time.

    python benches/serve/load.py --url http://127.0.0.1:8080 --clients 1,4,16 \
        --requests 4 --prompt-tokens 256 --max-tokens 128 --vocab 49152
"""

import argparse
import http.client
import json
import random
import statistics
import threading
import time
from urllib.parse import urlparse


def one_request(url, prompt, max_tokens, timeout, model):
    """Streams one completion; returns (ttft_s, tokens, total_s)."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    ttft = None
    chunks = 0
    usage = None
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        v = json.loads(data)
        if v.get("usage"):
            usage = v["usage"]
        choices = v.get("choices") or []
        if choices and choices[0].get("finish_reason") is None:
            if ttft is None:
                ttft = time.perf_counter() - t0
            chunks += 1
    total = time.perf_counter() - t0
    conn.close()
    tokens = usage["completion_tokens"] if usage else chunks
    return (ttft if ttft is not None else total), tokens, total, (usage or {}).get("prompt_tokens")


def run_level(args, clients, requests):
    results = []
    errors = []
    lock = threading.Lock()
    deadline = time.monotonic() + args.deadline

    shared = random.Random(99)
    if args.prompt_kind == "ids":
        system = [shared.randrange(3, args.vocab) for _ in range(args.system_tokens)]
    else:
        system = "".join(shared.choice("abcdefghijklmnopqrstuvwxyz")
                         for _ in range(args.system_tokens))

    def client(c):
        rng = random.Random(1000 * c + 7)
        for r in range(requests):
            if time.monotonic() > deadline:
                return
            if args.prompt_kind == "ids":
                prompt = [rng.randrange(3, args.vocab) for _ in range(args.prompt_tokens)]
            else:
                # Letters: with the bench files' placeholder vocabulary each one is a
                # byte token, so the prompt has about --prompt-tokens tokens.
                prompt = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                                 for _ in range(args.prompt_tokens))
            prompt = system + prompt
            try:
                res = one_request(args.url, prompt, args.max_tokens, args.timeout, args.model)
                with lock:
                    results.append(res)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(str(e))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if not results:
        print(f"clients {clients}: no result ({len(errors)} errors: {errors[:2]})")
        return
    ttfts = sorted(r[0] for r in results)
    prompt_tokens = sorted({r[3] for r in results if r[3] is not None})
    tokens = sum(r[1] for r in results)
    per_stream = statistics.median(
        (r[1] - 1) / (r[2] - r[0]) for r in results if r[1] > 1 and r[2] > r[0])
    p99 = ttfts[min(len(ttfts) - 1, int(round(0.99 * (len(ttfts) - 1))))]
    print(f"clients {clients}: {len(results)} requests, {tokens} output tokens in "
          f"{wall:.2f} s = {tokens / wall:.1f} tok/s aggregate; ttft p50 "
          f"{statistics.median(ttfts):.3f} s p99 {p99:.3f} s; per-stream decode "
          f"{per_stream:.1f} tok/s (median)"
          + (f"; prompt tokens {prompt_tokens}" if prompt_tokens else "")
          + (f"; {len(errors)} errors" if errors else ""),
          flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--requests", default="4",
                   help="requests per client: one number, or one per --clients level")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--system-tokens", type=int, default=0,
                   help="a prefix of this many tokens shared by every prompt")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--prompt-kind", choices=["ids", "text"], default="ids",
                   help="token ids (fucina-serve) or random letters (servers that take text only)")
    p.add_argument("--model", default=None)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--deadline", type=float, default=600, help="seconds per level")
    args = p.parse_args()
    levels = [int(x) for x in args.clients.split(",")]
    requests = [int(x) for x in args.requests.split(",")]
    if len(requests) == 1:
        requests = requests * len(levels)
    if len(requests) != len(levels):
        p.error("--requests needs one number or one per --clients level")
    for c, r in zip(levels, requests):
        run_level(args, c, r)


if __name__ == "__main__":
    main()
