#!/usr/bin/env python3
"""Reference fixtures from HF transformers, for transformer-bench's numerics tests.

Runs where torch + transformers exist (the GPU host). For each config it builds
`GPT2LMHeadModel` or `BloomForCausalLM` with HF's own init under a fixed seed, saves `config.json` +
`model.safetensors` (save_pretrained, the same files a real checkpoint has), and writes:

  reference.safetensors   input_ids, attention_mask (B, T) int64 and logits (B, T, V) float32
                          of a right-padded batch (eager attention, padding mask applied)
  lambada_reference.json  per passage: lm-eval `lambada_openai` tokens, summed log-likelihood
                          of the target and the greedy flag, each passage run on its own

The LAMBADA scoring below re-implements lm-evaluation-harness (HFLM._encode_pair and
_loglikelihood_tokens) because lm_eval is not installed on the GPU host:
  context = " ".join(text.split(" ")[:-1]), target = " " + text.split(" ")[-1]
  whole = tok(context + target); ctx = tok(context); cont = whole[len(ctx):]
  inp = (ctx + cont)[-(n_positions + 1):][:-1]
  ll = sum log_softmax(logits)[cont], greedy = all(argmax == cont)

Usage:
  python3 scripts/hf_fixtures/make_fixtures.py --vocab-dir DIR --data data/lambada_sample.jsonl \
      --out tests/fixtures --configs gpt2-fixture,gpt2-fixture-logits
  python3 scripts/hf_fixtures/make_fixtures.py ... --configs gpt2 --device cuda --dtype bf16   # 124M shape
DIR holds GPT-2's encoder.json and vocab.bpe (tiktoken-rs ships both).
"""
import argparse
import json
import os

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import BloomConfig, BloomForCausalLM, GPT2Config, GPT2LMHeadModel

# Fixture configs: name -> (architecture, config kwargs).
# `*-fixture` models have GPT-2's vocabulary size so LAMBADA text tokenizes for real (BLOOM's
# tokenizer is not available here: GPT-2's BPE stands in, as in the bench); few channels keep
# model.safetensors small enough to commit. `*-fixture-logits` compare full logits (small vocab)
# with a larger init scale so attention is far from uniform and masking mistakes show.
# BLOOM fixtures use head counts that are not powers of two (3, 6): the second ALiBi branch.
CONFIGS = {
    "gpt2-fixture": ("gpt2", dict(vocab_size=50257, n_positions=256, n_embd=32, n_layer=2, n_head=4)),
    "gpt2-fixture-logits": ("gpt2", dict(
        vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=4,
        initializer_range=0.1, layer_norm_epsilon=1e-6, bos_token_id=0, eos_token_id=0,
    )),
    "gpt2": ("gpt2", dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)),
    "bloom-fixture": ("bloom", dict(vocab_size=50257, hidden_size=24, n_layer=2, n_head=3)),
    "bloom-fixture-logits": ("bloom", dict(
        vocab_size=512, hidden_size=48, n_layer=2, n_head=6, initializer_range=0.1,
        layer_norm_epsilon=1e-6, apply_residual_connection_post_layernorm=True,
        bos_token_id=0, eos_token_id=0, pad_token_id=0,
    )),
    "bloom-560m": ("bloom", dict(vocab_size=250880, hidden_size=1024, n_layer=24, n_head=16)),
}
MODELS = {"gpt2": (GPT2Config, GPT2LMHeadModel), "bloom": (BloomConfig, BloomForCausalLM)}
# lm-eval's max_length for models whose config names no n_positions (BLOOM: ALiBi).
DEFAULT_MAX_LENGTH = 2048

# Passages whose last word repeats the previous one: a random model with tied embeddings
# tends to predict the current token again, so these give `greedy == True` cases to compare.
SYNTHETIC = [
    "she looked at the door and said the word again and again again",
    "the cat sat on the mat mat",
    "one two three four five five",
]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Gpt2Bpe:
    """GPT-2's byte-level BPE built from encoder.json + vocab.bpe the way GPT2TokenizerFast is."""

    def __init__(self, vocab_dir):
        bpe = models.BPE.from_file(
            os.path.join(vocab_dir, "encoder.json"), os.path.join(vocab_dir, "vocab.bpe")
        )
        self.tok = Tokenizer(bpe)
        self.tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        self.tok.decoder = decoders.ByteLevel()
        self.vocab_size = self.tok.get_vocab_size()

    def encode(self, text):
        return self.tok.encode(text).ids


def gpt2_tokenizer(vocab_dir):
    tok = Gpt2Bpe(vocab_dir)
    # Known ids from GPT-2's vocabulary: fail here rather than write wrong fixtures.
    assert tok.encode("Hello world") == [15496, 995], tok.encode("Hello world")
    assert tok.vocab_size >= 50256, tok.vocab_size
    return tok


def lambada_split(text):
    words = text.split(" ")
    return " ".join(words[:-1]), " " + words[-1]


def encode_pair(tok, context, continuation):
    # lm-eval HFLM._encode_pair: trailing spaces of the context move to the continuation.
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tok.encode(context + continuation)
    ctx = tok.encode(context)
    return ctx, whole[len(ctx):]


@torch.no_grad()
def score_passage(model, tok, text, max_len, device):
    context, target = lambada_split(text)
    ctx, cont = encode_pair(tok, context, target)
    inp = (ctx + cont)[-(max_len + 1):][:-1]
    ids = torch.tensor([inp], device=device)
    logits = model(input_ids=ids).logits.float()
    logp = torch.log_softmax(logits, dim=-1)[0, -len(cont):]  # (n_cont, V)
    want = torch.tensor(cont, device=device)
    ll = logp.gather(-1, want[:, None]).sum().item()
    greedy = bool((logp.argmax(-1) == want).all().item())
    return dict(text=text, context_tokens=ctx, target_tokens=cont, ll=ll, greedy=greedy)


@torch.no_grad()
def padded_batch_logits(model, cfg, device, seed):
    # Right-padded batch of three lengths; the tests compare only positions where mask == 1.
    g = torch.Generator().manual_seed(seed + 1)
    t = min(16, getattr(cfg, "n_positions", 16))
    lens = [t, t // 2, 3]
    ids = torch.randint(0, cfg.vocab_size, (len(lens), t), generator=g)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
        ids[i, n:] = 0
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float().cpu()
    return {"input_ids": ids.contiguous(), "attention_mask": mask.contiguous(), "logits": logits.contiguous()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab-dir", required=True, help="folder with GPT-2 encoder.json and vocab.bpe")
    ap.add_argument("--data", required=True, help="LAMBADA jsonl (the repo's sample)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default="gpt2-fixture,gpt2-fixture-logits")
    ap.add_argument("--n-passages", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    tok = gpt2_tokenizer(args.vocab_dir)
    with open(args.data) as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()][: args.n_passages]
    texts += SYNTHETIC

    for name in args.configs.split(","):
        arch, spec = CONFIGS[name]
        config_cls, model_cls = MODELS[arch]
        out = os.path.join(args.out, name)
        os.makedirs(out, exist_ok=True)
        torch.manual_seed(args.seed)
        cfg = config_cls(**spec, attn_implementation="eager")
        model = model_cls(cfg).eval()
        model.save_pretrained(out, safe_serialization=True)
        model = model.to(device=args.device, dtype=DTYPES[args.dtype])

        from safetensors.torch import save_file

        # Full logits only where they stay small enough to commit, or for uncommitted GPU runs.
        if cfg.vocab_size <= 4096 or args.device != "cpu":
            save_file(padded_batch_logits(model, cfg, args.device, args.seed), os.path.join(out, "reference.safetensors"))
        if cfg.vocab_size >= 50257:
            max_len = getattr(cfg, "n_positions", DEFAULT_MAX_LENGTH)
            passages = [score_passage(model, tok, t, max_len, args.device) for t in texts]
            ref = dict(
                generator="scripts/hf_fixtures/make_fixtures.py",
                tokenizer="gpt2" if arch == "gpt2" else "gpt2 (proxy)",
                transformers=transformers.__version__,
                torch=torch.__version__,
                device=str(torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"),
                dtype=args.dtype,
                seed=args.seed,
                data=args.data,
                n_synthetic=len(SYNTHETIC),
                passages=passages,
            )
            with open(os.path.join(out, "lambada_reference.json"), "w") as f:
                json.dump(ref, f, indent=1)
            n_greedy = sum(p["greedy"] for p in passages)
            print(f"{name}: {len(passages)} passages, {n_greedy} greedy, mean ll {sum(p['ll'] for p in passages)/len(passages):.4f}")
        print(f"{name}: wrote {out}")


if __name__ == "__main__":
    main()
