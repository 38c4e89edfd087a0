#!/usr/bin/env python3
"""Writes the fucina-llm test fixtures: tiny random-weight Hugging Face models and
the outputs `transformers` computes for them.

Not run by CI. Run it in a throwaway virtual environment with torch, transformers,
safetensors, tokenizers and numpy:

    python crates/fucina-llm/scripts/make_fixtures.py            # rewrites tests/fixtures/
    python crates/fucina-llm/scripts/make_fixtures.py --out DIR  # elsewhere
    python crates/fucina-llm/scripts/make_fixtures.py --bench-shapes DIR
        # random-weight bf16 models of the SmolLM2-135M and TinyLlama-1.1B shapes
        # (hundreds of MB to GB; for the benchmarks, never committed)

Each fixture model directory holds what `save_pretrained` writes (config.json,
generation_config.json, model.safetensors or shards + model.safetensors.index.json),
and:
  reference.json   prompt ids, the 32 greedy ids of `generate(do_sample=False)`,
                   the dtype of the weights, the smallest top-1/top-2 logit gap seen
                   (how far greedy is from a tie), and the library versions;
  logits.npy       f32 [T, vocab]: the logits of every prompt position;
  gen_logits.npy   f32 [32, vocab]: the logits each greedy token was chosen from.
For bf16/f16 weights the reference runs in f32 on the rounded values (the file is
loaded and upcast), so the comparison measures the runtime, not the rounding.
One model (llama_f32) also gets a small byte-level BPE tokenizer.json trained here,
and tokenizer_reference.json with encodings computed by the `tokenizers` library.
"""

import argparse
import json
import re
import os
import shutil
import sys

import numpy as np
import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

GEN_TOKENS = 32

TOKENIZER_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "A tiny model reads the same tokens on every machine and thread count.",
    "Deterministic inference gives the same logits whatever the batch.",
    "She sells sea shells by the sea shore, and the shells she sells are sea shells.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "Peter Piper picked a peck of pickled peppers; where is the peck he picked?",
    "The rain in Spain stays mainly in the plain, the plain, the plain.",
    "Numbers like 12, 345 and 6789 are split into pieces; so is café and naïve.",
]

TOKENIZER_CASES = [
    "The quick brown fox",
    "the same tokens on every machine",
    "Hello, world! 123",
    "café naïve 日本 🙂",
    "  leading and trailing spaces  ",
    "",
    "<|eos|> inside text <|bos|>",
]


def init_weights(model, seed, head_scale=4.0, mix=1.0, one_plus=False):
    """Weights of unit-scale activations, so logits are O(1..10) and greedy choices
    are far from ties (the default 0.02 initialization gives near-uniform logits).
    `mix` scales what the layers add to the residual stream (o_proj, down_proj, or
    with Gemma's sandwich norms the post norms, which undo any scale of the
    projections before them): above 1 the layers outweigh the token's own embedding,
    which keeps tied models from predicting their input token again and again.
    `one_plus`: the norms multiply by 1 + w (Gemma), so w is drawn around 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                w = 1.0 + 0.2 * torch.randn(p.shape, generator=g)
                if one_plus and ("post_attention" in name or "post_feedforward" in name):
                    w = mix * w
                p.copy_(w - 1.0 if one_plus else w)
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                scale = 1.0 / (p.shape[1] ** 0.5)
                if name.startswith("lm_head"):
                    scale *= head_scale
                if "o_proj" in name or "down_proj" in name:
                    scale *= mix
                p.copy_(scale * torch.randn(p.shape, generator=g))
        if model.config.tie_word_embeddings:
            # the embedding doubles as the output projection: keep logits O(1..10)
            emb = model.model.embed_tokens.weight
            emb.mul_(head_scale / (emb.shape[1] ** 0.5))


def train_tokenizer(vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=["<|bos|>", "<|eos|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TOKENIZER_TEXT, trainer)
    assert tok.get_vocab_size() == vocab_size, (tok.get_vocab_size(), vocab_size)
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", bos)]
    )
    return tok


def tokenizer_reference(tok):
    cases = []
    for text in TOKENIZER_CASES:
        with_special = tok.encode(text, add_special_tokens=True).ids
        without = tok.encode(text, add_special_tokens=False).ids
        cases.append(
            {
                "text": text,
                "ids_with_special": with_special,
                "ids_without_special": without,
                "decode_skip_special": tok.decode(with_special, skip_special_tokens=True),
                "decode_keep_special": tok.decode(with_special, skip_special_tokens=False),
            }
        )
    return {
        "vocab_size": tok.get_vocab_size(),
        "special_tokens": {t: tok.token_to_id(t) for t in ["<|bos|>", "<|eos|>", "<|pad|>"]},
        "cases": cases,
    }


def dump_json(obj, path):
    """Indented JSON with lists of numbers on one line."""
    text = json.dumps(obj, indent=1, ensure_ascii=False)
    text = re.sub(r"\[[-0-9.,\s]*\]", lambda m: " ".join(m.group(0).split()), text)
    with open(path, "w") as f:
        f.write(text + "\n")


def npy_save(path, array):
    np.save(path, np.ascontiguousarray(array, dtype="<f4"))


def force_long_rope(model):
    """Makes a LongRoPE model rotate every position with its long factors, as a
    runtime does for a context longer than the original one (llama.cpp and fucina
    choose the factors by the context's length; transformers' generate switches
    when the sequence crosses the original length and then recomputes it all)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    re = model.model.rotary_emb
    original = model.config.rope_parameters["original_max_position_embeddings"]
    long_inv, _ = ROPE_INIT_FUNCTIONS["longrope"](model.config, None, seq_len=original + 1)
    re.original_inv_freq = long_inv.clone()
    re.inv_freq.copy_(long_inv)
    re.long_inv_freq = long_inv.clone()


def reference(model_dir, prompt_ids, dtype_name, full_check=True, prepare=None):
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    if prepare is not None:
        with torch.no_grad():
            plain = model(ids).logits[0].float().numpy()
        prepare(model, model_dir, plain)
    with torch.no_grad():
        logits = model(ids).logits[0].float().numpy()
        gen = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=GEN_TOKENS,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            return_dict_in_generate=True,
            output_logits=True,
        )
    new_ids = gen.sequences[0, len(prompt_ids):].tolist()
    assert len(new_ids) == GEN_TOKENS, len(new_ids)
    gen_logits = torch.stack([s[0] for s in gen.logits]).float().numpy()
    # The greedy ids are the argmax of the logits they were chosen from.
    assert new_ids == gen_logits.argmax(axis=1).tolist()
    # Cross-check generate's cache against a full forward of the whole sequence
    # (not for LongRoPE past the original context: transformers rotates a forward
    # by its length, so the full forward uses the long factors for every row).
    if full_check:
        with torch.no_grad():
            full = model(gen.sequences).logits[0].float().numpy()
        n = len(prompt_ids)
        assert np.abs(full[n - 1 : n - 1 + GEN_TOKENS] - gen_logits).max() < 1e-4
    top2 = np.sort(gen_logits, axis=1)[:, -2:]
    min_gap = float((top2[:, 1] - top2[:, 0]).min())
    npy_save(os.path.join(model_dir, "logits.npy"), logits)
    npy_save(os.path.join(model_dir, "gen_logits.npy"), gen_logits)
    ref = {
        "prompt_ids": prompt_ids,
        "greedy_ids": new_ids,
        "weights_dtype": dtype_name,
        "min_greedy_gap": min_gap,
        "max_abs_logit": float(np.abs(logits).max()),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    dump_json(ref, os.path.join(model_dir, "reference.json"))
    return ref


def check_features(name, spec, model, prompt, logits_path):
    """Runs `spec["check"]` (a fixture-specific feature check) when it has one, else
    the check below.

    Checks that the feature a fixture is for changes its logits (a sliding window
    shorter than the prompt, RoPE rescaling) and that the older config keys give
    the model built from the newer ones."""
    if "check" in spec:
        return spec["check"](name, spec, model, prompt, logits_path)
    ref = np.load(logits_path)
    ids = torch.tensor([prompt], dtype=torch.long)
    model = model.float().eval()
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        same = model(ids).logits[0].numpy()
    if spec["dtype"] == torch.float32:
        # the in-memory model (newer keys) and the saved one (as written) agree
        assert np.abs(same - ref).max() < 1e-5, name
    cfg = dict(spec["cfg"])
    if "sliding_window" in cfg:
        cfg["sliding_window"] = None
    elif "rope_parameters" in cfg:
        cfg["rope_parameters"] = {"rope_type": "default",
                                  "rope_theta": cfg["rope_parameters"]["rope_theta"]}
    else:
        return
    other = spec["cls"][1](spec["cls"][0](**cfg))
    other.load_state_dict(model.state_dict())
    other.eval()
    other.config._attn_implementation = "eager"
    with torch.no_grad():
        plain = other(ids).logits[0].numpy()
    diff = float(np.abs(plain - ref).max())
    assert diff > 1e-2, (name, diff)
    print(f"  {name}: without its feature the logits move by up to {diff:.3f}")


def check_changed(name, spec, model, prompt, logits_path):
    """Checks that each feature the fixture is for moves its logits: the model is
    rebuilt with the config keys of `spec["features"]` replaced (e.g. a sliding
    window of None, soft-capping off) and the same weights."""
    ref = np.load(logits_path)
    ids = torch.tensor([prompt], dtype=torch.long)
    state = model.float().state_dict()
    for keys in spec["features"]:
        cfg = dict(spec["cfg"])
        cfg.update(keys)
        other = spec["cls"][1](spec["cls"][0](**cfg))
        other.load_state_dict(state)
        other.eval()
        other.config._attn_implementation = "eager"
        with torch.no_grad():
            plain = other(ids).logits[0].numpy()
        diff = float(np.abs(plain - ref).max())
        assert diff > 1e-3, (name, keys, diff)
        print(f"  {name}: with {keys} the logits move by up to {diff:.3f}")


# Phi-3's LongRoPE factors (head_dim 16: 8 of each).
SHORT_FACTOR = [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8]
LONG_FACTOR = [1.0, 1.4, 2.2, 3.5, 5.0, 8.0, 12.0, 16.0]


SPECS = {
    # Llama, untied, grouped-query attention (4 query heads, 2 KV heads), with a
    # tokenizer.
    "llama_f32": dict(
        cls=(LlamaConfig, LlamaForCausalLM),
        dtype=torch.float32,
        seed=1,
        tokenizer=True,
        cfg=dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=0, eos_token_id=1,
                 tie_word_embeddings=False),
    ),
    # The same model stored in bf16 and f16 (the reference runs in f32 on the rounded values).
    "llama_bf16": dict(same_as="llama_f32", dtype=torch.bfloat16),
    "llama_f16": dict(same_as="llama_f32", dtype=torch.float16),
    # Llama 3 frequency-band RoPE rescaling; every band (kept, smoothed, divided) occurs.
    "llama3_rope_f32": dict(
        cls=(LlamaConfig, LlamaForCausalLM),
        dtype=torch.float32,
        seed=2,
        cfg=dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                 rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                 rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 4.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 32}),
    ),
    # Llama with linear RoPE scaling, attention_bias (q, k, v and o biases), tied
    # embeddings, head_dim given explicitly (not hidden / heads), written with the
    # older rope_theta + rope_scaling keys.
    "llama_linear_f32": dict(
        cls=(LlamaConfig, LlamaForCausalLM),
        dtype=torch.float32,
        seed=6,
        mix=8.0,
        old_rope_keys=True,
        cfg=dict(vocab_size=80, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                 max_position_embeddings=128, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=[2, 3],
                 attention_bias=True, tie_word_embeddings=True,
                 rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}),
    ),
    # Qwen2: tied embeddings, q/k/v bias (no o bias), a width not a multiple of 16.
    "qwen2_f32": dict(
        cls=(Qwen2Config, Qwen2ForCausalLM),
        dtype=torch.float32,
        seed=4,
        mix=8.0,
        cfg=dict(vocab_size=112, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                 num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=128,
                 rms_norm_eps=1e-6, rope_theta=1000000.0, bos_token_id=None, eos_token_id=5,
                 tie_word_embeddings=True, use_sliding_window=False),
    ),
    # Mistral: a sliding window of 6 positions, shorter than the prompt (12) and the
    # generation, so it changes both prefill and decode. Sharded into several files.
    "mistral_f32": dict(
        cls=(MistralConfig, MistralForCausalLM),
        dtype=torch.float32,
        seed=5,
        shard="150KB",
        prompt_len=12,
        cfg=dict(vocab_size=128, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                 rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=6, bos_token_id=1,
                 eos_token_id=2, tie_word_embeddings=False),
    ),
    # Qwen3: q/k RMSNorm per head, head_dim (16) not hidden / heads (12), untied.
    "qwen3_f32": dict(
        cls=(Qwen3Config, Qwen3ForCausalLM),
        dtype=torch.float32,
        seed=7,
        mix=4.0,
        check=check_changed,
        features=[{"rms_norm_eps": 10.0}],
        cfg=dict(vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                 bos_token_id=None, eos_token_id=3, tie_word_embeddings=False),
    ),
    # Gemma 2: GeGLU, 1 + w norms, sandwich norms, embedding x sqrt(hidden), attention
    # and final soft-capping (small caps, so that they bite), a query scale other than
    # head_dim, a window of 4 on the even layers (the prompt is 12 long), tied.
    "gemma2_f32": dict(
        cls=(Gemma2Config, Gemma2ForCausalLM),
        dtype=torch.float32,
        seed=10,
        mix=6.0,
        one_plus=True,
        prompt_len=12,
        check=check_changed,
        features=[{"sliding_window": 64}, {"attn_logit_softcapping": None},
                  {"final_logit_softcapping": None}, {"query_pre_attn_scalar": 16}],
        cfg=dict(vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=10000.0,
                 query_pre_attn_scalar=24, sliding_window=4, attn_logit_softcapping=3.0,
                 final_logit_softcapping=8.0, bos_token_id=2, eos_token_id=1,
                 pad_token_id=0, tie_word_embeddings=True),
    ),
    # Gemma 3 (text): Gemma 2's layers with q/k norms, no soft-capping, sliding
    # (local) layers with their own RoPE base and global ones with linear scaling, in
    # the 5:1 pattern of sliding_window_pattern over 6 layers.
    "gemma3_f32": dict(
        cls=(Gemma3TextConfig, Gemma3ForCausalLM),
        dtype=torch.float32,
        seed=9,
        mix=6.0,
        one_plus=True,
        prompt_len=12,
        check=check_changed,
        features=[{"sliding_window": 64},
                  {"rope_parameters": {
                      "full_attention": {"rope_type": "default", "rope_theta": 50.0},
                      "sliding_attention": {"rope_type": "default", "rope_theta": 20.0}}}],
        cfg=dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=6,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                 max_position_embeddings=128, rms_norm_eps=1e-6, query_pre_attn_scalar=16,
                 sliding_window=4, sliding_window_pattern=6, bos_token_id=2, eos_token_id=1,
                 pad_token_id=0, tie_word_embeddings=True,
                 rope_parameters={
                     "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0,
                                        "factor": 2.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
    ),
    # Phi-3: fused qkv_proj and gate_up_proj, grouped-query attention, a sliding
    # window of 9, LongRoPE with an original context of 16: the reference (logits,
    # greedy ids) rotates every position with the long factors (the 42 positions of
    # the test exceed 16; see force_long_rope), and short_logits.npy holds the
    # prompt's logits with the short factors (a context of at most 16).
    "phi3_f32": dict(
        cls=(Phi3Config, Phi3ForCausalLM),
        dtype=torch.float32,
        seed=11,
        prepare=lambda model, model_dir, plain: (
            npy_save(os.path.join(model_dir, "short_logits.npy"), plain), force_long_rope(model)),
        check=check_changed,
        features=[{"sliding_window": None},
                  {"rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                       "short_factor": [1.0] * 8, "long_factor": LONG_FACTOR}}],
        cfg=dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                 original_max_position_embeddings=16, rms_norm_eps=1e-5, sliding_window=9,
                 bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                 rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                  "short_factor": SHORT_FACTOR, "long_factor": LONG_FACTOR}),
    ),
    # Phi-4-mini's shape of Phi-3: a partial rotary embedding (factor 0.75: the
    # first 12 of each head's 16 dimensions rotate), LongRoPE with 6 factors of
    # each kind, tied embeddings, no window; the reference rotates with the long
    # factors as for phi3_f32.
    "phi4_mini_f32": dict(
        cls=(Phi3Config, Phi3ForCausalLM),
        dtype=torch.float32,
        seed=15,
        mix=4.0,
        prepare=lambda model, model_dir, plain: (
            npy_save(os.path.join(model_dir, "short_logits.npy"), plain), force_long_rope(model)),
        check=check_changed,
        features=[{"partial_rotary_factor": 0.5,
                   "rope_parameters": {"rope_type": "longrope", "rope_theta": 10000.0,
                                       "short_factor": SHORT_FACTOR[:4],
                                       "long_factor": LONG_FACTOR[:4]}}],
        cfg=dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                 original_max_position_embeddings=16, rms_norm_eps=1e-5, sliding_window=None,
                 partial_rotary_factor=0.75, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                 tie_word_embeddings=True,
                 rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                  "short_factor": SHORT_FACTOR[:6], "long_factor": LONG_FACTOR[:6]}),
    ),
    # Qwen3-MoE: 4 experts, 2 per token, normalized probabilities; layers 0 and 2
    # sparse, layer 1 dense (mlp_only_layers).
    "qwen3_moe_f32": dict(
        cls=(Qwen3MoeConfig, Qwen3MoeForCausalLM),
        dtype=torch.float32,
        seed=14,
        mix=4.0,
        check=check_changed,
        features=[{"norm_topk_prob": False}, {"num_experts_per_tok": 1}],
        cfg=dict(vocab_size=96, hidden_size=48, intermediate_size=64, moe_intermediate_size=32,
                 num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                 decoder_sparse_step=1, mlp_only_layers=[1], max_position_embeddings=128,
                 rms_norm_eps=1e-6, rope_theta=1000000.0, bos_token_id=None, eos_token_id=3,
                 tie_word_embeddings=False),
    ),
    # Mixtral: Mistral's attention with a window of 6 (the prompt is 12 long), 4
    # experts of the MLP's width, 2 per token (always normalized), in every layer.
    "mixtral_f32": dict(
        cls=(MixtralConfig, MixtralForCausalLM),
        dtype=torch.float32,
        seed=13,
        mix=4.0,
        prompt_len=12,
        check=check_changed,
        features=[{"num_experts_per_tok": 1}, {"sliding_window": None}],
        cfg=dict(vocab_size=96, hidden_size=48, intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                 num_experts_per_tok=2, max_position_embeddings=128, rms_norm_eps=1e-5,
                 rope_theta=1000000.0, sliding_window=6, bos_token_id=1, eos_token_id=2,
                 tie_word_embeddings=False),
    ),
}


def rewrite_old_rope_keys(model_dir):
    """Rewrites `rope_parameters` as the `rope_theta` + `rope_scaling` keys that
    files written before transformers 5 have (the loader reads both forms)."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    rp = cfg.pop("rope_parameters")
    cfg["rope_theta"] = rp.pop("rope_theta")
    rp["type"] = rp.pop("rope_type")
    cfg["rope_scaling"] = rp
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def build(name, out_root, built):
    spec = dict(SPECS[name])
    if "same_as" in spec:
        base = dict(SPECS[spec["same_as"]])
        base.update({k: v for k, v in spec.items() if k != "same_as"})
        base["tokenizer"] = False
        spec = base
    cfg_cls, model_cls = spec["cls"]
    config = cfg_cls(**spec["cfg"])
    torch.manual_seed(spec["seed"])
    model = model_cls(config)
    init_weights(model, spec["seed"], mix=spec.get("mix", 1.0),
                 one_plus=spec.get("one_plus", False))
    model = model.to(spec["dtype"])
    model.config.dtype = spec["dtype"]
    model_dir = os.path.join(out_root, name)
    if os.path.exists(model_dir):
        shutil.rmtree(model_dir)
    os.makedirs(model_dir)
    kwargs = {}
    if "shard" in spec:
        kwargs["max_shard_size"] = spec["shard"]
    model.save_pretrained(model_dir, **kwargs)
    if spec.get("old_rope_keys"):
        rewrite_old_rope_keys(model_dir)

    vocab = config.vocab_size
    if spec.get("tokenizer"):
        tok = train_tokenizer(vocab)
        tok.save(os.path.join(model_dir, "tokenizer.json"))
        dump_json(tokenizer_reference(tok), os.path.join(model_dir, "tokenizer_reference.json"))
        prompt = tok.encode("The quick brown fox jumps over", add_special_tokens=True).ids
    else:
        g = torch.Generator().manual_seed(100 + spec["seed"])
        prompt = torch.randint(0, vocab, (spec.get("prompt_len", 10),), generator=g).tolist()
    dtype_name = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[spec["dtype"]]
    ref = reference(model_dir, prompt, dtype_name, full_check=spec.get("full_check", True),
                    prepare=spec.get("prepare"))
    check_features(name, spec, model, prompt, os.path.join(model_dir, "logits.npy"))
    size = sum(os.path.getsize(os.path.join(model_dir, f)) for f in os.listdir(model_dir))
    print(f"{name}: {size / 1024:.0f} KB, prompt {len(prompt)} ids, "
          f"min greedy gap {ref['min_greedy_gap']:.3f}, greedy {ref['greedy_ids'][:8]}...")
    built[name] = size


def write_npy_samples(out):
    """Small arrays as numpy.save writes them, for the byte-exact test of the
    examples' .npy writer (several shape reprs and header paddings)."""
    os.makedirs(out, exist_ok=True)
    samples = {
        "vector": np.arange(5, dtype="<f4") * 0.5 - 1.0,
        "matrix": np.linspace(-3.0, 3.0, 21, dtype="<f4").reshape(3, 7),
        "cube": (np.arange(24, dtype="<f4") / 7.0).reshape(2, 3, 4),
        "empty": np.zeros((0, 4), dtype="<f4"),
        "long_first_dim": np.ones((1234567, 0), dtype="<f4"),
    }
    for name, a in samples.items():
        np.save(os.path.join(out, name + ".npy"), a)


BENCH_SHAPES = {
    "smollm2-135m-shape": dict(
        cls=(LlamaConfig, LlamaForCausalLM),
        cfg=dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                 rms_norm_eps=1e-5, rope_theta=100000.0, bos_token_id=1, eos_token_id=2,
                 tie_word_embeddings=True),
    ),
    "tinyllama-1.1b-shape": dict(
        cls=(LlamaConfig, LlamaForCausalLM),
        cfg=dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                 num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
                 rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=1, eos_token_id=2,
                 tie_word_embeddings=False),
    ),
    # Qwen3-0.6B's shape (q/k RMSNorm per head, head_dim 128, tied embeddings).
    "qwen3-0.6b-shape": dict(
        cls=(Qwen3Config, Qwen3ForCausalLM),
        cfg=dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                 num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                 rope_theta=1000000.0, bos_token_id=1, eos_token_id=2,
                 tie_word_embeddings=True),
    ),
    # Gemma 2 scaled down to about 0.5 B parameters (Gemma 2's 256k vocabulary,
    # GeGLU, soft-capping, alternating 4096-token sliding windows).
    "gemma2-0.5b-shape": dict(
        cls=(Gemma2Config, Gemma2ForCausalLM),
        cfg=dict(vocab_size=256000, hidden_size=1024, intermediate_size=4096,
                 num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=4,
                 head_dim=128, max_position_embeddings=8192, rms_norm_eps=1e-6,
                 rope_theta=10000.0, attn_logit_softcapping=50.0,
                 final_logit_softcapping=30.0, query_pre_attn_scalar=128,
                 sliding_window=4096, hidden_activation="gelu_pytorch_tanh",
                 bos_token_id=2, eos_token_id=1, pad_token_id=0,
                 tie_word_embeddings=True),
    ),
    # A mixture of experts scaled down from Qwen3-30B-A3B (64 experts of 384, 8
    # per token, 16 layers): 1.3 B parameters, about 0.23 B read per decoded
    # token.
    "qwen3-moe-1.3b-a0.2b-shape": dict(
        cls=(Qwen3MoeConfig, Qwen3MoeForCausalLM),
        cfg=dict(vocab_size=32000, hidden_size=1024, intermediate_size=3072,
                 moe_intermediate_size=384, num_hidden_layers=16, num_attention_heads=16,
                 num_key_value_heads=4, head_dim=64, num_experts=64, num_experts_per_tok=8,
                 norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                 max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
                 bos_token_id=1, eos_token_id=2, tie_word_embeddings=False),
    ),
}


def bench_shapes(out_root, only=None):
    for name, spec in BENCH_SHAPES.items():
        if only and name not in only:
            continue
        cfg_cls, model_cls = spec["cls"]
        config = cfg_cls(**spec["cfg"])
        torch.manual_seed(0)
        # Built in bf16 directly: no f32 copy of a 1.1B-parameter model in memory.
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = model_cls(config)
        finally:
            torch.set_default_dtype(torch.float32)
        model.config.dtype = torch.bfloat16
        model_dir = os.path.join(out_root, name)
        os.makedirs(model_dir, exist_ok=True)
        model.save_pretrained(model_dir)
        n = sum(p.numel() for p in model.parameters())
        print(f"{name}: {n / 1e6:.1f} M parameters (bf16) -> {model_dir}")
        del model


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures"),
                    help="fixture root (default: the crate's tests/fixtures)")
    ap.add_argument("--bench-shapes", metavar="DIR",
                    help="write the bf16 benchmark-shape models to DIR instead")
    ap.add_argument("--only", nargs="*", help="fixture (or, with --bench-shapes, bench shape) names to build (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.bench_shapes:
        bench_shapes(args.bench_shapes, args.only)
        return
    os.makedirs(args.out, exist_ok=True)
    write_npy_samples(os.path.join(args.out, "npy"))
    built = {}
    for name in args.only or SPECS:
        build(name, args.out, built)
    total = sum(built.values())
    print(f"total {total / 1024:.0f} KB")
    if total > 4 * 1024 * 1024:
        sys.exit("fixtures too large")


if __name__ == "__main__":
    main()
