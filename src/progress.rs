//! Progress on stderr: bars over the timed loop (hidden when stderr is not a terminal or
//! progress is off), and [`Status`] lines for everything before it (weights, the HF worker,
//! rank rendezvous), so that a run is never silent for more than a moment: on a terminal a
//! live spinner or byte bar, elsewhere the same words as plain lines (a captured stderr says
//! what the run was doing when it stopped). stdout and the logs never get any of it.

use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::time::Duration;

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

/// How a [`Status`] shows itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Show {
    /// A live spinner or bar (stderr is a terminal).
    Live,
    /// Plain lines: the start and the end of the phase.
    Lines,
    /// Nothing (`--no-progress`, or a rank that does not log).
    Off,
}

/// One phase of a run's start (loading weights, starting the HF worker, waiting for ranks).
/// Count work on [`Status::bar`] (hidden unless live, but it keeps its position); end with
/// [`Status::done`].
pub struct Status {
    bar: ProgressBar,
    show: Show,
}

impl Status {
    fn new(enabled: bool, msg: String, live_style: &str, len: Option<u64>) -> Self {
        let show = match (enabled, std::io::stderr().is_terminal()) {
            (false, _) => Show::Off,
            (true, true) => Show::Live,
            (true, false) => Show::Lines,
        };
        if show == Show::Lines {
            eprintln!("{msg}");
        }
        // Styled while hidden, so that the first frame drawn is already this one.
        let bar = ProgressBar::hidden();
        if let Some(n) = len {
            bar.set_length(n);
        }
        let style = ProgressStyle::with_template(live_style).expect("valid template");
        bar.set_style(style.progress_chars("=> "));
        bar.set_message(msg);
        if show == Show::Live {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            bar.enable_steady_tick(Duration::from_millis(100));
        }
        Self { bar, show }
    }

    /// A phase without a count: a spinner with `msg` and the elapsed seconds.
    pub fn spinner(enabled: bool, msg: impl Into<String>) -> Self {
        Self::new(enabled, msg.into(), "{spinner} {msg} ({elapsed})", None)
    }

    /// Bytes (of weights): a bar to `total` (a counter without one), with bytes/s.
    pub fn bytes(enabled: bool, total: Option<u64>, msg: impl Into<String>) -> Self {
        let style = match total {
            Some(_) => {
                "{spinner} {msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} ({elapsed})"
            }
            None => "{spinner} {msg} {bytes} {bytes_per_sec} ({elapsed})",
        };
        Self::new(enabled, msg.into(), style, total)
    }

    /// The bar to count on (and to change the message of, while live).
    pub fn bar(&self) -> &ProgressBar {
        &self.bar
    }

    /// Seconds since the phase began.
    pub fn elapsed(&self) -> Duration {
        self.bar.elapsed()
    }

    /// Ends the phase with `msg`: the spinner's last line when live, a line otherwise.
    pub fn done(self, msg: impl Into<String>) {
        let msg = msg.into();
        match self.show {
            // The live bar makes way for a plain line, which the next bar cannot draw over.
            Show::Live => {
                self.bar.finish_and_clear();
                eprintln!("{msg}");
            }
            Show::Lines => eprintln!("{msg}"),
            Show::Off => {}
        }
    }
}

/// A phase that ends early (an error is on its way) takes its live bar with it, so that the
/// error starts its own line.
impl Drop for Status {
    fn drop(&mut self) {
        if !self.bar.is_finished() {
            self.bar.finish_and_clear();
        }
    }
}

/// `498.2 MiB in 0.41 s (1.2 GiB/s)`: what a byte count took.
pub fn rate(bytes: u64, elapsed: Duration) -> String {
    let s = elapsed.as_secs_f64();
    let per_sec = if s > 0. { bytes as f64 / s } else { 0. };
    format!(
        "{} in {s:.2} s ({}/s)",
        HumanBytes(bytes),
        HumanBytes(per_sec as u64)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_off_counts_silently() {
        let s = Status::bytes(false, Some(100), "loading weights");
        s.bar().inc(40);
        s.bar().inc(60);
        assert_eq!(s.bar().position(), 100);
        s.done("loaded");
    }

    #[test]
    fn rates_name_bytes_time_and_speed() {
        assert_eq!(
            rate(3 << 20, Duration::from_millis(1500)),
            "3.00 MiB in 1.50 s (2.00 MiB/s)"
        );
        assert_eq!(rate(0, Duration::ZERO), "0 B in 0.00 s (0 B/s)");
    }
}
