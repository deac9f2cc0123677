//! Which files `-i` names (files, directories walked in order, globs) and reading them,
//! gunzipped when their name ends in `.gz`.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Files named by `inputs`: files as given, directories walked (sorted), globs expanded.
/// In a directory holding HF's all_results.json, train/eval_results.json are left out (it
/// holds both).
pub fn collect_inputs(inputs: &[String]) -> Result<Vec<PathBuf>> {
    let mut out = vec![];
    for input in inputs {
        let path = PathBuf::from(input);
        if path.is_dir() {
            walk(&path, &mut out)?;
        } else if path.is_file() {
            out.push(path);
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
            out.extend(matched);
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
