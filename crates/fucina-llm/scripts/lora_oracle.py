#!/usr/bin/env python3
"""Writes the LoRA oracle of fucina-llm's fine-tuning tests: what PyTorch + PEFT
compute for LoRA adapters on the fixture models, from adapter values both sides
load from the same files.

Not run by CI. Run it in a throwaway virtual environment with torch,
transformers, peft, safetensors and numpy:

    python crates/fucina-llm/scripts/lora_oracle.py             # rewrites tests/fixtures/lora_oracle/
    python crates/fucina-llm/scripts/lora_oracle.py --out DIR   # elsewhere

For each fixture model (llama_f32: untied, 4 heads over 2 KV heads; qwen2_f32:
tied embeddings, q/k/v biases, 3 heads over 1 KV head) it writes, under
`lora_oracle/<model>/`:
  init/adapter_model.safetensors, init/adapter_config.json
                   the starting adapters, written by PEFT's `save_pretrained`
                   (r = 4, alpha = 8, dropout 0, all seven projections); A and B
                   are both drawn here (A in U[-0.2, 0.2), B in
                   U[-0.02, 0.02): not zero, so that A gets a gradient);
  batch.json       the batch: `input_ids` [3, T] right-padded with 0, `labels`
                   with -100 on the prompt and the padding (transformers'
                   convention);
  grads.safetensors
                   the gradient of every adapter matrix after one backward of the
                   loss (names as in the adapter file);
  losses.json      `losses`: the loss before each of 20 AdamW steps (lr 1e-3,
                   betas (0.9, 0.999), eps 1e-8, weight decay 0) on the batch,
                   and `final_loss` after the 20th;
  final/adapter_model.safetensors
                   the adapters after the 20 steps.
The loss is transformers' causal-LM loss: the mean over the labels that are not
-100 of the cross-entropy of the logits one position earlier. Everything runs
in float32 on the CPU, deterministic algorithms on.
"""

import argparse
import json
import os

import numpy as np
import torch
import transformers
import peft
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
STEPS = 20
LR = 1e-3


def batch_of(prompt_ids):
    """Three rows of 9, 14 and 11 tokens cycled from the fixture's prompt,
    prompts of 3, 0 and 5 tokens, right-padded with 0."""
    ids = [prompt_ids[i % len(prompt_ids)] for i in range(64)]
    rows = [(ids[0:9], 3), (ids[2:16], 0), (ids[5:16], 5)]
    t = max(len(r) for r, _ in rows)
    input_ids, labels = [], []
    for r, p in rows:
        pad = t - len(r)
        input_ids.append(r + [0] * pad)
        labels.append([-100] * p + r[p:] + [-100] * pad)
    return input_ids, labels


def causal_lm_loss(logits, labels):
    shift_logits = logits[:, :-1, :].reshape(-1, logits.shape[-1])
    shift_labels = labels[:, 1:].reshape(-1)
    return torch.nn.functional.cross_entropy(
        shift_logits, shift_labels, ignore_index=-100, reduction="mean"
    )


def lora_params(model):
    """The adapter parameters under PEFT's file names (no adapter name)."""
    out = {}
    for name, p in model.named_parameters():
        if "lora_" in name:
            out[name.replace(".default", "")] = p
    return out


def oracle(name, out_root, seed):
    src = os.path.join(FIXTURES, name)
    out = os.path.join(out_root, name)
    os.makedirs(out, exist_ok=True)
    base = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    base.eval()
    cfg = LoraConfig(
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=TARGETS,
        task_type="CAUSAL_LM",
        bias="none",
    )
    model = get_peft_model(base, cfg)
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for pname, p in sorted(lora_params(model).items()):
            a = 0.2 if "lora_A" in pname else 0.02
            p.copy_(torch.from_numpy(rng.uniform(-a, a, size=tuple(p.shape)).astype(np.float32)))
    model.save_pretrained(os.path.join(out, "init"))

    with open(os.path.join(src, "reference.json")) as f:
        prompt_ids = json.load(f)["prompt_ids"]
    input_ids, labels = batch_of(prompt_ids)
    with open(os.path.join(out, "batch.json"), "w") as f:
        json.dump({"input_ids": input_ids, "labels": labels}, f)
    x = torch.tensor(input_ids)
    y = torch.tensor(labels)

    params = lora_params(model)
    loss = causal_lm_loss(model(input_ids=x).logits, y)
    loss.backward()
    grads = {n: p.grad.detach().clone().contiguous() for n, p in params.items()}
    save_file(grads, os.path.join(out, "grads.safetensors"))
    model.zero_grad(set_to_none=True)

    opt = torch.optim.AdamW(
        list(params.values()), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
    )
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = causal_lm_loss(model(input_ids=x).logits, y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    with torch.no_grad():
        final = causal_lm_loss(model(input_ids=x).logits, y).item()
    model.save_pretrained(os.path.join(out, "final"))
    os.remove(os.path.join(out, "final", "adapter_config.json"))
    for d in ["init", "final"]:
        readme = os.path.join(out, d, "README.md")
        if os.path.exists(readme):
            os.remove(readme)
    # The base model by its fixture name, not this machine's path.
    cfg_path = os.path.join(out, "init", "adapter_config.json")
    with open(cfg_path) as f:
        c = json.load(f)
    c["base_model_name_or_path"] = name
    with open(cfg_path, "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
    with open(os.path.join(out, "losses.json"), "w") as f:
        json.dump(
            {
                "losses": losses,
                "final_loss": final,
                "lr": LR,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "peft": peft.__version__,
            },
            f,
            indent=1,
        )
    print(f"{name}: loss {losses[0]:.6f} -> {final:.6f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(FIXTURES, "lora_oracle"))
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    for i, name in enumerate(["llama_f32", "qwen2_f32"]):
        oracle(name, args.out, 1000 + i)


if __name__ == "__main__":
    main()
