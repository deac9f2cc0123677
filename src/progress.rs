//! Progress bars on stderr (hidden when stderr is not a terminal or progress is off).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// A bar over `len` items; `template` is indicatif's (`{pos}/{len} passages [{bar:40}] …`).
pub fn bar(enabled: bool, len: u64, template: &str) -> ProgressBar {
    if !enabled || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

/// Passages of a LAMBADA run.
pub fn passages(enabled: bool, len: u64) -> ProgressBar {
    bar(
        enabled,
        len,
        "{spinner} {pos}/{len} passages [{bar:40}] {per_sec} eta {eta}",
    )
}

/// Optimizer steps of a training run.
pub fn steps(enabled: bool, len: u64) -> ProgressBar {
    bar(
        enabled,
        len,
        "{spinner} {pos}/{len} steps [{bar:40}] {per_sec} eta {eta}",
    )
}

/// Runs of a sweep.
pub fn sweep_runs(enabled: bool, len: u64) -> ProgressBar {
    bar(
        enabled,
        len,
        "{spinner} sweep {pos}/{len} runs [{bar:30}] eta {eta} {msg}",
    )
}
