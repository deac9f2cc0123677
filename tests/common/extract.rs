//! Helpers of the extract-metrics and plot command-line tests (`tests/extract_plot.rs`,
//! `tests/extract_tables.rs`, `tests/plot_cli.rs`): running the binaries from the repository
//! root, golden files, CSV cells, one-line errors.

#[allow(unused_imports)]
pub use std::path::{Path, PathBuf};
#[allow(unused_imports)]
pub use std::process::{Command, Output};

pub fn logs(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/logs")
        .join(rel)
}

pub fn run(bin: &str, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("runs")
}

pub fn extract(args: &[&str]) -> Output {
    run(env!("CARGO_BIN_EXE_extract-metrics"), args)
}

/// `plot -i CSV -o OUT EXTRA…`
pub fn plot(csv: &Path, out: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["-i", csv.to_str().unwrap(), "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    run(env!("CARGO_BIN_EXE_plot"), &args)
}

/// Compares with `tests/fixtures/logs/golden/NAME`; `UPDATE_GOLDEN=1` rewrites it.
pub fn golden(name: &str, got: &[u8]) {
    let path = logs("golden").join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, got).unwrap();
    }
    let want =
        std::fs::read(&path).unwrap_or_else(|_| panic!("missing golden file {}", path.display()));
    assert_eq!(
        String::from_utf8_lossy(got),
        String::from_utf8_lossy(&want),
        "differs from {}",
        path.display()
    );
}

pub fn ok_stdout(o: &Output) -> &[u8] {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    &o.stdout
}

/// CSV text -> one map (column -> cell) per row. (No cell of these fixtures holds a comma.)
pub fn csv_rows(csv: &str) -> Vec<std::collections::HashMap<String, String>> {
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    lines
        .map(|l| {
            head.iter()
                .zip(l.split(','))
                .map(|(h, c)| (h.to_string(), c.to_string()))
                .collect()
        })
        .collect()
}

/// A CSV line's cells, quotes undone (for cells that hold a comma, such as serving's batching
/// label).
pub fn quoted_cells(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (vec![], String::new(), false);
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// The row of `csv` whose `run` is `run`.
pub fn row_of(csv: &str, run: &str) -> std::collections::HashMap<String, String> {
    csv_rows(csv)
        .into_iter()
        .find(|r| r["run"] == run)
        .unwrap_or_else(|| panic!("no run {run} in {csv}"))
}

pub fn cell(row: &std::collections::HashMap<String, String>, col: &str) -> f64 {
    row.get(col)
        .unwrap_or_else(|| panic!("no column {col}"))
        .parse()
        .unwrap_or_else(|_| panic!("{col} = {:?} is not a number", row[col]))
}

/// The error of a failed command: one line, `Error: …`, the last on stderr (notes about the
/// inputs, e.g. a torn line, may come before it), no usage text.
pub fn one_line_error(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let last = err.trim_end().lines().last().unwrap_or("").to_string();
    assert!(last.starts_with("Error: "), "{err}");
    assert_eq!(err.matches("Error").count(), 1, "{err}");
    assert!(
        !err.contains("Usage") && !err.contains("For more information"),
        "{err}"
    );
    last
}
