//! What an llm.c run needs before it starts: the binary (`--llmc-bin`, else `$LLMC_BIN`), the
//! model descriptor, the checks on precision, device and weights, and its command line. Every
//! refusal is one line that says what to do, given before anything is trained.

use crate::device::{DeviceSpec, Precision};
use crate::error::{Error, Result};
use crate::models::{ModelSpec, WeightSource};
use crate::record::Hyper;
use std::path::{Path, PathBuf};

/// The environment variable naming the binary when `--llmc-bin` is not given.
pub const BIN_ENV: &str = "LLMC_BIN";

/// Where this project keeps a build of `train_gpt2cu` for its GPU hosts, for the error message.
const SHARED_BUILD: &str = "/work/shared/gpu/llmc";

/// GPT-2 presets llm.c builds from scratch (`-e dN`: N layers, GPT-2's widths).
const DESCRIPTORS: &[(&str, &str)] = &[
    ("gpt2", "d12"),
    ("gpt2-medium", "d24"),
    ("gpt2-large", "d36"),
    ("gpt2-xl", "d48"),
];

/// `--llmc-bin`.
#[derive(Clone, Debug, Default)]
pub struct LlmcOptions {
    pub bin: Option<PathBuf>,
}

impl LlmcOptions {
    /// The binary, as an absolute path (llm.c runs in its work folder): `--llmc-bin`, else
    /// `$LLMC_BIN`; it must be an executable file.
    pub fn binary(&self) -> Result<PathBuf> {
        let (path, from) = match (&self.bin, std::env::var_os(BIN_ENV)) {
            (Some(p), _) => (p.clone(), "--llmc-bin"),
            (None, Some(p)) if !p.is_empty() => (PathBuf::from(p), BIN_ENV),
            _ => {
                return Err(Error::Config(format!(
                    "--engine llmc runs llm.c's train_gpt2cu: pass --llmc-bin PATH or set {BIN_ENV} (a build for H100/H200 is in {SHARED_BUILD})"
                )))
            }
        };
        if !is_executable(&path) {
            return Err(Error::Config(format!(
                "{from} {}: not an executable file (llm.c's train_gpt2cu; a build for H100/H200 is in {SHARED_BUILD})",
                path.display()
            )));
        }
        std::path::absolute(&path)
            .map_err(|e| Error::io(format!("resolving {from} {}", path.display()), e))
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// llm.c's `-e` for `model`: `dN` for the GPT-2 presets it builds (random init, its seed 42).
pub fn descriptor(model: &ModelSpec) -> Result<&'static str> {
    DESCRIPTORS
        .iter()
        .find(|(name, _)| *name == model.name)
        .map(|(_, d)| *d)
        .ok_or_else(|| {
            let known: Vec<String> = DESCRIPTORS
                .iter()
                .map(|(n, d)| format!("{n} ({d})"))
                .collect();
            Error::Config(format!(
                "--engine llmc trains GPT-2 presets from scratch: {}, not {}",
                known.join(", "),
                model.name
            ))
        })
}

/// Refuses what llm.c's default build cannot run as asked: another precision than bf16, a
/// device other than the first visible GPU, weights it would not read.
pub fn check(
    model: &ModelSpec,
    precision: Precision,
    device: DeviceSpec,
    weights: &WeightSource,
) -> Result<&'static str> {
    let d = descriptor(model)?;
    if precision != Precision::Bf16 {
        return Err(Error::Config(format!(
            "--engine llmc runs llm.c's default build, which trains in bf16 only: use --dtype bf16, not {precision}"
        )));
    }
    if device != DeviceSpec::Cuda(0) {
        return Err(Error::Config(format!(
            "--engine llmc trains on the first visible GPU: use --device cuda:0 (CUDA_VISIBLE_DEVICES picks the GPU), not {device}"
        )));
    }
    if !matches!(weights, WeightSource::Random { .. }) {
        return Err(Error::Config(
            "--engine llmc initializes its own random weights (-e dN): drop --model-dir / --weights checkpoint".into(),
        ));
    }
    Ok(d)
}

/// The shape and schedule of the run, as llm.c's flags take them.
pub struct RunShape<'a> {
    pub descriptor: &'a str,
    pub batch_size: usize,
    pub block_size: usize,
    pub hyper: &'a Hyper,
    /// Validation batches of `batch_size` blocks (`-m`).
    pub val_batches: usize,
}

/// llm.c's arguments for `train` / `val` token files and its output folder `out`: HF's
/// linear schedule (`-k linear -q 0`, warm-up `-u`), no weight decay unless asked, validation
/// only before the first and after the last step (`-v` past the end), no sampling, no
/// HellaSwag, no checkpoints, no recomputation (`-r 0`, its fastest setting), a fresh run.
pub fn arguments(s: &RunShape, train: &Path, val: &Path, out: &Path) -> Vec<String> {
    let h = s.hyper;
    let tokens_per_step = s.batch_size * s.block_size * h.grad_accum;
    let flags: Vec<(&str, String)> = vec![
        ("-i", train.display().to_string()),
        ("-j", val.display().to_string()),
        ("-o", out.display().to_string()),
        ("-e", s.descriptor.to_string()),
        ("-b", s.batch_size.to_string()),
        ("-t", s.block_size.to_string()),
        ("-d", tokens_per_step.to_string()),
        ("-x", h.total_steps.to_string()),
        ("-l", h.learning_rate.to_string()),
        ("-k", "linear".into()),
        ("-u", h.lr_warmup_steps.to_string()),
        ("-q", "0.0".into()),
        ("-c", h.weight_decay.to_string()),
        ("-v", (h.total_steps + 1).to_string()),
        ("-m", s.val_batches.to_string()),
        ("-s", "0".into()),
        ("-h", "0".into()),
        ("-n", "0".into()),
        ("-y", "0".into()),
        ("-r", "0".into()),
    ];
    flags
        .into_iter()
        .flat_map(|(f, v)| [f.to_string(), v])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_presets_map_to_llmc_depths_and_others_are_refused() {
        let spec = |n: &str| ModelSpec::preset(n).unwrap();
        assert_eq!(descriptor(&spec("gpt2")).unwrap(), "d12");
        assert_eq!(descriptor(&spec("gpt2-xl")).unwrap(), "d48");
        let e = descriptor(&spec("bloom-560m")).unwrap_err().to_string();
        assert!(
            e.contains("gpt2 (d12)") && e.ends_with("not bloom-560m"),
            "{e}"
        );
        let random = WeightSource::Random { seed: 0 };
        let gpu = DeviceSpec::Cuda(0);
        let e = check(&spec("gpt2"), Precision::Fp32, gpu, &random).unwrap_err();
        assert!(e.to_string().contains("use --dtype bf16"), "{e}");
        let e = check(&spec("gpt2"), Precision::Bf16, DeviceSpec::Cpu, &random).unwrap_err();
        assert!(e.to_string().contains("use --device cuda:0"), "{e}");
        let dir = WeightSource::Dir("/x".into());
        assert!(check(&spec("gpt2"), Precision::Bf16, gpu, &dir).is_err());
        assert_eq!(
            check(&spec("gpt2"), Precision::Bf16, gpu, &random).unwrap(),
            "d12"
        );
    }

    #[test]
    fn arguments_carry_the_suite_s_shape_and_schedule() {
        let hyper = Hyper {
            learning_rate: 5e-5,
            total_steps: 60,
            grad_accum: 2,
            ..Hyper::default()
        };
        let shape = RunShape {
            descriptor: "d12",
            batch_size: 8,
            block_size: 1024,
            hyper: &hyper,
            val_batches: 30,
        };
        let a = arguments(
            &shape,
            Path::new("t.bin"),
            Path::new("v.bin"),
            Path::new("o"),
        );
        let joined = a.join(" ");
        for want in [
            "-i t.bin -j v.bin -o o -e d12 -b 8 -t 1024 -d 16384 -x 60 -l 0.00005 -k linear -u 0 -q 0.0 -c 0",
            "-v 61 -m 30 -s 0",
        ] {
            assert!(joined.contains(want), "{joined}");
        }
    }
}
