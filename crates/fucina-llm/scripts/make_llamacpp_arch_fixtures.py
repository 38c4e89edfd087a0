#!/usr/bin/env python3
"""Writes tests/fixtures/llamacpp_arch/: the architecture fixtures of fucina-llm
(tests/fixtures/<name>/, written by transformers) converted to GGUF by
llama.cpp's own `convert_hf_to_gguf.py` (F32), and the logits llama.cpp computes
for them (llama-cpp-python, an f32 KV cache). tests/llamacpp_arch.rs checks
fucina against them. Not run by CI.

Two steps, in two throwaway virtual environments:

    # 1. convert: torch, transformers, mistral_common, sentencepiece, and a
    #    llama.cpp checkout (its convert_hf_to_gguf.py and gguf-py/)
    python crates/fucina-llm/scripts/make_llamacpp_arch_fixtures.py convert \
        --llama-cpp LLAMA_CPP_DIR crates/fucina-llm/tests/fixtures/qwen3_f32 OUT/qwen3_f32/model.gguf
    # 2. logits: llama-cpp-python (built as benches/llm/llamacpp_compare.py says), numpy
    python crates/fucina-llm/scripts/make_llamacpp_arch_fixtures.py logits OUT/qwen3_f32/model.gguf OUT/qwen3_f32

for each of qwen2_f32, qwen3_f32, gemma2_f32, gemma3_f32, phi3_f32,
phi4_mini_f32 and mixtral_f32 (qwen3_moe_f32 is refused by the converter used:
its dense layer). The fixtures have no tokenizer: the converter's vocabulary
step is replaced by a minimal SentencePiece-type vocabulary of the model's size
(`<unk>`, `<s>`, `</s>`, `tok3`, ...), and the prompt is fed as ids. Their
configs use transformers 5's `rope_parameters`, which the converter predates:
they are rewritten with the older keys (`rope_theta`, `rope_scaling`,
`rope_local_base_freq`, `num_experts`) before it reads them.

Each output directory holds model.gguf, logits.npy (f32 [12 + 15, vocab]: the
12 prompt positions in one batch, then one decode call per greedy id) and
reference.json (prompt ids, llama.cpp's 16 greedy ids).
"""
import argparse
import json
import pathlib
import shutil
import sys
import tempfile

GEN = 16
PROMPT_LEN = 12


def minimal_vocab(n):
    pieces = ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(3, n)]
    return pieces, [0.0] * n, [2, 3, 3] + [1] * (n - 3)


def older_keys(cfg):
    """The config with transformers 5's RoPE and expert keys written the older way."""
    cfg = dict(cfg)
    rp = cfg.pop("rope_parameters", None)
    if rp is not None:
        if "full_attention" in rp:  # Gemma 3: per layer type
            full, local = rp["full_attention"], rp["sliding_attention"]
            cfg["rope_theta"] = full["rope_theta"]
            if full.get("rope_type", "default") != "default":
                cfg["rope_scaling"] = {"rope_type": full["rope_type"], "factor": full["factor"]}
            cfg["rope_local_base_freq"] = local["rope_theta"]
        else:
            cfg["rope_theta"] = rp["rope_theta"]
            if rp.get("rope_type", "default") != "default":
                cfg["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
                cfg["rope_scaling"]["type"] = rp["rope_type"]
    if cfg.get("model_type") == "qwen3_moe" and "num_experts" not in cfg:
        cfg["num_experts"] = cfg["num_local_experts"]
    return cfg


def convert(llama_cpp, src, out):
    sys.path.insert(0, str(pathlib.Path(llama_cpp) / "gguf-py"))
    sys.path.insert(0, str(llama_cpp))
    import gguf
    import torch
    import convert_hf_to_gguf as C

    tmp = pathlib.Path(tempfile.mkdtemp())
    for f in src.iterdir():
        if f.is_file():
            shutil.copy(f, tmp / f.name)
    cfg = older_keys(json.load(open(src / "config.json")))
    json.dump(cfg, open(tmp / "config.json", "w"), indent=1)

    def set_vocab(self):
        pieces, scores, types = minimal_vocab(self.hparams["vocab_size"])
        w = self.gguf_writer
        w.add_tokenizer_model("llama")
        w.add_token_list(pieces)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)

    # Newer llama.cpp keeps the model classes in its `conversion` package.
    text_model = getattr(C, "TextModel", None) or __import__("conversion").TextModel
    text_model._create_vocab_sentencepiece = lambda self: minimal_vocab(self.hparams["vocab_size"])
    # The config as rewritten (the converter would read it through transformers,
    # which turns the older keys back into transformers 5's).
    C.ModelBase.load_hparams = staticmethod(lambda *a, **k: dict(cfg))
    with torch.inference_mode():
        arch = C.get_model_architecture(cfg, C.ModelType.TEXT)
        if hasattr(C, "get_model_class"):  # newer llama.cpp imports model classes on demand
            cls = C.get_model_class(arch)
        else:
            cls = C.ModelBase.from_model_architecture(arch, model_type=C.ModelType.TEXT)
        cls.set_vocab = set_vocab
        out.parent.mkdir(parents=True, exist_ok=True)
        cls(tmp, gguf.LlamaFileType.ALL_F32, out, eager=True).write()
    shutil.rmtree(tmp)
    print("wrote", out, arch)


def logits(path, out):
    import numpy as np
    import llama_cpp as L

    llm = L.Llama(model_path=str(path), n_ctx=64, n_batch=64, n_ubatch=64, n_threads=2,
                  n_threads_batch=2, logits_all=True, type_k=L.GGML_TYPE_F32,
                  type_v=L.GGML_TYPE_F32, verbose=False)
    n = llm.n_vocab()
    prompt = [(i * 37 + 5) % n for i in range(PROMPT_LEN)]
    llm.reset()
    llm.eval(prompt)
    greedy = []
    for step in range(GEN):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        tok = int(row.argmax())
        greedy.append(tok)
        if step + 1 < GEN:
            llm.eval([tok])
    rows = np.array(llm.scores[: llm.n_tokens], dtype=np.float32)
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "logits.npy", np.ascontiguousarray(rows, dtype="<f4"))
    ref = {"prompt_ids": prompt, "greedy_ids": greedy, "llama_cpp_python": L.__version__}
    json.dump(ref, open(out / "reference.json", "w"))
    print(path, "vocab", n, "greedy", greedy)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert")
    c.add_argument("--llama-cpp", required=True, help="a llama.cpp checkout")
    c.add_argument("src", type=pathlib.Path)
    c.add_argument("out", type=pathlib.Path)
    g = sub.add_parser("logits")
    g.add_argument("gguf", type=pathlib.Path)
    g.add_argument("out", type=pathlib.Path)
    a = ap.parse_args()
    if a.cmd == "convert":
        convert(a.llama_cpp, a.src, a.out)
    else:
        logits(a.gguf, a.out)


if __name__ == "__main__":
    main()
