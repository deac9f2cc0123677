//! The serving suite's options from its flags over the suite file's `[serving]`, and the
//! flags it refuses (one line each, before anything loads).

use crate::cli::RunArgs;
use crate::error::{Error, Result};
use crate::metrics::serving::Slo;
use crate::scenarios::serving::load::{LenRange, LoadSpec};
use crate::scenarios::suite_file::SuiteFile;
use crate::scenarios::ServeOptions;

/// `--suite serving`'s options; None for another suite, which refuses the serving flags.
pub(super) fn serve_options(args: &RunArgs, suite: &SuiteFile) -> Result<Option<ServeOptions>> {
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
    let count = |n: usize, flag: &str| match n {
        0 => Err(Error::Config(format!("{flag} must be at least 1"))),
        n => Ok(n),
    };
    let max_concurrency = match a.max_concurrency {
        Some(c) => Some(count(c, "--max-concurrency")?),
        None => file.max_concurrency,
    };
    // --max-concurrency alone is a closed loop: requests go as soon as there is room.
    let request_rate = match (a.request_rate, a.max_concurrency) {
        (Some(r), _) => r,
        (None, Some(_)) => f64::INFINITY,
        (None, None) => file.request_rate,
    };
    if request_rate.is_nan() || request_rate <= 0. {
        return Err(Error::Config(format!(
            "--request-rate {request_rate}: give requests/s above 0, or inf"
        )));
    }
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
    Ok(Some(ServeOptions { load, slo }))
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
            args.tp > 1 || args.dp > 1,
            "--tp and --dp: the serving suite runs in one process (not built for ranks yet)",
        ),
    ];
    match refused.iter().find(|(given, _)| *given) {
        Some((_, why)) => Err(Error::Config(why.to_string())),
        None => Ok(()),
    }
}

/// A serving run is one configuration: sweeps over it (rates, batch sizes, engines) and
/// repeats are not built yet.
pub(super) fn one_configuration(suite: &SuiteFile, sweep: bool) -> Result<()> {
    match sweep && suite.serving.is_some() {
        true => Err(Error::Config(
            "a serving run is one configuration (one model, dtype, batch size, engine; no --repeat): sweeps of serving runs are not built yet".into(),
        )),
        false => Ok(()),
    }
}
