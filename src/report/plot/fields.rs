//! The CSV columns a chart is built from, and how their values read in a legend, a group
//! label or the subtitle: short (`batch 16`, `tp2`, `H100 80GB HBM3`, a commit's 7 digits, a
//! `--fused` set as its difference from all).

/// Columns that name a workload: rows that differ in one are never one bar, one point. A
/// training strategy is one: its ZeRO stage and its recompute trade memory for speed, so a
/// strategies chart draws each pair as a line of its own.
pub const WORKLOAD: &[&str] = &[
    "suite",
    "mode",
    "model",
    "dtype",
    "gpu",
    "batch_size",
    "seq_len",
    "gen_source",
    "prompt_len",
    "new_tokens",
    "tp",
    "dp",
    "zero",
    "recompute",
];

/// An engine's own settings and build: unless `--all-configs`, each bar keeps the newest.
pub const CONFIG: &[&str] = &["attn", "fused", "backward", "git_commit"];

/// x columns that are swept numbers: drawn as lines.
pub const SWEPT: &[&str] = &[
    "batch_size",
    "seq_len",
    "prompt_len",
    "new_tokens",
    "tp",
    "dp",
];

/// A serving run's offered load: what a latency–throughput curve (`--curve`) runs along, so
/// rows differing in it are points of one line, not lines of their own.
pub const LOAD: &[&str] = &["arrivals", "request_rate", "max_concurrency"];

/// The rest of a serving run's workload: rows that differ in one are separate curves.
pub const SERVING: &[&str] = &[
    "batching",
    "burstiness",
    "num_requests",
    "input_len_min",
    "input_len_max",
    "output_len_min",
    "output_len_max",
    "slo_ttft_ms",
    "slo_tpot_ms",
];

/// A number as a label reads it: `4` for `4.0`; text unchanged.
pub fn trim_number(v: &str) -> String {
    match v.parse::<f64>() {
        Ok(x) if x.fract() == 0. && x.abs() < 1e15 => format!("{}", x as i64),
        Ok(x) => format!("{x}"),
        Err(_) => v.to_string(),
    }
}

/// Whether an engine is the baseline the others' speedups are over (HF transformers).
pub fn is_baseline(engine: &str) -> bool {
    crate::report::row::is_hf(engine)
}

/// Where an engine's bars come in a group: candle first, other engines, HF last.
pub fn engine_rank(engine: &str) -> u8 {
    match engine {
        "candle" => 0,
        e if is_baseline(e) => 2,
        _ => 1,
    }
}

/// A value as a legend or label reads it. `all_fused` is the union of the chart's `--fused`
/// sets: what `all` meant for the binaries plotted.
pub fn show(col: &str, v: &str, all_fused: &[String]) -> String {
    match col {
        "batch_size" => format!("batch {v}"),
        "seq_len" => format!("seq {v}"),
        "prompt_len" => format!("prompt {v}"),
        "gen_source" => format!("{v} prompts"),
        "new_tokens" => format!("{v} new"),
        "tp" | "dp" => format!("{col}{v}"),
        "zero" => format!("ZeRO-{v}"),
        "burstiness" => format!("burstiness {}", trim_number(v)),
        // `continuous: …` or `static: …` in the log: the mode names the curve.
        "batching" => format!("{} batching", v.split(':').next().unwrap_or(v).trim()),
        "num_requests" => format!("{} requests", trim_number(v)),
        "input_len_min" | "output_len_min" => {
            format!("{} ≥{}", &col[..col.len() - 8], trim_number(v))
        }
        "input_len_max" | "output_len_max" => {
            format!("{} ≤{}", &col[..col.len() - 8], trim_number(v))
        }
        "slo_ttft_ms" => format!("SLO TTFT {} ms", trim_number(v)),
        "slo_tpot_ms" => format!("SLO TPOT {} ms", trim_number(v)),
        "gpu" => v.trim_start_matches("NVIDIA ").to_string(),
        "git_commit" => commit(v),
        "fused" => format!("fused {}", fused(v, all_fused)),
        "backward" | "recompute" => format!("{col} {v}"),
        _ => v.to_string(),
    }
}

/// Values a label can leave unsaid where another part names the series: one GPU, no ZeRO, no
/// recompute.
pub fn is_default(col: &str, v: &str) -> bool {
    matches!(
        (col, v),
        ("tp" | "dp", "1") | ("zero", "0") | ("recompute", "off")
    )
}

/// A build by its commit: 7 hex digits, `-dirty` kept.
fn commit(v: &str) -> String {
    let (hash, dirty) = match v.strip_suffix("-dirty") {
        Some(h) => (h, "-dirty"),
        None => (v, ""),
    };
    format!("{}{dirty}", &hash[..hash.len().min(7)])
}

/// A `--fused` set by its difference from all: `all`, `all -gemv,skinny`, or, when that is
/// shorter, the set itself (`none`, `lt,softmax`).
pub fn fused(v: &str, all: &[String]) -> String {
    let set: Vec<&str> = v
        .split(',')
        .filter(|s| !s.is_empty() && *s != "none")
        .collect();
    if set.is_empty() {
        return "none".into();
    }
    let missing: Vec<&str> = all
        .iter()
        .map(String::as_str)
        .filter(|f| !set.contains(f))
        .collect();
    if missing.is_empty() {
        "all".into()
    } else if missing.len() <= set.len() {
        format!("all -{}", missing.join(","))
    } else {
        set.join(",")
    }
}

/// The union of the `--fused` sets in `values`, in first-seen order.
pub fn fused_union<'a>(values: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut all: Vec<String> = vec![];
    for f in values.flat_map(|v| v.split(',')) {
        if !f.is_empty() && f != "none" && !all.iter().any(|a| a == f) {
            all.push(f.to_string());
        }
    }
    all
}

/// The y-axis label, and the factor that converts the column into those units.
pub fn units(metric: &str) -> (String, f64) {
    if metric.contains("bytes") {
        (
            format!("{} (GiB)", metric.replace("_bytes", "")),
            1. / (1u64 << 30) as f64,
        )
    } else if let Some(what) = metric.strip_suffix("_per_second") {
        (format!("{}/s", what.replace('_', " ")), 1.)
    } else if metric.contains("_ms") {
        (format!("{metric} (ms)"), 1.)
    } else if metric.ends_with("seconds") || metric.ends_with("runtime") {
        (format!("{metric} (s)"), 1.)
    } else {
        (metric.to_string(), 1.)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_shortened() {
        let all = fused_union(["a,b,c,d", "a,b"].into_iter());
        assert_eq!(fused("a,b,c,d", &all), "all");
        assert_eq!(fused("a,b,c", &all), "all -d");
        assert_eq!(fused("a", &all), "a");
        assert_eq!(fused("none", &all), "none");
        assert_eq!(
            show("git_commit", "1342a160ff18-dirty", &all),
            "1342a16-dirty"
        );
        assert_eq!(show("gpu", "NVIDIA H100 80GB HBM3", &all), "H100 80GB HBM3");
        assert_eq!(show("tp", "2", &all), "tp2");
    }
}
