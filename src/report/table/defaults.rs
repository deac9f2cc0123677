//! The columns `--markdown` shows without `--columns`: what a person compares runs by (the
//! workload, throughput, latency p50 / p99, peak memory and the ratios), each only where some
//! row has a value; tp and dp only where some run used several GPUs. The CSV keeps every
//! column.

use super::Col;
use crate::error::Result;
use crate::report::row::polars_err;
use polars::prelude::*;

/// `NAME[:FMT][=LABEL]`, in table order.
const DEFAULT: &[&str] = &[
    "model",
    "engine",
    "attn",
    "dtype",
    "batch_size=batch",
    "tp",
    "dp",
    "gpu=GPU",
    "count",
    "samples_per_second:.1=samples/s",
    "decode_tokens_per_second:.1=decode tokens/s",
    "train_samples_per_second:.1=train samples/s",
    "latency_ms_p50:.2=p50 ms",
    "latency_ms_p99:.2=p99 ms",
    "itl_ms_p50:.3=ITL p50 ms",
    "itl_ms_p99:.3=ITL p99 ms",
    "step_latency_ms_p50:.1=step p50 ms",
    "step_latency_ms_p90:.1=step p90 ms",
    "peak_memory_bytes:GiB.2=peak GiB",
    "ratio_vs_hf_best:.2=× HF best",
    "ratio_vs_1gpu:.2=× 1 GPU",
    "scaling_efficiency:.3=efficiency",
];

/// The default columns `df` has values in.
pub fn default_columns(df: &DataFrame) -> Result<Vec<Col>> {
    let mut out = vec![];
    for spec in DEFAULT {
        let col = Col::parse(spec)?;
        if shown(df, &col.name)? {
            out.push(col);
        }
    }
    Ok(out)
}

/// Whether a column has a value; tp and dp only where one is not 1.
fn shown(df: &DataFrame, name: &str) -> Result<bool> {
    let Ok(c) = df.column(name) else {
        return Ok(false);
    };
    if !matches!(name, "tp" | "dp") {
        return Ok(c.null_count() < c.len());
    }
    let v = c.cast(&DataType::Float64).map_err(polars_err)?;
    let several = v
        .f64()
        .map_err(polars_err)?
        .iter()
        .flatten()
        .any(|x| x != 1.);
    Ok(several)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_columns_with_values_and_tp_where_it_varies() {
        let df = df!(
            "run" => ["a", "b"],
            "model" => ["gpt2", "gpt2"],
            "engine" => ["candle", "hf"],
            "tp" => [1i64, 1],
            "dp" => [1i64, 2],
            "samples_per_second" => [Some(10.), None],
            "itl_ms_p50" => [None::<f64>, None],
            "ratio_vs_hf_best" => [2., 1.],
        )
        .unwrap();
        let cols = default_columns(&df).unwrap();
        let labels: Vec<&str> = cols.iter().map(|c| c.label.as_str()).collect();
        assert_eq!(labels, ["model", "engine", "dp", "samples/s", "× HF best"]);
    }
}
