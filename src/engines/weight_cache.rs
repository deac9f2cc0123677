//! The HF checkpoint the HF engine loads. With random weights, candle writes them once (cached
//! by model, seed, device kind) and every engine of the run reads that same file, so both
//! engines run the same numbers.

use crate::device::DeviceSpec;
use crate::error::{Error, Result};
use crate::models::weights::save_checkpoint;
use crate::models::{ModelSpec, Recorder, WeightSource};
use crate::progress::{rate, Status};
use candle_core::DType;
use std::path::{Path, PathBuf};

/// Where random weights for the HF engine are cached: `$BENCH_CACHE_DIR` or
/// `~/.cache/transformer-bench`, then `weights/MODEL-seedN-DEVICE`. Stored in fp32, once for
/// every precision: both engines cast on load (round to nearest even), so their fp16/bf16
/// weights are identical too.
pub fn weight_cache_dir(model: &str, seed: u64, device: DeviceSpec) -> PathBuf {
    let root = std::env::var_os("BENCH_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/transformer-bench"))
        })
        .unwrap_or_else(|| PathBuf::from(".cache/transformer-bench"));
    let kind = match device {
        DeviceSpec::Cpu => "cpu",
        DeviceSpec::Cuda(_) => "cuda",
    };
    root.join("weights")
        .join(format!("{model}-seed{seed}-{kind}"))
}

/// The checkpoint directory the HF engine loads: the model directory itself, or the random
/// weights written to `save_to` (default: [`weight_cache_dir`]) unless already there.
pub fn hf_checkpoint(
    model: &ModelSpec,
    weights: &WeightSource,
    save_to: Option<&Path>,
    device: DeviceSpec,
    progress: bool,
) -> Result<PathBuf> {
    let seed = match weights {
        WeightSource::Dir(d) => return Ok(d.clone()),
        WeightSource::Random { seed } => *seed,
    };
    let dir = save_to
        .map(Path::to_path_buf)
        .unwrap_or_else(|| weight_cache_dir(&model.name, seed, device));
    if dir.join("config.json").is_file() && dir.join("model.safetensors").is_file() {
        return Ok(dir);
    }
    write_random(model, weights, &dir, device, progress)?;
    eprintln!(
        "wrote random weights (seed {seed}) for the HF engine to {}",
        dir.display()
    );
    Ok(dir)
}

/// Writes `weights` (random) as an fp32 HF checkpoint in `dir`: under a temporary name, then
/// renamed, so a crash never leaves a half checkpoint that a later run would take for a whole
/// one.
fn write_random(
    model: &ModelSpec,
    weights: &WeightSource,
    dir: &Path,
    device: DeviceSpec,
    progress: bool,
) -> Result<()> {
    let dtype = DType::F32;
    let tmp = dir.with_extension(format!("partial-{}", std::process::id()));
    let record = Recorder::default();
    let total = weights.payload_bytes(model.n_parameters(), dtype)?;
    let msg = format!(
        "making {} weights of {} (fp32) for the HF engine",
        weights.describe(),
        model.name
    );
    let status = Status::bytes(progress, Some(total), msg);
    let device = device.open()?;
    let loaded = model.load_watched(weights, dtype, &device, Some(record.clone()), status.bar())?;
    drop(loaded);
    let made = rate(status.bar().position(), status.elapsed());
    status.done(format!("made the weights: {made}; writing them"));
    let tensors = std::mem::take(&mut *record.lock().expect("recorder lock"));
    save_checkpoint(&tmp, &model.hf_config(dtype), tensors)?;
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .map_err(|e| Error::io(format!("replacing {}", dir.display()), e))?;
    }
    std::fs::rename(&tmp, dir)
        .map_err(|e| Error::io(format!("moving weights to {}", dir.display()), e))
}
