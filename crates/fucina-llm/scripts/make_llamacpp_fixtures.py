#!/usr/bin/env python3
"""Writes the llama.cpp fixtures of fucina-llm (tests/fixtures/llamacpp/): tiny
random-weight Llama-architecture GGUF files quantized by llama.cpp itself, with
the logits llama.cpp computes for them; or, with --check, checks them.

Not run by CI. Run it by hand in a virtual environment with llama-cpp-python
(llama.cpp built from source for this CPU, as benches/llm/llamacpp_compare.py
describes), gguf and numpy:

    python crates/fucina-llm/scripts/make_llamacpp_fixtures.py            # rewrites tests/fixtures/llamacpp/
    python crates/fucina-llm/scripts/make_llamacpp_fixtures.py --out DIR  # elsewhere
    python crates/fucina-llm/scripts/make_llamacpp_fixtures.py --check    # checks the fixtures

Two source models, written here in F32 with gguf-py's GGUFWriter (llama.cpp's
tensor names, a minimal SentencePiece-type vocabulary, the `llama.*` keys):
  tiny   hidden 256, MLP 256, 2 layers, 4 heads of 64, 1 key/value head,
         vocabulary 260, untied: every matrix row is a whole number of
         256-element super-blocks, so the K-quant presets hold K-quant tensors;
  small  hidden 64, MLP 256, 2 layers, 4 heads of 16, 1 key/value head,
         vocabulary 260, tied embeddings: only ffn_down's rows are whole
         super-blocks, so llama.cpp falls back per tensor elsewhere
         (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0).
`llama_cpp.llama_model_quantize` (the C API of `llama-quantize`, no imatrix)
then requantizes tiny into every preset (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
Q3_K_M, Q4_K_M, Q5_K_M, Q6_K, IQ4_NL, IQ4_XS) and small into Q4_K_M and Q5_K_M;
small is also kept as F32. Each output directory holds:
  model.gguf       the file llama.cpp wrote;
  logits.npy       f32 [T + 31, vocab]: llama.cpp's logits (llama-cpp-python's
                   `Llama(logits_all=True)`, an f32 KV cache) of the T prompt
                   positions (one batch) and of its first 31 greedy tokens (one
                   decode call each): row T - 1 + i is what greedy token i was
                   chosen from;
  reference.json   the prompt ids, llama.cpp's 32 greedy ids (argmax, no stop
                   token), each tensor's ggml type (as gguf-py's reader reports
                   it) and a fingerprint of its dequantized values, the smallest
                   top-1/top-2 logit gap of the greedy steps, the thread count
                   and library versions.
The script prints each file's tensor types and writes the tables that
tests/fixtures/README.md shows (types.md in the output directory).
"""

import argparse
import json
import re
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

GEN_TOKENS = 32
PROMPT_LEN = 8
THREADS = 2

# name: (hidden, mlp, layers, heads, kv heads, vocab, tied, seed)
SHAPES = {
    "tiny": (256, 256, 2, 4, 1, 260, False, 20261207),
    "small": (64, 256, 2, 4, 1, 260, True, 20261208),
}

# (source shape, preset name, llama_cpp ftype attribute); None: the F32 source itself
PRESETS = [
    ("tiny", "q4_0", "LLAMA_FTYPE_MOSTLY_Q4_0"),
    ("tiny", "q4_1", "LLAMA_FTYPE_MOSTLY_Q4_1"),
    ("tiny", "q5_0", "LLAMA_FTYPE_MOSTLY_Q5_0"),
    ("tiny", "q5_1", "LLAMA_FTYPE_MOSTLY_Q5_1"),
    ("tiny", "q8_0", "LLAMA_FTYPE_MOSTLY_Q8_0"),
    ("tiny", "q2_k", "LLAMA_FTYPE_MOSTLY_Q2_K"),
    ("tiny", "q3_k_m", "LLAMA_FTYPE_MOSTLY_Q3_K_M"),
    ("tiny", "q4_k_m", "LLAMA_FTYPE_MOSTLY_Q4_K_M"),
    ("tiny", "q5_k_m", "LLAMA_FTYPE_MOSTLY_Q5_K_M"),
    ("tiny", "q6_k", "LLAMA_FTYPE_MOSTLY_Q6_K"),
    ("tiny", "iq4_nl", "LLAMA_FTYPE_MOSTLY_IQ4_NL"),
    ("tiny", "iq4_xs", "LLAMA_FTYPE_MOSTLY_IQ4_XS"),
    ("small", "f32", None),
    ("small", "q4_k_m", "LLAMA_FTYPE_MOSTLY_Q4_K_M"),
    ("small", "q5_k_m", "LLAMA_FTYPE_MOSTLY_Q5_K_M"),
]


def random_weights(hidden, mlp, layers, heads, kv_heads, vocab, tied, seed):
    """llama.cpp-named F32 tensors (numpy shape [rows, row length]) of unit-scale
    activations: matrices N(0, 1/in), the output projection 4x that (logits
    O(1..10), greedy choices mostly far from ties), the embedding N(0, 1), norm
    weights 1 + N(0, 0.04). The q/k rows are random, so no rotary reordering is
    needed: the file is what llama.cpp's converter would have written."""
    rng = np.random.default_rng(seed)
    hd = hidden // heads
    t = {}

    def mat(rows, cols, scale=1.0):
        return (scale / np.sqrt(cols) * rng.standard_normal((rows, cols))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    # Tied: the embedding is the output projection too, scaled as one.
    emb_scale = 4.0 / np.sqrt(hidden) if tied else 1.0
    t["token_embd.weight"] = (emb_scale * rng.standard_normal((vocab, hidden))).astype(np.float32)
    for i in range(layers):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm(hidden)
        t[p + "attn_q.weight"] = mat(heads * hd, hidden)
        t[p + "attn_k.weight"] = mat(kv_heads * hd, hidden)
        t[p + "attn_v.weight"] = mat(kv_heads * hd, hidden)
        t[p + "attn_output.weight"] = mat(hidden, heads * hd)
        t[p + "ffn_norm.weight"] = norm(hidden)
        t[p + "ffn_gate.weight"] = mat(mlp, hidden)
        t[p + "ffn_up.weight"] = mat(mlp, hidden)
        t[p + "ffn_down.weight"] = mat(hidden, mlp)
    t["output_norm.weight"] = norm(hidden)
    if not tied:
        t["output.weight"] = mat(vocab, hidden, 4.0)
    return t


def write_source(path, shape):
    import gguf

    hidden, mlp, layers, heads, kv_heads, vocab, _, _ = shape
    hd = hidden // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(path.stem)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(mlp)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    # A minimal SentencePiece-type vocabulary (llama.cpp refuses a file without
    # one; the fixtures feed token ids directly).
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces += [f"tok{i}" for i in range(len(pieces), vocab)]
    types += [1] * (vocab - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, data in random_weights(*shape).items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(src, dst, ftype_name):
    import llama_cpp as L

    p = L.llama_model_quantize_default_params()
    p.ftype = getattr(L, ftype_name)
    p.nthread = THREADS
    rc = L.llama_model_quantize(str(src).encode(), str(dst).encode(), p)
    if rc != 0:
        sys.exit(f"llama_model_quantize({ftype_name}) returned {rc}")


def tensor_types(path):
    """[(name, ggml type name, shape innermost first, fingerprint)] of a GGUF
    file. The fingerprint of a tensor is of its values as gguf-py's own
    dequantizers (numpy, independent of llama.cpp's C and of fucina) read them:
    [sum x, sum x^2, sum over rows of sum_j j * x[j], max |x|], in f64. It does
    not depend on the order of the rows (fucina reorders the q/k rows)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    out = []
    for t in r.tensors:
        dims = [int(d) for d in t.shape]
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        x = x.reshape(-1, dims[0])
        j = np.arange(dims[0], dtype=np.float64)
        fp = [float(x.sum()), float((x * x).sum()), float((x * j).sum()), float(np.abs(x).max())]
        out.append((t.name, t.tensor_type.name, dims, fp))
    return out


def prompt_ids(vocab):
    """PROMPT_LEN fixed ids, a fixed stride through the vocabulary."""
    return [(i * 37 + 5) % vocab for i in range(PROMPT_LEN)]


def llama_reference(path, vocab):
    """llama.cpp's logits rows and greedy ids (see the module docstring)."""
    import llama_cpp as L

    llm = L.Llama(
        model_path=str(path),
        n_ctx=PROMPT_LEN + GEN_TOKENS + 16,
        n_batch=64,
        n_ubatch=64,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        logits_all=True,
        # An f32 KV cache (llama.cpp's default is f16, which rounds every key
        # and value): the F32 file then differs by float summation order only.
        type_k=L.GGML_TYPE_F32,
        type_v=L.GGML_TYPE_F32,
        verbose=False,
    )
    assert llm.n_vocab() == vocab, (llm.n_vocab(), vocab)
    prompt = prompt_ids(vocab)
    llm.reset()
    llm.eval(prompt)
    greedy = []
    gaps = []
    for step in range(GEN_TOKENS):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        order = np.argsort(row)[::-1]
        gaps.append(float(row[order[0]] - row[order[1]]))
        tok = int(order[0])
        greedy.append(tok)
        if step + 1 < GEN_TOKENS:
            llm.eval([tok])
    logits = np.array(llm.scores[: llm.n_tokens], dtype=np.float32)
    assert logits.shape == (PROMPT_LEN + GEN_TOKENS - 1, vocab), logits.shape
    del llm
    return prompt, greedy, logits, min(gaps)


ROLES = [
    "token_embd",
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
    "output",
]


def role_row(fixture, types):
    """A markdown row: each matrix role's ggml type, "layer 0 / layer 1" where
    the layers differ."""
    by = {n: t for n, t, _, _ in types}
    cells = []
    for role in ROLES:
        if role in ("token_embd", "output"):
            cells.append(by.get(f"{role}.weight", "(tied)"))
            continue
        per_layer = [t for n, t in by.items() if n.startswith("blk.") and n.endswith(f".{role}.weight")]
        cells.append(" / ".join(per_layer) if len(set(per_layer)) > 1 else per_layer[0])
    return f"| `{fixture}` | " + " | ".join(cells) + " |"


def generate(out):
    import gguf
    import llama_cpp as L

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    summary = [
        "| fixture | file size | tensors (count × ggml type) | min greedy gap |",
        "| --- | --- | --- | --- |",
    ]
    roles = [
        "| fixture | " + " | ".join(ROLES) + " |",
        "| --- |" + " --- |" * len(ROLES),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        sources = {}
        for name, shape in SHAPES.items():
            sources[name] = Path(tmp) / f"{name}-f32.gguf"
            write_source(sources[name], shape)
        for shape_name, preset, ftype in PRESETS:
            fixture = f"{shape_name}_{preset}"
            d = out / fixture
            d.mkdir()
            dst = d / "model.gguf"
            if ftype is None:
                shutil.copyfile(sources[shape_name], dst)
            else:
                quantize(sources[shape_name], dst, ftype)
            vocab = SHAPES[shape_name][5]
            types = tensor_types(dst)
            prompt, greedy, logits, gap = llama_reference(dst, vocab)
            np.save(d / "logits.npy", logits)
            ref = {
                "source": shape_name,
                "preset": preset,
                "ftype": ftype or "LLAMA_FTYPE_ALL_F32 (the source file)",
                "prompt_ids": prompt,
                "greedy_ids": greedy,
                "min_greedy_gap": gap,
                "logits_std": float(logits.std()),
                "logits_range": float(logits.max() - logits.min()),
                "tensor_types": {n: t for n, t, _, _ in types},
                "dequantized_fingerprints": {n: fp for n, _, _, fp in types},
                "threads": THREADS,
                "llama_cpp_python": L.__version__,
                "gguf": getattr(gguf, "__version__", "unknown"),
                "numpy": np.__version__,
            }
            text = json.dumps(ref, indent=1)
            # one line per list of numbers
            text = re.sub(r"\[[^\[\]{}]*\]", lambda m: " ".join(m.group(0).split()), text)
            (d / "reference.json").write_text(text + "\n")
            mix = Counter(t for _, t, _, _ in types)
            mix_text = ", ".join(f"{c} {t}" for t, c in sorted(mix.items(), key=lambda x: -x[1]))
            size = dst.stat().st_size
            print(
                f"{fixture}: {size / 1e3:.0f} kB; {mix_text}; min greedy gap {gap:.3f}; "
                f"logits std {logits.std():.2f}, range {logits.min():.2f}..{logits.max():.2f}"
            )
            for n, t, dims, _ in types:
                print(f"    {n:28} {t:7} {dims}")
            summary.append(f"| `{fixture}` | {size / 1e3:.0f} kB | {mix_text} | {gap:.3f} |")
            roles.append(role_row(fixture, types))
    (out / "types.md").write_text("\n".join(summary) + "\n\n" + "\n".join(roles) + "\n")
    total = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"total {total / 1e6:.2f} MB in {out}")


# ---------------------------------------------------------------- --check

# The activation format of llama.cpp's dot product for each weight type (its
# vec_dot_type): Q8_0 blocks of 32 with an f16 scale, or Q8_K blocks of 256
# with an f32 scale. (Q4_1 and Q5_1 pair with Q8_1, whose values round as
# Q8_0's do.)
ACT_Q8_0 = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"}
ACT_Q8_K = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}


def round_q8_0(x):
    """x rounded as ggml's quantize_row_q8_0_ref does, then dequantized."""
    b = x.reshape(-1, 32)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    d16 = d.astype(np.float16).astype(np.float32)
    return (np.round(b * inv) * d16).reshape(x.shape)


def round_q8_k(x):
    """x rounded as ggml's quantize_row_q8_K_ref does, then dequantized."""
    b = x.reshape(-1, 256)
    mx = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)
    iscale = np.divide(np.float32(-127), mx, out=np.zeros_like(mx), where=mx != 0)
    d = np.divide(np.float32(1), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (np.minimum(127, np.round(iscale * b)) * d).reshape(x.shape)


def numpy_logits(path, ids, emulate):
    """A Llama forward pass in numpy f32 over gguf-py's dequantized weights
    (llama.cpp's rotary embedding of adjacent pairs, its q/k row order), every
    position's logits; with `emulate`, each matrix product's input rounded to
    llama.cpp's activation format for the weight's type first."""
    import gguf

    r = gguf.GGUFReader(str(path))
    w, kind = {}, {}
    for t in r.tensors:
        dims = [int(v) for v in t.shape]
        w[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(dims[::-1])
        kind[t.name] = t.tensor_type.name

    def key(k):
        f = r.fields[k]
        return f.parts[f.data[0]][0]

    hidden = int(key("llama.embedding_length"))
    layers = int(key("llama.block_count"))
    heads = int(key("llama.attention.head_count"))
    kv_heads = int(key("llama.attention.head_count_kv"))
    eps = np.float32(key("llama.attention.layer_norm_rms_epsilon"))
    base = float(key("llama.rope.freq_base"))
    hd = hidden // heads
    n = len(ids)

    def mm(x, name):
        if emulate and kind[name] in ACT_Q8_0:
            x = round_q8_0(x)
        elif emulate and kind[name] in ACT_Q8_K:
            x = round_q8_k(x)
        return x @ w[name].T

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    ang = np.arange(n, dtype=np.float32)[:, None] * (base ** (-np.arange(0, hd, 2) / hd)).astype(np.float32)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    x = w["token_embd.weight"][ids]
    for i in range(layers):
        p = f"blk.{i}."
        h = norm(x, w[p + "attn_norm.weight"])
        q = rope(mm(h, p + "attn_q.weight").reshape(n, heads, hd))
        k = rope(mm(h, p + "attn_k.weight").reshape(n, kv_heads, hd))
        v = mm(h, p + "attn_v.weight").reshape(n, kv_heads, hd)
        att = np.empty((n, heads, hd), np.float32)
        for j in range(heads):
            kv = j // (heads // kv_heads)
            s = q[:, j] @ k[:, kv].T / np.float32(np.sqrt(hd)) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            att[:, j] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
        x = x + mm(att.reshape(n, hidden), p + "attn_output.weight")
        h = norm(x, w[p + "ffn_norm.weight"])
        g = mm(h, p + "ffn_gate.weight")
        x = x + mm(g / (1 + np.exp(-g)) * mm(h, p + "ffn_up.weight"), p + "ffn_down.weight")
    head = "output.weight" if "output.weight" in w else "token_embd.weight"
    return mm(norm(x, w["output_norm.weight"]), head)


def check(out):
    """For each fixture: ggml's own dequantization (llama_model_quantize to
    ALL_F32) against gguf-py's, and numpy forward passes (plain f32, and with
    llama.cpp's activation rounding emulated) against llama.cpp's logits."""
    import gguf
    import llama_cpp as L

    for d in sorted(p for p in out.iterdir() if p.is_dir()):
        ref = json.loads((d / "reference.json").read_text())
        logits = np.load(d / "logits.npy")
        ids = ref["prompt_ids"] + ref["greedy_ids"][:-1]
        with tempfile.TemporaryDirectory() as tmp:
            f32 = Path(tmp) / "f32.gguf"
            p = L.llama_model_quantize_default_params()
            p.ftype = L.LLAMA_FTYPE_ALL_F32
            p.allow_requantize = True
            p.nthread = THREADS
            if L.llama_model_quantize(str(d / "model.gguf").encode(), str(f32).encode(), p) != 0:
                sys.exit(f"{d.name}: llama_model_quantize to F32 failed")
            ggml = {t.name: np.array(t.data).reshape(-1) for t in gguf.GGUFReader(str(f32)).tensors}
        ours = gguf.GGUFReader(str(d / "model.gguf")).tensors
        deq = max(
            float(np.abs(gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1) - ggml[t.name]).max())
            for t in ours
        )
        plain = np.abs(numpy_logits(d / "model.gguf", ids, False) - logits)
        emul = np.abs(numpy_logits(d / "model.gguf", ids, True) - logits)
        print(
            f"{d.name:13} max |gguf-py - ggml| dequantized {deq:.1e}; numpy f32 against llama.cpp: "
            f"max {plain.max():.2e}, rms {np.sqrt((plain ** 2).mean()):.2e}; with llama.cpp's "
            f"activation rounding: max {emul.max():.2e}, rms {np.sqrt((emul ** 2).mean()):.2e}"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = Path(__file__).resolve().parent
    ap.add_argument("--out", default=str(here.parent / "tests/fixtures/llamacpp"))
    ap.add_argument(
        "--check",
        action="store_true",
        help="check the fixtures in --out instead of writing them (see check())",
    )
    args = ap.parse_args()

    import llama_cpp as L

    quiet = L.llama_log_callback(lambda level, text, data: None)  # kept alive
    L.llama_log_set(quiet, None)
    (check if args.check else generate)(Path(args.out))


if __name__ == "__main__":
    main()
