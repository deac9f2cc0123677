#!/usr/bin/env python3
"""Greedy-generation fixtures from HF transformers, for tests/generate_fixtures.rs.

Loads tiny random checkpoints (config.json + model.safetensors) with `AutoModelForCausalLM`
(eager attention, fp32): those shipped in tests/fixtures (made by scripts/make_fixtures.py),
and two made here, tests/fixtures/generate/{gpt2,bloom}-generate. The shipped ones have tied
embeddings and a small init, so a random BLOOM repeats one token whatever its attention does;
the `*-generate` ones (init 0.3, untied LM head) generate varied tokens, so a wrong mask,
position or ALiBi bias changes the ids. They are made (HF init, fixed seed) only when missing
or with --remake-checkpoints: regenerating the fixtures keeps the committed weights. It builds
left-padded batches of prompts of mixed lengths (token ids drawn with a fixed seed; several
batch shapes, batch 1 included, one batch without padding, one filling GPT-2's positions to the
last), and runs

    model.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=N,
                   min_new_tokens=N, pad_token_id=PAD, output_scores=True,
                   return_dict_in_generate=True)

on the CPU, and on the GPU too when CUDA is present (TF32 off), recording both. `min_new_tokens`
makes HF generate exactly N tokens by banning the EOS ids for all N of them; the fixture lists
those ids (`banned_ids`) so that the engine bans them too.

Writes tests/fixtures/generate/MODEL.json:
  cases[]: name, new_tokens, pad_token_id, banned_ids, prompts (unpadded),
           input_ids / attention_mask (B, T) as HF's tokenizer pads on the left,
           results{cpu, cuda?}: ids (B, N) generated, top1 (B, N) the chosen token's score and
           margin (B, N) its lead over the runner-up, both from the scores greedy chose from
           (after the EOS ban). A test treats margin < tie_rel * max(1, |top1|) as a tie, where
           either token is a correct choice.

Usage (from the repository root; the committed fixtures must come from the GPU host):
  python3 scripts/hf_fixtures/make_generate_fixtures.py
  python3 scripts/hf_fixtures/make_generate_fixtures.py --models gpt2-generate --cpu-only
"""
import argparse
import json
import os

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    BloomConfig,
    BloomForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
)

MODELS = [
    "gpt2-generate",
    "bloom-generate",
    "gpt2-fixture-logits",
    "bloom-fixture-logits",
    "gpt2-fixture",
    "bloom-fixture",
]
# Checkpoints made here, in the output folder: name -> (config class, model class, kwargs).
# BLOOM's 6 heads take ALiBi's non-power-of-two branch.
CHECKPOINTS = {
    "gpt2-generate": (GPT2Config, GPT2LMHeadModel, dict(
        vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=4, initializer_range=0.3,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
    )),
    "bloom-generate": (BloomConfig, BloomForCausalLM, dict(
        vocab_size=512, hidden_size=48, n_layer=2, n_head=6, initializer_range=0.3,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )),
}
# (name, prompt lengths of the batch, new tokens). GPT-2 fixtures have n_positions >= 64:
# "full" ends exactly at position 64.
CASES = [
    ("batch1", [7], 12),
    ("mixed4", [3, 11, 6, 1], 10),
    ("equal3", [9, 9, 9], 8),
    ("mixed6", [20, 2, 15, 9, 11, 4], 24),
    ("full", [40, 17], 24),
]
TIE_REL = 1e-4


def case_batch(vocab_size, lens, pad_id, seed):
    """Prompts of `lens` tokens drawn from the vocabulary, and their left-padded batch."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lens]
    t = max(lens)
    ids = torch.full((len(lens), t), pad_id, dtype=torch.long)
    mask = torch.zeros((len(lens), t), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, t - len(p):] = torch.tensor(p)
        mask[i, t - len(p):] = 1
    return prompts, ids, mask


@torch.no_grad()
def greedy(model, ids, mask, n, pad_id, device):
    out = model.generate(
        ids.to(device),
        attention_mask=mask.to(device),
        do_sample=False,
        max_new_tokens=n,
        min_new_tokens=n,
        pad_token_id=pad_id,
        output_scores=True,
        return_dict_in_generate=True,
    )
    new = out.sequences[:, ids.shape[1]:].cpu()
    assert new.shape == (ids.shape[0], n), new.shape
    scores = torch.stack(out.scores, dim=1).float().cpu()  # (B, N, V), after the EOS ban
    top2 = scores.topk(2, dim=-1).values  # (B, N, 2)
    chosen = scores.gather(-1, new[..., None])[..., 0]
    assert torch.equal(chosen, top2[..., 0]), "greedy did not pick the top score"
    return dict(
        ids=new.tolist(),
        top1=top2[..., 0].tolist(),
        margin=(top2[..., 0] - top2[..., 1]).tolist(),
    )


def banned_ids(model):
    eos = model.generation_config.eos_token_id
    if eos is None:
        return []
    return sorted(set(eos if isinstance(eos, list) else [eos]))


def make_checkpoint(path, name, seed):
    config_cls, model_cls, kwargs = CHECKPOINTS[name]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs, attn_implementation="eager")).eval()
    model.save_pretrained(path, safe_serialization=True)
    print(f"{name}: made the checkpoint {path}")


def fixture(path, name, devices, seed):
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    cfg = model.config
    pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else banned_ids(model)[0]
    limit = getattr(cfg, "n_positions", None)
    cases = []
    for k, (case, lens, n) in enumerate(CASES):
        if limit is not None and max(lens) + n > limit:
            raise SystemExit(f"{name}: case {case} needs {max(lens) + n} positions, n_positions is {limit}")
        prompts, ids, mask = case_batch(cfg.vocab_size, lens, pad_id, seed + k)
        results = {}
        for dev in devices:
            results[dev] = greedy(model.to(dev), ids, mask, n, pad_id, dev)
        cases.append(dict(
            name=case,
            new_tokens=n,
            pad_token_id=pad_id,
            banned_ids=banned_ids(model),
            prompts=prompts,
            input_ids=ids.tolist(),
            attention_mask=mask.tolist(),
            results=results,
        ))
    return dict(
        generator="scripts/hf_fixtures/make_generate_fixtures.py",
        model=name,
        transformers=transformers.__version__,
        torch=torch.__version__,
        devices={d: (torch.cuda.get_device_name() if d == "cuda" else "cpu") for d in devices},
        dtype="fp32",
        attention="eager",
        seed=seed,
        tie_rel=TIE_REL,
        cases=cases,
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", default="tests/fixtures", help="folder of the checkpoints")
    ap.add_argument("--out", default="tests/fixtures/generate")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--cpu-only", action="store_true", help="skip the GPU even when present")
    ap.add_argument("--remake-checkpoints", action="store_true",
                    help="make the *-generate checkpoints again (changes the committed weights)")
    args = ap.parse_args()

    # fp32 means fp32 on the GPU too: no TF32 matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and not args.cpu_only else [])
    os.makedirs(args.out, exist_ok=True)
    for name in args.models.split(","):
        path = os.path.join(args.out if name in CHECKPOINTS else args.fixtures, name)
        if name in CHECKPOINTS and (args.remake_checkpoints or not os.path.exists(path)):
            make_checkpoint(path, name, args.seed)
        ref = fixture(path, name, devices, args.seed)
        out = os.path.join(args.out, f"{name}.json")
        with open(out, "w") as f:
            json.dump(ref, f, indent=1)
            f.write("\n")
        agree = ""
        if "cuda" in devices:
            same = sum(c["results"]["cpu"]["ids"] == c["results"]["cuda"]["ids"] for c in ref["cases"])
            agree = f", cpu and cuda agree on {same}/{len(ref['cases'])} cases"
        print(f"{name}: {len(ref['cases'])} cases on {', '.join(devices)}{agree} -> {out}")


if __name__ == "__main__":
    main()
