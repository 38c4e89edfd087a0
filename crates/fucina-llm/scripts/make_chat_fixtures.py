#!/usr/bin/env python3
"""Chat-template fixtures for fucina-llm's tests/chat_templates.rs.

For each model's real chat template (tests/chat_fixtures/NAME.jinja, exact
bytes), writes tests/chat_fixtures/NAME.json: where the template came from,
its bos/eos spellings, and a few conversations with the exact text
transformers' `tokenizer.apply_chat_template(..., tokenize=False)` renders for
each (or the error message when the template raises).

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install transformers jinja2
    /tmp/venv/bin/python crates/fucina-llm/scripts/make_chat_fixtures.py

The .jinja files were copied once from the public git repositories named in
SOURCES (the Hugging Face hub was not reachable); `--extract DIR=REPO ...`
copies them again from local clones: each DIR is a git clone of REPO, and the
file is read at the commit SOURCES names.

torch is not needed: the renderer runs through a PreTrainedTokenizerFast over a
tiny word-level vocabulary, so only the template and the special tokens matter.
"""

import argparse
import ast
import datetime
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "chat_fixtures")

LLAMACPP = ("ye-NX/llama.cpp", "1eeb523c3e0c7ffbd59469f5463dcbdecba3535e")
TGI = ("huggingface/text-generation-inference", "db931fcf42da018a3657580c64bf2720f167f9ab")
GORILLA = ("ShishirPatil/gorilla", "6ea57973c7a6097fd7c5915698c54c17c5b1b6c8")
HFJS = ("huggingface/huggingface.js", "fe42e68017ffc76d09922ea8f9b38a6964345710")

# The time strftime_now reports in every case (transformers' clock is patched
# to it, in UTC): 2025-03-14 15:09:26 UTC, a Friday.
NOW_UNIX = 1741964966

# name: (model, bos, eos, source). A source is (repo, commit, path, how):
# "file" (the file is the template, as llama.cpp's scripts/get_chat_template.py
# writes it), ("rust-test", NAME) (the `chat_template:` string of TGI's test
# entry called NAME), ("js-test", NAME) (the chat_template string of the
# huggingface.js Jinja test entry NAME), "gemma3-docstring" (the
# chat_template member of the tokenizer_config.json excerpt in the handler's
# docstring), "quoted" (no file: see the note) or "synthetic" (a template
# written for these tests, no model's: FEATURES below).
SOURCES = {
    "smollm2_instruct": (
        "HuggingFaceTB/SmolLM2-135M-Instruct", None, "<|im_end|>",
        None, None, None, "quoted",
        "SmolLM2-Instruct's tokenizer_config.json chat_template (ChatML with a default system "
        "message). No clone of the file was reachable; the string is the one several public "
        "repositories quote, byte for byte the same, as that file's (test constants of chat "
        "renderers, and a training collator that .replace()s its first part).",
    ),
    "qwen2_5_instruct": (
        "Qwen/Qwen2.5-7B-Instruct", None, "<|im_end|>",
        *LLAMACPP, "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja", "file",
        "llama.cpp's copy (scripts/get_chat_template.py Qwen/Qwen2.5-7B-Instruct), from a fork's snapshot.",
    ),
    "qwen3": (
        "Qwen/Qwen3-0.6B", None, "<|im_end|>",
        *LLAMACPP, "models/templates/Qwen-Qwen3-0.6B.jinja", "file",
        "llama.cpp's copy (scripts/get_chat_template.py Qwen/Qwen3-0.6B), from a fork's snapshot.",
    ),
    "llama3_1_instruct": (
        "meta-llama/Llama-3.1-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>",
        *LLAMACPP, "models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja", "file",
        "llama.cpp's copy (scripts/get_chat_template.py meta-llama/Llama-3.1-8B-Instruct).",
    ),
    "llama3_2_instruct": (
        "meta-llama/Llama-3.2-3B-Instruct", "<|begin_of_text|>", "<|eot_id|>",
        *LLAMACPP, "models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja", "file",
        "llama.cpp's copy (scripts/get_chat_template.py meta-llama/Llama-3.2-3B-Instruct).",
    ),
    "gemma2_it": (
        "google/gemma-2-2b-it", "<bos>", "<eos>",
        *LLAMACPP, "models/templates/google-gemma-2-2b-it.jinja", "file",
        "llama.cpp's copy (scripts/get_chat_template.py google/gemma-2-2b-it).",
    ),
    "gemma3_it": (
        "google/gemma-3-it", "<bos>", "<eos>",
        *GORILLA, "berkeley-function-call-leaderboard/bfcl_eval/model_handler/local_inference/gemma.py",
        "gemma3-docstring",
        "The Gemma 3 instruct models' tokenizer_config.json chat_template, as the Berkeley "
        "function-calling leaderboard's Gemma handler quotes the file's JSON in a docstring.",
    ),
    "phi3_5_mini_instruct": (
        "microsoft/Phi-3.5-mini-instruct", "<s>", "<|endoftext|>",
        *LLAMACPP, "models/templates/microsoft-Phi-3.5-mini-instruct.jinja", "file",
        "llama.cpp's copy (scripts/get_chat_template.py microsoft/Phi-3.5-mini-instruct).",
    ),
    "mistral_7b_instruct_v0_1": (
        "mistralai/Mistral-7B-Instruct-v0.1", "<s>", "</s>",
        *TGI, "router/src/infer/chat_template.rs", ("rust-test", "mistralai/Mistral-7B-Instruct-v0.1"),
        "Hugging Face text-generation-inference's chat-template test table entry for the model.",
    ),
    "mistral_nemo_instruct_2407": (
        "mistralai/Mistral-Nemo-Instruct-2407", "<s>", "</s>",
        *LLAMACPP, "models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja", "file",
        "llama.cpp's copy (scripts/get_chat_template.py mistralai/Mistral-Nemo-Instruct-2407).",
    ),
    "smollm3": (
        "HuggingFaceTB/SmolLM3-3B", None, "<|im_end|>",
        *HFJS, "packages/jinja/test/e2e.test.js", ("js-test", "HuggingFaceTB/SmolLM3-3B"),
        "Hugging Face's huggingface.js Jinja tests' copy of the model's template (reasoning modes, "
        "strftime_now, tools printed with |string, {% generation %} blocks).",
    ),
    "jinja_features": (
        "(none: a synthetic template)", "<s>", "</s>",
        None, None, None, "synthetic",
        "Not a model's template: written for these tests to exercise the Jinja features chat "
        "templates use (loop controls, namespaces, Python printing of values, tojson options, "
        "string and dict methods, filters, tests, slices, arithmetic, generation blocks, "
        "strftime_now, raise_exception).",
    ),
    "tinyllama_chat": (
        "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "<s>", "</s>",
        *TGI, "router/src/infer/chat_template.rs",
        ("rust-test", "HuggingFaceH4/zephyr-7b-beta (add_generation_prompt=true)"),
        "The Zephyr template TinyLlama-1.1B-Chat-v1.0 ships (its GGUF conversions store the same "
        "410 characters), from Hugging Face text-generation-inference's test table entry for "
        "HuggingFaceH4/zephyr-7b-beta.",
    ),
}

SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


FEATURES = """{#- Not a model's template: the Jinja features chat templates use. -#}
{%- set ns = namespace(count=0) -%}
{%- for m in messages -%}
{%- if m.role == 'skip' %}{% continue %}{% endif -%}
{%- if m.content == 'STOP' %}{% break %}{% endif -%}
{%- set ns.count = ns.count + 1 -%}
[{{ loop.index }}/{{ loop.length }} {{ m.role | upper }}|{{ m.content | trim }}|{{ m.content.strip().split(' ') | length }}|{{ loop.first }}{{ loop.last }}]
{% endfor %}
count={{ ns.count }} first={{ messages[0].role }} last={{ (messages | last).role }} n={{ messages | length }}
{{ true }} {{ false }} {{ none }} {{ 1.0 }} {{ 2.5e-7 }} {{ 10 / 4 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ -3 }}
{{ [1, 'a', none, true, 0.5] }} {{ {'k': 'v', 'n': [1.5]} }} {{ {'k': "it's"} | string }} {{ ['say "hi"'] }}
{{ data | tojson }}
{{ data | tojson(indent=2) }}
{{ data | tojson(indent=4, sort_keys=true) }}
{{ data | tojson(separators=(',', ':')) }}
{{ data.items() | list | length }} {% for k, v in data.items() %}{{ k }}:{{ v | string }};{% endfor %}
{{ data.get('missing', 'dflt') }} {{ data.get('name') }} {{ data.keys() | list }}
{{ 'Hello World'.lower() }} {{ 'abc'.upper() }} {{ '  pad  '.lstrip() }}| {{ 'x,y,,z'.split(',') }} {{ 'a-b'.replace('-', '+') }} {{ 'title me'.title() }} {{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('x') }} {{ '\n\nx\n'.lstrip('\n') }}
{{ messages | map(attribute='role') | join(', ') }}
{{ [1, true, none, 'x', 2.0] | join('-') }} {{ messages | join('/', attribute='role') }} {{ 'abc' | join('.') }} {{ [[1, 2]] | join(attribute='1') }}
{{ messages | selectattr('role', 'equalto', 'user') | list | length }}
{{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='content') | list }}
{{ 'x' ~ 1 ~ 'y' }} {{ 'ab' + 'cd' }} {{ [1, 2] + [3] }} {{ 'na' * 3 }}
{{ range(3) | list }} {{ (range(5) | list)[1:4] }} {{ 'hello'[::-1] }} {{ 'hello'[1:-1] }} {{ messages[-1].role }}
{{ undefined_var is defined }} {{ data is mapping }} {{ messages is iterable }} {{ 'x' is string }} {{ 3 is number }} {{ none is none }} {{ 'a' in 'cat' }} {{ 'name' in data }}
{{ undefined_var | default('fallback') }} {{ '' | default('empty', true) }} {{ undefined_var }}|
{{ bos_token }}{{ eos_token }} {{ add_generation_prompt }}
{%- if add_generation_prompt %}
{% generation %}GEN {{ messages | length }}{% endgeneration %}
{%- endif %}
{{ strftime_now('%Y-%m-%d %H:%M:%S %a %A %b %B %d %j') }}
    {% if true %}
indented block
    {% endif %}
{# a comment #}
{%- macro shout(x) %}{{ x | upper }}!{% endmacro %}
{{ shout('hey') }}
{{ raise_exception('boom: ' ~ reason) if reason is defined else 'no raise' }}"""


def git_show(clone, commit, path):
    return subprocess.run(
        ["git", "--git-dir", clone, "show", f"{commit}:{path}"], check=True, capture_output=True
    ).stdout.decode("utf-8")


def string_literal(text, start):
    """The value of the Rust or JavaScript string literal whose quote opens at
    text[start] (the escapes those sources use: \\n \\t \\r \\0 \\\\ \\' \\" \\uXXXX)."""
    quote, out, i = text[start], [], start + 1
    esc = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", '"': '"'}
    while text[i] != quote:
        if text[i] == "\\":
            if text[i + 1] == "u":
                out.append(chr(int(text[i + 2 : i + 6], 16)))
                i += 6
                continue
            out.append(esc[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def extract(name, clones):
    if name == "smollm2_instruct":
        return SMOLLM2
    if name == "jinja_features":
        return FEATURES
    _, _, _, repo, commit, path, how, _ = SOURCES[name]
    text = git_show(clones[repo], commit, path)
    if how == "file":
        return text
    if how == "gemma3-docstring":
        # The docstring's source text (not its value: Python would undo the
        # JSON escapes) is an excerpt of the file's JSON.
        fn = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == "_format_prompt")
        node = fn.body[0].value
        lines = text.splitlines(keepends=True)
        start = sum(map(len, lines[: node.lineno - 1])) + node.col_offset
        end = sum(map(len, lines[: node.end_lineno - 1])) + node.end_col_offset
        doc = text[start:end].strip('"').strip().rstrip(",")
        return json.loads("{" + doc + "}")["chat_template"]
    kind, entry = how
    if kind == "js-test":
        at = text.index(f'"{entry}": {{')
        at = text.index("chat_template:", at) + len("chat_template:")
        while text[at] not in "'\"":
            at += 1
        return string_literal(text, at)
    at = text.index(f'name: "{entry}"')
    key = 'chat_template: "'
    return string_literal(text, text.index(key, at) + len(key) - 1)


def conversations(name):
    """(label, messages, add_generation_prompt, tools, extra kwargs) per case."""
    sys_user = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi! What is 2+2?"},
    ]
    multi = [
        {"role": "user", "content": "  Hello there  "},
        {"role": "assistant", "content": "Hi. How can I help?"},
        {"role": "user", "content": "Tell me a joke about \"quotes\" and émojis 🎉.\nTwo lines."},
    ]
    cases = [
        ("user_gen", [{"role": "user", "content": "Hello"}], True, None, {}),
        ("user_nogen", [{"role": "user", "content": "Hello"}], False, None, {}),
        ("multi_gen", multi, True, None, {}),
        ("multi_nogen", multi + [{"role": "assistant", "content": "Why did the quote close?"}], False, None, {}),
        ("system_gen", sys_user, True, None, {}),
    ]
    weather = [{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    }]
    tool_turns = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
        {"role": "tool", "content": "{\"temp\": 21.5}"},
    ]
    if name in ("qwen2_5_instruct", "qwen3"):
        cases.append(("tools_gen", sys_user, True, weather, {}))
        cases.append(("tool_turns", [sys_user[0]] + tool_turns, True, weather, {}))
    if name == "qwen3":
        think = [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
            {"role": "user", "content": "And 3+3?"},
        ]
        cases.append(("thinking_history", think, True, None, {}))
        cases.append(("no_thinking", [{"role": "user", "content": "Hello"}], True, None, {"enable_thinking": False}))
        cases.append(("reasoning_content", [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "add"},
        ], False, None, {}))
    if name == "jinja_features":
        data = {"name": "fucina", "version": 1.5, "tags": ["a", "b"], "nested": {"z": None, "t": True, "q": "é\"<"}}
        skip = [
            {"role": "system", "content": "  Be brief.  "},
            {"role": "skip", "content": "not counted"},
            {"role": "user", "content": "one two three"},
            {"role": "assistant", "content": "STOP"},
            {"role": "user", "content": "after the break"},
        ]
        return [
            ("features_gen", skip, True, None, {"data": data}),
            ("features_nogen", skip[:3], False, None, {"data": data}),
            ("raises", skip[:3], True, None, {"data": data, "reason": "asked to"}),
        ]
    if name == "smollm3":
        cases.append(("no_think", sys_user[:1] + [{"role": "user", "content": "Hi /no_think"}], True, None, {}))
        cases.append(("enable_thinking_false", [{"role": "user", "content": "Hi"}], True, None, {"enable_thinking": False}))
        cases.append(("tools", sys_user, True, weather, {}))
        cases.append(("python_tools", sys_user, True, None, {"python_tools": weather}))
    if name == "llama3_2_instruct":
        # Today's date from strftime_now (the fixed clock).
        cases.append(("strftime_now", sys_user, True, None, {}))
    if name.startswith("llama3"):
        cases = [
            (l, m, g, t, k if l == "strftime_now" else {"date_string": "26 Jul 2024", **k})
            for (l, m, g, t, k) in cases
        ]
        cases.append(("tools_in_user", sys_user, True, weather, {"date_string": "26 Jul 2024"}))
        cases.append(("tools_in_system", sys_user, True, weather,
                      {"date_string": "26 Jul 2024", "tools_in_user_message": False}))
    if name == "mistral_nemo_instruct_2407":
        nemo_turns = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "tool_calls": [
                {"id": "abcDEF123", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "abcDEF123", "content": "21.5"},
        ]
        cases.append(("tools_gen", [{"role": "user", "content": "Weather?"}], True, weather, {}))
        cases.append(("tool_turns", nemo_turns, True, weather, {}))
    cases.append(("not_alternating", [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}], True, None, {}))
    cases.append(("empty_content", [{"role": "user", "content": ""}], True, None, {}))
    return cases


def render_cases(name, template, bos, eos):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import chat_template_utils

    class FixedClock(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime.fromtimestamp(NOW_UNIX, datetime.timezone.utc).replace(tzinfo=None)

    chat_template_utils.datetime = FixedClock

    vocab = {"[UNK]": 0}
    for t in (bos, eos):
        if t is not None:
            vocab.setdefault(t, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    kwargs = {"tokenizer_object": core, "unk_token": None}
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    tok = PreTrainedTokenizerFast(**kwargs)
    tok.chat_template = template
    template_kwargs = {k: v for k, v in tok.special_tokens_map.items()}
    out = []
    for label, messages, gen, tools, extra in conversations(name):
        # JSON text, so a reader whose JSON objects do not keep their key order
        # (serde_json's default) still gets the order the template sees.
        case = {"label": label, "messages_json": json.dumps(messages, ensure_ascii=False),
                "add_generation_prompt": gen, "now_unix": NOW_UNIX}
        if tools is not None:
            case["tools_json"] = json.dumps(tools, ensure_ascii=False)
        if extra:
            case["variables_json"] = json.dumps(extra, ensure_ascii=False)
        try:
            case["expected"] = tok.apply_chat_template(
                messages, tools=tools, add_generation_prompt=gen, tokenize=False, **extra
            )
        except Exception as e:  # the template raised
            case["error"] = str(e)
        out.append(case)
    return out, template_kwargs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--extract", nargs="*", default=[], metavar="GITDIR=REPO",
                    help="copy the templates again from these git clones")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    clones = dict(reversed(a.split("=", 1)) for a in args.extract)
    import transformers

    for name, (model, bos, eos, repo, commit, path, how, note) in SOURCES.items():
        jinja = os.path.join(OUT, f"{name}.jinja")
        # The quoted and synthetic templates live in this script; the others
        # are copied only with --extract.
        if repo is None or repo in clones:
            with open(jinja, "w", encoding="utf-8", newline="") as f:
                f.write(extract(name, clones))
        with open(jinja, encoding="utf-8", newline="") as f:
            template = f.read()
        cases, special = render_cases(name, template, bos, eos)
        fixture = {
            "model": model,
            "source": {"repository": repo, "commit": commit, "path": path,
                       "how": how if isinstance(how, str) else f"{how[0]}: {how[1]}", "note": note},
            "rendered_by": f"transformers {transformers.__version__} apply_chat_template(tokenize=False)",
            "special_tokens": special,
            "cases": cases,
        }
        with open(os.path.join(OUT, f"{name}.json"), "w", encoding="utf-8") as f:
            json.dump(fixture, f, indent=1, ensure_ascii=False)
            f.write("\n")
        print(f"{name}: {len(cases)} cases, {sum('error' in c for c in cases)} raise", file=sys.stderr)


if __name__ == "__main__":
    main()
