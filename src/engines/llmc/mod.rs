//! The llmc engine: karpathy/llm.c's `train_gpt2cu` as an external process, a reference for the
//! training suite. `bench` writes the suite's blocks as llm.c token files ([`token_file`]),
//! runs the binary from scratch with the suite's shape and schedule ([`setup`]), and reads its
//! stdout as it prints ([`output`]): each `step N/M | loss … | … ms | …` line becomes the
//! step [`crate::engines::Stepwise::step`] returns, so the scenario logs, times (warm-up left out)
//! and summarizes llm.c's steps as it does candle's and HF's ([`train`]).
//!
//! What is not the suite's: llm.c draws its own batches (B consecutive blocks of the token
//! file, in its own seeded order), initializes its own weights (seed 42, not `--seed`), has no
//! dropout, and its AdamW has betas 0.9 / 0.95. Its step time is its own (CUDA events around
//! forward, backward and update). Its output, whole, stays in the work folder named in the log
//! header (`engine_info.workdir`); the token files are deleted after a run that succeeded.

pub mod output;
pub mod setup;
pub mod token_file;
pub mod train;

use super::Engine;
use crate::device::{DeviceSpec, Precision};
use crate::error::{Error, Result};
use crate::models::{ModelSpec, WeightSource};
use crate::record::Hyper;
use crate::trackers::MemoryReading;
use output::{parse_line, Line};
pub use setup::LlmcOptions;
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Instant;

/// GPT-2's `<|endoftext|>`, which closes each token file.
const GPT2_EOT: u32 = 50256;
/// Lines of output kept for error messages.
const TAIL: usize = 20;

/// How an llm.c run is set up: the suite's model, precision, shape, schedule and blocks.
pub struct LlmcSetup<'a> {
    pub opts: &'a LlmcOptions,
    pub model: &'a ModelSpec,
    pub weights: &'a WeightSource,
    pub precision: Precision,
    pub device: DeviceSpec,
    pub hyper: &'a Hyper,
    pub batch_size: usize,
    pub block_size: usize,
    pub train_blocks: &'a [Vec<u32>],
    pub eval_blocks: &'a [Vec<u32>],
}

/// A running `train_gpt2cu` and what its output has said so far.
pub struct LlmcEngine {
    child: Child,
    lines: Receiver<String>,
    tail: VecDeque<String>,
    workdir: PathBuf,
    info: BTreeMap<String, String>,
    load_seconds: f64,
    device_memory_mib: Option<u64>,
    total_steps: usize,
    steps_done: usize,
    /// The last `val loss` and the steps done when it was printed.
    val_loss: Option<(usize, f64)>,
    /// Read to the end and exited 0.
    succeeded: bool,
}

/// What a run starts: the binary, its arguments and its work folder (token files written).
struct Launch {
    bin: PathBuf,
    args: Vec<String>,
    workdir: PathBuf,
    descriptor: &'static str,
    val_batches: usize,
}

/// Checks the run, writes the token files into a fresh work folder, builds the arguments.
fn prepare(s: &LlmcSetup) -> Result<Launch> {
    let bin = s.opts.binary()?;
    let descriptor = setup::check(s.model, s.precision, s.device, s.weights)?;
    let val_batches = s.eval_blocks.len() / s.batch_size;
    if val_batches == 0 || s.train_blocks.len() < s.batch_size {
        return Err(Error::Config(format!(
            "llm.c reads whole batches of --batch-size {} blocks: the data has {} train and {} eval blocks; lower --batch-size or --block-size",
            s.batch_size,
            s.train_blocks.len(),
            s.eval_blocks.len()
        )));
    }
    let workdir = work_folder()?;
    let (train, val) = (workdir.join("train.bin"), workdir.join("val.bin"));
    token_file::write_blocks(&train, s.train_blocks, GPT2_EOT)?;
    token_file::write_blocks(&val, s.eval_blocks, GPT2_EOT)?;
    let shape = setup::RunShape {
        descriptor,
        batch_size: s.batch_size,
        block_size: s.block_size,
        hyper: s.hyper,
        val_batches,
    };
    let args = setup::arguments(&shape, &train, &val, &workdir.join("out"));
    Ok(Launch {
        bin,
        args,
        workdir,
        descriptor,
        val_batches,
    })
}

/// The log header's `engine_info`: what ran, where its output is, and what is llm.c's own.
fn describe(l: &Launch, batch_size: usize, line_buffered: bool) -> BTreeMap<String, String> {
    let own = [
        (
            "init",
            "llm.c's random init (seed 42; --seed does not apply)",
        ),
        (
            "data_order",
            "llm.c's loader: batches of B consecutive blocks of train.bin, in its own seeded order",
        ),
        (
            "optimizer",
            "llm.c's AdamW (betas 0.9/0.95, eps 1e-8), gradient clip 1.0, no dropout",
        ),
    ];
    let mut info: BTreeMap<String, String> = own
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    info.insert("binary".into(), l.bin.display().to_string());
    info.insert("args".into(), l.args.join(" "));
    info.insert("model".into(), l.descriptor.into());
    info.insert("workdir".into(), l.workdir.display().to_string());
    info.insert("line_buffered".into(), line_buffered.to_string());
    let eval = format!(
        "llm.c's val loss over {} batches of {batch_size} blocks",
        l.val_batches
    );
    info.insert("eval".into(), eval);
    info
}

impl LlmcEngine {
    /// Writes the token files, starts llm.c and waits until it has allocated everything (its
    /// `device memory usage` line): the load time.
    pub fn start(s: LlmcSetup) -> Result<Self> {
        let launch = prepare(&s)?;
        let load = Instant::now();
        let (child, lines, line_buffered) = spawn(&launch.bin, &launch.args, &launch.workdir)?;
        let mut engine = Self {
            child,
            lines,
            tail: VecDeque::new(),
            info: describe(&launch, s.batch_size, line_buffered),
            workdir: launch.workdir,
            load_seconds: 0.,
            device_memory_mib: None,
            total_steps: s.hyper.total_steps,
            steps_done: 0,
            val_loss: None,
            succeeded: false,
        };
        engine.wait_until_allocated()?;
        engine.load_seconds = load.elapsed().as_secs_f64();
        Ok(engine)
    }

    /// Reads llm.c's set-up lines up to `device memory usage` (printed once the weights,
    /// gradients, optimizer state and activations are allocated).
    fn wait_until_allocated(&mut self) -> Result<()> {
        while self.device_memory_mib.is_none() {
            let Some(line) = self.next_line() else {
                return Err(self.ended("before training"));
            };
            self.note(&line);
        }
        Ok(())
    }

    /// The next line of llm.c's output; None once it closed its output (exited).
    fn next_line(&mut self) -> Option<String> {
        let line = self.lines.recv().ok()?;
        if self.tail.len() == TAIL {
            self.tail.pop_front();
        }
        self.tail.push_back(line.clone());
        Some(line)
    }

    /// Keeps what a line other than a step says.
    fn note(&mut self, line: &str) {
        match parse_line(line) {
            Some(Line::ValLoss(v)) => self.val_loss = Some((self.steps_done, v)),
            Some(Line::DeviceMemory { used_mib, .. }) => self.device_memory_mib = Some(used_mib),
            _ => {}
        }
    }

    /// The error of a run whose output ended `when`: its exit status and its last lines.
    fn ended(&mut self, when: &str) -> Error {
        let status = self
            .child
            .wait()
            .map(|s| s.to_string())
            .unwrap_or_else(|e| e.to_string());
        let last: Vec<&str> = self
            .tail
            .iter()
            .rev()
            .take(5)
            .rev()
            .map(String::as_str)
            .collect();
        Error::Engine(format!(
            "llm.c ended ({status}) {when}, after step {} of {}: {} (whole output: {})",
            self.steps_done,
            self.total_steps,
            last.join(" | "),
            self.workdir.join("output.log").display()
        ))
    }
}

/// A fresh folder for one run's token files and output, under the system's temporary folder
/// (not the log folder: `extract-metrics` reads every file there).
fn work_folder() -> Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!(
        "transformer-bench-llmc-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating llm.c's work folder {}", dir.display()), e))?;
    Ok(dir)
}

/// `stdbuf` on PATH: llm.c's printf is block-buffered into a pipe; `stdbuf -oL` makes it
/// print each line as it happens (progress, and nothing lost if it aborts).
fn stdbuf() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("stdbuf"))
        .find(|p| p.is_file())
}

/// Starts `bin args` in `workdir` (llm.c looks for its tokenizer and HellaSwag files in the
/// current folder) with stdout and stderr merged into one pipe; a thread copies each line to
/// `workdir/output.log` and hands it on.
fn spawn(bin: &Path, args: &[String], workdir: &Path) -> Result<(Child, Receiver<String>, bool)> {
    let mut cmd = match stdbuf() {
        Some(sb) => {
            let mut c = Command::new(sb);
            c.arg("-oL").arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let line_buffered = cmd.get_program() != bin.as_os_str();
    let (reader, writer) =
        std::io::pipe().map_err(|e| Error::io("creating a pipe for llm.c", e))?;
    let writer2 = writer
        .try_clone()
        .map_err(|e| Error::io("creating a pipe for llm.c", e))?;
    let child = cmd
        .args(args)
        .current_dir(workdir)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(writer2)
        .spawn()
        .map_err(|e| Error::io(format!("starting llm.c ({})", bin.display()), e))?;
    // The child holds the pipe's write ends now; ours are dropped with `cmd`.
    drop(cmd);
    let mut copy = std::fs::File::create(workdir.join("output.log"))
        .map_err(|e| Error::io("creating llm.c's output.log", e))?;
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines().map_while(|l| l.ok()) {
            let _ = writeln!(copy, "{line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok((child, rx, line_buffered))
}

impl Engine for LlmcEngine {
    fn name(&self) -> &'static str {
        "llmc"
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

    /// llm.c allocates everything before its first step: the device memory in use then is its
    /// peak (the whole GPU's, as cudaMemGetInfo counts it).
    fn finish(&mut self) -> Result<MemoryReading> {
        let used = self.device_memory_mib.map(|m| m << 20);
        Ok(MemoryReading {
            peak_bytes: used.unwrap_or(0),
            device_used_bytes: used,
            pool_reserved_bytes: None,
        })
    }
}

impl Drop for LlmcEngine {
    fn drop(&mut self) {
        // A run that ends early must not leave llm.c (and its GPU memory) behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // The token files can be written again; a failed run keeps them for a look.
        if self.succeeded {
            for f in ["train.bin", "val.bin"] {
                let _ = std::fs::remove_file(self.workdir.join(f));
            }
        }
    }
}
