//! From flags to a typed plan: the suite, the configurations of its matrix (model × dtype ×
//! seq-len × batch size × request rate × engine) and whether they run as a sweep of child processes; then,
//! per configuration, the fully resolved [`RunSpec`]. Every flag rule lives here, so a bad
//! combination fails before anything is loaded.

use super::{DeviceArg, DtypeArg, RunArgs};
use crate::device::{choose_auto, visible_gpus, AutoChoice, DeviceSpec, Precision};
use crate::engines::EngineKind;
use crate::error::{Error, Result};
use crate::models::ModelSpec;
use crate::scenarios::suite_file::SuiteFile;
use crate::scenarios::RunSpec;

mod matrix;
mod resolve;
mod rules;
mod serve;

use matrix::*;
pub use matrix::{expand, Axes, Plan, RunConfig};
pub use resolve::{model_source, resolve_config};
pub use rules::{check_parallel, parallel, Parallel};
pub use serve::show_rate;

/// `--device`, and whether `auto` chose it or the precision. `--dtype auto` on a device given
/// explicitly: bf16 on a CUDA GPU that has it, fp32 on the CPU.
fn resolve_device(arg: DeviceArg, auto_dtype: bool) -> (DeviceSpec, Option<AutoChoice>) {
    let cuda_built = cfg!(feature = "cuda");
    match arg {
        DeviceArg::Auto => {
            let c = choose_auto(cuda_built, visible_gpus());
            (c.device, Some(c))
        }
        DeviceArg::Spec(DeviceSpec::Cpu) => {
            let why = "auto: fp32 on the CPU".to_string();
            let c = AutoChoice {
                device: DeviceSpec::Cpu,
                precision: Precision::Fp32,
                why,
            };
            (DeviceSpec::Cpu, auto_dtype.then_some(c))
        }
        DeviceArg::Spec(d @ DeviceSpec::Cuda(n)) => {
            let mut c = choose_auto(cuda_built, visible_gpus());
            // Only the precision is auto here: the GPU asked for decides it.
            let major = visible_gpus().ok().and_then(|g| g.get(n).copied());
            c.precision = match major {
                Some(m) if m < 8 => Precision::Fp32,
                _ => Precision::Bf16,
            };
            c.why = format!("auto: {} on {d}", c.precision);
            (d, auto_dtype.then_some(c))
        }
    }
}

/// The suite and its matrix from `args` (flags over the suite file's `[sweep]`).
pub fn plan(args: &RunArgs) -> Result<Plan> {
    let suite = match &args.suite_file {
        Some(p) => SuiteFile::from_path(p)?,
        None => SuiteFile::builtin(&args.suite)?,
    };
    let sw = &suite.sweep;
    let models = match &args.model_dir {
        Some(dir) if args.models.is_empty() => vec![ModelSpec::from_dir(dir)?.name],
        Some(_) => {
            return Err(Error::Config(
                "--model-dir replaces --model: give one of them".into(),
            ))
        }
        None => pick(&args.models, sw.models.clone(), "gpt2-tiny".into()),
    };
    let file_dtypes = parse_all(&sw.dtypes, parse_dtype)?;
    let dtypes = pick(&args.dtypes, file_dtypes, DtypeArg::Auto);
    let (device, auto) = resolve_device(args.device, dtypes.contains(&DtypeArg::Auto));
    let auto_precision = auto.as_ref().map_or(Precision::Fp32, |a| a.precision);
    let precisions: Vec<Precision> = dtypes.iter().map(|d| d.resolve(auto_precision)).collect();
    let file_engines = parse_all(&sw.engines, parse_engine)?;
    let engines = pick(&args.engines, file_engines, EngineKind::Candle);
    let batch_sizes = pick(
        &args.batch_sizes,
        sw.batch_sizes.clone(),
        suite.run.batch_size,
    );
    let (seq_lens, new_tokens) = lengths(args, &suite)?;
    if batch_sizes.contains(&0) {
        return Err(Error::Config("--batch-size must be at least 1".into()));
    }
    if seq_lens.contains(&Some(0)) {
        return Err(Error::Config("--seq-len must be at least 1".into()));
    }
    let repeat = args.repeat.or(sw.repeat).unwrap_or(1);
    if repeat == 0 {
        return Err(Error::Config("--repeat must be at least 1".into()));
    }
    let (zeros, recomputes) = training_axes(args, &suite)?;
    let request_rates = serve::request_rates(args, &suite)?;
    let n = models.len()
        * precisions.len()
        * batch_sizes.len()
        * seq_lens.len()
        * new_tokens.len()
        * zeros.len()
        * recomputes.len()
        * request_rates.len()
        * engines.len();
    let sweep = n > 1
        || repeat > 1
        || args.isolate
        || args.resume
        || args.sweep_dir.is_some()
        || args.run_timeout.is_some();
    let engines = if sweep {
        one_engine_each(&engines)
    } else {
        engines
    };
    let configs = expand_some(&Axes {
        models,
        precisions,
        seq_lens,
        new_tokens,
        batch_sizes,
        zeros,
        recomputes,
        request_rates,
        engines,
    })?;
    Ok(Plan {
        suite,
        device,
        auto: auto.map(|a| a.why),
        configs,
        repeat,
        sweep,
    })
}

/// A single run of `args` (which must not be a sweep).
pub fn resolve(args: RunArgs, command_line: Vec<String>) -> Result<RunSpec> {
    let plan = plan(&args)?;
    match &plan.configs[..] {
        [config] if !plan.sweep => resolve_config(&args, &plan, config, None, command_line),
        _ => Err(Error::Config(
            "these options describe a sweep, not one run".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::Recompute;

    /// `--strategies dp,zero1 --engine candle,hf`: HF has no ZeRO-1, so candle runs it alone.
    #[test]
    fn strategies_leave_out_zero1_and_mlp_recompute_for_hf() {
        let c = expand(&Axes {
            models: vec!["gpt2".into()],
            precisions: vec![Precision::Bf16],
            seq_lens: vec![None],
            new_tokens: vec![None],
            batch_sizes: vec![8],
            zeros: vec![Some(0), Some(1)],
            recomputes: vec![Recompute::Off, Recompute::Blocks, Recompute::Mlp],
            request_rates: vec![None],
            engines: vec![EngineKind::Candle, EngineKind::Hf],
        });
        let got: Vec<(Option<u8>, &str, &str)> = c
            .iter()
            .map(|c| (c.zero, c.recompute.as_str(), c.engine.as_str()))
            .collect();
        let want = [
            (Some(0), "off", "candle"),
            (Some(0), "off", "hf"),
            (Some(0), "blocks", "candle"),
            (Some(0), "blocks", "hf"),
            (Some(0), "mlp", "candle"),
            (Some(1), "off", "candle"),
            (Some(1), "blocks", "candle"),
            (Some(1), "mlp", "candle"),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn product_runs_engines_innermost() {
        let c = expand(&Axes {
            models: vec!["a".into(), "b".into()],
            precisions: vec![Precision::Fp32],
            seq_lens: vec![None],
            new_tokens: vec![None],
            batch_sizes: vec![1, 2],
            zeros: vec![None],
            recomputes: vec![Recompute::Off],
            request_rates: vec![None],
            engines: vec![EngineKind::Candle, EngineKind::Hf],
        });
        assert_eq!(c.len(), 8);
        assert_eq!(
            (c[0].engine.as_str(), c[1].engine.as_str()),
            ("candle", "hf")
        );
        assert_eq!((c[1].batch_size, c[2].batch_size), (1, 2));
        assert_eq!((c[3].model.as_str(), c[4].model.as_str()), ("a", "b"));
    }
}
