"""LoRA training steps with PyTorch + PEFT on the configuration of
`crates/fucina-llm/examples/finetune_bench.rs`: a Hugging Face model directory
(bf16 weights kept bf16, f32 adapters), LoRA rank r on the chosen projections,
synthetic token ids (batch x seq-len, every token after the first predicted),
AdamW with gradient clipping at 1.0; the median step time after the first
(warm-up), training tokens per second at that median, and the process's peak
resident memory (VmHWM).

Run in a throwaway venv (`pip install torch transformers peft`), never in CI:

    python benches/finetune/peft_step.py --model DIR --batch 4 --seq-len 256 \
        --lora-r 8 --target all --steps 5 --threads 2
"""

import argparse
import statistics
import time


def vm_hwm_kb():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--lora-alpha", type=float, default=16.0)
    ap.add_argument("--target", default="all")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--base-dtype", default="bf16", choices=["bf16", "f32"])
    args = ap.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.base_dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype)
    targets = (
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        if args.target == "all"
        else args.target.split(",")
    )
    cfg = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                     target_modules=targets, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
    # f32 adapters over the bf16 base (PEFT keeps the adapters in the base's
    # dtype unless told: cast them, as the fucina run keeps f32 adapters)
    for n, p in model.named_parameters():
        if p.requires_grad:
            p.data = p.data.float()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4, weight_decay=0.0)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (args.batch, args.seq_len), generator=g)
    times = []
    for s in range(args.steps):
        t0 = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        times.append(dt)
        print(f"step {s} loss {out.loss.item():.6f} {dt:.3f} s", flush=True)
    med = statistics.median(times[1:])
    tokens = args.batch * args.seq_len
    print(f"torch {torch.__version__}; threads {args.threads}; base {args.base_dtype}")
    print(f"median step {med:.3f} s; {tokens / med:.1f} training tokens/s")
    hwm = vm_hwm_kb()
    if hwm is not None:
        print(f"peak RSS {hwm / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
