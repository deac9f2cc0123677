//! How a run ended: the `status` of a run's summary ([`super::Summary`],
//! [`super::TrainSummary`]) and of a sweep's run record ([`super::SweepRun`]), one type for the
//! sweep, the log and the report. Serialized as the log has always spelled it: `ok`, `oom`,
//! `error`, `killed`, `timeout`.

use serde::{Deserialize, Serialize};

/// Clone, not Copy, while tests/sweep.rs clones it (clippy's `clone_on_copy`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    /// Finished.
    Ok,
    /// Out of memory (the device's or the host's): a result of a sweep, not a failure.
    Oom,
    /// Any other failure, with the run's `error` set.
    Error,
    /// Ended by a signal (the kernel's OOM killer, `kill -9`), or killed with its sweep.
    Killed,
    /// Killed by the sweep after `--run-timeout`.
    Timeout,
}

impl RunStatus {
    /// Every status, in the order the sweep's table counts them.
    pub const ALL: [RunStatus; 5] = [
        Self::Ok,
        Self::Oom,
        Self::Error,
        Self::Killed,
        Self::Timeout,
    ];

    /// The status as the log writes it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Oom => "oom",
            Self::Error => "error",
            Self::Killed => "killed",
            Self::Timeout => "timeout",
        }
    }

    /// How a failed run is recorded: `oom` when its message says it ran out of memory (CUDA's
    /// `CUDA_ERROR_OUT_OF_MEMORY`, cuBLAS's `ALLOC_FAILED`, PyTorch's `CUDA out of memory`,
    /// Rust's `memory allocation of N bytes failed`), else `error`.
    pub fn of_failure(message: &str) -> Self {
        let m = message.to_ascii_lowercase();
        let oom = [
            "out of memory",
            "out_of_memory",
            "alloc_failed",
            "memory allocation of",
        ];
        match oom.iter().any(|p| m.contains(p)) {
            true => Self::Oom,
            false => Self::Error,
        }
    }

    /// `ok` without a failure, else the failure's status ([`Self::of_failure`]).
    pub fn of_result(failure: Option<&str>) -> Self {
        failure.map_or(Self::Ok, Self::of_failure)
    }

    /// `ok` or `oom`: the run has its result (an out-of-memory is one), so a sweep counts it
    /// as done and `--resume` skips it.
    pub fn is_done(&self) -> bool {
        matches!(self, Self::Ok | Self::Oom)
    }
}

impl std::fmt::Display for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `status == "ok"`: the spelling of the log.
impl PartialEq<str> for RunStatus {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for RunStatus {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::RunStatus;

    #[test]
    fn out_of_memory_messages_of_every_engine_are_oom() {
        for m in [
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
            "memory allocation of 3221225472 bytes failed",
            "cublas error: CUBLAS_STATUS_ALLOC_FAILED",
        ] {
            assert_eq!(RunStatus::of_failure(m), RunStatus::Oom, "{m}");
        }
        assert_eq!(
            RunStatus::of_failure("unknown model 'gpt3'"),
            RunStatus::Error
        );
        assert_eq!(RunStatus::of_result(None), RunStatus::Ok);
    }

    #[test]
    fn statuses_are_written_as_the_log_always_spelled_them() {
        for s in RunStatus::ALL {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
            assert_eq!(serde_json::from_str::<RunStatus>(&json).unwrap(), s);
        }
        let names = RunStatus::ALL.map(|s| s.as_str());
        assert_eq!(names, ["ok", "oom", "error", "killed", "timeout"]);
    }
}
