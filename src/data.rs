//! Data files: reading LAMBADA passages, checksums, finding the full data set.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// The first 100 passages of `lambada_test.jsonl`, shipped in the repo and the binary
/// (LAMBADA, Paperno et al. 2016, CC BY 4.0; see data/README.md).
pub const LAMBADA_SAMPLE: &str = include_str!("../data/lambada_sample.jsonl");
pub const LAMBADA_SAMPLE_NAME: &str = "embedded:lambada_sample.jsonl";

/// Text of a data set plus where it came from.
pub struct DataFile {
    /// A path, or [`LAMBADA_SAMPLE_NAME`].
    pub origin: String,
    pub text: String,
}

impl DataFile {
    pub fn embedded_lambada_sample() -> Self {
        Self {
            origin: LAMBADA_SAMPLE_NAME.into(),
            text: LAMBADA_SAMPLE.into(),
        }
    }

    pub fn read(path: &Path, missing_hint: &str) -> Result<Self> {
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(Self {
                origin: path.display().to_string(),
                text,
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Error::NotFound {
                what: "data file".into(),
                path: path.to_path_buf(),
                hint: missing_hint.into(),
            }),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
        }
    }

    pub fn sha256(&self) -> String {
        sha256_hex(self.text.as_bytes())
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Directories searched for a full data set named by file name: `$BENCH_DATA_DIR`, `./data`,
/// `~/.cache/transformer-bench`.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![];
    if let Some(d) = std::env::var_os("BENCH_DATA_DIR") {
        dirs.push(PathBuf::from(d));
    }
    dirs.push(PathBuf::from("data"));
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cache/transformer-bench"));
    }
    dirs
}

/// LAMBADA passages of a JSONL file: one `{"text": "..."}` object a line; blank lines are
/// skipped. Returns (line index, text) pairs; errors name the file and 1-based line.
pub fn lambada_passages(data: &DataFile) -> Result<Vec<(usize, String)>> {
    let bad = |line: usize, msg: String| Error::BadData {
        path: data.origin.clone(),
        line,
        msg,
    };
    let mut out = vec![];
    for (i, line) in data.text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(i + 1, format!("invalid JSON: {e}")))?;
        let text = v
            .get("text")
            .and_then(|t| t.as_str())
            .ok_or_else(|| bad(i + 1, "expected an object with a string \"text\"".into()))?;
        if !text.trim().contains(' ') {
            return Err(bad(
                i + 1,
                "passage has no space: it cannot be split into context and target word".into(),
            ));
        }
        out.push((i, text.to_string()));
    }
    if out.is_empty() {
        return Err(bad(0, "no passages".into()));
    }
    Ok(out)
}
