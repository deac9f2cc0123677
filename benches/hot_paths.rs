//! The CPU hot paths under criterion (`cargo bench`; `cargo bench -- NAME` for one): the work
//! around the model that every run pays on the host (BPE, padding, reading and extracting
//! logs) and gpt2-tiny's forward and decoding on the CPU. Built-in data and random weights
//! only, so it runs on any machine. The fused CUDA kernels are checked and timed on the GPU
//! host instead (`scripts/gpu_checks.sh kernels`, the suites' own runs).

use candle_core::{DType, Device, Tensor};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::path::PathBuf;
use transformer_bench::data::{lambada_passages, DataFile};
use transformer_bench::models::generate::{generate, left_pad, Greedy};
use transformer_bench::models::{ModelSpec, WeightSource};
use transformer_bench::report::extract::{collect_inputs, extract};
use transformer_bench::tokenizer::TextTokenizer;

/// The built-in LAMBADA sample's passages, tokenized with GPT-2's BPE.
fn sample_tokens(tok: &TextTokenizer) -> Vec<Vec<u32>> {
    let passages = lambada_passages(&DataFile::embedded_lambada_sample()).unwrap();
    passages
        .iter()
        .map(|(_, t)| tok.encode(t).unwrap())
        .collect()
}

fn bpe_and_padding(c: &mut Criterion) {
    let tok = TextTokenizer::gpt2().unwrap();
    let passages = lambada_passages(&DataFile::embedded_lambada_sample()).unwrap();
    c.bench_function("bpe encode, LAMBADA sample (100 passages)", |b| {
        b.iter(|| {
            for (_, text) in &passages {
                black_box(tok.encode(text).unwrap());
            }
        })
    });
    let tokens = sample_tokens(&tok);
    c.bench_function("left-pad 100 prompts into batches of 16", |b| {
        b.iter(|| {
            for batch in tokens.chunks(16) {
                black_box(left_pad(batch, 0, &Device::Cpu).unwrap());
            }
        })
    });
}

/// A folder of 1,000 copies of a real training log (an H100 run's), made once.
fn thousand_logs() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let log = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(
        "tests/fixtures/logs/bench/wikitext2_gpt2_candle_bf16_bs8_cuda0_20261122T010350Z.jsonl",
    );
    let bytes = std::fs::read(&log).unwrap();
    for i in 0..1000 {
        std::fs::write(dir.path().join(format!("run{i:04}.jsonl")), &bytes).unwrap();
    }
    (dir, log)
}

fn logs(c: &mut Criterion) {
    let (dir, one) = thousand_logs();
    c.bench_function("read one run log (JSONL, 25 records)", |b| {
        b.iter(|| black_box(transformer_bench::log::read_log(&one).unwrap()))
    });
    let inputs = collect_inputs(&[dir.path().display().to_string()]).unwrap();
    let mut group = c.benchmark_group("extract-metrics");
    group.sample_size(10);
    group.bench_function("rows of 1,000 run logs", |b| {
        b.iter(|| black_box(extract(&inputs, None, false).unwrap()))
    });
    group.finish();
}

fn gpt2_tiny(c: &mut Criterion) {
    let spec = ModelSpec::preset("gpt2-tiny").unwrap();
    let model = spec
        .load(&WeightSource::Random { seed: 0 }, DType::F32, &Device::Cpu)
        .unwrap();
    let tok = TextTokenizer::gpt2().unwrap();
    let batch: Vec<Vec<u32>> = sample_tokens(&tok)
        .into_iter()
        .take(16)
        .map(|t| t[..64.min(t.len())].to_vec())
        .collect();
    let t = batch.iter().map(Vec::len).max().unwrap();
    let ids: Vec<u32> = batch
        .iter()
        .flat_map(|r| r.iter().copied().chain(std::iter::repeat_n(0, t - r.len())))
        .collect();
    let mask: Vec<u32> = batch
        .iter()
        .flat_map(|r| std::iter::repeat_n(1, r.len()).chain(std::iter::repeat_n(0, t - r.len())))
        .collect();
    let ids = Tensor::from_vec(ids, (16, t), &Device::Cpu).unwrap(); // (16, T)
    let mask = Tensor::from_vec(mask, (16, t), &Device::Cpu).unwrap(); // (16, T)
    c.bench_function("gpt2-tiny forward, 16 x 64 tokens, fp32 CPU", |b| {
        b.iter(|| black_box(model.hidden_states(&ids, &mask).unwrap()))
    });
    let prompts = left_pad(&batch[..1], 0, &Device::Cpu).unwrap();
    let g = Greedy {
        new_tokens: 16,
        banned: vec![],
    };
    c.bench_function("gpt2-tiny generate, 1 prompt + 16 tokens, fp32 CPU", |b| {
        b.iter(|| black_box(generate(model.as_ref(), &prompts, &g, &mut |_| Ok(())).unwrap()))
    });
}

criterion_group! {
    name = hot_paths;
    // Short: `cargo bench` on a 2-core machine in about a minute.
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = bpe_and_padding, logs, gpt2_tiny
}
criterion_main!(hot_paths);
