//! The llmc engine behind the [`Train`] capability: each `step` is the next step line llm.c
//! prints, `eval` its last `val loss`.

use super::output::{parse_line, Line, StepLine};
use super::LlmcEngine;
use crate::engines::{train_stepwise, AfterSteps, StepBook, Stepwise, TimedStep, Train, Trained};
use crate::error::{Error, Result};
use crate::train::StepOutcome;
use std::path::Path;

impl LlmcEngine {
    /// The next step line, keeping what the lines before it say; the run's end before it is
    /// an error with llm.c's exit status and last lines.
    fn next_step(&mut self) -> Result<StepLine> {
        loop {
            let Some(line) = self.next_line() else {
                return Err(self.ended("before its next step"));
            };
            match parse_line(&line) {
                Some(Line::Step(s)) => return Ok(s),
                _ => self.note(&line),
            }
        }
    }
}

impl Train for LlmcEngine {
    fn train<'a>(&mut self, book: &mut dyn StepBook<'a>, after: &AfterSteps) -> Result<Trained> {
        train_stepwise(self, book, after)
    }
    /// train_gpt2cu has no dropout.
    fn applies_dropout(&self) -> bool {
        false
    }
}

impl Stepwise for LlmcEngine {
    /// llm.c draws its own micro-batches from the token file (the same blocks, its own order),
    /// so `micro_batches` only says how many blocks the step trains; the step is the one llm.c
    /// prints next, timed by llm.c (CUDA events around forward, backward and update).
    fn step(&mut self, _micro_batches: &[Vec<&[u32]>]) -> Result<TimedStep> {
        let s = self.next_step()?;
        self.steps_done = s.step;
        let Some(lr) = s.lr else {
            return Err(Error::Engine(
                "llm.c's step lines have no lr and norm (an older llm.c): use a train_gpt2cu of llm.c from 2024-06 or newer".into(),
            ));
        };
        Ok(TimedStep {
            outcome: StepOutcome {
                loss: s.loss,
                grad_norm: s.grad_norm.unwrap_or(f64::NAN),
                lr,
                skipped: false,
                loss_scale: None,
                phases_ms: None,
                comm_ms: None,
                host_ms: None,
            },
            latency_ms: s.ms,
        })
    }

    /// llm.c evaluates after its last step by itself (`-m` batches of the val file, which
    /// holds the eval blocks): reads its output to the end and returns that `val loss`. llm.c
    /// does not time its evaluation, so the runtime is NaN.
    fn eval(&mut self, _blocks: &[Vec<u32>], _batch_size: usize) -> Result<(f64, f64)> {
        while let Some(line) = self.next_line() {
            self.note(&line);
        }
        let status = self
            .child
            .wait()
            .map_err(|e| Error::io("waiting for llm.c", e))?;
        if !status.success() {
            return Err(self.ended("after training"));
        }
        self.succeeded = true;
        let loss = match self.val_loss {
            Some((step, loss)) if step == self.steps_done => loss,
            _ => f64::NAN,
        };
        Ok((loss, f64::NAN))
    }

    fn save(&self, _dir: &Path) -> Result<()> {
        Err(Error::Unsupported(
            "--save writes the candle engine's weights".into(),
        ))
    }
}
