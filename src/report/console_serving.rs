//! The tables `bench` prints after a serving run (`--suite serving`): the load, what batching
//! served it, the rates, goodput under `--slo`, and the latency percentiles; after a sweep of
//! serving runs (`--request-rate 1,2,4,inf`), one row a run: offered rate against what it
//! achieved, the latency–throughput curve as numbers.

use super::console::summary_heading;
use crate::log::read_log;
use crate::record::{Header, Percentiles, Record, ServingSummary, SweepOutcome, SweepRun};
use std::path::Path;

/// The serving run's summary, as printed.
pub fn serving_table(h: &Header, s: &ServingSummary, log_path: &Path) -> String {
    // The heading: the line, `auto`'s choice, and the ranks of a --tp run.
    let mut t = summary_heading(h, "batch ≤");
    let mut rows: Vec<(&str, String)> = vec![];
    if let Some(i) = &h.serving {
        let rate = i
            .request_rate
            .map_or("inf".into(), |r| format!("{r} req/s"));
        let cap = i
            .max_concurrency
            .map_or("open loop".into(), |c| format!("at most {c} in flight"));
        let len = |(a, b): (usize, usize)| match a == b {
            true => format!("{a}"),
            false => format!("{a}:{b}"),
        };
        rows.push((
            "load",
            format!(
                "{} requests, rate {rate} (burstiness {}), {cap}, input {} output {} tokens, seed {}",
                i.num_requests,
                i.burstiness,
                len(i.input_len),
                len(i.output_len),
                i.seed
            ),
        ));
        // Continuous batching's description is long: its first clause here, whole in the log.
        let batching = i.batching.split(';').next().unwrap_or_default();
        rows.push(("batching", batching.to_string()));
    }
    if let Some(e) = &s.error {
        rows.push(("status", format!("{} ({e})", s.status)));
    }
    rows.extend(rate_rows(h, s));
    for (name, p) in [
        ("TTFT ms", &s.ttft_ms),
        ("TPOT ms", &s.tpot_ms),
        ("ITL ms", &s.itl_ms),
        ("E2E ms", &s.e2e_ms),
        ("queue ms", &s.queue_ms),
    ] {
        rows.push((name, percentiles(p)));
    }
    rows.push((
        "peak memory",
        format!("{:.1} MiB", s.peak_memory_bytes as f64 / (1 << 20) as f64),
    ));
    for (k, v) in rows {
        t += &format!("  {k:<18} {v}\n");
    }
    t += &format!("log: {}\n", log_path.display());
    t
}

/// Served counts, throughput and goodput.
fn rate_rows(h: &Header, s: &ServingSummary) -> Vec<(&'static str, String)> {
    let continuous = h
        .serving
        .as_ref()
        .is_some_and(|i| i.batching.starts_with("continuous"));
    // Continuous batching counts decode steps where the engine steps here; transformers'
    // manager counts none (no mean slots a step): each request joins the running batch once.
    let served = match (continuous, s.batch_size_mean.is_nan()) {
        (true, true) => format!(
            "{} requests, each joining the running batch, {:.2} s",
            s.n_requests, s.duration_seconds
        ),
        (true, false) => format!(
            "{} requests in {} decode steps ({:.2} slots a step), {:.2} s",
            s.n_requests, s.n_batches, s.batch_size_mean, s.duration_seconds
        ),
        (false, _) => format!(
            "{} requests in {} calls ({:.2} a call), {:.2} s",
            s.n_requests, s.n_batches, s.batch_size_mean, s.duration_seconds
        ),
    };
    let mut rows = vec![
        ("served", served),
        ("requests/s", format!("{:.2}", s.requests_per_second)),
        (
            "output tokens/s",
            format!("{:.1}", s.output_tokens_per_second),
        ),
    ];
    if let (Some(g), Some(n), Some(i)) = (
        s.goodput_requests_per_second,
        s.slo_met_requests,
        &h.serving,
    ) {
        let limit = |name: &str, v: Option<f64>| v.map(|x| format!("{name} ≤ {x} ms"));
        let slo: Vec<String> = [limit("TTFT", i.slo_ttft_ms), limit("TPOT", i.slo_tpot_ms)]
            .into_iter()
            .flatten()
            .collect();
        rows.push((
            "goodput",
            format!(
                "{g:.2} req/s ({n} of {} within {})",
                s.n_requests,
                slo.join(", ")
            ),
        ));
    }
    rows
}

fn percentiles(p: &Percentiles) -> String {
    format!(
        "p50 {:.3}  p90 {:.3}  p99 {:.3}  mean {:.3}",
        p.p50, p.p90, p.p99, p.mean
    )
}

/// A serving sweep's runs, one row each in run order: the offered rate, achieved requests/s
/// and output tokens/s, TTFT and TPOT p99, goodput (where `--slo` was given), and the status
/// of a run that did not end `ok`. Empty when the sweep served nothing.
pub fn serving_sweep_table(out: &SweepOutcome) -> String {
    let runs: Vec<(&SweepRun, Option<ServingSummary>)> = out
        .runs
        .iter()
        .filter(|r| r.config.request_rate.is_some())
        .map(|r| (r, serving_summary(out, r)))
        .collect();
    let Some((first, _)) = runs.first() else {
        return String::new();
    };
    // The configuration besides the rate, where the sweep has several.
    let config = |r: &SweepRun| {
        let c = &r.config;
        format!("{} {} bs{} {}", c.model, c.dtype, c.batch_size, c.engine)
    };
    let several = runs.iter().any(|(r, _)| config(r) != config(first));
    let head = [
        "rate req/s",
        "req/s",
        "out tok/s",
        "TTFT p99 ms",
        "TPOT p99 ms",
        "goodput req/s",
    ];
    let cells = |v: Vec<String>| -> String { v.iter().map(|c| format!(" {c:>13}")).collect() };
    let mut t = format!("\nserving{}\n", cells(head.map(String::from).to_vec()));
    for (r, s) in &runs {
        let rate = r.config.request_rate.clone().unwrap_or_default();
        let mut row = vec![rate];
        row.extend(match s {
            Some(s) => vec![
                format!("{:.2}", s.requests_per_second),
                format!("{:.1}", s.output_tokens_per_second),
                format!("{:.2}", s.ttft_ms.p99),
                format!("{:.3}", s.tpot_ms.p99),
                s.goodput_requests_per_second
                    .map_or("-".into(), |g| format!("{g:.2}")),
            ],
            None => vec!["-".to_string(); 5],
        });
        let mut line = format!("{:<7}{}", "", cells(row));
        if several {
            line += &format!("  {}", config(r));
        }
        if r.status != crate::record::RunStatus::Ok {
            line += &format!("  {}", r.status);
        }
        t += &(line + "\n");
    }
    t
}

/// A sweep run's serving summary, read back from its log.
fn serving_summary(out: &SweepOutcome, run: &SweepRun) -> Option<ServingSummary> {
    run.logs.iter().find_map(|l| {
        let records = read_log(&out.dir.join(l)).ok()?;
        records.into_iter().find_map(|r| match r {
            Record::ServingSummary(s) => Some(*s),
            _ => None,
        })
    })
}
