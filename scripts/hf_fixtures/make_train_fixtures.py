#!/usr/bin/env python3
"""Training reference fixtures from HF transformers + torch, for tests/train_fixtures.rs.

Runs where torch + transformers exist (the GPU host; CPU fp32, so any host gives the same
numbers up to float summation order). For each tiny config it builds `GPT2LMHeadModel` /
`BloomForCausalLM` with HF's own init under a fixed seed and writes into OUT/train-ARCH/:

  config.json, model.safetensors   initial weights (save_pretrained, as a real checkpoint)
  batches.safetensors              input_ids (steps, grad_accum, B, T) int64, ids < vocab_size
  final.safetensors                every parameter after the last step (named_parameters names)
  grads.safetensors                every parameter's gradient of the first step (the sum over its
                                   micro-batches of grad(loss / grad_accum), before clipping)
  reference.json                   hyper-parameters; per step: loss (mean of its micro-batch
                                   losses), grad_norm (before clipping), lr (the step's)

The loop is HF Trainer's, written out (train mode, dropout 0 in the config):
  loss = model(input_ids=ids, labels=ids).loss / grad_accum; loss.backward()  (per micro-batch)
  clip_grad_norm_(params, 1.0); AdamW.step(); scheduler.step(); zero_grad()
with torch.optim.AdamW(foreach=False, fused=False) and get_linear_schedule_with_warmup.
The learning rate is 1e-3 (not HF's 5e-5) so that 5 steps move weights far beyond the
test's 1e-5 tolerance; warm-up 2 of 10 scheduled steps, so both schedule branches run.
Tiny vocabulary (512; random ids) keeps the files small: no tokenizer is involved.

Usage:
  python3 scripts/hf_fixtures/make_train_fixtures.py --out tests/fixtures [--archs gpt2,bloom]
  # only grads.safetensors, from the model.safetensors and batches.safetensors already in OUT:
  python3 scripts/hf_fixtures/make_train_fixtures.py --out tests/fixtures --grads-only
"""
import argparse
import json
import os

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, BloomConfig, BloomForCausalLM, GPT2Config, GPT2LMHeadModel,
                          get_linear_schedule_with_warmup)

STEPS, ACCUM, BATCH, T = 5, 2, 2, 32
HYPER = dict(learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0,
             max_grad_norm=1.0, lr_warmup_steps=2, total_steps=10, grad_accum=ACCUM)


def build(arch):
    if arch == "gpt2":
        cfg = GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return GPT2LMHeadModel(cfg)
    if arch == "bloom":
        cfg = BloomConfig(vocab_size=512, hidden_size=64, n_layer=2, n_head=4,
                          hidden_dropout=0.0, attention_dropout=0.0)
        return BloomForCausalLM(cfg)
    raise SystemExit(f"unknown arch {arch}")


def first_step(model, ids):
    """Step 0's micro-batches through forward and backward: (their losses, {name: grad})."""
    losses = []
    for a in range(ACCUM):
        loss = model(input_ids=ids[0, a], labels=ids[0, a]).loss
        (loss / ACCUM).backward()
        losses.append(loss.item())
    return losses, {n: p.grad.detach().contiguous().clone() for n, p in model.named_parameters()}


def grads_only(out):
    """grads.safetensors from the checkpoint and batches already in `out`."""
    model = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager", dtype=torch.float32)
    model.train()
    ids = load_file(os.path.join(out, "batches.safetensors"))["input_ids"]
    losses, grads = first_step(model, ids)
    save_file(grads, os.path.join(out, "grads.safetensors"))
    print(out, "first-step losses", [round(x, 6) for x in losses])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--archs", default="gpt2,bloom")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--grads-only", action="store_true",
                    help="write grads.safetensors only, from the fixtures already in OUT")
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    for arch in args.archs.split(","):
        if args.grads_only:
            grads_only(os.path.join(args.out, f"train-{arch}"))
            continue
        torch.manual_seed(args.seed)
        model = build(arch)
        model.config._attn_implementation = "eager"
        out = os.path.join(args.out, f"train-{arch}")
        model.save_pretrained(out, safe_serialization=True)
        g = torch.Generator().manual_seed(args.seed + 1)
        ids = torch.randint(0, model.config.vocab_size, (STEPS, ACCUM, BATCH, T), generator=g)
        save_file({"input_ids": ids.contiguous()}, os.path.join(out, "batches.safetensors"))

        model.train()
        params = [p for _, p in model.named_parameters()]
        opt = torch.optim.AdamW(params, lr=HYPER["learning_rate"], betas=(HYPER["beta1"], HYPER["beta2"]),
                                eps=HYPER["eps"], weight_decay=HYPER["weight_decay"], foreach=False, fused=False)
        sched = get_linear_schedule_with_warmup(opt, HYPER["lr_warmup_steps"], HYPER["total_steps"])
        steps = []
        for s in range(STEPS):
            if s == 0:
                losses, grads = first_step(model, ids)
                save_file(grads, os.path.join(out, "grads.safetensors"))
            else:
                losses = []
                for a in range(ACCUM):
                    loss = model(input_ids=ids[s, a], labels=ids[s, a]).loss
                    (loss / ACCUM).backward()
                    losses.append(loss.item())
            norm = torch.nn.utils.clip_grad_norm_(params, HYPER["max_grad_norm"]).item()
            lr = sched.get_last_lr()[0]
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            steps.append(dict(loss=sum(losses) / ACCUM, grad_norm=norm, lr=lr))
        final = {n: p.detach().contiguous().clone() for n, p in model.named_parameters()}
        save_file(final, os.path.join(out, "final.safetensors"))
        ref = dict(arch=arch, seed=args.seed, torch=torch.__version__, transformers=transformers.__version__,
                   hyper=HYPER, batch=BATCH, block=T, steps=steps)
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump(ref, f, indent=1)
        print(arch, [round(x["loss"], 6) for x in steps], "grad norms", [round(x["grad_norm"], 4) for x in steps])


if __name__ == "__main__":
    main()
