#!/usr/bin/env python3
"""Checks that PEFT loads the adapters fucina-llm's `finetune` example writes,
and computes the same logits with them.

Not run by CI. Run it in a throwaway virtual environment with torch,
transformers, peft and numpy, after a fine-tune that wrote the logits of some
ids with its adapters:

    cargo run --release -p fucina-llm --example finetune -- \\
        --model MODEL --data DATA.jsonl --target all --out ADAPTER \\
        --logits-ids 0,299,223,83 --logits-out fucina_logits.npy
    python crates/fucina-llm/scripts/peft_roundtrip.py \\
        --model MODEL --adapter ADAPTER --ids 0,299,223,83 --logits fucina_logits.npy

It loads the base model in float32, applies the adapters with
`peft.PeftModel.from_pretrained`, checks that every adapter matrix of the
model holds the file's values (none silently left at PEFT's initialization)
and that no tensor of the file went unused, then compares the logits of the
ids with fucina's: it prints the largest absolute difference and exits 1 when
it exceeds --tol (default 1e-4). With `--merged DIR` (the fine-tune's
`--merge-lora DIR`) it also loads that directory with transformers alone and
compares its logits with PEFT's.
"""

import argparse
import sys

import numpy as np
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--ids", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--merged", help="a directory written by finetune --merge-lora")
    args = ap.parse_args()

    base = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, args.adapter)
    model.eval()

    saved = load_file(f"{args.adapter}/adapter_model.safetensors")
    params = {
        n.replace(".default", ""): p for n, p in model.named_parameters() if "lora_" in n
    }
    unused = sorted(set(saved) - set(params))
    missing = sorted(set(params) - set(saved))
    if unused or missing:
        print(f"unused tensors of the file: {unused}\nadapters not in the file: {missing}")
        return 1
    for n, p in params.items():
        if not torch.equal(p.detach(), saved[n]):
            print(f"{n}: the model does not hold the file's values")
            return 1
    print(f"{len(params)} adapter matrices loaded with the file's values")

    ids = torch.tensor([[int(x) for x in args.ids.split(",")]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].numpy()
    ours = np.load(args.logits)
    if ours.shape != logits.shape:
        print(f"shape {ours.shape} against PEFT's {logits.shape}")
        return 1
    diff = float(np.abs(ours - logits).max())
    print(f"max |fucina - PEFT| logit difference {diff:.3e} (max |logit| {np.abs(logits).max():.2f})")
    if diff > args.tol:
        return 1
    if args.merged:
        merged = AutoModelForCausalLM.from_pretrained(args.merged, dtype=torch.float32)
        merged.eval()
        with torch.no_grad():
            m = merged(input_ids=ids).logits[0].numpy()
        mdiff = float(np.abs(m - logits).max())
        print(f"max |merged model (transformers) - PEFT| logit difference {mdiff:.3e}")
        if mdiff > args.tol:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
