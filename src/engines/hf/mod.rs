//! The HF engine: transformers + PyTorch in a Python worker (`src/engines/hf/worker.py`, embedded
//! in the binary), driven over JSON lines on its stdin/stdout. Its stderr is kept (last lines)
//! to explain a crash. Its ops: `score.rs`, `generate.rs`, `train.rs`, and `serve.rs` (the serving
//! suite's whole load, replayed by the worker on its clock).

pub mod generate;
pub mod open;
pub mod score;
pub mod serve;
pub mod train;

use super::Engine;
use crate::device::{DeviceSpec, Precision};
use crate::error::{Error, Result};
use crate::trackers::MemoryReading;
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};

/// The worker script, run with `python -c`.
pub const WORKER: &str = include_str!("worker.py");

/// Lines of the worker's stderr kept for error messages (torchrun's summary of a failed rank
/// alone is about 15).
const STDERR_TAIL: usize = 60;

/// `--hf-attn`: transformers' attention implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HfAttn {
    /// Time every attention the model has on the run's first batches and keep the fastest
    /// (with `--hf-compile best`, compiled and not: every pair is a candidate).
    Best,
    /// sdpa where the model supports it, else eager.
    Auto,
    Eager,
    Sdpa,
}

impl HfAttn {
    pub fn as_str(self) -> &'static str {
        match self {
            HfAttn::Best => "best",
            HfAttn::Auto => "auto",
            HfAttn::Eager => "eager",
            HfAttn::Sdpa => "sdpa",
        }
    }
}

/// `--hf-compile`: HF under torch.compile (scoring: the body with dynamic shapes; generation:
/// a static KV cache; training: the whole model, as HF Trainer's torch_compile=True).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HfCompile {
    /// Inference: compiled and not are both candidates of the probe; training: off.
    Best,
    On,
    Off,
}

impl HfCompile {
    pub fn as_str(self) -> &'static str {
        match self {
            HfCompile::Best => "best",
            HfCompile::On => "on",
            HfCompile::Off => "off",
        }
    }
}

/// `--hf-config`: one HF configuration named whole (`sdpa+compile`), or `best`.
pub fn parse_hf_config(s: &str) -> std::result::Result<(HfAttn, HfCompile), String> {
    use clap::ValueEnum;
    let (attn, compile) = match s.strip_suffix("+compile") {
        Some(attn) => (attn, HfCompile::On),
        None if s == "best" => (s, HfCompile::Best),
        None => (s, HfCompile::Off),
    };
    let attn = HfAttn::from_str(attn, true)
        .ok()
        .filter(|a| *a != HfAttn::Auto && (*a != HfAttn::Best || compile == HfCompile::Best))
        .ok_or_else(|| format!("'{s}': one of best, eager, sdpa, eager+compile, sdpa+compile"))?;
    Ok((attn, compile))
}

/// One candidate of the probe as the worker timed it: its cold and warm latencies of the probe
/// requests, the predicted cost of a timed batch, its compilations, or why it could not run.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
pub struct Candidate {
    pub attn: String,
    pub compile: bool,
    #[serde(default)]
    pub cold_ms: Vec<f64>,
    #[serde(default)]
    pub warm_ms: Vec<f64>,
    #[serde(default)]
    pub per_batch_ms: Option<f64>,
    #[serde(default)]
    pub compiles_cold: u64,
    #[serde(default)]
    pub compiles_warm: u64,
    #[serde(default)]
    pub error: Option<String>,
}

impl Candidate {
    /// `sdpa+compile` or `eager`.
    pub fn label(&self) -> String {
        format!(
            "{}{}",
            self.attn,
            if self.compile { "+compile" } else { "" }
        )
    }
}

/// The worker's answer to `choose`: the configuration it kept and every candidate's timings,
/// or why there was nothing to time (one candidate).
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
pub struct ConfigChoice {
    pub attn: String,
    pub compile: bool,
    #[serde(default)]
    pub candidates: Vec<Candidate>,
    #[serde(default)]
    pub cold_share: f64,
    #[serde(default)]
    pub note: Option<String>,
}

impl ConfigChoice {
    /// Parses the worker's reply.
    pub fn from_reply(v: &Value) -> Result<Self> {
        serde_json::from_value(v.clone()).map_err(|e| {
            Error::Engine(format!(
                "HF worker's choose reply is not a configuration choice ({e}): {v}"
            ))
        })
    }

    /// `best of eager 1.25 ms, eager+compile 0.80 ms, … a batch (cold share 0.00)`, or the
    /// note (one candidate).
    pub fn describe(&self) -> String {
        if self.candidates.is_empty() {
            return format!("best: {}", self.note.as_deref().unwrap_or("one candidate"));
        }
        let each: Vec<String> = self
            .candidates
            .iter()
            .map(|c| match (c.per_batch_ms, &c.error) {
                (Some(ms), _) => format!("{} {ms:.2} ms", c.label()),
                (None, Some(e)) => format!("{} failed ({e})", c.label()),
                (None, None) => format!("{} not timed", c.label()),
            })
            .collect();
        format!(
            "best of {} a batch (cold share {:.2})",
            each.join(", "),
            self.cold_share
        )
    }
}

#[derive(Clone, Debug)]
pub struct HfOptions {
    /// Python interpreter: `--python`, else `$BENCH_PYTHON`, else `python3`.
    pub python: Option<PathBuf>,
    pub attn: HfAttn,
    pub compile: HfCompile,
    /// A worker script to run instead of the embedded one (development and tests).
    pub worker: Option<PathBuf>,
}

impl HfOptions {
    /// The interpreter the worker runs in.
    pub fn python(&self) -> PathBuf {
        self.python
            .clone()
            .or_else(|| std::env::var_os("BENCH_PYTHON").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("python3"))
    }
}

pub struct HfEngine {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// Says when the stderr thread has read the pipe to its end.
    stderr_done: std::sync::mpsc::Receiver<()>,
    info: BTreeMap<String, String>,
    pub(crate) max_positions: usize,
    load_seconds: f64,
    /// Inference with more than one candidate configuration (`--hf-attn best`, `--hf-compile
    /// best`): it is chosen on the run's first batches ([`HfEngine::choose`]).
    choose: bool,
    /// torch.compile's compilations the worker reported over the scoring / generation calls.
    compiles: u64,
    /// `--hf-attn` and `--hf-compile` as given: what [`HfEngine::choose`] may choose between.
    requested: (HfAttn, HfCompile),
    /// The worker runs under torchrun in a process group of its own (training strategies).
    group: bool,
    /// The worker script written for torchrun (removed with the engine).
    script: Option<PathBuf>,
}

/// The embedded worker written to a file of its own, for torchrun (which runs a script).
fn worker_file() -> Result<PathBuf> {
    let path = std::env::temp_dir().join(format!(
        "transformer-bench-worker-{}.py",
        std::process::id()
    ));
    std::fs::write(&path, WORKER)
        .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
    Ok(path)
}

impl HfEngine {
    /// Checks that the worker starts and imports torch + transformers, before any weights are
    /// written for it; returns their versions.
    pub fn preflight(opts: &HfOptions) -> Result<BTreeMap<String, String>> {
        let reply = Self::spawn(opts, None)?.request(&json!({ "op": "hello" }))?;
        Ok(versions(&reply))
    }

    /// Starts the worker and loads `model_dir` (an HF checkpoint) on `device` in `precision`.
    pub fn start(
        opts: &HfOptions,
        model_dir: &Path,
        precision: Precision,
        device: DeviceSpec,
    ) -> Result<Self> {
        Self::start_with(opts, model_dir, precision, device, None)
    }

    /// As [`HfEngine::start`], for training: fp32 weights, `model.train()`, and the worker's
    /// optimizer, schedule and (fp16) grad scaler built from `train` (see `src/engines/hf/worker.py`).
    pub fn start_training(
        opts: &HfOptions,
        model_dir: &Path,
        precision: Precision,
        device: DeviceSpec,
        train: Value,
    ) -> Result<Self> {
        Self::start_with(opts, model_dir, precision, device, Some(train))
    }

    fn start_with(
        opts: &HfOptions,
        model_dir: &Path,
        precision: Precision,
        device: DeviceSpec,
        train: Option<Value>,
    ) -> Result<Self> {
        // A training strategy over N GPUs (`train.parallel`): the worker under torchrun.
        let ranks = train
            .as_ref()
            .and_then(|t| t["parallel"]["size"].as_u64())
            .map(|n| n as usize);
        let device = match device {
            DeviceSpec::Cpu => "cpu".to_string(),
            DeviceSpec::Cuda(n) => format!("cuda:{n}"),
        };
        let mut engine = Self::spawn(opts, ranks.map(|n| (n, device.as_str())))?;
        // A training step changes the weights, so `best` has nothing to time there: auto's
        // choice (sdpa where the model has it), compiled only when asked.
        let training = train.is_some();
        let attn = match opts.attn {
            HfAttn::Best if training => HfAttn::Auto,
            a => a,
        };
        let compiled = opts.compile == HfCompile::On;
        let mut load = json!({
            "op": "load",
            "model_dir": model_dir,
            "dtype": precision.as_str(),
            "device": device,
            "attn": attn.as_str(),
            "compile": compiled,
        });
        if let Some(train) = train {
            load["train"] = train;
        }
        let reply = engine.request(&load)?;
        engine.info = versions(&reply);
        engine
            .info
            .insert("attn".into(), reply["attn"].as_str().unwrap_or("?").into());
        engine
            .info
            .insert("attn_requested".into(), opts.attn.as_str().into());
        if opts.attn == HfAttn::Best && training {
            let why = "auto: training is not timed (a step changes the weights)";
            engine.info.insert("attn_chosen_by".into(), why.into());
        }
        engine.choose = !training && (attn == HfAttn::Best || opts.compile == HfCompile::Best);
        engine.requested = (attn, opts.compile);
        engine.info.insert("compile".into(), compiled.to_string());
        engine
            .info
            .insert("compile_requested".into(), opts.compile.as_str().into());
        if let Some(t) = load.get("train") {
            let recompute = match t["recompute"].as_bool() {
                Some(true) => "blocks",
                _ => "off",
            };
            engine.info.insert("recompute".into(), recompute.into());
            if let Some(s) = t["parallel"]["strategy"].as_str() {
                engine.info.insert("parallel".into(), s.into());
            }
        }
        engine.max_positions = reply["max_positions"].as_u64().unwrap_or(0) as usize;
        engine.load_seconds = reply["load_seconds"].as_f64().unwrap_or(0.);
        Ok(engine)
    }

    /// The worker; with `ranks` (N, device type) N of them under torchrun.
    fn spawn(opts: &HfOptions, ranks: Option<(usize, &str)>) -> Result<Self> {
        let python = opts.python();
        let mut cmd = Command::new(&python);
        let mut script = None;
        match (&opts.worker, ranks) {
            (Some(path), None) => cmd.arg(path),
            (None, None) => cmd.arg("-c").arg(WORKER),
            (given, Some((n, device))) => {
                let path = match given {
                    Some(p) => p.clone(),
                    None => script.insert(worker_file()?).clone(),
                };
                // One process a GPU; its own process group, so that ending the run ends every
                // rank (torchrun's workers are its children, not ours).
                use std::os::unix::process::CommandExt;
                cmd.args(["-m", "torch.distributed.run", "--standalone"])
                    .arg(format!("--nproc_per_node={n}"))
                    .arg(path)
                    .env("NCCL_NVLS_ENABLE", "0")
                    .env(
                        "TB_WORKER_DEVICE",
                        if device == "cpu" { "cpu" } else { "cuda" },
                    )
                    .process_group(0)
            }
        };
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("PYTHONUNBUFFERED", "1")
            .spawn()
            .map_err(|e| {
                Error::Unsupported(format!(
                    "cannot start Python '{}' for the HF engine ({e}): install Python 3 with torch + transformers, or pass --python PATH (or set BENCH_PYTHON)",
                    python.display()
                ))
            })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let stderr = child.stderr.take().expect("piped stderr");
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let tail = stderr_tail.clone();
        let (done, stderr_done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                let mut t = tail.lock().expect("stderr tail lock");
                if t.len() == STDERR_TAIL {
                    t.pop_front();
                }
                t.push_back(line);
            }
            let _ = done.send(());
        });
        Ok(Self {
            child,
            stdin,
            stdout,
            stderr_tail,
            stderr_done,
            info: BTreeMap::new(),
            max_positions: 0,
            load_seconds: 0.,
            choose: false,
            compiles: 0,
            requested: (HfAttn::Auto, HfCompile::Off),
            group: ranks.is_some(),
            script,
        })
    }

    /// `--hf-attn best` / `--hf-compile best`: the worker times every candidate configuration
    /// on `probe` (score or generate requests, the first batch of each of the run's first
    /// padded lengths) and keeps the one with the lowest predicted cost of a timed batch, a
    /// share `cold_share` of which meet a shape the warm-up did not. The choice and every
    /// candidate's timings go into [`Engine::info`] (the log header). Nothing happens with
    /// one candidate.
    pub(crate) fn choose(
        &mut self,
        probe: Vec<Value>,
        cold_share: f64,
    ) -> Result<Option<ConfigChoice>> {
        if !self.choose || probe.is_empty() {
            return Ok(None);
        }
        let (attn, compile) = self.requested;
        let attns: Vec<&str> = match attn {
            HfAttn::Best => vec![], // every attention the model has
            _ => vec![self.info.get("attn").map_or("eager", |a| a.as_str())],
        };
        let compiles = match compile {
            HfCompile::Best => vec![false, true],
            c => vec![c == HfCompile::On],
        };
        let n = probe.len();
        let req = json!({ "op": "choose", "probe": probe, "attns": attns, "compiles": compiles,
                          "cold_share": cold_share });
        let choice = ConfigChoice::from_reply(&self.request(&req)?)?;
        self.info.insert("attn".into(), choice.attn.clone());
        self.info
            .insert("compile".into(), choice.compile.to_string());
        let batches = if n == 1 { "batch" } else { "batches" };
        let by = format!("{} ({n} probe {batches})", choice.describe());
        self.info.insert("attn_chosen_by".into(), by);
        for c in &choice.candidates {
            let label = c.label();
            if let Some(ms) = c.per_batch_ms {
                self.info
                    .insert(format!("probe_ms_{label}"), format!("{ms:.3}"));
            }
            let cold: f64 = c.cold_ms.iter().sum();
            self.info
                .insert(format!("probe_cold_ms_{label}"), format!("{cold:.1}"));
            let compiles = c.compiles_cold + c.compiles_warm;
            self.info
                .insert(format!("probe_compiles_{label}"), compiles.to_string());
        }
        Ok(Some(choice))
    }

    /// Counts the compilations a scoring or generation reply reports.
    pub(crate) fn count_compiles(&mut self, reply: &Value) {
        self.compiles += reply["compiles"].as_u64().unwrap_or(0);
    }

    /// Sends one request and reads its reply. A reply `{"ok": false}` or a dead worker is an
    /// error with the worker's own words (and the tail of its stderr when it died).
    pub(crate) fn request(&mut self, req: &Value) -> Result<Value> {
        let op = req["op"].as_str().unwrap_or("?").to_string();
        let mut line = req.to_string();
        line.push('\n');
        let sent = self
            .stdin
            .write_all(line.as_bytes())
            .and_then(|_| self.stdin.flush());
        let mut reply = String::new();
        let read = match sent {
            Ok(()) => self.stdout.read_line(&mut reply),
            Err(e) => Err(e),
        };
        match read {
            Ok(n) if n > 0 => {
                let v: Value = serde_json::from_str(&reply).map_err(|e| {
                    Error::Engine(format!(
                        "HF worker sent a line that is not JSON during '{op}' ({e}): {}",
                        reply.trim()
                    ))
                })?;
                if v["ok"].as_bool() == Some(true) {
                    Ok(v)
                } else {
                    Err(Error::Engine(format!(
                        "HF worker: {}",
                        v["error"].as_str().unwrap_or("unknown error")
                    )))
                }
            }
            _ => Err(self.crashed(&op)),
        }
    }

    fn crashed(&mut self, op: &str) -> Error {
        let status = self
            .child
            .wait()
            .map(|s| s.to_string())
            .unwrap_or_else(|e| e.to_string());
        // The stderr thread may still be draining the pipe: wait for its end, bounded (under
        // torchrun a grandchild can hold the pipe open after the worker is gone).
        let _ = self
            .stderr_done
            .recv_timeout(std::time::Duration::from_secs(5));
        let tail = self.stderr_tail.lock().expect("stderr tail lock");
        // Under torchrun a failing rank says `rank N: why` (worker.py) before torchrun's summary.
        let rank_said = tail
            .iter()
            .rev()
            .find(|l| l.starts_with("rank ") && l.contains(": "));
        let last: Vec<&str> = match rank_said {
            Some(line) => vec![line.as_str()],
            None => tail
                .iter()
                .rev()
                .take(5)
                .rev()
                .map(|s| s.as_str())
                .collect(),
        };
        Error::Engine(format!(
            "HF worker died ({status}) during '{op}': {}",
            last.join(" | ")
        ))
    }
}

/// The `versions` object of a worker reply, as strings.
fn versions(reply: &Value) -> BTreeMap<String, String> {
    reply["versions"]
        .as_object()
        .map(|v| {
            v.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

impl Engine for HfEngine {
    fn name(&self) -> &'static str {
        "hf"
    }

    fn info(&self) -> BTreeMap<String, String> {
        self.info.clone()
    }

    fn load_seconds(&self) -> f64 {
        self.load_seconds
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn compiles(&self) -> Option<u64> {
        Some(self.compiles)
    }

    fn finish(&mut self) -> Result<MemoryReading> {
        let v = self.request(&json!({ "op": "finish" }))?;
        let _ = self.child.wait();
        Ok(MemoryReading {
            peak_bytes: v["peak_memory_bytes"].as_u64().unwrap_or(0),
            device_used_bytes: v["device_memory_used_bytes"].as_u64(),
            pool_reserved_bytes: v["reserved_memory_bytes"].as_u64(),
        })
    }
}

impl Drop for HfEngine {
    fn drop(&mut self) {
        // A run that ends early must not leave the worker (and its GPU memory) behind.
        if let Ok(None) = self.child.try_wait() {
            match self.group {
                // SAFETY: kill(2) on the worker's own process group (torchrun and its ranks).
                true => unsafe {
                    libc::kill(-(self.child.id() as i32), libc::SIGKILL);
                },
                false => {
                    let _ = self.child.kill();
                }
            }
            let _ = self.child.wait();
        }
        if let Some(p) = &self.script {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `choose` reply as worker.py writes it (one JSON line).
    #[test]
    fn the_worker_s_configuration_choice_parses() {
        let line = r#"{"ok": true, "attn": "eager", "compile": true, "cold_share": 0.25, "candidates": [
            {"attn": "eager", "compile": false, "cold_ms": [3, 3], "warm_ms": [2, 2], "per_batch_ms": 2.25, "compiles_cold": 0, "compiles_warm": 0},
            {"attn": "eager", "compile": true, "cold_ms": [900, 4], "warm_ms": [1, 1], "per_batch_ms": 1.75, "compiles_cold": 2, "compiles_warm": 0},
            {"attn": "sdpa", "compile": true, "error": "BackendCompilerFailed: no C compiler"}]}"#;
        let choice = ConfigChoice::from_reply(&serde_json::from_str(line).unwrap()).unwrap();
        assert_eq!((choice.attn.as_str(), choice.compile), ("eager", true));
        assert_eq!(choice.candidates[1].label(), "eager+compile");
        assert_eq!(choice.candidates[1].compiles_cold, 2);
        assert_eq!(
            choice.describe(),
            "best of eager 2.25 ms, eager+compile 1.75 ms, sdpa+compile failed (BackendCompilerFailed: no C compiler) a batch (cold share 0.25)"
        );
        let one = r#"{"ok": true, "attn": "eager", "compile": false, "candidates": [], "note": "BloomForCausalLM in transformers 5.17.0: eager is the only candidate"}"#;
        let choice = ConfigChoice::from_reply(&serde_json::from_str(one).unwrap()).unwrap();
        assert_eq!(
            choice.describe(),
            "best: BloomForCausalLM in transformers 5.17.0: eager is the only candidate"
        );
        let bad = ConfigChoice::from_reply(&json!({"ok": true})).unwrap_err();
        assert!(
            bad.to_string().contains("not a configuration choice"),
            "{bad}"
        );
    }

    #[test]
    fn an_hf_configuration_is_named_whole() {
        let ok = |s: &str| parse_hf_config(s).unwrap();
        assert_eq!(ok("best"), (HfAttn::Best, HfCompile::Best));
        assert_eq!(ok("eager"), (HfAttn::Eager, HfCompile::Off));
        assert_eq!(ok("sdpa+compile"), (HfAttn::Sdpa, HfCompile::On));
        for bad in ["auto", "best+compile", "flash", "sdpa+jit", ""] {
            let err = parse_hf_config(bad).unwrap_err();
            assert!(err.contains("eager+compile"), "{bad}: {err}");
        }
    }
}
