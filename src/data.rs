//! Data files: reading LAMBADA passages, checksums, finding the full data set and downloading
//! it (checksum-verified, through a temporary file) when it is not found; data sets shipped
//! as a zip in [`archive`].

mod archive;

pub use archive::{find_or_download_dir, Archive};

use crate::error::{Error, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};
use std::io::{IsTerminal, Read, Write};
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

/// Where a download of the full data set goes: `$BENCH_DATA_DIR`, else
/// `~/.cache/transformer-bench` (both are in [`search_dirs`], so the next run finds it).
pub fn download_dir() -> Option<PathBuf> {
    std::env::var_os("BENCH_DATA_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/transformer-bench"))
        })
}

/// A suite's full data set (its `[data]` table): file name, download URL, checksum, and the
/// hint its not-found error gives.
pub struct Reference<'a> {
    pub file: &'a str,
    pub url: &'a str,
    pub sha256: &'a str,
    pub hint: &'a str,
}

/// Where [`find_or_download`] looks and whether it may download.
pub struct Lookup {
    pub dirs: Vec<PathBuf>,
    /// How the not-found error names `dirs`.
    pub searched: String,
    /// Where a download goes; `None`: no download.
    pub download_to: Option<PathBuf>,
    /// Why downloads are off, if they are (see [`crate::hub::offline_reason`]).
    pub offline: Option<String>,
}

impl Lookup {
    /// [`search_dirs`], [`download_dir`] and `HF_HUB_OFFLINE` / `BENCH_OFFLINE`.
    pub fn from_env() -> Self {
        Self {
            dirs: search_dirs(),
            searched: "$BENCH_DATA_DIR, ./data, ~/.cache/transformer-bench".into(),
            download_to: download_dir(),
            offline: crate::hub::offline_reason(),
        }
    }
}

/// `--data full`: the reference file from the first of `how.dirs` holding it; else, when
/// downloads are allowed and the URL names the file itself (not an archive), downloaded into
/// `how.download_to` and checked against the suite's sha256. When it cannot be had: a one-line
/// not-found error with the URL and checksum, plus the download's failure when one was tried.
pub fn find_or_download(r: &Reference, how: &Lookup) -> Result<DataFile> {
    if let Some(p) = how
        .dirs
        .iter()
        .map(|d| d.join(r.file))
        .find(|p| p.is_file())
    {
        return DataFile::read(&p, r.hint);
    }
    let not_found = |extra: String| Error::NotFound {
        what: r.file.into(),
        path: PathBuf::from(&how.searched),
        hint: format!("{}{extra}", r.hint),
    };
    let plain_file = r.url.rsplit('/').next() == Some(r.file);
    let dir = match &how.download_to {
        Some(dir) if how.offline.is_none() && plain_file => dir,
        _ => return Err(not_found(String::new())),
    };
    let dest = dir.join(r.file);
    eprintln!(
        "downloading {} from {} into {}",
        r.file,
        r.url,
        dir.display()
    );
    download(r.url, &dest, r.sha256)
        .map_err(|cause| not_found(format!("; downloading it failed: {cause}")))?;
    DataFile::read(&dest, r.hint)
}

/// `url` into `dest` through [`write_verified`]. `file://` URLs are read from disk.
fn download(url: &str, dest: &Path, sha256: &str) -> std::result::Result<(), String> {
    let (mut reader, len): (Box<dyn Read>, Option<u64>) = match url.strip_prefix("file://") {
        Some(path) => {
            let f = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
            let len = f.metadata().ok().map(|m| m.len());
            (Box::new(f), len)
        }
        None => {
            let agent: ureq::Agent = ureq::Agent::config_builder()
                .timeout_connect(Some(std::time::Duration::from_secs(30)))
                .timeout_recv_response(Some(std::time::Duration::from_secs(60)))
                .build()
                .into();
            let response = agent.get(url).call().map_err(|e| e.to_string())?;
            let body = response.into_body();
            let len = body.content_length();
            (Box::new(body.into_reader()), len)
        }
    };
    write_verified(&mut reader, dest, sha256, &download_bar(len))
}

/// A bytes bar on stderr when it is a terminal.
fn download_bar(len: Option<u64>) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (bar, template) = match len {
        Some(n) => (
            ProgressBar::new(n),
            "{bytes}/{total_bytes} [{bar:40}] {bytes_per_sec} eta {eta}",
        ),
        None => (
            ProgressBar::no_length(),
            "{spinner} {bytes} {bytes_per_sec}",
        ),
    };
    bar.set_style(
        ProgressStyle::with_template(template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

/// Copies `reader` to `dest`: written to `.NAME.PID.part` beside it, hashed on the way, renamed
/// onto `dest` only when its sha256 is `sha256` (hex, any case). On any failure the temporary
/// file is removed and `dest` is untouched: nothing half-written is left behind.
pub fn write_verified(
    reader: &mut dyn Read,
    dest: &Path,
    sha256: &str,
    bar: &ProgressBar,
) -> std::result::Result<(), String> {
    let dir = dest
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = TempFile(dir.join(format!(".{name}.{}.part", std::process::id())));
    let mut out =
        std::fs::File::create(&tmp.0).map_err(|e| format!("creating {}: {e}", tmp.0.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("reading: {e}")),
        };
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| format!("writing {}: {e}", tmp.0.display()))?;
        bar.inc(n as u64);
    }
    out.sync_all()
        .map_err(|e| format!("writing {}: {e}", tmp.0.display()))?;
    bar.finish_and_clear();
    let got: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if !got.eq_ignore_ascii_case(sha256) {
        return Err(format!(
            "the file has sha256 {got}, not the suite's {sha256}; nothing was kept"
        ));
    }
    // After the rename `tmp`'s drop finds nothing to remove.
    std::fs::rename(&tmp.0, dest).map_err(|e| format!("renaming onto {}: {e}", dest.display()))
}

/// A temporary file removed when dropped: on every early return of [`write_verified`], and on
/// a panic.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
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
