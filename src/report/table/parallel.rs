//! `--table`: which of the reports on parallel runs ([`super::dp`], [`super::tp`]) a call
//! asks for, read from the bench logs ([`super::logs`]).

use super::{dp, logs, tp};
use crate::error::Result;
use std::path::PathBuf;

/// `--table`: the reports that compare parallel runs with their single-GPU run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TableKind {
    /// Data-parallel training, per directory: dp N against dp 1 step by step (loss, grad
    /// norm), and throughput with scaling efficiency, all-reduce share, memory per rank.
    DpReport,
    /// Tensor-parallel LAMBADA runs against their tp 1 run, passage by passage.
    TpAgreement,
    /// Tensor-parallel LAMBADA throughput, speed-up over tp 1, latency, memory and MFU.
    TpScaling,
}

/// The Markdown report `kind` of the bench run logs among `files`.
pub fn report(kind: TableKind, files: &[PathBuf]) -> Result<String> {
    let runs = logs::read_runs(files)?;
    match kind {
        TableKind::DpReport => dp::report(&runs),
        TableKind::TpAgreement => tp::agreement(&runs),
        TableKind::TpScaling => tp::scaling(&runs),
    }
}
