#!/usr/bin/env python3
"""A small HF Trainer run in run_clm.py's shape, to capture real Trainer output for
extract-metrics' golden tests (tests/fixtures/logs/hf_trainer/).

Tiny random GPT-2 (2 layers, 64 channels), trained on the repo's LAMBADA sample text grouped into
blocks like run_clm (tokenize, concatenate, split into block_size), evaluated on a held-out part.
It logs like run_clm: INFO logging to stdout, `{'loss': …}` lines, `***** train metrics *****`
and `***** eval metrics *****` blocks (with perplexity), then save_metrics + save_state write
all_results.json, train_results.json, eval_results.json and trainer_state.json.

usage: python3 scripts/hf_trainer_sample.py --vocab-dir DIR --out DIR > DIR/run_clm.log
"""
import argparse
import json
import logging
import math
import os
import sys

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, default_data_collator

ap = argparse.ArgumentParser()
ap.add_argument("--vocab-dir", required=True)
ap.add_argument("--data", default="data/lambada_sample.jsonl")
ap.add_argument("--out", required=True)
ap.add_argument("--block-size", type=int, default=64)
ap.add_argument("--max-steps", type=int, default=40)
args = ap.parse_args()

logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                    datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
transformers.utils.logging.set_verbosity_info()
logging.getLogger().setLevel(logging.INFO)

tok = Tokenizer(models.BPE.from_file(os.path.join(args.vocab_dir, "encoder.json"),
                                     os.path.join(args.vocab_dir, "vocab.bpe")))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
texts = [json.loads(line)["text"] for line in open(args.data)]
ids = [t for text in texts for t in tok.encode(text).ids]
n = len(ids) // args.block_size * args.block_size
blocks = [ids[i:i + args.block_size] for i in range(0, n, args.block_size)]
split = len(blocks) * 9 // 10


class Blocks(torch.utils.data.Dataset):
    def __init__(self, blocks):
        self.blocks = blocks

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, i):
        x = torch.tensor(self.blocks[i])
        return {"input_ids": x, "labels": x.clone()}


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=args.block_size))
training_args = TrainingArguments(
    output_dir=args.out, per_device_train_batch_size=8, per_device_eval_batch_size=8,
    max_steps=args.max_steps, logging_steps=5, learning_rate=5e-4, bf16=torch.cuda.is_available(),
    report_to=[], save_strategy="no", seed=42,
)
trainer = Trainer(model=model, args=training_args, train_dataset=Blocks(blocks[:split]),
                  eval_dataset=Blocks(blocks[split:]), data_collator=default_data_collator)
train_result = trainer.train()
metrics = train_result.metrics
metrics["train_samples"] = split
trainer.log_metrics("train", metrics)
trainer.save_metrics("train", metrics)
trainer.save_state()
metrics = trainer.evaluate()
metrics["eval_samples"] = len(blocks) - split
metrics["perplexity"] = math.exp(metrics["eval_loss"])
trainer.log_metrics("eval", metrics)
trainer.save_metrics("eval", metrics)
