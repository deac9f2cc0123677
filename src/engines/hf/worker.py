"""HF transformers + PyTorch engine worker for transformer-bench (`bench --engine hf`).

`bench` starts this (embedded in the binary, run with `python -c`) and talks JSON lines:
one request on stdin, one reply on stdout, stderr is free for warnings. Tokenization, batching,
padding and the metric code stay on the Rust side so both engines do identical work; this
worker only runs the model and reports what the Rust side would have measured.

  -> {"op": "hello"}                       (imports work: checked before any weights are written)
  <- {"ok": true, "versions": {...}}
  -> {"op": "load", "model_dir": D, "dtype": "fp32|tf32|fp16|bf16", "device": "cpu|cuda:N",
      "attn": "best|auto|eager|sdpa", "compile": false}
  <- {"ok": true, "versions": {...}, "attn": "sdpa", "max_positions": N, "n_parameters": N,
      "load_seconds": s}
     (best loads as auto does; choose then picks)
  -> {"op": "choose", "probe": [score or generate request...], "attns": ["eager", ...] (empty:
      every attention the model supports, and on CUDA "sdpa-nocudnn": sdpa with torch's cuDNN
      attention off, uncompiled only), "compiles": [false, true], "cold_share": x}
  <- {"ok": true, "attn": "eager", "compile": true, "candidates": [{"attn": .., "compile": ..,
      "cold_ms": [..], "warm_ms": [..], "per_batch_ms": t, "compiles_cold": n,
      "compiles_warm": n} or {"attn": .., "compile": .., "error": "one line"}, ...],
      "note": "..." (one candidate: nothing timed)}
     (--hf-attn best / --hf-compile best: each candidate (attention x compiled or not) runs
     every probe request cold, the first meeting of each shape (torch.compile's compilation,
     sdpa's set-up: reported, not what decides), then warm: WARM_REPEATS times, the median
     kept. The run's cost of a
     batch is predicted as cold_share x a new shape's cost (the mean cold latency of the probes
     after the first two, which pay one-time set-up) + (1 - cold_share) x the mean warm one,
     where cold_share is the share of the run's timed batches that meet a shape the warm-up
     did not; the cheapest is kept, its compiled graphs still cached.)
  -> {"op": "score", "inputs": [[ids]...], "targets": [[ids]...], "padded_len": T}
  <- {"ok": true, "token_ll": [...], "argmax": [...], "latency_ms": t, "compiles": n}
     (inputs right-padded to max(T, longest); token_ll / argmax: for every passage in order,
     one entry per target token)
  -> {"op": "finish"}
  <- {"ok": true, "peak_memory_bytes": N, "device_memory_used_bytes": N|null,
      "reserved_memory_bytes": N|null}
  -> {"op": "generate", "prompts": [[ids]...], "padded_len": T, "new_tokens": N, "pad_id": P,
      "time_steps": bool}
  <- {"ok": true, "ids": [[N ids]...], "latency_ms": t, "token_ms": [t1, ..., tN], "compiles": n}
     (greedy, exactly N new tokens per prompt, batch left-padded to max(T, longest) with its
     attention mask, as
     `model.generate(do_sample=False, min_new_tokens=N, max_new_tokens=N, pad_token_id=P)`;
     token_ms[k]: device-synchronized time from the start to the (k+1)-th token, so token_ms[0]
     is the time to first token (prefill) and the differences are inter-token latencies; empty
     without time_steps, which leaves out the synchronisation after each token)
Serving (`--suite serving`): the whole load, replayed here on this process's clock:

  -> {"op": "serve_mode", "batching": "continuous|static", "max_batch": N, "pad_id": P,
      "eos_ids": [E...]}
  <- {"ok": true, "mode": "continuous|static", "why": "model, attention, notes or what it lacks",
      "sdpa": "the SDPA backends served with"|null}
     (batching static (`--batching static`): static, nothing probed. Else
     continuous: transformers' ContinuousBatchingManager (`model.init_continuous_batching`),
     where the model runs on transformers' attention interface (`_supports_attention_backend`)
     and one short request through the started manager returns its tokens; greedy, the EOS ids
     suppressed and none ending a request (eos_token_id -1), at most N requests a step where
     ContinuousBatchingConfig has max_requests_per_batch. Else static, saying why: BLOOM's
     ALiBi attention is its own code. On CUDA both modes serve with torch's cuDNN attention off:
     it builds a graph for each new batch and key length (serving_sdpa), which a served load
     meets every decode step.)
  -> {"op": "serve", "requests": [{"scheduled_ms": t, "prompt": [ids], "output_len": N}...],
      "max_batch": N, "max_concurrency": C|null, "warm": {"prompts": [[ids]...], "new_tokens": N,
      "calls": K}, "pad_id": P, "eos_ids": [E...], "pad_multiple": M, "pad_cap": T}
  <- {"ok": true, "mode": "...", "requests": [{"request": i, "batch": b, "batch_size": n,
      "arrival_ms": t, "start_ms": t, "token_ms": [t...], "finish_ms": t}...] (in the order
      served), "n_batches": N, "compiles": n, "error": null|"one line"}
     (the warm-up first, untimed: K calls of the warm prompts, through the manager or generate;
     then the clock's 0. A request arrives at its scheduled time or, with C requests in flight,
     when one finishes (closed loop). static: src/scenarios/serving/queue.rs's queue line for
     line, each call the generate op on the arrived requests (at most max_batch), left-padded to
     the longest rounded up to M (at most T), every token synchronized; a request's tokens are
     its first output_len, its finish the call's return. continuous: each request added to the
     manager as it arrives (max_new_tokens = output_len); start = it left the manager's waiting
     queue, tokens and finish = the manager's own stamps (record_timestamps; else the times
     each streamed token is read here); batch = its admission in start order, batch_size = the
     requests running as it joined; n_batches = the requests. An exception mid-replay keeps the
     requests served before it and says why in "error".)
`compiles`: torch.compile's graph compilations during the call (dynamo's count): the Rust side
sums them over the timed batches, where a compiled candidate should compile nothing.
Errors: {"ok": false, "error": "one line"}; the worker then exits non-zero.

Training (`--suite wikitext2`): `load` with a `train` object loads fp32 weights (fp32 masters
and optimizer state, as HF Trainer), `model.train()`, and builds HF Trainer's loop written out:

  -> {"op": "load", ..., "train": {"learning_rate": x, "beta1": x, "beta2": x, "eps": x,
      "weight_decay": x, "max_grad_norm": x, "lr_warmup_steps": N, "total_steps": N,
      "grad_accum": N, "dropout": true|false, "seed": N}}
     (dropout false: every `*pdrop` / `*dropout` probability of the config set to 0;
     "compile": true trains `torch.compile(model)`, as HF Trainer's torch_compile=True: the
     first train_step compiles forward and backward, so the Rust side keeps it a warm-up step)
  -> {"op": "train_step", "micro_batches": [[[ids]...]...]}   (one optimizer step)
  <- {"ok": true, "loss": x, "grad_norm": x, "learning_rate": x, "latency_ms": t,
      "skipped": false, "loss_scale": x|null, "phases_ms": {forward, backward, update}|null}
  -> {"op": "eval", "blocks": [[ids]...], "batch_size": N}
  <- {"ok": true, "eval_loss": x, "runtime_ms": t}

A step: per micro-batch `loss = model(input_ids=ids, labels=ids).loss` (the model shifts the
labels), `(loss / grad_accum).backward()`; `clip_grad_norm_(max_grad_norm)`;
`torch.optim.AdamW` step (its default: foreach on CUDA, as HF Trainer); `get_linear_schedule_with_warmup` step; `zero_grad`.
bf16/fp16: `torch.autocast` over fp32 weights; fp16 with `torch.amp.GradScaler` (unscaled
before clipping; a skipped step does not advance the schedule, as accelerate). tf32: TF32
matmuls on fp32. `loss`: mean of the micro-batch losses; `grad_norm`: before clipping;
`learning_rate`: the one the step used; `latency_ms`: synchronize, clock, ids to the device,
forward, backward, clip, optimizer and scheduler step, zero_grad, synchronize, clock (the same
region as the candle trainer). `eval`: `model.eval()`, no grad, autocast as in training,
batches of `batch_size` blocks; `eval_loss` = mean over blocks of each block's mean next-token
loss (the candle runner's definition; blocks have equal length), `runtime_ms` from the first
forward to the last loss on the host (ids already on the device).

Timing matches the candle engine: synchronize, clock, ids to the device, forward, LM head only
on the target rows, log-softmax in fp32, results back on the host, synchronize, clock.

Training strategies (`--engine hf --dp N`, `--strategies`): the Rust side starts this script
under torchrun (`python -m torch.distributed.run --standalone --nproc_per_node N`), one process
a GPU (cuda:LOCAL_RANK). Rank 0 alone reads stdin and writes replies; it broadcasts each
request to the other ranks, and every rank runs it. `train` then holds
`"parallel": {"size": N, "strategy": "ddp|fsdp_grad_op|fsdp_full"}`: DDP (torch's
DistributedDataParallel), FSDP's SHARD_GRAD_OP (ZeRO-2: FSDP2 `fully_shard` a block at a time,
`reshard_after_forward=False`) or FULL_SHARD (ZeRO-3: resharded after the forward). A
train_step's `micro_batches` are the whole step's, N·grad_accum of them: rank r trains on the
r-th grad_accum of them (what the candle engine's rank r takes), the gradients are averaged
over the ranks (DDP's all-reduce, FSDP's reduce-scatter), the reported loss is the mean over
every rank. `eval` runs on every rank (FSDP gathers the weights in its forward); `finish`
reports the largest peak of any rank and every rank's. `"recompute": true` turns on HF's
gradient checkpointing (`gradient_checkpointing_enable`, non-reentrant), as HF Trainer's
`gradient_checkpointing=True`.
"""
import collections
import contextlib
import inspect
import json
import os
import sys
import time


# Under torchrun: this process's rank (only rank 0 talks to the Rust side).
RANK = int(os.environ.get("RANK", "0"))
DISTRIBUTED = "LOCAL_RANK" in os.environ


# The attention candidate "sdpa with torch's cuDNN attention off" (Inference.no_cudnn_candidate).
NO_CUDNN = "sdpa-nocudnn"


def reply(**kw):
    if RANK == 0:
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()


def fail(msg):
    if RANK != 0:
        print(f"rank {RANK}: {msg}", file=sys.stderr, flush=True)
    reply(ok=False, error=msg)
    sys.exit(1)


try:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
except ImportError as e:  # one line the Rust side shows as is
    fail(f"the HF engine needs torch and transformers in this Python ({sys.executable}): "
         f"pip install torch transformers ({e})")

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# lm-eval's max_length when the config names no n_positions (BLOOM: ALiBi).
DEFAULT_MAX_LENGTH = 2048


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# Warm runs of each probe request a candidate's warm time is the median of: compiled HF's
# decoding moves ~10 % between calls of one process, as far as eager+compile from sdpa+compile
# at batch 1 on an H100 (results/h100x2/hf-probe-run2): one run picked the slower of the two.
WARM_REPEATS = 3


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def compiles():
    """torch.compile's graph compilations so far in this process (dynamo's own count)."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:  # an older torch without the counter: nothing to report
        return 0


def versions():
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "cuda": torch.version.cuda or "none",
    }


class Serving:
    """The serving suite (`serve_mode`, `serve`): the whole load replayed on this process's clock,
    its 0 the first scheduled arrival, after an untimed warm-up. See the module's docstring."""

    def serve_mode(self, req):
        self.serve_pad, self.serve_eos = req["pad_id"], req["eos_ids"]
        sdpa = self.serving_sdpa()  # before the manager's probe: it runs sdpa too
        if req.get("batching") == "static":
            self.serving_mode, why = "static", "asked for (--batching static)"
        else:
            self.serving_mode, why = self.choose_serving(int(req["max_batch"]))
        reply(ok=True, mode=self.serving_mode, why=why, sdpa=sdpa)

    def serving_sdpa(self):
        """Serving's SDPA backends: on CUDA, torch's cuDNN attention off. torch 2.11 puts it first
        on sm90 / sm100 (cuDNN >= 9.15; unless TORCH_CUDNN_SDPA_DEPRIORITIZED) and builds a cuDNN
        graph on the host for every new (batch, key length) it meets, ~40 ms on an H100: a
        generation suite's run repeats its warm-up's shapes, a served load does not (every
        decode step of a call whose length the warm-up did not cover; every step of the
        continuous manager, whose key length is the running requests' sum). Flash (no mask) and
        memory-efficient (masked) attention have no per-shape cost. None off CUDA."""
        if self.device.type != "cuda":
            return None
        if not torch.backends.cuda.cudnn_sdp_enabled():
            return "flash / memory-efficient / math (cuDNN attention already off)"
        torch.backends.cuda.enable_cudnn_sdp(False)
        return ("flash / memory-efficient / math: cuDNN attention off (a host-built graph for each "
                "new batch and key length, ~40 ms a decode step under a served load)")

    def choose_serving(self, max_batch):
        """transformers' continuous batching where this model has it (the attention interface its
        paged cache plugs into), checked on one short request; else static batching, and why."""
        name = f"{type(self.model).__name__} in transformers {transformers.__version__}"
        if not hasattr(self.model, "init_continuous_batching"):
            return "static", f"{name} has no continuous batching (init_continuous_batching)"
        if not getattr(self.model, "_supports_attention_backend", False):
            return "static", (f"{name}: its attention is its own code, not transformers' attention "
                              "interface that continuous batching's paged cache needs")
        try:
            self.cb, notes = self.start_manager(max_batch)
            out = self.cb_run([[0, 1, 2, 3]], 2, timeout_s=600)[0]
            if len(out.generated_tokens) != 2:
                raise RuntimeError(f"a probe of 2 new tokens returned {len(out.generated_tokens)}")
        except Exception as e:  # noqa: BLE001 - any failure means static batching, said in the header
            self.stop_manager()
            self.model.set_attn_implementation("sdpa" if self.attn == NO_CUDNN else self.attn)
            return "static", f"{name}: continuous batching failed ({type(e).__name__}: {e})".splitlines()[0]
        return "continuous", f"{name}, attention {self.model.config._attn_implementation}" + notes

    def start_manager(self, max_batch):
        """A started ContinuousBatchingManager: greedy, EOS suppressed and never ending a request,
        at most `max_batch` requests a step where this transformers can cap it."""
        import dataclasses
        from transformers import GenerationConfig

        notes = ""
        gen = GenerationConfig(do_sample=False, max_new_tokens=16, pad_token_id=self.serve_pad,
                               eos_token_id=-1, suppress_tokens=self.serve_eos or None)
        kwargs = {"generation_config": gen}
        try:
            from transformers import ContinuousBatchingConfig
            fields = {f.name for f in dataclasses.fields(ContinuousBatchingConfig)}
        except (ImportError, TypeError):
            ContinuousBatchingConfig, fields = None, set()
        if "max_requests_per_batch" in fields:
            kwargs["continuous_batching_config"] = ContinuousBatchingConfig(max_requests_per_batch=max_batch)
        else:
            notes += f"; the batch size is not capped (no max_requests_per_batch here), --batch-size {max_batch} unused"
        if self.compiled:
            notes += "; --hf-compile does not apply (continuous batching's own defaults)"
        manager = self.model.init_continuous_batching(**kwargs)
        if hasattr(manager, "warmup"):
            manager.warmup()  # CUDA graphs captured before any request, where the manager uses them
        manager.start()
        self.cb_warm = 0  # warm-up requests so far (their ids)
        params = inspect.signature(manager.add_request).parameters
        self.cb_kwargs = {k: v for k, v in (("record_timestamps", True), ("eos_token_id", -1)) if k in params}
        if "record_timestamps" not in self.cb_kwargs:
            notes += "; token times stamped as each streamed token is read (no record_timestamps here)"
        return manager, notes

    def stop_manager(self):
        manager, self.cb = getattr(self, "cb", None), None
        if manager is not None:
            manager.stop(block=True, timeout=30)

    def cb_run(self, prompts, new_tokens, timeout_s):
        """Untimed: `prompts` through the manager at once; their finished outputs, in order."""
        ids = [f"warm{self.cb_warm + k}" for k in range(len(prompts))]
        self.cb_warm += len(prompts)
        for i, p in zip(ids, prompts):
            self.cb.add_request(p, request_id=i, max_new_tokens=new_tokens, **self.cb_kwargs)
        done, deadline = {}, time.perf_counter() + timeout_s
        while len(done) < len(ids):
            out = self.cb.get_result(timeout=1.0)
            if out is None:
                if not self.cb.is_running() or time.perf_counter() > deadline:
                    raise RuntimeError("the continuous batching manager stopped before its requests finished")
                continue
            if getattr(out, "error", None):
                raise RuntimeError(out.error)
            if out.is_finished():
                done[out.request_id] = out
        return [done[i] for i in ids]

    def serve(self, req):
        self.serve_pad, self.serve_eos = req["pad_id"], req["eos_ids"]
        self.serving_sdpa()  # as serve_mode chose (it is always asked first)
        mode = getattr(self, "serving_mode", None) or "static"
        warm = req["warm"]
        for _ in range(warm["calls"]):  # untimed: kernels, allocator, graphs; not the serving speed
            if mode == "continuous":
                self.cb_run(warm["prompts"], warm["new_tokens"], timeout_s=600)
            else:
                self.run_generate({"prompts": warm["prompts"], "new_tokens": warm["new_tokens"],
                                   "padded_len": self.pad_len(req, max(map(len, warm["prompts"]))),
                                   "pad_id": req["pad_id"], "time_steps": True})
        c0 = compiles()
        served, error = [], None
        replay = Replay(req, time.perf_counter())
        try:
            if mode == "continuous":
                self.serve_continuous(replay, served)
            else:
                self.serve_static(replay, req, served)
        except Exception as e:  # noqa: BLE001 - the requests served before it are kept
            import traceback

            traceback.print_exc(file=sys.stderr)
            error = f"{type(e).__name__}: {e}".splitlines()[0]
        if mode == "continuous":
            self.stop_manager()
            admissions(served)
        n_batches = len(served) if mode == "continuous" else replay.calls
        reply(ok=True, mode=mode, requests=served, n_batches=n_batches, compiles=compiles() - c0,
              error=error)

    def pad_len(self, req, longest):
        """The scenario's padding (skeleton.rs's Padding::len): the longest prompt rounded up to
        pad_multiple, at most pad_cap, never below the longest."""
        m = max(1, req["pad_multiple"])
        return max(min(-(-longest // m) * m, req["pad_cap"]), longest)

    def serve_static(self, r, req, served):
        """The suite's static batching (src/scenarios/serving/queue.rs, line for line): each free
        moment, the arrived requests (up to max_batch) as one generate call."""
        while len(served) < r.n:
            r.send_until(r.now())
            if not r.waiting:
                r.sleep_until(r.reqs[r.next]["scheduled_ms"])
                continue
            batch = [r.waiting.popleft() for _ in range(min(len(r.waiting), r.max_batch))]
            prompts = [r.reqs[i]["prompt"] for i, _ in batch]
            start = r.now()
            out = self.run_generate({"prompts": prompts, "pad_id": req["pad_id"], "time_steps": True,
                                     "new_tokens": max(r.reqs[i]["output_len"] for i, _ in batch),
                                     "padded_len": self.pad_len(req, max(map(len, prompts)))})
            finish = r.now()
            r.send_until(finish)  # scheduled during the call: they entered the queue then
            r.in_flight -= len(batch)
            r.freed = finish
            for i, arrival in batch:
                tokens = [start + lap for lap in out["token_ms"][:r.reqs[i]["output_len"]]]
                served.append(dict(request=i, batch=r.calls, batch_size=len(batch), arrival_ms=arrival,
                                   start_ms=start, token_ms=tokens, finish_ms=max([finish] + tokens)))
            r.calls += 1

    def serve_continuous(self, r, served):
        """Each request added to the running manager at its arrival; its times from the manager's
        own stamps (start: it left the waiting queue; tokens; finish)."""
        stamped = "record_timestamps" in self.cb_kwargs
        streamed = {}  # request -> token times read here (no record_timestamps)
        arrival = {}
        ms = r.ms
        while len(served) < r.n:
            for i, t in r.send_until(r.now()):
                arrival[i] = t
                streamed[i] = []
                self.cb.add_request(r.reqs[i]["prompt"], request_id=f"r{i}", streaming=not stamped,
                                    max_new_tokens=r.reqs[i]["output_len"], **self.cb_kwargs)
            room = r.next < r.n and r.in_flight < r.cap
            wait_s = (r.reqs[r.next]["scheduled_ms"] - r.now()) / 1e3 if room else 1.0
            out = self.cb.get_result(timeout=min(max(wait_s, 1e-4), 1.0))
            if out is None:
                if not self.cb.is_running():
                    raise RuntimeError("the continuous batching manager stopped")
                continue
            if getattr(out, "error", None):
                raise RuntimeError(f"request {out.request_id}: {out.error}")
            i = int(out.request_id[1:])
            now = r.now()
            if not stamped:
                streamed[i] += [now] * (len(out.generated_tokens) - len(streamed[i]))
            if not out.is_finished():
                continue
            tokens = [ms(t) for t in out.timestamps] if stamped else streamed[i]
            start, end = out.lifespan
            served.append(dict(request=i, arrival_ms=arrival[i], token_ms=tokens,
                               start_ms=ms(start) if start > 0 else tokens[0],
                               finish_ms=max([ms(end) if end > 0 else now] + tokens)))
            r.in_flight -= 1
            r.freed = served[-1]["finish_ms"]


def admissions(served):
    """Continuous batching has no calls: a request's batch is its admission (in start order), its
    batch_size the requests in the running batch as it joined (itself included)."""
    for k, s in enumerate(sorted(served, key=lambda s: s["start_ms"])):
        s["batch"] = k
        s["batch_size"] = sum(1 for o in served if o["start_ms"] <= s["start_ms"] < o["finish_ms"]) or 1


class Replay:
    """A replayed load's clock and queue (queue.rs's Queue): who has been sent, who waits, how many
    are in flight, when places last freed (a closed loop's earliest arrival)."""

    def __init__(self, req, t0):
        self.reqs, self.t0 = req["requests"], t0
        self.n = len(self.reqs)
        self.max_batch = max(1, req["max_batch"])
        self.cap = req.get("max_concurrency") or self.n
        self.next, self.in_flight, self.freed, self.calls = 0, 0, 0.0, 0
        self.waiting = collections.deque()

    def ms(self, t):
        return (t - self.t0) * 1e3

    def now(self):
        return self.ms(time.perf_counter())

    def sleep_until(self, t_ms):
        wait = t_ms - self.now()
        if wait > 0:
            time.sleep(wait / 1e3)

    def send_until(self, t_ms):
        """Sends the requests scheduled by t_ms while the concurrency allows; returns them with
        their arrivals (also queued in `waiting`)."""
        sent = []
        while self.next < self.n and self.reqs[self.next]["scheduled_ms"] <= t_ms and self.in_flight < self.cap:
            sent.append((self.next, max(self.reqs[self.next]["scheduled_ms"], self.freed)))
            self.in_flight += 1
            self.next += 1
        self.waiting.extend(sent)
        return sent


class Worker(Serving):
    def hello(self, _req):
        reply(ok=True, versions=versions())

    def load(self, req):
        train = req.get("train")
        self.device = torch.device(req["device"])
        if DISTRIBUTED and self.device.type == "cuda":
            self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                fail("torch sees no CUDA device (torch.cuda.is_available() is False)")
            torch.cuda.set_device(self.device)
        # TF32 only for --dtype tf32, as the candle engine.
        torch.backends.cuda.matmul.allow_tf32 = req["dtype"] == "tf32"
        torch.backends.cudnn.allow_tf32 = req["dtype"] == "tf32"
        config = AutoConfig.from_pretrained(req["model_dir"])
        if train and not train["dropout"]:
            for k, v in config.to_dict().items():
                if (k.endswith("pdrop") or k.endswith("dropout")) and isinstance(v, float):
                    setattr(config, k, 0.0)
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        cls = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
        supported = ["eager"] + (["sdpa"] if getattr(cls, "_supports_sdpa", False) else [])
        # The attentions choose may time (--hf-attn best); see no_cudnn_candidate.
        self.candidates = supported + self.no_cudnn_candidate(supported)
        self.cudnn_sdp = self.device.type == "cuda" and torch.backends.cuda.cudnn_sdp_enabled()
        attn = req["attn"]
        if attn in ("auto", "best"):
            attn = supported[-1]
        if attn not in supported:
            fail(f"{cls.__name__} in transformers {transformers.__version__} supports attention "
                 f"{', '.join(supported)}, not {attn}: use --hf-attn {supported[-1]}")
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        try:
            model = AutoModelForCausalLM.from_pretrained(
                req["model_dir"], config=config, attn_implementation=attn,
                dtype=torch.float32 if train else DTYPES[req["dtype"]],
            )
        except ValueError as e:  # transformers refuses an attention it does not implement
            fail(f"{cls.__name__} in transformers {transformers.__version__}: {str(e).splitlines()[0]}: "
                 f"use --hf-attn eager")
        model = model.to(self.device).eval()
        if train:
            self.setup_training(model, train, req["dtype"], req.get("compile"))
        sync(self.device)
        load_seconds = time.perf_counter() - t0
        self.model = model
        self.attn = attn
        self.head = model.get_output_embeddings()  # the LM head runs only on target rows
        # Training compiles the whole model (setup_training); inference as configure says.
        self.configure(attn, bool(req.get("compile")) and not train)
        max_positions = getattr(config, "n_positions", None) or DEFAULT_MAX_LENGTH
        info = versions()
        if train:
            info["optimizer"] = "torch.optim.AdamW (torch default: foreach on CUDA)"
            info["autocast"] = str(self.autocast_dtype).replace("torch.", "") if self.autocast_dtype else "none"
            if req.get("compile"):
                # HF Trainer's torch_compile=True: torch.compile(model), inductor, default mode.
                # It compiles forward and backward in the first train_step, a warm-up step.
                info["compiled"] = "torch.compile(model): training steps (eval runs eager)"
        if self.device.type == "cuda":
            info["gpu"] = torch.cuda.get_device_name(self.device)
        reply(ok=True, versions=info, attn=attn, max_positions=max_positions,
              n_parameters=model.num_parameters(), load_seconds=load_seconds)

    def no_cudnn_candidate(self, supported):
        """On CUDA, sdpa with torch's cuDNN attention off (NO_CUDNN) as a candidate of its own,
        uncompiled: torch 2.11 puts cuDNN attention first on sm90 and builds a graph on the host
        for each new (batch, key length), ~40 ms on an H100, so a generate call whose prompt
        length the warm-up did not meet pays it at every decode step; flash and
        memory-efficient attention have no per-shape cost. Compiled generation runs a static
        cache (one key length), so only the uncompiled path is offered without cuDNN."""
        cuda = self.device.type == "cuda" and torch.backends.cuda.cudnn_sdp_enabled()
        return [NO_CUDNN] if cuda and "sdpa" in supported else []

    def configure(self, attn, compiled):
        """Inference with attention `attn`, under torch.compile or not. Scoring: the body (the
        hidden states) compiled with dynamic shapes; generation: a static KV cache, with which
        generate() compiles its decoding forward itself (transformers' fastest generation path;
        it compiles again for each new batch shape). NO_CUDNN: sdpa, torch's cuDNN attention
        off while it runs (no_cudnn_candidate)."""
        if attn != self.attn:
            impl = "sdpa" if attn == NO_CUDNN else attn
            if impl != ("sdpa" if self.attn == NO_CUDNN else self.attn):
                self.model.set_attn_implementation(impl)
            self.attn = attn
        if self.device.type == "cuda":
            torch.backends.cuda.enable_cudnn_sdp(self.cudnn_sdp and attn != NO_CUDNN)
        self.compiled = compiled
        body = self.model.base_model
        self.body = torch.compile(body, dynamic=True) if compiled else body
        self.generate_kwargs = {"cache_implementation": "static"} if compiled else {}

    def choose(self, req):
        """--hf-attn best / --hf-compile best: times every candidate on the probe requests and
        keeps the one whose predicted cost of a timed batch is lowest (see the module's
        docstring for the prediction)."""
        attns = [a for a in (req.get("attns") or self.candidates) if a in self.candidates]
        candidates = [(a, c) for a in attns for c in req["compiles"] if not (a == NO_CUDNN and c)]
        if len(candidates) == 1:
            attn, comp = candidates[0]
            self.configure(attn, comp)
            name = f"{type(self.model).__name__} in transformers {transformers.__version__}"
            reply(ok=True, attn=attn, compile=comp, candidates=[],
                  note=f"{name}: {attn}{' compiled' if comp else ''} is the only candidate")
            return
        run = {"score": self.run_score, "generate": self.run_generate}
        probes, cold_share = req["probe"], float(req.get("cold_share", 0.0))
        results = []
        for attn, comp in candidates:
            result = {"attn": attn, "compile": comp}
            try:
                self.configure(attn, comp)
                c0 = compiles()
                cold = [run[p["op"]](p)["latency_ms"] for p in probes]
                c1 = compiles()
                warm = [median(run[p["op"]](p)["latency_ms"] for _ in range(WARM_REPEATS))
                        for p in probes]
                new_shape = cold[2:] or cold  # the first two pay one-time set-up
                result.update(
                    cold_ms=cold, warm_ms=warm, compiles_cold=c1 - c0, compiles_warm=compiles() - c1,
                    per_batch_ms=cold_share * sum(new_shape) / len(new_shape)
                    + (1 - cold_share) * sum(warm) / len(warm))
            except Exception as e:  # a candidate this host cannot run: say so, time the others
                result["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            # Compiled graphs stay cached (dynamo guards on the attention), so the winner does
            # not compile again: two compiled candidates stay under dynamo's recompile limit.
            results.append(result)
        timed = [r for r in results if "per_batch_ms" in r]
        if not timed:
            fail("no HF configuration ran the probe: " + "; ".join(r["error"] for r in results))
        best = min(timed, key=lambda r: r["per_batch_ms"])
        self.configure(best["attn"], best["compile"])
        if self.device.type == "cuda":  # the run's memory figures are its own, not the probe's
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        reply(ok=True, attn=best["attn"], compile=best["compile"], candidates=results,
              cold_share=cold_share)

    def score(self, req):
        reply(ok=True, **self.run_score(req))

    @torch.inference_mode()
    def run_score(self, req):
        inputs, targets = req["inputs"], req["targets"]
        b, t = len(inputs), max([req.get("padded_len", 0)] + [len(x) for x in inputs])
        c0 = compiles()
        sync(self.device)
        t0 = time.perf_counter()
        ids = torch.zeros((b, t), dtype=torch.long)
        mask = torch.zeros((b, t), dtype=torch.long)
        rows, flat_targets = [], []
        for i, (x, y) in enumerate(zip(inputs, targets)):
            n = len(x)
            ids[i, :n] = torch.tensor(x)
            mask[i, :n] = 1
            first = n + 1 - len(y)  # input[first - 1] predicts y[0]
            rows.extend(i * t + p for p in range(first - 1, n))
            flat_targets.extend(y)
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self.body(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, C)
        picked = hidden.reshape(b * t, -1)[torch.tensor(rows, device=self.device)]  # (N, C)
        logp = torch.log_softmax(self.head(picked).float(), dim=-1)  # (N, V)
        want = torch.tensor(flat_targets, device=self.device)
        token_ll = logp.gather(-1, want[:, None])[:, 0].tolist()
        argmax = logp.argmax(-1).tolist()
        sync(self.device)
        latency_ms = (time.perf_counter() - t0) * 1e3
        return dict(token_ll=token_ll, argmax=argmax, latency_ms=latency_ms, compiles=compiles() - c0)

    def generate(self, req):
        reply(ok=True, **self.run_generate(req))

    @torch.inference_mode()
    def run_generate(self, req):
        prompts, n_new, pad = req["prompts"], req["new_tokens"], req["pad_id"]
        b, t = len(prompts), max([req.get("padded_len", 0)] + [len(p) for p in prompts])
        c0 = compiles()
        sync(self.device)
        t0 = time.perf_counter()
        ids = torch.full((b, t), pad, dtype=torch.long)
        mask = torch.zeros((b, t), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding, as generate() expects
            ids[i, t - len(p):] = torch.tensor(p)
            mask[i, t - len(p):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        stamps = []
        device = self.device

        class Clock:  # generate() hands a streamer the prompt, then each new token
            def put(self, _value):
                sync(device)
                stamps.append(time.perf_counter())

            def end(self):
                pass

        out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                  max_new_tokens=n_new, min_new_tokens=n_new, pad_token_id=pad,
                                  streamer=Clock() if req.get("time_steps", True) else None,
                                  **self.generate_kwargs)
        new = out[:, t:].tolist()
        sync(self.device)
        latency_ms = (time.perf_counter() - t0) * 1e3
        token_ms = [(s - t0) * 1e3 for s in stamps[1:]]  # stamps[0]: the prompt
        return dict(ids=new, latency_ms=latency_ms, token_ms=token_ms, compiles=compiles() - c0)

    def setup_training(self, model, h, dtype, compile_):
        from transformers import get_linear_schedule_with_warmup

        torch.manual_seed(h["seed"])  # dropout masks
        if h.get("recompute"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        self.parallel = h.get("parallel")
        self.train_model = self.wrap(model) if self.parallel else model
        if compile_:
            self.train_model = torch.compile(self.train_model)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=h["learning_rate"], betas=(h["beta1"], h["beta2"]),
                                     eps=h["eps"], weight_decay=h["weight_decay"])  # foreach on CUDA, as Trainer
        self.phase_times = bool(h.get("phase_times", False))
        self.sched = get_linear_schedule_with_warmup(self.opt, h["lr_warmup_steps"], h["total_steps"])
        self.max_grad_norm = h["max_grad_norm"]
        self.autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype)
        self.scaler = torch.amp.GradScaler(self.device.type) if dtype == "fp16" else None

    def wrap(self, model):
        """The model under the strategy `self.parallel` names (see the module's docstring)."""
        strategy = self.parallel["strategy"]
        if strategy == "ddp":
            ids = [self.device.index] if self.device.type == "cuda" else None
            return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # The run's device type (a CPU run on a GPU host would default to CUDA's mesh).
        mesh = init_device_mesh(self.device.type, (self.parallel["size"],))
        reshard = strategy == "fsdp_full"
        for block in model.base_model.h:  # GPT-2 and BLOOM: transformer.h
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        return model

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def train_step(self, req):
        micro = req["micro_batches"]
        n = len(micro)
        sync(self.device)
        t0 = time.perf_counter()
        losses = []
        phases = {"forward": 0.0, "backward": 0.0, "update": 0.0}
        last = [t0]

        def lap(phase):  # --phase-times: synchronize and charge the time since the last lap
            if self.phase_times:
                sync(self.device)
                now = time.perf_counter()
                phases[phase] += (now - last[0]) * 1e3
                last[0] = now

        if self.parallel:  # this rank's share of the step's micro-batches
            n = n // self.parallel["size"]
            micro = micro[RANK * n:(RANK + 1) * n]
        for k, block_ids in enumerate(micro):
            ids = torch.tensor(block_ids, dtype=torch.long).to(self.device)
            # DDP: the gradients cross ranks once, after the step's last micro-batch.
            quiet = k + 1 < n and isinstance(self.train_model, torch.nn.parallel.DistributedDataParallel)
            with self.train_model.no_sync() if quiet else contextlib.nullcontext():
                with self.autocast():
                    loss = self.train_model(input_ids=ids, labels=ids).loss
                lap("forward")
                scaled = loss / n
                if self.scaler is not None:
                    scaled = self.scaler.scale(scaled)
                scaled.backward()
            lap("backward")
            losses.append(loss.detach())
        if self.scaler is not None:
            self.scaler.unscale_(self.opt)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        lr = self.sched.get_last_lr()[0]
        skipped = False
        if self.scaler is not None:
            before = self.scaler.get_scale()
            self.scaler.step(self.opt)
            self.scaler.update()
            skipped = self.scaler.get_scale() < before  # inf/NaN gradients: step skipped
        else:
            self.opt.step()
        if not skipped:
            self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        loss = torch.stack(losses).float().mean()
        if self.parallel:
            torch.distributed.all_reduce(loss)  # gloo has no AVG: the sum, then the mean
            loss = loss / self.parallel["size"]
            if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
                grad_norm = grad_norm.full_tensor()
        loss = loss.item()
        grad_norm = grad_norm.item()
        lap("update")
        sync(self.device)
        latency_ms = (time.perf_counter() - t0) * 1e3
        reply(ok=True, loss=loss, grad_norm=grad_norm, learning_rate=lr, latency_ms=latency_ms,
              skipped=skipped, loss_scale=self.scaler.get_scale() if self.scaler is not None else None,
              phases_ms=phases if self.phase_times else None)

    def eval(self, req):
        blocks, bs = req["blocks"], max(1, req["batch_size"])
        batches = [torch.tensor(blocks[i:i + bs], dtype=torch.long).to(self.device)
                   for i in range(0, len(blocks), bs)]
        self.model.eval()
        total, count = 0.0, 0
        sync(self.device)
        t0 = time.perf_counter()
        with torch.no_grad():
            for ids in batches:
                with self.autocast():
                    loss = self.model(input_ids=ids, labels=ids).loss
                total += loss.float().item() * ids.shape[0]
                count += ids.shape[0]
        sync(self.device)
        runtime_ms = (time.perf_counter() - t0) * 1e3
        self.model.train()
        reply(ok=True, eval_loss=total / max(count, 1), runtime_ms=runtime_ms)

    def finish(self, _req):
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
            per_rank = None
            if DISTRIBUTED:
                per_rank = [None] * torch.distributed.get_world_size()
                torch.distributed.all_gather_object(per_rank, peak)
                peak = max(per_rank)
            reply(ok=True, peak_memory_bytes=peak, per_rank_peak_memory_bytes=per_rank,
                  device_memory_used_bytes=total - free,
                  reserved_memory_bytes=torch.cuda.max_memory_reserved(self.device))
            if DISTRIBUTED:
                torch.distributed.destroy_process_group()
        else:
            import resource
            reply(ok=True, peak_memory_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  device_memory_used_bytes=None)


# TB_CUDA_PROFILE=N: the N-th score / train_step call (from 0, warm-up included) runs between
# cudaProfilerStart and Stop, for `ncu --profile-from-start off`; as src/profile.rs does.
PROFILE_AT = int(os.environ["TB_CUDA_PROFILE"]) if os.environ.get("TB_CUDA_PROFILE", "").strip() else None


def requests():
    """The Rust side's requests: read by rank 0, broadcast to the other ranks under torchrun."""
    if not DISTRIBUTED:
        for line in sys.stdin:
            if line.strip():
                yield json.loads(line)
        return
    # The run's device (set by bench): a CPU run on a GPU host trains over gloo.
    cuda = os.environ.get("TB_WORKER_DEVICE", "cuda") == "cuda" and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group("nccl" if cuda else "gloo")
    lines = sys.stdin if RANK == 0 else None
    while True:
        box = [None]
        if RANK == 0:
            line = next(lines, "")
            while line and not line.strip():
                line = next(lines, "")
            box[0] = json.loads(line) if line else {"op": "finish"}
        torch.distributed.broadcast_object_list(box, src=0)
        yield box[0]
        if box[0].get("op") == "finish":
            return


def main():
    worker = Worker()
    calls = 0
    for req in requests():
        op = req.get("op")
        if op == "finish":
            worker.finish(req)
            return
        timed_ops = ("score", "train_step", "generate")
        profiled = op in timed_ops and calls == PROFILE_AT and worker.device.type == "cuda"
        if op in timed_ops:
            calls += 1
        if profiled:
            sync(worker.device)
            torch.cuda.cudart().cudaProfilerStart()
        getattr(worker, op)(req)
        if profiled:
            sync(worker.device)
            torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - report any failure as one line, then die
        import traceback

        traceback.print_exc(file=sys.stderr)
        fail(f"{type(e).__name__}: {e}".splitlines()[0])
