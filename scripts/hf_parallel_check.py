"""The HF worker's training strategies on one GPU, as `bench --engine hf --dp N` runs them but
with one torchrun process: DDP, FSDP SHARD_GRAD_OP and FULL_SHARD (FSDP2 `fully_shard`), with
and without gradient checkpointing, against the plain worker on the same steps. With one rank
the maths are the plain worker's, so the losses must agree; what two ranks exchange needs two
GPUs. Run from the repo root on the GPU host:

    python3 scripts/hf_parallel_check.py        -> a table; exit 1 if a strategy disagrees
"""
import json
import subprocess
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

WORKER = "src/engines/hf/worker.py"
MODEL = "/tmp/hf-parallel-check"
STEPS, BATCH, T = 6, 4, 128


def request(p, req):
    p.stdin.write(json.dumps(req) + "\n")
    p.stdin.flush()
    reply = json.loads(p.stdout.readline())
    if not reply.get("ok"):
        sys.exit(f"{req['op']}: {reply}")
    return reply


def run(strategy, recompute, steps, eval_blocks):
    cmd = [sys.executable, WORKER]
    if strategy:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", WORKER]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    train = dict(learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, max_grad_norm=1.0,
                 lr_warmup_steps=0, total_steps=STEPS, grad_accum=1, dropout=False, seed=0, recompute=recompute)
    if strategy:
        train["parallel"] = {"size": 1, "strategy": strategy}
    request(p, dict(op="load", model_dir=MODEL, dtype="bf16", device="cuda:0", attn="auto", compile=False,
                    train=train))
    losses = [request(p, dict(op="train_step", micro_batches=[s]))["loss"] for s in steps]
    ev = request(p, dict(op="eval", blocks=eval_blocks, batch_size=BATCH))["eval_loss"]
    peak = request(p, dict(op="finish"))["peak_memory_bytes"]
    p.wait()
    return losses, ev, peak


def main():
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=4, n_embd=256, n_head=4, n_positions=T)
    GPT2LMHeadModel(cfg).save_pretrained(MODEL)
    g = torch.Generator().manual_seed(1)
    steps = [torch.randint(0, cfg.vocab_size, (BATCH, T), generator=g).tolist() for _ in range(STEPS)]
    eval_blocks = torch.randint(0, cfg.vocab_size, (8, T), generator=g).tolist()
    plain = {rc: run(None, rc, steps, eval_blocks) for rc in (False, True)}
    ok = True
    print("strategy      recompute  max |loss - plain| / plain  eval_loss  peak MiB")
    for strategy in (None, "ddp", "fsdp_grad_op", "fsdp_full"):
        for rc in (False, True):
            losses, ev, peak = plain[rc] if strategy is None else run(strategy, rc, steps, eval_blocks)
            ref = plain[rc][0]
            worst = max(abs(a - b) / b for a, b in zip(losses, ref))
            ok &= worst < 2e-3
            print(f"{strategy or 'plain':13} {str(rc):9}  {worst:.2e}                    {ev:.4f}     {peak / 2**20:.0f}")
    print("losses per step (plain):", [round(x, 4) for x in plain[False][0]])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
