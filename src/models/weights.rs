//! Where a model's tensors come from. Both sources sit behind candle's `SimpleBackend`, so a
//! model's `load(vb, cfg)` walks the same checkpoint paths for real checkpoints and for random
//! weights: the random path exercises exactly the loading code a real checkpoint uses.
//!
//! - [`CheckpointWeights`]: an HF model directory, `model.safetensors` or the shards named by
//!   `model.safetensors.index.json`, memory-mapped and moved to the device tensor by tensor.
//! - [`RandomInit`]: HF's init (the `Init` hint each layer passes: normal(0, initializer_range),
//!   ones, zeros), generated on the target device, one tensor at a time, then cast to the
//!   target dtype. Each tensor's stream is seeded from (seed, tensor name), so a tensor's values
//!   do not depend on load order. CPU and CUDA use different generators: the same seed gives
//!   the same weights on every run on the same kind of device, not across kinds.

use super::shard::{NarrowSource, Sharded, Slices, SplitRule};
use crate::error::{Error, Result};
use candle_core::safetensors::{Load, MmapedSafetensors};
use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{Init, VarBuilder};
use indicatif::ProgressBar;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Tensors a [`RandomInit`] handed out, by checkpoint name, so they can be written back as a
/// checkpoint (`--save-weights`).
pub type Recorder = Arc<Mutex<Vec<(String, Tensor)>>>;

/// Where to take the weights from (`--weights random --seed N` or `--model-dir DIR`).
#[derive(Clone, Debug)]
pub enum WeightSource {
    Random { seed: u64 },
    Dir(PathBuf),
}

impl WeightSource {
    /// A builder over these weights. `prefixes` are tried in order in front of every tensor
    /// name (HF checkpoints name GPT-2's tensors `h.0…` or `transformer.h.0…`).
    /// With `record`, random tensors are also kept there.
    pub fn var_builder(
        &self,
        dtype: DType,
        device: &Device,
        prefixes: &'static [&'static str],
        record: Option<Recorder>,
    ) -> Result<VarBuilder<'static>> {
        let backend = self.backend(prefixes, record)?;
        Ok(VarBuilder::from_backend(backend, dtype, device.clone()))
    }

    /// What rank `rank` of a `size`-way tensor-parallel group holds of these weights: the
    /// tensors `rule` splits are sliced (see [`super::shard`]); with `size == 1` all of them.
    /// `progress` counts the bytes of every tensor handed out: what the checkpoint stores of
    /// it (this rank's slices), or what random init made.
    pub fn sharded_backend(
        &self,
        prefixes: &'static [&'static str],
        (rank, size): (usize, usize),
        rule: SplitRule,
        progress: &ProgressBar,
    ) -> Result<Box<dyn SimpleBackend>> {
        Ok(match self {
            WeightSource::Random { seed } => Box::new(Sharded {
                inner: RandomInit::new(*seed, None, progress),
                rank,
                size,
                rule,
            }),
            WeightSource::Dir(dir) => Box::new(Sharded {
                inner: CheckpointWeights::open(dir, prefixes)?.with_progress(progress),
                rank,
                size,
                rule,
            }),
        })
    }

    /// The tensor source behind [`WeightSource::var_builder`].
    pub fn backend(
        &self,
        prefixes: &'static [&'static str],
        record: Option<Recorder>,
    ) -> Result<Box<dyn SimpleBackend>> {
        self.backend_watched(prefixes, record, &ProgressBar::hidden())
    }

    /// [`WeightSource::backend`], counting bytes on `progress` as
    /// [`WeightSource::sharded_backend`] does.
    pub fn backend_watched(
        &self,
        prefixes: &'static [&'static str],
        record: Option<Recorder>,
        progress: &ProgressBar,
    ) -> Result<Box<dyn SimpleBackend>> {
        Ok(match self {
            WeightSource::Random { seed } => Box::new(RandomInit::new(*seed, record, progress)),
            WeightSource::Dir(dir) => {
                Box::new(CheckpointWeights::open(dir, prefixes)?.with_progress(progress))
            }
        })
    }

    /// The bytes a whole (single-rank) load hands out, for a progress bar's length: the
    /// safetensors payload of a checkpoint, or `n_parameters` in `dtype` for random weights.
    pub fn payload_bytes(&self, n_parameters: usize, dtype: DType) -> Result<u64> {
        match self {
            WeightSource::Random { .. } => Ok((n_parameters * dtype.size_in_bytes()) as u64),
            WeightSource::Dir(dir) => safetensors_files(dir)?
                .iter()
                .map(|f| safetensors_payload(f))
                .sum(),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            WeightSource::Random { seed } => format!("random (seed {seed})"),
            WeightSource::Dir(dir) => dir.display().to_string(),
        }
    }
}

/// The safetensors files of an HF model directory. Pickle checkpoints (`*.bin`, `*.pt`) are
/// refused: unpickling can execute arbitrary code.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index)
            .map_err(|e| Error::io(format!("reading {}", index.display()), e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: invalid JSON: {e}", index.display())))?;
        let map = json["weight_map"].as_object().ok_or_else(|| {
            Error::Config(format!("{}: no \"weight_map\" object", index.display()))
        })?;
        let mut files: Vec<PathBuf> = map
            .values()
            .filter_map(|v| v.as_str())
            .map(|f| dir.join(f))
            .collect();
        files.sort();
        files.dedup();
        return Ok(files);
    }
    let pickles: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(format!("reading model dir {}", dir.display()), e))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".bin") || n.ends_with(".pt") || n.ends_with(".pth"))
        .collect();
    if !pickles.is_empty() {
        return Err(Error::Unsupported(format!(
            "{} has only pickle checkpoints ({}), which can execute code when loaded: convert them to safetensors first (transformers: model.save_pretrained(OUT, safe_serialization=True))",
            dir.display(),
            pickles.join(", ")
        )));
    }
    Err(Error::NotFound {
        what: "model.safetensors".into(),
        path: dir.to_path_buf(),
        hint: "a model dir needs config.json and model.safetensors (or model.safetensors.index.json with its shards)".into(),
    })
}

/// Bytes of tensor data in one safetensors file: the file less its 8-byte header length and
/// the JSON header.
pub fn safetensors_payload(file: &Path) -> Result<u64> {
    use std::io::Read;
    let bad = |e: std::io::Error| Error::io(format!("reading {}", file.display()), e);
    let mut f = std::fs::File::open(file).map_err(bad)?;
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(bad)?;
    let len = f.metadata().map_err(bad)?.len();
    len.checked_sub(8 + u64::from_le_bytes(n)).ok_or_else(|| {
        Error::Config(format!(
            "{}: not a safetensors file (its header is longer than the file)",
            file.display()
        ))
    })
}

/// Writes `config.json` and `model.safetensors` into `dir`. Names get the `transformer.`
/// prefix of HF's `*ForCausalLM` classes (the LM head, when untied, keeps its own name).
pub fn save_checkpoint(
    dir: &Path,
    config: &serde_json::Value,
    tensors: Vec<(String, Tensor)>,
) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let named: std::collections::HashMap<String, Tensor> = tensors
        .into_iter()
        .map(|(n, t)| {
            if n.starts_with("lm_head.") {
                (n, t)
            } else {
                (format!("transformer.{n}"), t)
            }
        })
        .collect();
    let path = dir.join("model.safetensors");
    // `format: pt` is the metadata transformers' save_pretrained writes and its loader checks.
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::tensor::serialize_to_file(named, Some(metadata), &path)
        .map_err(|e| Error::Config(format!("writing {}: {e}", path.display())))?;
    let text = serde_json::to_string_pretty(config).expect("config serializes");
    std::fs::write(dir.join("config.json"), text)
        .map_err(|e| Error::io(format!("writing {}/config.json", dir.display()), e))
}

/// Memory-mapped safetensors of one model directory.
pub struct CheckpointWeights {
    dir: PathBuf,
    tensors: MmapedSafetensors,
    prefixes: &'static [&'static str],
    /// Counts the stored bytes of every tensor read.
    progress: ProgressBar,
}

impl CheckpointWeights {
    pub fn open(dir: &Path, prefixes: &'static [&'static str]) -> Result<Self> {
        let files = safetensors_files(dir)?;
        // SAFETY: the files are mapped read-only; a file changed by another process while we
        // run could change tensor contents, which is the same contract as every mmap loader
        // (candle, safetensors-python) and cannot cause memory unsafety in our reads.
        let tensors = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| {
            Error::Config(format!("cannot read safetensors in {}: {e}", dir.display()))
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            tensors,
            prefixes,
            progress: ProgressBar::hidden(),
        })
    }

    /// Counts the stored bytes of every tensor read on `progress`.
    pub fn with_progress(self, progress: &ProgressBar) -> Self {
        Self {
            progress: progress.clone(),
            ..self
        }
    }

    /// The stored name of `name` and its view, checked against the shape the model expects.
    fn view(
        &self,
        name: &str,
        s: &Shape,
    ) -> candle_core::Result<(String, safetensors::tensor::TensorView<'_>)> {
        let stored = self.resolve(name).ok_or_else(|| {
            candle_core::Error::wrap(Error::MissingTensor {
                tensor: name.to_string(),
                dir: self.dir.clone(),
            })
        })?;
        let view = self.tensors.get(&stored)?;
        if view.shape() != s.dims() {
            return Err(candle_core::Error::wrap(Error::ShapeMismatch {
                tensor: stored,
                expected: s.dims().to_vec(),
                got: view.shape().to_vec(),
            }));
        }
        Ok((stored, view))
    }

    /// The stored name of `name`, trying each prefix.
    fn resolve(&self, name: &str) -> Option<String> {
        self.prefixes
            .iter()
            .map(|p| format!("{p}{name}"))
            .find(|n| self.tensors.get(n).is_ok())
    }
}

impl SimpleBackend for CheckpointWeights {
    fn get(
        &self,
        s: Shape,
        name: &str,
        _: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let (stored, view) = self.view(name, &s)?;
        self.progress.inc(view.data().len() as u64);
        // Converts on the device: the host only holds the mapped file.
        self.tensors.load(&stored, dev)?.to_dtype(dtype)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let stored = self.resolve(name).unwrap_or_else(|| name.to_string());
        self.progress
            .inc(self.tensors.get(&stored)?.data().len() as u64);
        self.tensors.load(&stored, dev)?.to_dtype(dtype)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.resolve(name).is_some()
    }
}

/// Reads only the slices: a rank of a tensor-parallel group touches its share of the file.
impl NarrowSource for CheckpointWeights {
    fn get_slices(
        &self,
        full: Shape,
        name: &str,
        _: Init,
        dtype: DType,
        dev: &Device,
        slices: Slices,
    ) -> candle_core::Result<Tensor> {
        let Slices { dim, ranges } = slices;
        use safetensors::slice::TensorIndexer::Narrow;
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let (stored, view) = self.view(name, &full)?;
        let bad = |e: String| candle_core::Error::Msg(format!("slicing {stored}: {e}"));
        let one = std::num::NonZeroUsize::MIN;
        let pieces = ranges
            .iter()
            .map(|r| {
                let index: Vec<_> = (0..view.shape().len())
                    .map(|d| match d == dim {
                        true => Narrow(Included(r.start), Excluded(r.end), one),
                        false => Narrow(Unbounded, Unbounded, one),
                    })
                    .collect();
                let bytes: Vec<u8> = view
                    .sliced_data(&index)
                    .map_err(|e| bad(format!("{e:?}")))?
                    .flatten()
                    .copied()
                    .collect();
                self.progress.inc(bytes.len() as u64);
                let mut shape = view.shape().to_vec();
                shape[dim] = r.len();
                safetensors::tensor::TensorView::new(view.dtype(), shape, &bytes)
                    .map_err(|e| bad(e.to_string()))?
                    .load(dev)?
                    .to_dtype(dtype)
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Tensor::cat(&pieces, dim)
    }
}

/// Random weights: generated whole from the tensor's seed, then sliced, so each rank holds
/// exactly the values a single-GPU run has.
impl NarrowSource for RandomInit {}

/// Random weights with the init each layer asks for (HF's `_init_weights`).
pub struct RandomInit {
    pub seed: u64,
    pub record: Option<Recorder>,
    /// Counts the bytes of every tensor made.
    pub progress: ProgressBar,
}

impl RandomInit {
    pub fn new(seed: u64, record: Option<Recorder>, progress: &ProgressBar) -> Self {
        Self {
            seed,
            record,
            progress: progress.clone(),
        }
    }
}

/// The seed of one tensor's stream: FNV-1a of its name, mixed with the run's seed.
pub fn tensor_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

fn randn(
    seed: u64,
    shape: &Shape,
    mean: f64,
    std: f64,
    dev: &Device,
) -> candle_core::Result<Tensor> {
    match dev {
        Device::Cpu => {
            use rand::SeedableRng;
            use rand_distr::Distribution;
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let normal = rand_distr::Normal::new(mean as f32, std as f32)
                .map_err(candle_core::Error::wrap)?;
            let data: Vec<f32> = (0..shape.elem_count())
                .map(|_| normal.sample(&mut rng))
                .collect();
            Tensor::from_vec(data, shape, dev)
        }
        // curand, seeded per tensor; generated in f32 on the device (curand has no bf16/f16).
        _ => {
            dev.set_seed(seed)?;
            Tensor::randn(mean as f32, std as f32, shape, dev)
        }
    }
}

impl SimpleBackend for RandomInit {
    fn get(
        &self,
        s: Shape,
        name: &str,
        h: Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let t = match h {
            Init::Const(0.) => Tensor::zeros(s, dtype, dev)?,
            Init::Const(v) => Tensor::full(v as f32, s, dev)?.to_dtype(dtype)?,
            Init::Randn { mean, stdev } => {
                randn(tensor_seed(self.seed, name), &s, mean, stdev, dev)?.to_dtype(dtype)?
            }
            other => candle_core::bail!("random init {other:?} of '{name}' is not supported"),
        };
        self.progress
            .inc((t.elem_count() * t.dtype().size_in_bytes()) as u64);
        if let Some(r) = &self.record {
            r.lock()
                .expect("recorder lock")
                .push((name.to_string(), t.clone()));
        }
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        candle_core::bail!("random weights need a shape for '{name}'")
    }

    fn contains_tensor(&self, _name: &str) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(seed: u64, name: &str, init: Init) -> Vec<f32> {
        RandomInit::new(seed, None, &ProgressBar::hidden())
            .get(Shape::from((4, 8)), name, init, DType::F32, &Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    #[test]
    fn random_weights_depend_on_seed_and_name_only() {
        let randn = Init::Randn {
            mean: 0.,
            stdev: 0.02,
        };
        assert_eq!(
            get(7, "h.0.attn.c_attn.weight", randn),
            get(7, "h.0.attn.c_attn.weight", randn)
        );
        assert_ne!(
            get(7, "h.0.attn.c_attn.weight", randn),
            get(8, "h.0.attn.c_attn.weight", randn)
        );
        assert_ne!(
            get(7, "h.0.attn.c_attn.weight", randn),
            get(7, "h.1.attn.c_attn.weight", randn)
        );
    }

    #[test]
    fn random_init_follows_the_hint() {
        assert!(get(0, "ln_f.weight", Init::Const(1.))
            .iter()
            .all(|&v| v == 1.));
        assert!(get(0, "ln_f.bias", Init::Const(0.))
            .iter()
            .all(|&v| v == 0.));
        let big = RandomInit::new(3, None, &ProgressBar::hidden())
            .get(
                Shape::from(100_000),
                "w",
                Init::Randn {
                    mean: 0.,
                    stdev: 0.02,
                },
                DType::F32,
                &Device::Cpu,
            )
            .unwrap();
        let std: f32 = big
            .sqr()
            .unwrap()
            .mean_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
            .sqrt();
        assert!((std - 0.02).abs() < 0.0005, "std {std}");
    }
}
