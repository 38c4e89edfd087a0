"""The official `openai` Python client against a running fucina-serve: a
completion, a streamed completion, a chat turn and a streamed chat turn. Not
part of CI; run it in a throwaway virtual environment:

    python3 -m venv /tmp/venv-openai && /tmp/venv-openai/bin/pip install openai
    cargo run --release -p fucina-serve -- --model models/SmolLM2-135M-Instruct --port 8080 &
    /tmp/venv-openai/bin/python crates/fucina-serve/scripts/openai_client.py --url http://127.0.0.1:8080/v1

Each call is checked (a non-empty answer, a finish reason, usage counts) and
the script exits non-zero on the first failure. `--no-chat` skips the chat
calls for a model without a chat template.
"""

import argparse
import sys

from openai import OpenAI


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="http://127.0.0.1:8080/v1")
    p.add_argument("--no-chat", action="store_true")
    args = p.parse_args()
    client = OpenAI(base_url=args.url, api_key="unused")
    model = client.models.list().data[0].id
    print(f"model: {model}")

    r = client.completions.create(model=model, prompt="The three primary colors are",
                                  max_tokens=16, temperature=0, seed=1, logprobs=2)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length"), c
    assert r.usage.completion_tokens > 0, r.usage
    print(f"completion: {c.text!r} ({c.finish_reason}, {r.usage.completion_tokens} tokens)")

    text = "".join(ch.choices[0].text for ch in client.completions.create(
        model=model, prompt="The three primary colors are", max_tokens=16, temperature=0,
        seed=1, stream=True) if ch.choices)
    assert text == c.text, (text, c.text)
    print("streamed completion: the same text")

    if not args.no_chat:
        messages = [{"role": "user", "content": "Name a primary color."}]
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                           temperature=0, seed=1)
        m = r.choices[0].message
        assert m.role == "assistant", m
        print(f"chat: {m.content!r} ({r.choices[0].finish_reason})")
        parts = [ch.choices[0].delta.content or "" for ch in client.chat.completions.create(
            model=model, messages=messages, max_tokens=24, temperature=0, seed=1, stream=True)
            if ch.choices]
        assert "".join(parts) == m.content, (parts, m.content)
        print("streamed chat: the same text")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
