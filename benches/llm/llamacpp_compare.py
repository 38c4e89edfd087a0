"""fucina-llm against llama.cpp on the same GGUF files. Not part of CI.

Two subcommands:

    convert  a Hugging Face Llama directory (config.json + safetensors, the
             random bench shapes of crates/fucina-llm/scripts/make_fixtures.py
             --bench-shapes) to GGUF files in bf16, Q8_0 and Q4_0, written with
             the `gguf` package (GGUFWriter + gguf.quants.quantize);
    llama    llama.cpp's prefill and decode throughput on one GGUF file, through
             llama-cpp-python's low-level API (llama_batch + llama_decode), with
             the same protocol and output lines as fucina-llm's `bench` example
             (crates/fucina-llm/examples/bench.rs), which runs the same file
             with `--model FILE.gguf`.

Setup (a throwaway virtual environment, llama.cpp compiled for this CPU):

    apt-get install -y cmake
    python3 -m venv /tmp/venv-llama
    CMAKE_ARGS="-DGGML_NATIVE=ON" /tmp/venv-llama/bin/pip install --no-binary llama-cpp-python llama-cpp-python
    /tmp/venv-llama/bin/pip install gguf numpy

On a CPU whose AMX tiles llama.cpp cannot use (the project's development VM
reports AMX, and llama.cpp's AMX kernels crash there with SIGSEGV at the first
`ldtilecfg` of a Q8_0 or Q4_0 matmul), build it with the same instruction sets
named and AMX off, so that llama.cpp's default path for Q4_0 is its repacked
(interleaved) AVX-512 kernels:

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
      -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON \
      -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF \
      -DGGML_AMX_BF16=OFF" pip install --no-cache-dir --no-binary llama-cpp-python llama-cpp-python

    PY=/tmp/venv-llama/bin/python
    $PY benches/llm/llamacpp_compare.py convert --model DIR --out OUT --formats bf16,q8_0,q4_0
    $PY benches/llm/llamacpp_compare.py llama --gguf OUT/NAME-q8_0.gguf --threads 2
    target/release/examples/bench --model OUT/NAME-q8_0.gguf --threads 2

What the converter writes, as llama.cpp's own convert_hf_to_gguf.py does for a
Llama model:
- llama.cpp's tensor names (token_embd, blk.N.attn_{norm,q,k,v,output},
  blk.N.ffn_{norm,gate,up,down}, output_norm, output; no output when the
  embedding is tied) and the `llama.*` metadata;
- the rows of each head of attn_q and attn_k reordered for llama.cpp's rotary
  embedding, which rotates adjacent pairs where Hugging Face rotates the two
  halves of a head: the head's rows viewed as [2, D/2] are transposed to
  [D/2, 2] (attn_k with the key/value head count). fucina's GGUF loader undoes
  this on load;
- every matrix (the embedding and output included) in the chosen format, the
  norms in F32 (llama.cpp's converter keeps 1-D tensors in F32). bf16 copies
  the safetensors' bf16 bits exactly; Q8_0 and Q4_0 use gguf.quants.quantize,
  llama.cpp's reference quantizers;
- a minimal tokenizer, since llama.cpp refuses a file without one: a
  SentencePiece-type ("llama") vocabulary of vocab_size tokens, <unk>, <s>,
  </s>, the 256 byte tokens <0x00>..<0xFF>, then placeholder pieces. The
  benchmark feeds token ids directly, so the vocabulary only has to be valid.

The llama.cpp protocol (the same as the bench example's):
- prefill N: a fresh context state (memory cleared), one batch of N random ids
  with the logits of the last one only, median of --reps after a warm-up;
- decode at batch B: B sequences (sequence ids 0..B-1) each get a 16-token
  prompt, then --decode steps of one token per sequence in one llama_batch,
  greedy (argmax of each sequence's logits); tokens/s counts every sequence's
  token; median of --reps after a warm-up.
"""

import argparse
import json
import statistics
import struct
import sys
import time
from pathlib import Path

import numpy as np


# ---------------------------------------------------------------- convert


def read_safetensors(path):
    """{name: (dtype, shape, bytes view)} of a safetensors file, no copies."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    header = json.loads(bytes(data[8 : 8 + n]))
    header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, info in header.items():
        lo, hi = info["data_offsets"]
        out[name] = (info["dtype"], info["shape"], data[base + lo : base + hi])
    return out


def tensors_of(model_dir):
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        sys.exit(f"no .safetensors file in {model_dir}")
    out = {}
    for f in files:
        out.update(read_safetensors(f))
    return out


def as_bf16_bits(dtype, shape, raw):
    if dtype == "BF16":
        return np.frombuffer(raw, dtype=np.uint16).reshape(shape)
    if dtype == "F32":
        f = np.frombuffer(raw, dtype=np.float32).reshape(shape)
        # round to nearest even, as torch's bf16 conversion does (no NaNs here)
        u = f.view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return u.astype(np.uint16)
    sys.exit(f"unsupported safetensors dtype {dtype}")


def as_f32(dtype, shape, raw):
    if dtype == "F32":
        return np.frombuffer(raw, dtype=np.float32).reshape(shape)
    bits = as_bf16_bits(dtype, shape, raw)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def permute_rope(w, heads):
    """llama.cpp's row order for q/k: per head, rows [2, D/2] -> [D/2, 2]."""
    rows = w.shape[0]
    d = rows // heads
    return w.reshape(heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert(args):
    import gguf

    model_dir = Path(args.model)
    cfg = json.loads((model_dir / "config.json").read_text())
    tensors = tensors_of(model_dir)
    hidden = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    layers = cfg["num_hidden_layers"]
    vocab = cfg["vocab_size"]
    rope = cfg.get("rope_parameters") or {}
    rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    if rope.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
        sys.exit("only the default rotary embedding is converted")
    if cfg.get("attention_bias") or cfg.get("mlp_bias"):
        sys.exit("biases are not converted")
    tied = cfg.get("tie_word_embeddings", False) or "lm_head.weight" not in tensors

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = args.name or model_dir.name
    Q = gguf.GGMLQuantizationType
    kinds = {
        "bf16": (Q.BF16, gguf.LlamaFileType.MOSTLY_BF16),
        "q8_0": (Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
        "q4_0": (Q.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
    }
    # llama.cpp's name for each Hugging Face tensor (None: skipped).
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": None if tied else "output.weight",
    }
    per_layer = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for i in range(layers):
        for hf, ll in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{ll}.weight"
    missing = [n for n, v in names.items() if v is not None and n not in tensors]
    if missing:
        sys.exit(f"tensors missing from {model_dir}: {missing[:5]}")

    for fmt in args.formats.split(","):
        qtype, ftype = kinds[fmt]
        path = out_dir / f"{name}-{fmt}.gguf"
        t0 = time.perf_counter()
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_name(name)
        w.add_file_type(ftype)
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(hidden)
        w.add_block_count(layers)
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(float(rope_theta))
        w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
        w.add_vocab_size(vocab)
        # The minimal SentencePiece-type vocabulary (see the module docstring).
        pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        types = [2, 3, 3] + [6] * 256  # unknown, control, control, bytes
        pieces += [f"tok{i}" for i in range(len(pieces), vocab)]
        types += [1] * (vocab - len(types))  # normal
        w.add_tokenizer_model("llama")
        w.add_token_list(pieces)
        w.add_token_scores([0.0] * vocab)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(cfg.get("bos_token_id", 1) or 1)
        eos = cfg.get("eos_token_id", 2)
        w.add_eos_token_id((eos[0] if isinstance(eos, list) else eos) or 2)

        for hf, ll in names.items():
            if ll is None:
                continue
            dtype, shape, raw = tensors[hf]
            if len(shape) == 1:
                w.add_tensor(ll, np.ascontiguousarray(as_f32(dtype, shape, raw)))
                continue
            if qtype == Q.BF16:
                data = as_bf16_bits(dtype, shape, raw)
            else:
                data = as_f32(dtype, shape, raw)
            if hf.endswith("q_proj.weight"):
                data = permute_rope(data, heads)
            elif hf.endswith("k_proj.weight"):
                data = permute_rope(data, kv_heads)
            if qtype == Q.BF16:
                w.add_tensor(ll, np.ascontiguousarray(data), raw_dtype=Q.BF16)
            else:
                q = gguf.quants.quantize(np.ascontiguousarray(data), qtype)
                w.add_tensor(ll, q, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        print(
            f"{path}: {path.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )


# ---------------------------------------------------------------- llama.cpp


def ids(n, vocab, salt):
    """n pseudo-random ids below vocab (the bench example's xorshift)."""
    s = (0x9E3779B97F4A7C15 ^ salt) & 0xFFFFFFFFFFFFFFFF
    out = []
    for _ in range(n):
        s ^= (s << 13) & 0xFFFFFFFFFFFFFFFF
        s ^= s >> 7
        s ^= (s << 17) & 0xFFFFFFFFFFFFFFFF
        out.append(s % vocab)
    return out


def llama(args):
    import llama_cpp as L

    def quiet(level, text, user_data):
        pass

    log_cb = L.llama_log_callback(quiet)
    if not args.verbose:
        L.llama_log_set(log_cb, None)
    L.llama_backend_init()
    cpu = "unknown CPU"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    print(f"CPU: {cpu}; {args.threads} threads; llama-cpp-python {L.__version__}")
    print("llama.cpp system info:", L.llama_print_system_info().decode().strip())

    mp = L.llama_model_default_params()  # memory-mapped, as fucina
    mp.use_extra_bufts = not args.no_extra_bufts
    t0 = time.perf_counter()
    model = L.llama_model_load_from_file(args.gguf.encode(), mp)
    if not model:
        sys.exit(f"llama.cpp could not load {args.gguf}")
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    print(
        f"model: {L.llama_model_n_layer(model)} layers, hidden {L.llama_model_n_embd(model)}, "
        f"vocab {vocab}; {L.llama_model_size(model) / 1e6:.1f} MB of tensors; "
        f"loaded in {time.perf_counter() - t0:.2f} s"
    )
    prefill = [int(v) for v in args.prefill.split(",") if v]
    batches = [int(v) for v in args.batch.split(",") if v]

    def context(n_seq, n_ctx, n_batch):
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = n_batch
        cp.n_ubatch = n_batch
        cp.n_seq_max = n_seq
        cp.n_threads = args.threads
        cp.n_threads_batch = args.threads
        cp.no_perf = True
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            sys.exit("llama.cpp could not make a context")
        return ctx

    def run(ctx, batch, entries):
        """entries: (token, pos, seq, want_logits); returns nothing."""
        batch.n_tokens = len(entries)
        for i, (tok, pos, seq, want) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = 1 if want else 0
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            sys.exit(f"llama_decode returned {rc}")

    def argmax(ctx, i):
        p = L.llama_get_logits_ith(ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(p, shape=(vocab,))))

    # Prefill.
    if prefill:
        n_max = max(prefill)
        ctx = context(1, n_max, n_max)
        batch = L.llama_batch_init(n_max, 0, 1)
        mem = L.llama_get_memory(ctx)
        for t in prefill:
            prompt = ids(t, vocab, t)
            times = []
            for _ in range(args.reps + 1):
                L.llama_memory_clear(mem, True)
                t0 = time.perf_counter()
                run(ctx, batch, [(tok, p, 0, p == t - 1) for p, tok in enumerate(prompt)])
                argmax(ctx, t - 1)
                times.append(time.perf_counter() - t0)
            times.pop(0)
            m = statistics.median(times)
            print(
                f"prefill {t}: {t / m:.1f} tokens/s (median {m * 1e3:.1f} ms, "
                f"min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f})",
                flush=True,
            )
        L.llama_batch_free(batch)
        L.llama_free(ctx)

    # Decode.
    for b in batches:
        ctx = context(b, b * max(256, 16 + args.decode), 16 * b)
        batch = L.llama_batch_init(16 * b, 0, b)
        mem = L.llama_get_memory(ctx)
        times = []
        for rep in range(args.reps + 1):
            L.llama_memory_clear(mem, True)
            entries = []
            for s in range(b):
                prompt = ids(16, vocab, rep * 64 + s)
                entries += [(tok, p, s, p == 15) for p, tok in enumerate(prompt)]
            run(ctx, batch, entries)
            nxt = [argmax(ctx, s * 16 + 15) for s in range(b)]
            greedy = [nxt[0]]
            t0 = time.perf_counter()
            for step in range(args.decode):
                run(ctx, batch, [(nxt[s], 16 + step, s, True) for s in range(b)])
                nxt = [argmax(ctx, s) for s in range(b)]
                greedy.append(nxt[0])
            times.append(time.perf_counter() - t0)
            if rep == 0 and b == 1:
                print(f"greedy ids after prompt 0: {greedy[:8]}")
        times.pop(0)
        m = statistics.median(times)
        print(
            f"decode batch {b}: {b * args.decode / m:.1f} tokens/s (median "
            f"{m / args.decode * 1e3:.2f} ms/step, min {min(times) / args.decode * 1e3:.2f}, "
            f"max {max(times) / args.decode * 1e3:.2f})",
            flush=True,
        )
        L.llama_batch_free(batch)
        L.llama_free(ctx)
    L.llama_model_free(model)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="safetensors Llama directory -> GGUF files")
    c.add_argument("--model", required=True, help="config.json + safetensors directory")
    c.add_argument("--out", required=True, help="output directory")
    c.add_argument("--name", help="file name stem (default: the directory's name)")
    c.add_argument("--formats", default="bf16,q8_0,q4_0")
    b = sub.add_parser("llama", help="llama.cpp prefill/decode throughput of a GGUF file")
    b.add_argument("--gguf", required=True)
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--prefill", default="512")
    b.add_argument("--batch", default="1,8")
    b.add_argument("--decode", type=int, default=32)
    b.add_argument("--reps", type=int, default=3)
    b.add_argument("--verbose", action="store_true", help="keep llama.cpp's log")
    b.add_argument(
        "--no-extra-bufts",
        action="store_true",
        help="no AMX / repacked (interleaved) weight copies: the plain CPU kernels",
    )
    args = ap.parse_args()
    {"convert": convert, "llama": llama}[args.cmd](args)


if __name__ == "__main__":
    main()
