//! HF hub ids (`--model ORG/NAME[@REV]`): a checkpoint found in the HF cache, and downloaded
//! into it when a file is missing.
//!
//! The cache is huggingface_hub's: `HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`. One repo lives in
//! `models--ORG--NAME/`:
//!
//! ```text
//! refs/REV            the commit hash a branch or tag (REV, default `main`) points at
//! snapshots/HASH/     that commit's files (symlinks into blobs/ when hf-hub or Python wrote them)
//! blobs/ETAG          file contents; `ETAG.part` while a download is under way (resumed)
//! ```
//!
//! A REV with no `refs/REV` that names a snapshot directory (a commit hash) is that snapshot. A
//! snapshot directory is an ordinary model directory: `ModelSpec::from_dir` and
//! `WeightSource::Dir` read it exactly as they read `--model-dir`.
//!
//! A run needs `config.json` and the safetensors (`model.safetensors`, or
//! `model.safetensors.index.json` and every shard it names); `tokenizer.json` is used when
//! the snapshot has it. When a needed file is missing, the repo's file list and commit are asked
//! of the hub and what is missing is downloaded with `hf-hub` (progress bar, resumable), unless
//! downloads are off ([`offline_reason`]): then the error names the missing file and the cache
//! path, in one line. Nothing touches the network while the cache holds what a run needs.

use crate::error::{Error, Result};
use crate::models::{weights, ModelSpec, WeightSource, PRESETS};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// `ORG/NAME[@REV]`, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubId {
    /// `ORG/NAME`.
    pub repo: String,
    /// A branch, tag or commit hash; `main` when the id has no `@REV`.
    pub revision: String,
}

impl HubId {
    /// Parses `ORG/NAME[@REV]`: one `/`, ORG and NAME of letters, digits, `-`, `_`, `.`.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::Config(format!(
                "'{s}' is not an HF hub id ({why}): expected ORG/NAME or ORG/NAME@REVISION, e.g. bigscience/bloom-560m"
            ))
        };
        let (repo, revision) = match s.split_once('@') {
            Some((_, "")) => return Err(bad("empty revision after '@'")),
            Some((repo, rev)) => (repo, rev),
            None => (s, "main"),
        };
        let (org, name) = repo.split_once('/').ok_or_else(|| bad("no '/'"))?;
        let part_ok = |p: &str| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                && !p.starts_with('.')
        };
        if !part_ok(org) || !part_ok(name) {
            return Err(bad("ORG and NAME are letters, digits, '-', '_' and '.'"));
        }
        if revision
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
        {
            return Err(bad("bad revision"));
        }
        Ok(Self {
            repo: repo.into(),
            revision: revision.into(),
        })
    }

    /// The repo's folder in the cache: `models--ORG--NAME`.
    pub fn folder(&self) -> String {
        format!("models--{}", self.repo.replace('/', "--"))
    }
}

/// `ORG/NAME`, with `@REV` unless REV is `main`: what the log records as the model's name.
impl std::fmt::Display for HubId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.revision.as_str() {
            "main" => write!(f, "{}", self.repo),
            rev => write!(f, "{}@{rev}", self.repo),
        }
    }
}

/// Whether `--model S` names a hub repo: exactly one `/`, not an existing path, not a preset.
pub fn is_hub_id(s: &str) -> bool {
    let repo = s.split_once('@').map_or(s, |(r, _)| r);
    repo.matches('/').count() == 1
        && !Path::new(s).exists()
        && !PRESETS.contains(&s)
        && HubId::parse(s).is_ok()
}

/// A checkpoint found (or completed) in the HF cache.
#[derive(Clone, Debug)]
pub struct ResolvedModel {
    pub id: HubId,
    /// The snapshot's commit hash (its directory name).
    pub commit: String,
    /// `CACHE/models--ORG--NAME/snapshots/HASH`: a model directory (`--model-dir`).
    pub dir: PathBuf,
    pub config: PathBuf,
    /// `model.safetensors`, or the shards named by `index`, sorted.
    pub weights: Vec<PathBuf>,
    /// `model.safetensors.index.json` of a sharded checkpoint.
    pub index: Option<PathBuf>,
    /// The checkpoint's `tokenizer.json`, when the snapshot has one.
    pub tokenizer: Option<PathBuf>,
    /// Files this call downloaded (empty when the cache held everything).
    pub downloaded: Vec<String>,
}

impl ResolvedModel {
    /// The model of `config.json`, named after the hub id (not the snapshot's hash).
    pub fn spec(&self) -> Result<ModelSpec> {
        let mut spec = ModelSpec::from_dir(&self.dir)?;
        spec.name = self.id.to_string();
        Ok(spec)
    }

    /// The checkpoint's weights, read like `--model-dir`.
    pub fn weight_source(&self) -> WeightSource {
        WeightSource::Dir(self.dir.clone())
    }
}

/// Finds `ORG/NAME[@REV]` in the HF cache ([`hub_cache_dir`]), downloading missing files unless
/// downloads are off ([`offline_reason`]).
pub fn resolve_model(id: &str) -> Result<ResolvedModel> {
    let id = HubId::parse(id)?;
    let cache = hub_cache_dir()?;
    match offline_reason() {
        Some(reason) => resolve_in(&id, &cache, Fetch::Offline(reason)),
        None => {
            let remote = HfRemote::new(&cache, &id)?;
            resolve_in(&id, &cache, Fetch::From(&remote))
        }
    }
}

/// Where missing files may come from.
pub enum Fetch<'a> {
    /// Nowhere; the string says why (e.g. "HF_HUB_OFFLINE=1"), for the error.
    Offline(String),
    From(&'a dyn Remote),
}

/// What [`resolve_in`] asks of the hub. Errors are causes: the caller names file and cache.
pub trait Remote {
    /// The commit `revision` points at now, and the repo's file names.
    fn info(&self, id: &HubId) -> std::result::Result<RemoteInfo, String>;
    /// Downloads `file` of `commit` into the cache; returns its path in
    /// `snapshots/COMMIT/` and writes nothing else there.
    fn download(
        &self,
        id: &HubId,
        commit: &str,
        file: &str,
    ) -> std::result::Result<PathBuf, String>;
}

pub struct RemoteInfo {
    pub commit: String,
    pub files: Vec<String>,
}

/// [`resolve_model`] with an explicit cache and source of missing files.
pub fn resolve_in(id: &HubId, cache: &Path, fetch: Fetch<'_>) -> Result<ResolvedModel> {
    let repo_dir = cache.join(id.folder());
    let local = snapshot_commit(&repo_dir, &id.revision);
    let missing = match &local {
        Some(commit) => match scan(id, &repo_dir, commit)? {
            Scan::Complete(found) => return Ok(found),
            Scan::Missing { file, dir } => (file, dir),
        },
        None => (format!("refs/{}", id.revision), repo_dir.clone()),
    };
    match fetch {
        Fetch::Offline(reason) => Err(missing_error(id, &missing, &format!(
            "{reason} forbids downloads: unset it to download the model, or check the id (the cache is {})",
            cache.display()
        ))),
        Fetch::From(remote) => download_missing(id, &repo_dir, remote).map_err(|stop| match stop {
            Stop::Refused(e) => e,
            Stop::Cause(cause) => {
                missing_error(id, &missing, &format!("downloading it failed: {cause}"))
            }
        }),
    }
}

/// `{file} of {id} not found at {dir}: {why}`: one line.
fn missing_error(id: &HubId, (file, dir): &(String, PathBuf), why: &str) -> Error {
    Error::NotFound {
        what: format!("{file} of {id}"),
        path: dir.clone(),
        hint: why.to_string(),
    }
}

/// The commit of `revision`: `refs/REVISION` when there, else REVISION itself when it names a
/// snapshot directory (a commit hash).
fn snapshot_commit(repo_dir: &Path, revision: &str) -> Option<String> {
    if let Ok(text) = std::fs::read_to_string(repo_dir.join("refs").join(revision)) {
        let commit = text.trim();
        if !commit.is_empty() && !commit.contains(['/', '\\']) && commit != ".." {
            return Some(commit.to_string());
        }
    }
    repo_dir
        .join("snapshots")
        .join(revision)
        .is_dir()
        .then(|| revision.to_string())
}

enum Scan {
    Complete(ResolvedModel),
    /// The first needed file that is not there, and the directory it should be in.
    Missing {
        file: String,
        dir: PathBuf,
    },
}

/// What `snapshots/COMMIT` holds of what a run needs. Pickle-only checkpoints are refused as
/// `--model-dir` refuses them; a malformed index is an error.
fn scan(id: &HubId, repo_dir: &Path, commit: &str) -> Result<Scan> {
    let dir = repo_dir.join("snapshots").join(commit);
    let missing = |file: &str| {
        Ok(Scan::Missing {
            file: file.into(),
            dir: dir.clone(),
        })
    };
    if !dir.is_dir() {
        return missing("config.json");
    }
    let config = dir.join("config.json");
    if !config.is_file() {
        return missing("config.json");
    }
    let weights = match weights::safetensors_files(&dir) {
        Ok(files) => files,
        Err(Error::NotFound { .. }) => {
            return missing("model.safetensors (or model.safetensors.index.json)")
        }
        Err(e) => return Err(e),
    };
    if let Some(absent) = weights.iter().find(|f| !f.is_file()) {
        let name = absent.strip_prefix(&dir).unwrap_or(absent);
        return missing(&name.display().to_string());
    }
    let index = dir.join(INDEX);
    let tokenizer = dir.join("tokenizer.json");
    Ok(Scan::Complete(ResolvedModel {
        id: id.clone(),
        commit: commit.into(),
        index: (weights.first() != Some(&dir.join(SINGLE))).then_some(index),
        tokenizer: tokenizer.is_file().then_some(tokenizer),
        config,
        weights,
        dir,
        downloaded: vec![],
    }))
}

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

/// Why [`download_missing`] stopped: the hub could not be reached or a transfer failed
/// (`Cause`, framed by the caller with the missing file), or the repo cannot be run (`Refused`).
enum Stop {
    Cause(String),
    Refused(Error),
}

impl From<String> for Stop {
    fn from(cause: String) -> Self {
        Stop::Cause(cause)
    }
}

/// Asks the hub for the revision's commit and files, downloads what its snapshot lacks
/// (config, weights, tokenizer.json when the repo has one), points `refs/REV` at the commit and
/// scans the snapshot again.
fn download_missing(
    id: &HubId,
    repo_dir: &Path,
    remote: &dyn Remote,
) -> std::result::Result<ResolvedModel, Stop> {
    let info = remote.info(id)?;
    let has = |f: &str| info.files.iter().any(|x| x == f);
    let dir = repo_dir.join("snapshots").join(&info.commit);
    if !has(SINGLE) && !has(INDEX) {
        return Err(Stop::Refused(no_safetensors(id, &dir, &info.files)));
    }
    let mut downloaded = vec![];
    let mut get = |file: &str| -> std::result::Result<(), String> {
        if dir.join(file).is_file() {
            return Ok(());
        }
        eprintln!("{id}: downloading {file} into {}", dir.display());
        let path = remote.download(id, &info.commit, file)?;
        if path != dir.join(file) {
            return Err(format!(
                "the download landed at {}, not in {}",
                path.display(),
                dir.display()
            ));
        }
        downloaded.push(file.to_string());
        Ok(())
    };
    get("config.json")?;
    if has(SINGLE) {
        get(SINGLE)?;
    } else {
        get(INDEX)?;
        for shard in weights::safetensors_files(&dir).map_err(Stop::Refused)? {
            let name = shard.strip_prefix(&dir).unwrap_or(&shard);
            get(&name.display().to_string())?;
        }
    }
    if has("tokenizer.json") {
        get("tokenizer.json")?;
    }
    write_ref(repo_dir, &id.revision, &info.commit)
        .map_err(|e| format!("writing refs/{}: {e}", id.revision))?;
    match scan(id, repo_dir, &info.commit).map_err(Stop::Refused)? {
        Scan::Complete(found) => Ok(ResolvedModel {
            downloaded,
            ..found
        }),
        Scan::Missing { file, dir } => Err(Stop::Cause(format!(
            "{file} is still missing from {} after the download",
            dir.display()
        ))),
    }
}

/// A hub repo with neither `model.safetensors` nor an index: pickle-only repos are refused as
/// `--model-dir` refuses them.
fn no_safetensors(id: &HubId, dir: &Path, files: &[String]) -> Error {
    let pickles: Vec<&str> = files
        .iter()
        .map(String::as_str)
        .filter(|n| n.ends_with(".bin") || n.ends_with(".pt") || n.ends_with(".pth"))
        .collect();
    if pickles.is_empty() {
        return Error::NotFound {
            what: format!("model.safetensors of {id}"),
            path: dir.to_path_buf(),
            hint: "the repo on the hub has no model.safetensors or model.safetensors.index.json"
                .into(),
        };
    }
    Error::Unsupported(format!(
        "{id} has only pickle checkpoints ({}), which can execute code when loaded: convert them to safetensors first (transformers: model.save_pretrained(OUT, safe_serialization=True))",
        pickles.join(", ")
    ))
}

/// `refs/REV` = `commit` (REV may hold `/`, e.g. `refs/pr/1`); nothing for REV = commit.
fn write_ref(repo_dir: &Path, revision: &str, commit: &str) -> std::io::Result<()> {
    if revision == commit {
        return Ok(());
    }
    let path = repo_dir.join("refs").join(revision);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, commit)
}

/// The HF cache of this environment, or an error when no variable or home names one.
pub fn hub_cache_dir() -> Result<PathBuf> {
    hub_cache_dir_from(|k| std::env::var_os(k)).ok_or_else(|| {
        Error::Config(
            "cannot locate the HF cache: set HF_HUB_CACHE or HF_HOME (HOME is not set)".into(),
        )
    })
}

/// huggingface_hub's rule, over any variable lookup: `HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `$XDG_CACHE_HOME/huggingface/hub`, else `$HOME/.cache/huggingface/hub`. Empty values count
/// as unset.
pub fn hub_cache_dir_from(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let get = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    get("HF_HUB_CACHE")
        .or_else(|| get("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| get("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
        .or_else(|| get("HOME").map(|h| h.join(".cache/huggingface/hub")))
}

/// Why downloads are off, if they are: `HF_HUB_OFFLINE` or `BENCH_OFFLINE` set to a true value
/// (1, true, yes, on; any case). Applies to models and to `--data full`.
pub fn offline_reason() -> Option<String> {
    offline_reason_from(|k| std::env::var_os(k))
}

/// [`offline_reason`] over any variable lookup.
pub fn offline_reason_from(var: impl Fn(&str) -> Option<OsString>) -> Option<String> {
    ["HF_HUB_OFFLINE", "BENCH_OFFLINE"]
        .into_iter()
        .find_map(|k| {
            let v = var(k)?.to_string_lossy().to_ascii_lowercase();
            matches!(v.as_str(), "1" | "true" | "yes" | "on").then(|| format!("{k}={v}"))
        })
}

/// The hub through `hf-hub`'s sync API: its progress bar, its `.part` files resumed on the next
/// try, its blob/snapshot/ref layout (the same as Python's).
struct HfRemote {
    api: hf_hub::api::sync::Api,
}

impl HfRemote {
    fn new(cache: &Path, id: &HubId) -> Result<Self> {
        let mut builder =
            hf_hub::api::sync::ApiBuilder::from_cache(hf_hub::Cache::new(cache.to_path_buf()))
                .with_progress(true)
                .with_retries(2)
                .with_token(token());
        if let Some(endpoint) = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty()) {
            builder = builder.with_endpoint(endpoint);
        }
        let api = builder
            .build()
            .map_err(|e| Error::Config(format!("{id}: cannot set up the HF hub client: {e}")))?;
        Ok(Self { api })
    }

    fn repo(&self, id: &HubId, revision: &str) -> hf_hub::api::sync::ApiRepo {
        self.api.repo(hf_hub::Repo::with_revision(
            id.repo.clone(),
            hf_hub::RepoType::Model,
            revision.to_string(),
        ))
    }
}

impl Remote for HfRemote {
    fn info(&self, id: &HubId) -> std::result::Result<RemoteInfo, String> {
        let info = self
            .repo(id, &id.revision)
            .info()
            .map_err(|e| one_line(&e.to_string()))?;
        Ok(RemoteInfo {
            commit: info.sha,
            files: info.siblings.into_iter().map(|s| s.rfilename).collect(),
        })
    }

    /// Pinned to `commit`, so every file lands in the same snapshot even if the branch moves.
    fn download(
        &self,
        id: &HubId,
        commit: &str,
        file: &str,
    ) -> std::result::Result<PathBuf, String> {
        self.repo(id, commit)
            .download(file)
            .map_err(|e| one_line(&e.to_string()))
    }
}

/// The token huggingface_hub would send: `HF_TOKEN`, else the file `$HF_HOME/token`
/// (`~/.cache/huggingface/token`).
fn token() -> Option<String> {
    if let Some(t) = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Some(t.trim().to_string());
    }
    let home = std::env::var_os("HF_HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/huggingface"))
        })?;
    let text = std::fs::read_to_string(home.join("token")).ok()?;
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

/// Error text on one line (some transport errors carry newlines).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
