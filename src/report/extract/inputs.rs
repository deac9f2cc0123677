//! Which files `-i` names (files, directories walked in order, globs) and reading them,
//! gunzipped when their name ends in `.gz`.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// A file to read, and whether it was met walking a directory (where files in no known
/// format are skipped: a results folder holds notes, profiles and archives beside its logs)
/// rather than named (where they are an error).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    pub path: PathBuf,
    pub walked: bool,
}

/// Files named by `inputs`: files as given, directories walked (sorted), globs expanded.
/// In a directory holding HF's all_results.json, train/eval_results.json are left out (it
/// holds both).
pub fn collect_inputs(inputs: &[String]) -> Result<Vec<Input>> {
    let mut out = vec![];
    let named = |path| Input {
        path,
        walked: false,
    };
    for input in inputs {
        let path = PathBuf::from(input);
        if path.is_dir() {
            let mut found = vec![];
            walk(&path, &mut found)?;
            out.extend(found.into_iter().map(|path| Input { path, walked: true }));
        } else if path.is_file() {
            out.push(named(path));
        } else if input.contains(['*', '?', '[']) {
            let paths = glob::glob(input)
                .map_err(|e| Error::Config(format!("bad pattern '{input}': {e}")))?;
            let mut matched: Vec<PathBuf> = paths
                .filter_map(|p| p.ok())
                .filter(|p| p.is_file())
                .collect();
            if matched.is_empty() {
                return Err(Error::Config(format!("no file matches '{input}'")));
            }
            matched.sort();
            out.extend(matched.into_iter().map(named));
        } else {
            return Err(Error::NotFound {
                what: "input".into(),
                path,
                hint: "give log files, directories or glob patterns".into(),
            });
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(format!("reading {}", dir.display()), e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    let has_all = entries
        .iter()
        .any(|p| p.file_name().is_some_and(|n| n == "all_results.json"));
    for p in entries {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if p.is_dir() {
            walk(&p, out)?;
        } else if !(has_all && (name == "train_results.json" || name == "eval_results.json")) {
            out.push(p);
        }
    }
    Ok(())
}

pub use crate::report::row::{is_gz, read_maybe_gz};

/// Whether `path` is a gzipped tar archive (`.tgz`, `.tar.gz`): its members are read as files.
pub fn is_archive(path: &Path) -> bool {
    let name = path.to_string_lossy();
    name.ends_with(".tgz") || name.ends_with(".tar.gz")
}

/// The regular files of the gzipped tar archive at `path`, in archive order: (the member's
/// path inside the archive, its bytes, gunzipped when its name ends in `.gz`).
pub fn archive_members(path: &Path) -> Result<Vec<(PathBuf, Vec<u8>)>> {
    use std::io::Read;
    let bad = |e: std::io::Error| Error::io(format!("reading the archive {}", path.display()), e);
    let file = std::fs::File::open(path).map_err(bad)?;
    let mut archive = tar::Archive::new(flate2::read::MultiGzDecoder::new(file));
    let mut members = vec![];
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path().map_err(bad)?.into_owned();
        let mut bytes = vec![];
        entry.read_to_end(&mut bytes).map_err(bad)?;
        if is_gz(&name) {
            let mut plain = vec![];
            flate2::read::MultiGzDecoder::new(&bytes[..])
                .read_to_end(&mut plain)
                .map_err(bad)?;
            bytes = plain;
        }
        members.push((name, bytes));
    }
    Ok(members)
}
