#![cfg(feature = "report")]
//! results/README.md, the page of current figures, against the committed CSVs it is made of:
//! `bash scripts/results_page.sh --no-charts`, run with this build's extract-metrics and plot,
//! must write it byte for byte. The charts are left out of the comparison (PNG rendering is
//! checked in tests/plot.rs); the page's links to them are compared. And README.md's results
//! section quotes no figure the page does not hold.

mod common;

use common::extract::*;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

#[test]
fn the_results_page_regenerates_from_the_committed_csvs() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("README.md");
    let o = Command::new("bash")
        .arg("scripts/results_page.sh")
        .args(["--no-charts", "-o", page.to_str().unwrap()])
        .env("EXTRACT_METRICS", env!("CARGO_BIN_EXE_extract-metrics"))
        .env("PLOT", env!("CARGO_BIN_EXE_plot"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("bash runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = std::fs::read_to_string(&page).unwrap();
    let want = std::fs::read_to_string(repo("results/README.md")).unwrap();
    assert!(
        got == want,
        "results/README.md is not what `bash scripts/results_page.sh` makes of results/current/*.csv: run it and commit the page"
    );
}

/// The numbers with a decimal point in `text` (`3.03`, `0.855`, `483.3`): the figures.
/// Integers (batch sizes, GPU counts, `128 + 128`) are settings, not figures.
fn decimals(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let mut out = vec![];
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() || (i > 0 && (b[i - 1].is_ascii_digit() || b[i - 1] == b'.')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
            i += 1;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            out.push(text[start..i].to_string());
        }
    }
    out
}

#[test]
fn readme_quotes_only_figures_found_on_the_results_page() {
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let start = readme
        .find("## Status / measured results")
        .expect("README has its results section");
    let section = &readme[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let page = std::fs::read_to_string(repo("results/README.md")).unwrap();
    let on_page = decimals(&page);
    let quoted = decimals(section);
    assert!(quoted.len() > 20, "{quoted:?}");
    let missing: Vec<&String> = quoted.iter().filter(|n| !on_page.contains(n)).collect();
    assert!(
        missing.is_empty(),
        "README.md quotes figures results/README.md does not hold: {missing:?}"
    );
}

#[test]
fn decimals_are_whole_numbers_with_a_point() {
    assert_eq!(
        decimals("1.49× (483.3 vs 324.8), 0.855–0.926, batch 16, v1.2.3, 8 × 1024."),
        ["1.49", "483.3", "324.8", "0.855", "0.926", "1.2"]
    );
}
