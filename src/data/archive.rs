//! `--data full` for data sets shipped as a zip (WikiText-2 raw): the members found in a
//! local folder, else the archive downloaded (checksum-verified) and its members extracted,
//! each checked against its own sha256, into the download folder.

use super::{download, write_verified, Lookup};
use crate::error::{Error, Result};
use indicatif::ProgressBar;
use std::path::{Path, PathBuf};

/// A zip and the files a suite reads from it.
pub struct Archive<'a> {
    /// The zip's file name, and the folder its members land in (under a search directory).
    pub name: &'a str,
    pub dir: &'a str,
    pub url: &'a str,
    pub sha256: &'a str,
    /// (path inside the zip, sha256) of each member; each lands as `dir/<its file name>`.
    pub members: &'a [(&'a str, &'a str)],
    /// The file names a local folder must hold to be used (WikiText-2 runs without its train
    /// split); a download extracts every member.
    pub required: &'a [&'a str],
    /// What the not-found error adds.
    pub hint: &'a str,
}

impl Archive<'_> {
    fn file_name(member: &str) -> &str {
        member.rsplit('/').next().unwrap_or(member)
    }

    fn complete_in(&self, dir: &Path) -> bool {
        self.required.iter().all(|f| dir.join(f).is_file())
    }
}

/// The folder holding the members: `a.dir` under the first of `how.dirs` that has the required ones;
/// else, online, the archive downloaded into `how.download_to` and extracted there. A
/// one-line error otherwise, with the download's failure when one was tried; a failed
/// download or extraction leaves no file behind.
pub fn find_or_download_dir(a: &Archive, how: &Lookup) -> Result<PathBuf> {
    if let Some(d) = how
        .dirs
        .iter()
        .map(|d| d.join(a.dir))
        .find(|d| a.complete_in(d))
    {
        return Ok(d);
    }
    let not_found = |extra: String| Error::NotFound {
        what: format!("{}/ (from {})", a.dir, a.name),
        path: PathBuf::from(&how.searched),
        hint: format!("{}{extra}", a.hint),
    };
    let root = match (&how.download_to, &how.offline) {
        (Some(dir), None) => dir,
        (_, Some(why)) => return Err(not_found(format!("; not downloaded: {why}"))),
        (None, None) => return Err(not_found(String::new())),
    };
    eprintln!(
        "downloading {} from {} into {}",
        a.name,
        a.url,
        root.display()
    );
    let zip = root.join(a.name);
    download(a.url, &zip, a.sha256)
        .and_then(|()| extract(a, &zip, &root.join(a.dir)))
        .map_err(|cause| not_found(format!("; downloading it failed: {cause}")))?;
    let _ = std::fs::remove_file(&zip); // the members are what the runs read
    Ok(root.join(a.dir))
}

/// Each member of `zip` into `dir`, through [`write_verified`] (its own sha256).
fn extract(a: &Archive, zip: &Path, dir: &Path) -> std::result::Result<(), String> {
    let f = std::fs::File::open(zip).map_err(|e| format!("{}: {e}", zip.display()))?;
    let mut z = zip::ZipArchive::new(f).map_err(|e| format!("{}: {e}", zip.display()))?;
    for (member, sha256) in a.members {
        let mut entry = z
            .by_name(member)
            .map_err(|e| format!("{member} in {}: {e}", a.name))?;
        let dest = dir.join(Archive::file_name(member));
        write_verified(&mut entry, &dest, sha256, &ProgressBar::hidden())
            .map_err(|e| format!("{member}: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A zip at `path` with `files` (path inside, contents).
    fn write_zip(path: &Path, files: &[(&str, &str)]) {
        let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, text) in files {
            z.start_file(*name, opts).unwrap();
            z.write_all(text.as_bytes()).unwrap();
        }
        z.finish().unwrap();
    }

    fn sha(path: &Path) -> String {
        super::super::sha256_hex(&std::fs::read(path).unwrap())
    }

    fn lookup(search: &Path, download_to: &Path) -> Lookup {
        Lookup {
            dirs: vec![search.to_path_buf()],
            searched: search.display().to_string(),
            download_to: Some(download_to.to_path_buf()),
            offline: None,
        }
    }

    const A: &str = " = A =\n a line\n";
    const B: &str = " = B =\n another\n";
    /// Not the sha256 of A: the checksum a corrupted download would fail.
    const WRONG_SHA: &str = "b4e9a1fe0d9c4eef7d1ab2c8c2f3a3cbd48b43f5d35ff2cb5cd0d2b1a2f6c8d4";

    /// Downloaded (a `file://` URL), verified, extracted member by member; found locally on
    /// the next call; a member whose checksum is wrong leaves nothing behind.
    #[test]
    fn archive_downloads_extracts_verifies_and_is_found_next_time() {
        let tmp = tempfile::tempdir().unwrap();
        let zip = tmp.path().join("src.zip");
        write_zip(
            &zip,
            &[("set/a.raw", A), ("set/b.raw", B), ("set/readme", "x")],
        );
        let (a_sha, b_sha) = (
            super::super::sha256_hex(A.as_bytes()),
            super::super::sha256_hex(B.as_bytes()),
        );
        let members = [("set/a.raw", a_sha.as_str()), ("set/b.raw", b_sha.as_str())];
        let url = format!("file://{}", zip.display());
        let zip_sha = sha(&zip);
        let archive = Archive {
            name: "set.zip",
            dir: "set",
            url: &url,
            sha256: &zip_sha,
            members: &members,
            required: &["a.raw", "b.raw"],
            hint: "put set/ there",
        };
        let (search, cache) = (tmp.path().join("search"), tmp.path().join("cache"));
        let dir = find_or_download_dir(&archive, &lookup(&search, &cache)).unwrap();
        assert_eq!(dir, cache.join("set"));
        assert_eq!(std::fs::read_to_string(dir.join("a.raw")).unwrap(), A);
        assert_eq!(std::fs::read_to_string(dir.join("b.raw")).unwrap(), B);
        assert!(!cache.join("set.zip").exists(), "the archive is removed");
        assert!(!dir.join("readme").exists(), "only the members");
        // Next time from a search directory, without downloading (a dead URL).
        let found = Archive {
            url: "file:///nonexistent.zip",
            ..archive
        };
        let again = find_or_download_dir(&found, &lookup(&cache, &tmp.path().join("x")));
        assert_eq!(again.unwrap(), cache.join("set"));

        // A member whose checksum does not match: an error, and no member file kept.
        let bad_members = [("set/a.raw", WRONG_SHA), ("set/b.raw", b_sha.as_str())];
        let bad = Archive {
            members: &bad_members,
            ..found
        };
        let bad = Archive { url: &url, ..bad };
        let cache2 = tmp.path().join("cache2");
        let e = find_or_download_dir(&bad, &lookup(&search, &cache2))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("set/a.raw") && e.contains("nothing was kept"),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
        assert!(!cache2.join("set").join("a.raw").exists());
    }

    /// Offline: one line that says why, nothing downloaded.
    #[test]
    fn archive_offline_is_one_line() {
        let tmp = tempfile::tempdir().unwrap();
        let archive = Archive {
            name: "set.zip",
            dir: "set",
            url: "https://example.invalid/set.zip",
            sha256: "00",
            members: &[("set/a.raw", "00")],
            required: &["a.raw"],
            hint: "put set/ there",
        };
        let mut how = lookup(tmp.path(), tmp.path());
        how.offline = Some("HF_HUB_OFFLINE=1".into());
        let e = find_or_download_dir(&archive, &how)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("HF_HUB_OFFLINE=1") && e.contains("put set/ there"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        assert!(!tmp.path().join("set.zip").exists());
    }
}
