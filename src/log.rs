//! Run-log files: written one record per line as each record exists (one `write` each, so a
//! run that dies half-way keeps every finished record), never overwritten, read back
//! tolerating the torn last line of a killed run. The records themselves: [`crate::record`].

use crate::error::{Error, Result};
use crate::record::{Header, Record};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A finished run: where its log is, its header and its summary (a LAMBADA [`crate::record::Summary`]
/// or a [`crate::record::TrainSummary`]).
pub struct RunOutcome<S> {
    pub log_path: PathBuf,
    pub header: Header,
    pub summary: S,
}

/// An open run log.
pub struct RunLog {
    path: PathBuf,
    file: File,
}

/// The log of one rank of a run: a [`RunLog`] on the rank that logs, nothing on the others
/// (every rank of a parallel run goes through the same loop, only rank 0 writes).
pub struct RankLog(Option<RunLog>);

impl RankLog {
    pub fn create(logging: bool, dir: &Path, stem: &str) -> Result<Self> {
        Ok(Self(match logging {
            true => Some(RunLog::create(dir, stem)?),
            false => None,
        }))
    }

    pub fn write(&mut self, record: &Record) -> Result<()> {
        match &mut self.0 {
            Some(l) => l.write(record),
            None => Ok(()),
        }
    }

    /// The log's path; empty on a rank that does not log.
    pub fn path(&self) -> PathBuf {
        self.0
            .as_ref()
            .map(|l| l.path().to_path_buf())
            .unwrap_or_default()
    }
}

impl RunLog {
    /// Creates `dir/stem.jsonl` (`stem-1.jsonl`, … if taken); never overwrites a log.
    pub fn create(dir: &Path, stem: &str) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating log dir {}", dir.display()), e))?;
        for n in 0.. {
            let name = if n == 0 {
                format!("{stem}.jsonl")
            } else {
                format!("{stem}-{n}.jsonl")
            };
            let path = dir.join(name);
            match File::options().write(true).create_new(true).open(&path) {
                Ok(file) => return Ok(Self { path, file }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(format!("creating {}", path.display()), e)),
            }
        }
        unreachable!()
    }

    /// Opens an existing log to append to it (a sweep completing a killed child's log).
    pub fn append(path: &Path) -> Result<Self> {
        let file = File::options()
            .append(true)
            .open(path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record as one line, in one write: it is on disk (page cache) on return.
    pub fn write(&mut self, record: &Record) -> Result<()> {
        let mut line = serde_json::to_string(record).expect("records serialize");
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .map_err(|e| Error::io(format!("writing {}", self.path.display()), e))
    }
}

/// Reads a run log back, skipping a torn last line (a run killed mid-write).
pub fn read_log(path: &Path) -> Result<Vec<Record>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut records = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(r) => records.push(r),
            Err(_) if i + 1 == lines.len() && !text.ends_with('\n') => break,
            Err(e) => {
                return Err(Error::BadData {
                    path: path.display().to_string(),
                    line: i + 1,
                    msg: format!("not a run-log record: {e}"),
                })
            }
        }
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_last_line_is_skipped_but_garbage_inside_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RunLog::create(dir.path(), "run").unwrap();
        let summary_line = r#"{"record":"batch","batch":0,"n_samples":1,"n_tokens":3,"padded_len":3,"latency_ms":1.5,"passages":[]}"#;
        log.write(&serde_json::from_str(summary_line).unwrap())
            .unwrap();
        let path = log.path().to_path_buf();
        // A run killed in the middle of a write leaves a partial line.
        std::fs::write(&path, format!("{summary_line}\n{{\"record\":\"ba")).unwrap();
        assert_eq!(read_log(&path).unwrap().len(), 1);
        std::fs::write(&path, format!("nonsense\n{summary_line}\n")).unwrap();
        let err = read_log(&path).unwrap_err().to_string();
        assert!(err.contains(":1: not a run-log record"), "{err}");
    }

    #[test]
    fn logs_are_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let a = RunLog::create(dir.path(), "run").unwrap();
        let b = RunLog::create(dir.path(), "run").unwrap();
        assert_ne!(a.path(), b.path());
    }
}
