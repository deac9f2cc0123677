//! The serving suite's options from its flags over the suite file's `[serving]`, and the
//! flags it refuses (one line each, before anything loads).

use crate::cli::RunArgs;
use crate::engines::replay::Batching;
use crate::error::{Error, Result};
use crate::metrics::serving::Slo;
use crate::scenarios::serving::load::{LenRange, LoadSpec};
use crate::scenarios::suite_file::SuiteFile;
use crate::scenarios::ServeOptions;

/// `--suite serving`'s options at `request_rate` (the configuration's point of the rate
/// axis, [`request_rates`]); None for another suite, which refuses the serving flags.
pub(super) fn serve_options(
    args: &RunArgs,
    suite: &SuiteFile,
    request_rate: Option<f64>,
) -> Result<Option<ServeOptions>> {
    let a = &args.serve;
    let Some(file) = &suite.serving else {
        return match a.given() {
            Some(flag) => Err(Error::Config(format!(
                "{flag} is a serving option: it applies to --suite serving, not {}",
                suite.name
            ))),
            None => Ok(None),
        };
    };
    refuse_other_flags(args)?;
    let max_concurrency = match a.max_concurrency {
        Some(c) => Some(count(c, "--max-concurrency")?),
        None => file.max_concurrency,
    };
    let request_rate = match request_rate {
        Some(r) => r,
        None => only_rate(&request_rates(args, suite)?)?,
    };
    let input = a.input_len.as_deref().unwrap_or(&file.input_len);
    let output = a.output_len.as_deref().unwrap_or(&file.output_len);
    let load = LoadSpec {
        num_requests: count(
            a.num_requests.unwrap_or(file.num_requests),
            "--num-requests",
        )?,
        request_rate,
        burstiness: a.burstiness.unwrap_or(file.burstiness),
        max_concurrency,
        input_len: LenRange::parse(input, "--input-len")?,
        output_len: LenRange::parse(output, "--output-len")?,
        seed: args.seed,
    };
    // The schedule's own checks (a positive burstiness) before anything loads.
    crate::scenarios::serving::load::arrivals_ms(2, load.request_rate, load.burstiness, 0)?;
    let slo = a.slo.as_deref().map(Slo::parse).transpose()?;
    let batching = match (&a.batching, &file.batching) {
        (Some(b), _) => Batching::parse(b, "--batching")?,
        (None, Some(b)) => Batching::parse(b, "the suite file's batching")?,
        (None, None) => Batching::Continuous,
    };
    Ok(Some(ServeOptions {
        load,
        slo,
        batching,
    }))
}

/// At least 1, else the one-line error naming `flag`.
fn count(n: usize, flag: &str) -> Result<usize> {
    match n {
        0 => Err(Error::Config(format!("{flag} must be at least 1"))),
        n => Ok(n),
    }
}

/// The plan's rate axis: `--request-rate`'s list (each a run of a sweep), else the suite
/// file's rate (inf with `--max-concurrency` alone: a closed loop sends requests as soon as
/// there is room); `[None]` for a suite that does not serve.
pub(super) fn request_rates(args: &RunArgs, suite: &SuiteFile) -> Result<Vec<Option<f64>>> {
    let a = &args.serve;
    let Some(file) = &suite.serving else {
        return Ok(vec![None]);
    };
    let given: Vec<f64> = a
        .request_rate
        .iter()
        .map(|r| parse_rate(r))
        .collect::<Result<_>>()?;
    let rates = match (given.is_empty(), a.max_concurrency) {
        (false, _) => given,
        (true, Some(_)) => vec![f64::INFINITY],
        (true, None) => vec![check_rate(
            file.request_rate,
            "the suite file's request_rate",
        )?],
    };
    let mut seen: Vec<f64> = vec![];
    for r in rates {
        if seen.contains(&r) {
            return Err(Error::Config(format!(
                "--request-rate: {} is listed twice (one run per rate)",
                show_rate(r)
            )));
        }
        seen.push(r);
    }
    Ok(seen.into_iter().map(Some).collect())
}

/// One `--request-rate` value: requests/s above 0, or `inf`.
fn parse_rate(text: &str) -> Result<f64> {
    let what = format!("--request-rate '{text}'");
    match text.trim().parse::<f64>() {
        Ok(r) => check_rate(r, &what),
        Err(_) => Err(Error::Config(format!(
            "{what}: give requests/s above 0, or inf (a sweep: a list, 1,2,4,inf)"
        ))),
    }
}

fn check_rate(r: f64, what: &str) -> Result<f64> {
    match r.is_nan() || r <= 0. {
        true => Err(Error::Config(format!(
            "{what}: give requests/s above 0, or inf (a sweep: a list, 1,2,4,inf)"
        ))),
        false => Ok(r),
    }
}

/// A rate as the sweep log and its tables write it: `4`, `0.5`, `inf`.
pub fn show_rate(r: f64) -> String {
    format!("{r}")
}

/// The one rate of a run that is not a sweep's point.
fn only_rate(rates: &[Option<f64>]) -> Result<f64> {
    match rates {
        [Some(r)] => Ok(*r),
        _ => Err(Error::Config(
            "--request-rate lists several rates: that is a sweep, one run per rate".into(),
        )),
    }
}

/// Flags of the other suites that a serving run has no use for.
fn refuse_other_flags(args: &RunArgs) -> Result<()> {
    let refused = [
        (
            args.limit.is_some(),
            "--limit: the serving suite takes --num-requests",
        ),
        (
            args.data.is_some(),
            "--data: the serving suite's prompts are random token ids",
        ),
        (
            args.min_time.is_some() || args.min_batches.is_some(),
            "--min-time and --min-batches: a serving run serves --num-requests requests",
        ),
        (
            args.dp > 1,
            "--dp: the serving suite runs no data parallelism (it serves one load): use --tp N",
        ),
    ];
    match refused.iter().find(|(given, _)| *given) {
        Some((_, why)) => Err(Error::Config(why.to_string())),
        None => Ok(()),
    }
}
