//! `--dtype fp8` on the CPU (the embedded default: gpt2-tiny, the shipped sample): the
//! projections' and LM head's weights quantized to E4M3 change the scores a little, not much; and
//! the combinations it is not built for are one-line errors before any weights load.

mod common;

use common::cli::*;

#[test]
fn fp8_weights_score_close_to_bf16s_and_not_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().to_str().unwrap();
    let score = |dtype: &str| {
        let args = [
            "--device",
            "cpu",
            "--dtype",
            dtype,
            "--limit",
            "16",
            "--log-dir",
            logs,
        ];
        summary_of(&args)
    };
    let (bf16, fp8) = (score("bf16"), score("fp8"));
    let change = fp8.perplexity / bf16.perplexity - 1.;
    assert!(
        change != 0.,
        "fp8 scored exactly as bf16: the weights were not quantized"
    );
    assert!(
        change.abs() < 0.05,
        "fp8 perplexity {} against bf16's {}",
        fp8.perplexity,
        bf16.perplexity
    );
    assert_eq!(fp8.n_samples, bf16.n_samples);
}

#[test]
fn fp8_where_it_is_not_built_is_a_one_line_error() {
    let e = error_of(&["--engine", "hf", "--dtype", "fp8", "--device", "cpu"]);
    assert!(
        e.contains("--dtype fp8 is the candle engine's fp8 weights; --engine hf"),
        "{e}"
    );
    let e = error_of(&["--suite", "wikitext2", "--dtype", "fp8", "--device", "cpu"]);
    assert!(
        e.contains("--dtype fp8 is for inference: train in bf16 with --save DIR"),
        "{e}"
    );
    let e = error_of(&["--dtype", "fp8", "--tp", "2", "--device", "cpu"]);
    assert!(e.contains("--dtype fp8 under --tp is not built"), "{e}");
}
