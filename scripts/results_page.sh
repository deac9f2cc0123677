#!/usr/bin/env bash
# results/README.md, the page of current figures, from one CSV per host kind in
# results/current/, with extract-metrics (--markdown, chosen columns) and plot only.
#   bash scripts/results_page.sh                  the page and its charts from the committed CSVs
#   bash scripts/results_page.sh --csvs           first the CSVs again from the logs (calls below)
#   bash scripts/results_page.sh --no-charts -o FILE   the Markdown only (tests/results_page.rs)
# EXTRACT_METRICS and PLOT name the binaries (default: the release build, made if needed).
# The page is generated: change this script (its text, its list of calls), never the page.
set -euo pipefail
cd "$(dirname "$0")/.."
R=results
C=$R/current
PAGE=$R/README.md
CSVS=0
CHARTS=1
while [ $# -gt 0 ]; do
  case $1 in
    --csvs) CSVS=1 ;;
    --no-charts) CHARTS=0 ;;
    -o) PAGE=$2; shift ;;
    *) echo "usage: bash scripts/results_page.sh [--csvs] [--no-charts] [-o FILE]" >&2; exit 2 ;;
  esac
  shift
done
if [ -z "${EXTRACT_METRICS:-}" ] || [ -z "${PLOT:-}" ]; then
  cargo build --release --quiet --bin extract-metrics --bin plot
fi
X=${EXTRACT_METRICS:-${CARGO_TARGET_DIR:-target}/release/extract-metrics}
P=${PLOT:-${CARGO_TARGET_DIR:-target}/release/plot}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

# quiet CMD…: CMD's notes on stderr shown only when it fails.
quiet() {
  "$@" 2> "$T/err" || { cat "$T/err" >&2; exit 1; }
}

# ---------------------------------------------------------------------------------------------
# The CSVs: for each host kind, the newest call of each configuration, and the older calls
# whose spread README.md quotes. part NAME ARGS…: one call's runs (ARGS: -i and --where) into a
# CSV of its own; host HOST: every part so far into results/current/HOST.csv.
part() {
  local name=$1
  shift
  quiet "$X" "$@" -o "$T/parts/$name.csv"
}
host() {
  "$X" -i "$T"/parts/*.csv -o "$C/$1.csv"
  rm -f "$T"/parts/*.csv
}

csvs() {
  mkdir -p "$T/parts" "$C"
  local M=$R/h100 H=$R/h100x2 G=$R/h200x2
  # One H100 (#40): the probe's re-measure; run2's scoring met the partial last batch in the
  # timed loop (run3 warms it up), so run2 gives FT mode and decoding only.
  part a1 -i $M/remeasure-run1/hf-probe-logs.tgz
  part a2 -i $M/remeasure-run2/remeasure-logs.tgz --where mode=generate
  # LAMBADA scoring on 3f3d74e (#37: the fused prefill attention, the passages packed) against
  # HF's best, the same script as remeasure-run3 (whose 9d8602b figures HISTORY.md keeps): gpt2
  # and bloom-560m in one call (prefill-run2, where bloom-7b1 ran out of the call's time), then
  # bloom-7b1 alone on the same machine (prefill-run3, /tmp cleared first).
  part a3 -i $M/prefill-run2/remeasure-logs.tgz
  part a4 -i $M/prefill-run3/remeasure-logs.tgz
  # Decoding on earlier binaries, against compiled HF, BLOOM's only attention (README's
  # ranges): bloom-560m on d5e65b8 (the call's c0ee17b runs were its "before"), bloom-7b1.
  part b1 -i $M/gen-final-run1/gen-logs.tgz --where model=bloom-560m --where git_commit=d5e65b89a468
  part b2 -i $M/gen-7b1-hf-run1/gen-logs.tgz
  # WikiText-2 fine-tuning: the calls on binaries before c28dda5 (train-run8..10, remeasure-run5's
  # training, dropout-run3 and train-table-run1..2) are no longer read: the three engines on
  # c28dda5 (c8, c9) measured every configuration they had again; HISTORY.md keeps those calls.
  # 0c8e9fe (#40, the remaining re-measure), two calls on one machine, one after the other:
  # FT mode padded to 64 (compiled HF candidates on buckets) and bloom-7b1's FT mode (run4),
  # then FT mode at pad 1 (run5). run5's archive holds run4's logs too (the same /tmp on the
  # same machine), so its ratios are against HF's fastest at either padding; run4's own archive
  # is not read again.
  part a5 -i $M/remeasure-run5/remeasure-logs.tgz
  # 9d8602b (#36, after ab-run5's faster step): the three engines at gpt2 batch 16, 8, 32, 30
  # timed steps, one call (one archive: the same /tmp): the binary before c28dda5, README quotes
  # its batch 8 (its batch 16 and 32 left out: c8 measured them again).
  part c7 -i $M/train-table-run3/train-compare-logs.tgz --where batch_size=8
  # c28dda5 (#36, the attention on mma.sync): the three engines at gpt2 batch 8, with dropout
  # 0.1 (candle and HF: llm.c has none), batch 16 and 32, gpt2-medium and gpt2-large batch 8,
  # 30 timed steps, one call; then gpt2-medium batch 16 and 32 and gpt2-large batch 16, 20
  # timed steps, the next call on another machine.
  part c8 -i $M/train-table-run4/train-compare-logs.tgz
  part c9 -i $M/train-table-run5/train-compare-logs.tgz
  # 945be75 (its training code the submitted head's: the optimizer's 16-byte accesses):
  # gpt2-medium and gpt2-large batch 8, the three engines, 20 timed steps (ab-run6; its decode
  # A/B of the reverted cluster merge is docs/perf-notes.md's, not rows here).
  # The archive holds cluster-run1's candle-alone pair too (the same /tmp): left out.
  part c10 -i $M/ab-run6/train-compare-logs.tgz \
    --where run!=wikitext2_gpt2-medium_candle_bf16_bs8_cuda0_20261126T154412Z \
    --where run!=wikitext2_gpt2-medium_candle_bf16_bs8_cuda0_20261126T154416Z
  # 65d20b7 (#36: the LayerNorm backward in one pass, the MLP's bias gradient inside its GELU
  # backward): gpt2-medium and gpt2-large batch 8, the three engines, 20 timed steps, on GPU 0
  # of a 2× H100 host (gate-run11); 9d78426's candle-alone runs there (the A/B's before) and
  # train-ab1's are docs/perf-notes.md's, not rows here.
  part c11 -i $H/gate-run11/train-compare-logs.tgz --where git_commit=65d20b7ed291
  # 3601ade (#36: AdamW writes the next step's bf16 copies, the LayerNorm backward adds the
  # residual and sums it for the projections' bias gradients): the three engines on GPU 0 of
  # a 2× H100 host (gate-run15), its sweep_* runs; the candle-alone A/B against 7572d2b in the
  # same archive is docs/perf-notes.md's, not rows here.
  part c12 -i $H/gate-run15/train-compare-logs.tgz --where git_commit=3601aded8d2f \
    --where run!=wikitext2_gpt2-medium_candle_bf16_bs8_cuda0_20261126T194014Z \
    --where run!=wikitext2_gpt2-medium_candle_bf16_bs8_cuda0_20261126T194054Z \
    --where run!=wikitext2_gpt2-large_candle_bf16_bs8_cuda0_20261126T194034Z \
    --where run!=wikitext2_gpt2-large_candle_bf16_bs8_cuda0_20261126T194108Z
  # 1684c2f (#36: dq inside the attention's dk/dv kernel, the loss and its gradient in one
  # pass over the logits, the head's gradient cast once): the three engines at gpt2,
  # gpt2-medium and gpt2-large batch 8 on GPU 0 of a 2× H100 host (gate-run16); the
  # candle-alone A/Bs (its ab-logs.tgz, flashdq-run1's and -run2's) are docs/perf-notes.md's.
  part c13 -i $H/gate-run16/table-logs.tgz
  # fp8 weights (#37 item 3) against bf16 in the same call, the generation suite: batch 1 and
  # 16 on eed7753 (the first GEMV), batch 1 on a8ad4c6 (four columns a block) and f709a2b
  # (weights streamed). Their LAMBADA runs (the self-trained gpt2's checkpoint) are
  # docs/perf-notes.md's accuracy table, not rows here.
  part h1 -i $M/fp8-run1/fp8-logs.tgz --where suite=generation
  part h2 -i $M/fp8-run2/fp8-logs.tgz --where suite=generation
  part h3 -i $M/fp8-run3/fp8-logs.tgz --where suite=generation
  # d2dc14c (#37: the one-row fp8 GEMV with eight warps where K >= 4096), fp8 alone, batch 1,
  # on GPU 0 of a 2x H100 host (gate-run21, its binary reporting -dirty: results/ was out of
  # git's index at the build), alternating with the binary before (045ded2-dirty: fp8-sweep1's,
  # its sweep variable unset, so 8dd84f1's kernels).
  part h4 -i $H/gate-run21/ab-logs.tgz
  # The decode kernels of #37's fifteenth session, candle alone, on one GPU of 2x H100 hosts:
  # attn1 alternates bddef16 (8dae5c8's kernels: an experiment binary, its variables unset)
  # with 51667c7 (the decode attention's loads in one round, one block a head at 128 (row,
  # head) pairs or more), batch 1 (GPU 1) and 16 (GPU 0); gate-run23 alternates 51667c7 with
  # 4f61c08 (the one-row GEMV a column a block), batch 1, GPU 1; gate-run24 alternates 51667c7
  # with a7663d0 (the split kernel back at fewer than 128 pairs), batch 1 and 16, GPU 1 and 0.
  part h5 -i $H/attn1/logs.tgz
  part h6 -i $H/gate-run23/ab-logs.tgz
  part h7 -i $H/gate-run24/ab-logs.tgz
  # The sixteenth session's projections at 5-16 rows on tensor cores (skinny-proj): gate-run25
  # alternates a7663d0 with 74a3901, batch 16 bf16 / fp8 (GPU 1), batch 1 and 8 bf16 and gpt2
  # batch 16 fp8 (GPU 0); gate-run26 a7663d0 with db3de2a (74a3901's code), batch 16 (GPU 1).
  # The experiment binaries' sweeps (skinny-run3..5) are docs/perf-notes.md's, not rows here.
  part h8 -i $H/gate-run25/ab-logs.tgz
  part h9 -i $H/gate-run26/ab-logs.tgz
  # The eighteenth session's programmatic edges into the decode kernels at 1-4 rows (pdl):
  # gate-run31 alternates 88bfdd2 with every path (rows here) and with every path but pdl (the
  # same binary: docs/perf-notes.md's, not rows here), batch 1 and 16 bf16 (GPU 1), bloom-7b1
  # fp8 batch 1 (GPU 0).
  local pdl=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding
  pdl=$pdl,heads,flash,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum
  part h10 -i $H/gate-run31/ab-logs.tgz --where "fused=$pdl,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl"
  # The nineteenth session's db67dba (gemv-head, trigger-first, early-weights on the fp8 GEMVs)
  # on one H100 (ew-run4), alternating with every path but those three (the same binary:
  # docs/perf-notes.md's, not rows here), batch 1. Its 2x H200 calls (ew-run1..3, gate-run37)
  # are docs/perf-notes.md's too.
  local ew=$pdl,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl,early-weights,gemv-head
  part h11 -i $M/ew-run4/ab-logs.tgz --where "fused=$ew,trigger-first"
  # The twentieth session's norm-fold (the LayerNorms folded into the GEMVs) on GPU 1 of a 2x
  # H100 host (gate-run39, 0448f94, alternating with every path but norm-fold: docs/perf-notes.md's,
  # not rows here): gpt2 and bloom-560m at batch 1, whose kernels the submitted 752452d runs
  # there; its bloom-7b1 and batch-4 runs folded where 752452d does not, left out.
  part h12 -i $H/gate-run39/ab-logs.tgz --where "fused=$ew,trigger-first,norm-fold" \
    --where batch_size=1 --where model!=bloom-7b1
  # The twenty-first session's split attention with its loads first, its merge in a cluster
  # and the step's own first and last kernels (cluster, step-io) on one H100 (gate-run45,
  # d2e568a, every path: its runs of f0e828e's binary, of 1477d8f's and of the same binary
  # without the paths are docs/perf-notes.md's, not rows here), batch 1, whose kernels the
  # submitted HEAD runs there.
  part h13 -i $M/gate-run45/ab-logs.tgz --where "fused=$ew,trigger-first,norm-fold,cluster,step-io" \
    --where git_commit=d2e568ae96e3
  # The twenty-second session's norm-stats (bloom-7b1's norms folded, their statistics summed
  # by the GEMV before each norm) on GPU 1 of a 2x H100 host (gate-run51, 0eca40a, the
  # submitted code, built with results/ out of git's index for the device copy: "-dirty"; every
  # path: its runs without norm-stats are docs/perf-notes.md's, not rows here), batch 1.
  part h14 -i $H/gate-run51/ab-logs.tgz \
    --where "fused=$ew,trigger-first,norm-fold,cluster,step-io,norm-stats" \
    --where git_commit=0eca40a197fd-dirty
  # Its bloom-7b1 on fe347df (the fold 1024 rows at a time: the peak memory of the unfolded
  # model), one H100 (gate-run53), every path.
  part h15 -i $M/gate-run53/ab-logs.tgz \
    --where "fused=$ew,trigger-first,norm-fold,cluster,step-io,norm-stats" \
    --where git_commit=fe347dfbbe5c-dirty
  # 5eec037 (the submitted code but for one test's fix, gate-run55), GPU 1 of a 2x H100 host
  # (gate-run54), every path: bloom-7b1, and gpt2-xl and bloom-1b7, whose rows over 2 KB fold
  # only with norm-stats, batch 1.
  part h16 -i $H/gate-run54/ab-logs.tgz \
    --where "fused=$ew,trigger-first,norm-fold,cluster,step-io,norm-stats" \
    --where git_commit=5eec037b4fe5
  # The twenty-third session's skinny-fold (the norms folded into the tensor-core projections
  # at 5-16 rows) on one H100 (gate-run57, a77804a, whose kernels and model code the submitted
  # 0686493 runs: that commit fixed a test's count; every path: its runs without skinny-fold
  # are docs/perf-notes.md's, not rows here), gpt2 and bloom-560m at batch 16, 8 and 1.
  part h17 -i $M/gate-run57/ab-logs.tgz \
    --where "fused=$ew,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold"
  # The submitted 79b448f (skinny-fold after its review) on GPU 1 of a 2x H100 host
  # (gate-run60), every path: gpt2 and bloom-560m at batch 16 and 1.
  part h18 -i $H/gate-run60/ab-logs.tgz \
    --where "fused=$ew,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold"
  # The submitted bbbbd3f (the batch-16 attention's loads unpacked where used) on GPU 1 of a 2x
  # H100 host (gate-run62), every path: its runs of 79b448f are h18's binary, not rows here.
  part h19 -i $H/gate-run62/ab-logs.tgz --where git_commit=bbbbd3f85247
  # The twenty-fourth session's four-tile blocks from 2304 columns (gpt2's qkv and MLP, BLOOM's
  # qkv): the submitted 7ded869 on one H100 (h100-run68; "-dirty": built with results/ out of
  # git's index for the device copy), every path: its runs of 062270e, the code before, are
  # docs/perf-notes.md's, not rows here. On 2x H200: h200's part e3.
  part h20 -i $M/h100-run68/ab-logs.tgz --where git_commit=7ded869aac7a-dirty
  # The twenty-fifth session's x in 16-byte loads, rounds of four at one tile, two tiles from
  # 2304 columns and the head at 2-16 rows at four: the submitted 53d485d on GPU 1 of a 2x H100
  # host (gate-run75), every path, gpt2, bloom-560m and gpt2-medium at batch 16, gpt2 and
  # bloom-560m at batch 1: its runs of f19b77f (7ded869's kernels) are docs/perf-notes.md's.
  part h21 -i $H/gate-run75/ab-logs.tgz --where git_commit=53d485d681eb
  # 53d485d on the larger models at batch 16 (wide-run76, one H100): gpt2-large, gpt2-xl,
  # bloom-1b7; its f19b77f runs are docs/perf-notes.md's.
  part h22 -i $M/wide-run76/ab-logs.tgz --where git_commit=53d485d681eb
  # The twenty-sixth session's LM head at one row through the tensor-core head kernel for rows
  # of at most 2 KB (bloom-560m's): the submitted a927426 on one H100 (ab-run81), batch 1; its
  # runs of 62ebce1 (the kernels before at one row) are docs/perf-notes.md's. Its gates
  # (2x H200, gate-run80) and the experiments (l2-run77, head-run78) are docs/perf-notes.md's.
  part h23 -i $M/ab-run81/ab-logs.tgz --where git_commit=a9274263b7ac
  # The serving suite (#39) on 6ac4535 (HF's worker without cuDNN attention): serving-run4's
  # archive holds serving-run3's logs too (the same /tmp on the same machine); of HF's two
  # bloom-560m static sweeps the first, cut at its fifth rate by the call's time, is left out.
  local cut=serving_bloom-560m_hf_bf16_bs8_cuda0_20261126T12
  part s1 -i $M/serving-run4/serving-logs.tgz --where "run!=${cut}1110Z" --where "run!=${cut}1147Z" \
    --where "run!=${cut}1222Z" --where "run!=${cut}1256Z" --where "run!=${cut}1333Z"
  # bloom-7b1's sweeps, the next call (another machine).
  part s2 -i $M/serving-run5/serving-logs.tgz
  # bd3958f (the HF probe with its sdpa-nocudnn candidate): gpt2 FT mode at pad 64 on GPU 0
  # of a 2× H100 host (HF chose sdpa with cuDNN attention off); the next call, on a one-GPU
  # machine where HF's compiled runs were 1.4-1.9x slower than on the earlier machines (scoring
  # 7.50 ms a batch against 4.05, the probe too; candle the same): gpt2 decoding at batch 16
  # and 1, FT mode at pad 1 and scoring, on the page, not in README's ranges.
  part a6 -i $M/remeasure-run6/remeasure-logs.tgz
  part a7 -i $M/remeasure-run7/remeasure-logs.tgz
  # 07544ed (#37: generation's prefill packed): FT mode at pad 1 against HF's best, one H100
  # (ft-run1: two calls on one machine, whose HF ran 11-50 % slower than the earlier calls'
  # hosts'); bloom-7b1's pair on GPU 1 of a 2x H100 host too (gate-run28; its gpt2 pair, whose
  # HF ran 1.28x slower than ft-run1's and 1.89x slower than remeasure-run5's, left out).
  part a8 -i $M/ft-run1/ft-logs.tgz
  part a9 -i $H/gate-run28/remeasure-logs.tgz --where model=bloom-7b1
  host h100
  # 2× H100 (#34, #40): tp on 76b0da8 (multi-run1's own logs, not its smoke stage's tiny
  # models), dp on 7c35eef without the withdrawn bf16 gradient sum, the strategies, and HF's
  # probe on gpt2 decoding (one GPU of the host).
  part d1 -i "$H/multi-run1/*.jsonl.gz"
  part d2 -i "$H/multi-run3/dp?-dropout-off__*.jsonl.gz" "$H/multi-run3/dp?-dropout-on__*.jsonl.gz"
  part d3 -i $H/multi-run2/strategies-gpt2-xl-candle $H/multi-run3/strategies-gpt2-xl-hf-dp \
    $H/multi-run3/strategies-gpt2-xl-hf-zero3-rc $H/multi-run4/strategies-gpt2-candle \
    --where suite=shakespeare
  part d4 -i $H/hf-probe-run1 $H/hf-probe-run2
  # 6ac4535 (#34): bloom-7b1 decoding at tp 1 / 2 and gpt2 dp 1 / 2 / 2 --dp-overlap with
  # --drop-last (full 8 x 1024 steps), two rounds each, after the gate (gate-run3).
  part d5 -i $H/multi-run6/multi-logs.tgz
  # 7ca64fe (#34): tp decoding with the row-parallel GEMV pushing its output (push-sum), after
  # the gate (gate-run4); its runs without push-sum left out (docs/perf-notes.md has them).
  local nopush=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding
  nopush=$nopush,heads,flash,residual,gemv,skinny,oneshot,split-head,sum-norm
  part d6 -i $H/multi-run7/multi-logs.tgz --where "fused!=$nopush"
  # bd3958f (#34, #39): every tp and dp figure of #34 in one call after the gate (gate-run5):
  # the card's command, bloom-7b1 scoring, generation and decoding at tp 1 / 2, gpt2 dp 1 / 2
  # / 2 --dp-overlap; then the serving suite over --tp 2 against one GPU (bloom-7b1).
  part d7 -i $H/multi-run8/multi-logs.tgz
  part d8 -i $H/serving-run1/serving-logs.tgz
  # bd3958f: gpt2-xl dp against zero3 + recompute, the batch doubled to out of memory (two calls
  # on one machine, one archive).
  part d9 -i $H/multi-run9/multi-logs.tgz --where suite=shakespeare
  # c28dda5 (#34, #36: the faster training step): gpt2 dp 1 / 2 / 2 --dp-overlap after the
  # two-GPU smoke stage (gate-run7, whose own archive is not read), then gpt2-xl dp against zero3 + recompute (multi-run10, the
  # next call on the same machine: its archive holds both calls' logs, the same /tmp).
  part d10 -i $H/multi-run10/multi-logs.tgz
  # ef1c9c9 (#34): gpt2-xl dp against ZeRO-3 + --recompute mlp, two rounds, every timed step a
  # full batch (--drop-last, 382a0f6); gate-run9's same runs with the epoch's tail kept are in
  # its own archive, not read here (docs/perf-notes.md has them).
  part d11 -i $H/multi-run11/multi-logs.tgz
  # 9d78426: the same target in one call after the gate (gate-run10): dp 16 and 32, ZeRO-3 +
  # mlp 64 and 128.
  part d12 -i $H/gate-run10/multi-logs.tgz
  host h100x2
  # One H200: decoding against compiled HF, BLOOM only (gpt2's compiled sdpa was not tried).
  part e1 -i $R/h200/gen-final-run1/gen-logs.tgz --where model=bloom-560m
  part e2 -i $R/h200/gen-final-run1/gen-logs.tgz --where model=bloom-7b1
  # The submitted 7ded869 (four-tile blocks from 2304 columns) on GPU 1 of a 2x H200 host
  # (gate-run67; "-dirty": built with results/ out of git's index for the device copy), every
  # path: its runs of 062270e, the code before, are docs/perf-notes.md's, not rows here.
  part e3 -i $G/gate-run67/ab-logs.tgz --where git_commit=7ded869aac7a-dirty
  # The submitted 0bab297 (#37, `gemv-wide`) on GPU 1 of a 2x H200 host (gate-run104), every
  # path; its runs without gemv-wide in the same call are docs/perf-notes.md's.
  local every=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding,heads,flash,residual,gemv,skinny,skinny-proj,oneshot,split-head,sum-norm,copy-sum,prefill,push-sum,adamw-copies,ln-residual,flash-dq,pdl,early-weights,gemv-head,trigger-first,norm-fold,cluster,step-io,norm-stats,skinny-fold,gemv-wide
  part e4 -i $G/gate-run104/ab-logs.tgz --where "fused=$every"
  # The submitted 9f5d47c (#37, `gemv-wide` triggering first, the folded GEMVs wide too) on GPU 1
  # of a 2x H200 host (gate-run110), every path; its traced run (CUPTI) left out, its runs
  # without gemv-wide in the same call are docs/perf-notes.md's.
  part e5 -i $G/gate-run110/ab-logs.tgz --where "fused=$every" \
    --where run!=generation_bloom-560m_candle_bf16_bs1_cuda0_20261128T141625Z
  # The submitted b4df0b9 (#37, gemv-wide's row kernel two warps a column) on GPU 1 of a 2x H200
  # host (gate-run112), every path; its traced run left out, its runs of 9f5d47c and without
  # gemv-wide in the same call are docs/perf-notes.md's.
  part e6 -i $G/gate-run112/ab-logs.tgz --where "fused=$every" --where git_commit=b4df0b918bd7 \
    --where run!=generation_bloom-560m_candle_bf16_bs1_cuda0_20261128T153759Z
  # The submitted 5216d27 (#37, `cache-first`) on GPU 1 of a 2x H200 host (gate-run113), every
  # path; its traced run left out, its runs without cache-first and of b4df0b9 in the same call
  # are docs/perf-notes.md's.
  part e7 -i $G/gate-run113/ab-logs.tgz --where "fused=$every,cache-first" \
    --where run!=generation_bloom-560m_candle_bf16_bs1_cuda0_20261128T155618Z
  # The submitted d051d7c (#37, the greedy pick's loads in one round) on GPU 1 of a 2x H200 host
  # (gate-run121), every path; its traced run left out, its runs of e80deb3 (the code before) in
  # the same call are docs/perf-notes.md's.
  part e8 -i $G/gate-run121/ab-logs.tgz --where "fused=$every,cache-first" --where git_commit=d051d7c75435 \
    --where run!=generation_bloom-560m_candle_bf16_bs1_cuda0_20261128T190238Z
  host h200
  # 2× H200 (#34, #35): d15a80a (README's figures; its runs with levers switched off are left
  # out) and 2bb4aec, the newest, after the restructure.
  local all=lt,softmax,bias-act,adamw,layer-norm,dropout,cross-entropy,decode,graph,embedding
  all=$all,heads,flash,residual,gemv,skinny,oneshot,split-head
  part f1 -i $G/multi-run3/multi-logs.tgz --where "fused=$all"
  part f2 -i $G/multi-run4/multi-logs.tgz
  # 9e274c6: tp decoding with the sum fused with the add and the norm (the runs without it
  # left out); 765a243: dp 1 and 2, 50 steps (its --dp-overlap variants left out: no column
  # tells them apart; docs/perf-notes.md has them).
  part f3 -i $G/multi-run5/multi-logs.tgz --where "fused=$all,sum-norm"
  part f4 -i $G/multi-run6/multi-logs.tgz \
    --where run!=wikitext2_gpt2_candle_bf16_bs8_cuda0_20261126T025705Z \
    --where run!=wikitext2_gpt2_candle_bf16_bs8_cuda0_20261126T025709Z \
    --where run!=wikitext2_gpt2_candle_bf16_bs8_cuda0_20261126T025722Z \
    --where run!=wikitext2_gpt2_candle_bf16_bs8_cuda0_20261126T025727Z
  # 442b7ff (#34, #36: the fused dropout): dp 1 / 2 / 2 with --dp-overlap, dropout off and
  # on, six rounds over three calls on one machine (multi-run10..12); run12's archive holds the
  # three calls' logs (the same /tmp), so it is read alone.
  part f5 -i $G/multi-run12/multi-logs.tgz
  host h200x2
  # 4× H200: tp 1/2/4 scoring on 61743bf, dp 1/2/4 fine-tuning on 7f8523b (200 steps; its
  # fp32 runs are the 10-step equivalence check's, not timings).
  part g1 -i $R/h200x4/tp-run2
  part g2 -i $R/h200x4/dp-200 --where dtype=bf16
  host h200x4
}

# ---------------------------------------------------------------------------------------------
# The page. say TEXT…: lines of the page; table HOST ARGS…: a Markdown table of HOST's CSV;
# chart NAME ALT PLOT-ARGS…: a chart into results/current/NAME.png and its link.
say() { printf '%s\n' "$@" >> "$T/page.md"; }
table() {
  local host=$1
  shift
  quiet "$X" -i "$C/$host.csv" "$@" --markdown >> "$T/page.md"
  say ""
}
chart() {
  local name=$1 alt=$2
  shift 2
  if [ $CHARTS = 1 ]; then quiet "$P" "$@" -o "$C/$name.png"; fi
  say "![$alt](current/$name.png)" ""
}

ONE="model,engine,attn,attn_requested=asked,dtype,batch_size=batch"
SCORE="$ONE,pad_multiple=pad,n_samples=passages,gpu=GPU,samples_per_second:.1=samples/s,latency_ms_p50:.2=p50 ms"
SCORE="$SCORE,latency_ms_p99:.2=p99 ms,peak_memory_bytes:GiB.2=peak GiB,ratio_vs_hf_best:.2=× HF best"
SCORE="$SCORE,git_commit=commit"
GEN="$ONE,gpu=GPU,decode_tokens_per_second:.1=decode tokens/s,itl_ms_p50:.3=ITL p50 ms"
GEN="$GEN,itl_ms_p99:.3=ITL p99 ms,ttft_ms_p50:.2=TTFT p50 ms,peak_memory_bytes:GiB.2=peak GiB"
GEN="$GEN,ratio_vs_hf_best:.2=× HF best,git_commit=commit"
FP8="model,engine,dtype,batch_size=batch,gpu=GPU,decode_tokens_per_second:.1=decode tokens/s"
FP8="$FP8,itl_ms_p50:.3=ITL p50 ms,itl_ms_p99:.3=ITL p99 ms,peak_memory_bytes:GiB.2=peak GiB,git_commit=commit"
TRAIN="model,engine,attn,dtype,batch_size=batch,dropout,gpu=GPU"
TRAIN="$TRAIN,train_samples_per_second:.1=train samples/s,step_latency_ms_p50:.1=step p50 ms"
TRAIN="$TRAIN,step_latency_ms_p90:.1=step p90 ms,peak_memory_bytes:GiB.2=peak GiB"
TRAIN="$TRAIN,ratio_vs_hf_best:.2=× HF best,git_commit=commit"
TP="model,suite,mode,dtype,batch_size=batch,n_samples=samples,tp,gpu=GPU"
TP="$TP,samples_per_second:.1=samples/s,decode_tokens_per_second:.1=decode tokens/s"
TP="$TP,latency_ms_p50:.2=p50 ms,itl_ms_p50:.3=ITL p50 ms,peak_memory_bytes:GiB.2=rank 0 peak GiB"
TP="$TP,ratio_vs_1gpu:.2=× 1 GPU,scaling_efficiency:.3=efficiency,git_commit=commit"
# 4× H200's tp runs are scoring only (their logs have no generation columns).
TP_SCORE="model,dtype,batch_size=batch,n_samples=passages,tp,gpu=GPU,samples_per_second:.1=samples/s"
TP_SCORE="$TP_SCORE,latency_ms_p50:.2=p50 ms,peak_memory_bytes:GiB.2=rank 0 peak GiB"
TP_SCORE="$TP_SCORE,ratio_vs_1gpu:.2=× 1 GPU,scaling_efficiency:.3=efficiency,git_commit=commit"
SERVE="model,engine,batching_mode=batching,request_rate=offered req/s,requests_per_second:.2=req/s"
SERVE="$SERVE,ttft_ms_p99:.1=TTFT p99 ms,tpot_ms_p99:.2=TPOT p99 ms,goodput_requests_per_second:.2=goodput req/s"
SERVE="$SERVE,git_commit=commit"
SERVE_TP="${SERVE/engine,/engine,tp,}"
DP="model,dtype,batch_size=batch a rank,dp,zero=ZeRO,dp_overlap=overlap,dropout,gpu=GPU"
DP="$DP,train_samples_per_second:.1=train samples/s,tokens_per_second:.0=tokens/s"
DP="$DP,peak_memory_bytes:GiB.2=peak GiB,ratio_vs_1gpu:.2=× 1 GPU,scaling_efficiency:.3=efficiency"
DP="$DP,git_commit=commit"
STRAT="model,engine,strategy,recompute,batch_size=batch a rank,dp"
STRAT="$STRAT,train_samples_per_second:.1=train samples/s,tokens_per_second:.0=tokens/s"
STRAT="$STRAT,peak_memory_bytes:GiB.2=peak GiB,status,git_commit=commit"
# One GPU against HF: the runs with an HF ratio; several GPUs against one (on 2× H100, whose
# CSV holds HF's probe too: the runs without an HF ratio).
VS_HF=(--where "ratio_vs_hf_best!=" --sort model,batch_size,time_utc)
PAR=(--where suite!=wikitext2 --where suite!=shakespeare --where suite!=serving)
BY_MODE=(--sort suite,mode,model,batch_size,git_commit,tp,time_utc)
DPS=(--where suite=wikitext2 --sort model,dtype,git_commit,dropout,dp,zero,dp_overlap,time_utc)

intro() {
  say "# Measured results: the current figures" "" \
    "<!-- Generated by \`bash scripts/results_page.sh\`: change the script, not this page. -->" "" \
    "This page is made by \`bash scripts/results_page.sh\` from one CSV per host kind in" \
    "[current/](current/), with \`extract-metrics --markdown\` (chosen columns) and \`plot\` only;" \
    "\`bash scripts/results_page.sh --csvs\` makes those CSVs again from the run logs in this" \
    "folder. For each host kind they hold the newest call of each configuration, and the older" \
    "calls whose spread README.md quotes (the script lists the calls and why). Each row is one run;" \
    "its log's header holds the command line, GPU, driver, CUDA version and the binary's commit." \
    "Every measurement before, the withdrawn figures and why: [HISTORY.md](HISTORY.md)." "" \
    "| host kind | CSV | calls (folders of results/) |" "|---|---|---|" \
    "| one H100 80GB HBM3 | [h100.csv](current/h100.csv) | h100/remeasure-run1..2, remeasure-run4..7, prefill-run2..3, gen-final-run1, gen-7b1-hf-run1, train-table-run3..5, ab-run6, fp8-run1..3, serving-run3..5, ft-run1; h100x2/gate-run11, gate-run15, gate-run16, gate-run21 (their GPU 0), attn1 (GPU 0 and 1), gate-run23 (GPU 1), gate-run24 (GPU 0 and 1), gate-run25 (GPU 0 and 1), gate-run26 (GPU 1), gate-run28 (GPU 1), gate-run31 (GPU 0 and 1); h100/ew-run4 |" \
    "| 2× H100 80GB HBM3 (NVLink) | [h100x2.csv](current/h100x2.csv) | h100x2/multi-run1..4, multi-run6..11, gate-run7, gate-run10, serving-run1, hf-probe-run1..2 |" \
    "| one H200 | [h200.csv](current/h200.csv) | h200/gen-final-run1 |" \
    "| 2× H200 (NVLink) | [h200x2.csv](current/h200x2.csv) | h200x2/multi-run3..6, multi-run12 |" \
    "| 4× H200 | [h200x4.csv](current/h200x4.csv) | h200x4/tp-run2, dp-200 |" "" \
    "Columns (each defined once, in \`src/report/extract/derived.rs\`):" "" \
    "- **× HF best**: the run's throughput over that of the fastest HF run (any attention, compiled" \
    "  or not) of the same workload in the same call (one folder or archive: one host, one" \
    "  session). Above 1 candle beats HF's best there; HF's own runs read 1 for the fastest." \
    "- **× 1 GPU**: a run on several GPUs against the fastest one-GPU run of the same engine and" \
    "  workload in the same call; **efficiency** is that over the number of GPUs." \
    "- Throughput is decode tokens/s for the generation suite, train samples/s for training and" \
    "  samples/s otherwise; **asked** is the HF attention asked for (\`best\`: chosen by the probe," \
    "  which times every attention × torch.compile candidate); **peak GiB** the GPU memory peak." \
    "- bf16 and random weights (seed 0) throughout: speed does not depend on the values." ""
}

one_gpu() {
  say "## LAMBADA scoring" "" "Candle against HF's best on one GPU (lm-eval's \`lambada_openai\`)." ""
  say "### One H100" ""
  table h100 --where suite=lambada --where mode= "${VS_HF[@]}" --columns "$SCORE"
  chart h100_scoring "LAMBADA scoring on one H100: samples/s, candle against HF's best" \
    -i $C/h100.csv --where suite=lambada --where mode= --where "ratio_vs_hf_best!=" \
    --metric samples_per_second --title "LAMBADA scoring, one H100: samples/s, candle vs HF's best"
  say "## LAMBADA generation (FasterTransformer's mode)" "" \
    "\`--mode generate\`: each passage's target word generated greedily (FasterTransformer's" \
    "\`bloom_lambada\`), on one GPU. From 07544ed candle's prefill runs only the prompts' real" \
    "tokens, end to end (the rows before: the padded prefill). 07544ed's HF ran 11–50 % slower" \
    "than the earlier calls' (README.md gives both readings)." ""
  say "### One H100" ""
  table h100 --where suite=lambada --where mode=generate "${VS_HF[@]}" --columns "$SCORE"
  # The newest call alone (ft-run1: candle and HF's best of one call a model): the newest bar
  # of each engine would otherwise mix calls (an older call's compiled HF beside this one's).
  local x2=lambada_bloom-7b1_%s_bf16_bs16_cuda0_20261127T%sZ
  chart h100_ft "LAMBADA --mode generate on one H100 (07544ed): samples/s, candle against HF's best" \
    -i $C/h100.csv --where suite=lambada --where mode=generate --where "ratio_vs_hf_best!=" \
    --where git_commit=07544ed341b2 --where "run!=$(printf $x2 candle 064854)" \
    --where "run!=$(printf $x2 hf 065042)" --metric samples_per_second \
    --title "LAMBADA --mode generate, one H100, 07544ed: samples/s, candle vs HF's best (one call)"
  say "## Generation suite" "" "Prompt 128 + 128 new tokens, one GPU: decode tokens/s and the" \
    "inter-token latency (ITL) against HF's best (compiled: a static KV cache)." ""
  for h in "h100:One H100" "h100x2:One H100 of a 2× H100 host" "h200:One H200"; do
    say "### ${h#*:}" ""
    table "${h%%:*}" --where suite=generation "${VS_HF[@]}" --columns "$GEN"
  done
  chart h100_generation "Generation suite on one H100: decode tokens/s, candle against HF's best" \
    -i $C/h100.csv --where suite=generation --where "ratio_vs_hf_best!=" \
    --metric decode_tokens_per_second --title "Generation suite 128 + 128, one H100: decode tokens/s (newest call a bar)"
  say "### Candle alone: fp8 weights against bf16, and the decode kernels, one H100" "" \
    "\`--dtype fp8\` (#37): the projections' and LM head's weights as E4M3, a scale per output row," \
    "activations bf16; each call ran bf16, then fp8 (docs/perf-notes.md, fp8), but gate-run21," \
    "which ran fp8 alone: d2dc14c (the one-row GEMV with eight warps where K ≥ 4096) against" \
    "045ded2-dirty (8dd84f1's kernels), alternating. The decode kernels' calls alternate each" \
    "binary with the one before: attn1, bddef16 (8dae5c8's kernels) against 51667c7 (the decode" \
    "attention's loads in one round, one block a head from 128 (row, head) pairs), batch 1 and" \
    "16; gate-run23, 51667c7 against 4f61c08 (the one-row GEMV a column a block), batch 1;" \
    "gate-run24, 51667c7 against a7663d0 (the split attention back below 128 pairs or past 256" \
    "keys), batch 1 and 16; gate-run25 and gate-run26, a7663d0 against 74a3901 / db3de2a (the" \
    "projections at 5–16 rows and fp8 weights at 5–16 rows on tensor cores, \`skinny-proj\`)," \
    "batch 1, 8 and 16; gate-run31, 88bfdd2 (programmatic edges into the decode kernels at 1–4" \
    "rows, \`--fused pdl\`) against itself without them: its rows here are those with the edges" \
    "(batch 1 and 16; at 16 rows the path does not apply); ew-run4, db67dba (the LM head" \
    "through the GEMV, the norms and the merge triggering the next kernel first, the fp8" \
    "GEMVs loading weights before they wait) against itself without those paths: its rows" \
    "here are those with them (batch 1)." ""
  table h100 --where suite=generation --where engine=candle --where "ratio_vs_hf_best=" \
    --sort model,batch_size,git_commit,dtype --columns "$FP8"
  chart h100_fp8 "Generation suite on one H100: decode tokens/s in bf16 and fp8" \
    -i $C/h100.csv --where suite=generation --where engine=candle --where "ratio_vs_hf_best=" --where batch_size=1 \
    --where "git_commit!=bddef16ec5ab" --where "git_commit!=51667c755774" --where "git_commit!=4f61c081fc36" \
    --where "git_commit!=a7663d0b089d" --where "git_commit!=74a3901e0d64" \
    --metric decode_tokens_per_second --title "Generation suite 128 + 128, batch 1, one H100: decode tokens/s across precisions"
  say "### Candle alone, one H200 of a 2× H200 host" "" \
    "gate-run67: the submitted 7ded869 (gpt2's qkv and MLP and BLOOM's qkv at four tiles a block" \
    "at 5–16 rows), every path; 062270e's runs in the same call are docs/perf-notes.md's." \
    "gate-run104: the submitted 0bab297 (\`gemv-wide\`: the one-row projections with a bias as" \
    "8-warp blocks loading their weights before they wait), every path; its runs without" \
    "gemv-wide in the same call are docs/perf-notes.md's. (The SASS later showed that ptxas had" \
    "moved those weight loads after the wait: results/h200x2/gate-run108/sass.txt.)" \
    "gate-run110: the submitted 9f5d47c (\`gemv-wide\` triggering the next kernel before loading" \
    "their weights, now streaming loads that stay before the wait, and the folded qkv and fc" \
    "wide too), every path; its runs without gemv-wide in the same call are docs/perf-notes.md's." \
    "gate-run112: the submitted b4df0b9 (gemv-wide's row kernel as two warps a column, four" \
    "columns a block), every path. gate-run113: the submitted 5216d27 (\`cache-first\`: the" \
    "one-row attention reads its cached keys and values before it waits), every path." \
    "gate-run121: the submitted d051d7c (the greedy pick loads a thread's logits in one round)," \
    "every path; the runs of the code before in the same calls are docs/perf-notes.md's." ""
  table h200 --where suite=generation --where engine=candle --where "ratio_vs_hf_best=" \
    --sort model,batch_size,git_commit,dtype --columns "$FP8"
  say "## Training" "" "WikiText-2 fine-tuning, blocks of 1024 tokens (batch: blocks a step), one" \
    "GPU: candle against HF Trainer (compiled or not) and llm.c (which has no dropout)." ""
  say "### One H100" ""
  table h100 --where suite=wikitext2 "${VS_HF[@]}" --columns "$TRAIN"
  chart h100_training "WikiText-2 fine-tuning on one H100, dropout off: train samples/s by engine" \
    -i $C/h100.csv --where suite=wikitext2 --where dropout=off --where "ratio_vs_hf_best!=" \
    --metric train_samples_per_second \
    --title "WikiText-2 fine-tuning, dropout off, one H100: train samples/s (newest call a bar)"
  chart h100_training_dropout "WikiText-2 fine-tuning on one H100, dropout 0.1: train samples/s" \
    -i $C/h100.csv --where suite=wikitext2 --where dropout=on --where "ratio_vs_hf_best!=" \
    --metric train_samples_per_second \
    --title "WikiText-2 fine-tuning gpt2, dropout 0.1, one H100: train samples/s (llm.c has none)"
}

serving() {
  say "## Serving" "" "\`--suite serving\` (#39, docs/serving.md): 32 requests a rate arriving over time" \
    "(Poisson), prompts 64..256 tokens, 128 out, at most 8 together, SLO TTFT 200 ms / TPOT 20 ms;" \
    "candle's continuous or static batching, HF's worker replaying the same load (transformers'" \
    "ContinuousBatchingManager for GPT-2, its static queue around \`generate\` otherwise, eager" \
    "sdpa with torch's cuDNN attention off). Rate empty: all at once (\`inf\`)." ""
  say "### One H100" ""
  table h100 --where suite=serving --sort model,engine,batching_mode,requests_per_second --columns "$SERVE"
  for m in gpt2 bloom-560m bloom-7b1; do
    chart "h100_serving_$m" "$m serving on one H100: p99 TTFT against achieved requests/s" \
      -i $C/h100.csv --where suite=serving --where model=$m --curve --x requests_per_second \
      --metric ttft_ms_p99 --log-y --title "$m serving, one H100: p99 TTFT by achieved req/s (a line an engine and batching)"
  done
  say "### 2× H100: candle over \`--tp 2\` against one GPU" "" \
    "Rank 0 schedules and broadcasts each engine operation to the other rank (one small" \
    "all-reduce an operation, inside the times); each rank one GPU of the pair." ""
  table h100x2 --where suite=serving --sort model,tp,requests_per_second --columns "$SERVE_TP"
  chart "h100x2_serving_bloom-7b1" "bloom-7b1 serving on 2× H100, tp 1 and tp 2: p99 TTFT against achieved requests/s" \
    -i $C/h100x2.csv --where suite=serving --where model=bloom-7b1 --curve --x requests_per_second \
    --metric ttft_ms_p99 --log-y --title "bloom-7b1 serving, 2× H100: p99 TTFT by achieved req/s, tp 1 and tp 2"
}

parallel() {
  say "## Parallel" "" "Several GPUs of one host against one GPU of it: \`--tp\` for scoring," \
    "\`--mode generate\` and the generation suite, \`--dp\` (ZeRO 0–3) for training, and the" \
    "training strategies side by side (Tiny Shakespeare)." ""
  say "### 2× H100" ""
  table h100x2 "${PAR[@]}" --where "ratio_vs_hf_best=" "${BY_MODE[@]}" --columns "$TP"
  table h100x2 "${DPS[@]}" --columns "$DP"
  say "6ac4535's and bd3958f's dp rows ran \`--drop-last\` (every timed step 8 × 1024 a rank; docs/perf-notes.md," \
    "\"dp 2 with full batches\"); 7c35eef's kept each epoch's 2-row last batch." ""
  say "The strategies rows of ef1c9c9 and 9d78426 ran \`--drop-last\` (every timed step a full batch: Tiny Shakespeare" \
    "holds about 2.3 steps of 2 × 64 rows, and a partial step takes a full one's time); the earlier rows kept" \
    "each epoch's last batch." ""
  table h100x2 --where suite=shakespeare --sort model,engine,zero,recompute,batch_size --columns "$STRAT"
  chart h100x2_strategies "gpt2-xl training strategies on 2× H100: tokens/s by batch" \
    -i $C/h100x2.csv --where suite=shakespeare --where model=gpt2-xl --metric tokens_per_second \
    --x batch_size --title "gpt2-xl, Tiny Shakespeare, --dp 2 on 2x H100: tokens/s by batch (OOM: no point)"
  say "### 2× H200" ""
  table h200x2 "${PAR[@]}" "${BY_MODE[@]}" --columns "$TP"
  table h200x2 "${DPS[@]}" --columns "$DP"
  chart h200x2_decode "bloom-7b1 decoding on 2× H200: inter-token latency by tp" \
    -i $C/h200x2.csv --where suite=generation --metric itl_ms_p50 --x tp \
    --title "bloom-7b1 generation suite on 2x H200: inter-token latency p50 by --tp (newest binary)"
  say "### 4× H200" ""
  table h200x4 "${PAR[@]}" --sort model,batch_size,tp,time_utc --columns "$TP_SCORE"
  table h200x4 "${DPS[@]}" --columns "$DP"
}

if [ $CSVS = 1 ]; then csvs; fi
: > "$T/page.md"
intro
one_gpu
serving
parallel
# The page ends with one newline ($(…) drops the blank lines after the last table).
printf '%s\n' "$(cat "$T/page.md")" > "$PAGE"
echo "wrote $PAGE" >&2
