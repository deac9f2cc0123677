//! llm.c's stdout, line by line: the one parser of its `step …` lines, read by the llmc engine
//! as the trainer prints them (`crate::engines::llmc`) and by `extract-metrics` from a saved log
//! (`crate::report::extract`). A leaf both import: it imports nothing of this crate. Three
//! generations of the step line are known: the current CUDA trainer's (`train_gpt2.cu`), the
//! older CUDA trainer's and the C trainer's (0-based steps).

use regex::Regex;
use std::sync::LazyLock;

const NUM: &str = r"[-\d.eE+naif]+";

static STEP_CUDA: LazyLock<Regex> = LazyLock::new(|| {
    // step    1/74 | loss 11.0 (+0.00z)| norm 15.4 (+0.00z)| lr 6.00e-06 | 1234.56 ms | 12.3% bf16 MFU | 12345 tok/s
    // (2024: "| train loss 11.0 | norm 15.4 | …", without the z-scores; some builds print no MFU)
    Regex::new(&format!(r"^step\s+(\d+)/(\d+)\s*\|\s*(?:train )?loss ({NUM})(?:\s*\([^)]*\))?\s*\|\s*norm ({NUM})(?:\s*\([^)]*\))?\s*\|\s*lr ({NUM})\s*\|\s*([\d.]+) ms(?:\s*\|\s*(-?[\d.]+)% bf16 MFU)?\s*\|\s*([\d.]+) tok/s")).unwrap()
});
static STEP_OLD_CUDA: LazyLock<Regex> = LazyLock::new(|| {
    // step   61/74: train loss 3.213066 (312.014672 ms, 13127 tok/s)   ("step %4d/%d: …")
    Regex::new(&format!(
        r"^step\s+(\d+)/(\d+): train loss ({NUM}) \(([\d.]+) ms, ([\d.]+) tok/s\)"
    ))
    .unwrap()
});
static STEP_C: LazyLock<Regex> = LazyLock::new(|| {
    // step 20: train loss 4.52 (took 2636.6 ms)   (0-based step)
    Regex::new(&format!(
        r"^step\s+(\d+): train loss ({NUM}) \(took ([\d.]+) ms\)"
    ))
    .unwrap()
});
static VAL: LazyLock<Regex> = LazyLock::new(|| Regex::new(&format!(r"^val loss ({NUM})")).unwrap());
static HELLASWAG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^HellaSwag: \d+/\d+ = ([\d.]+)").unwrap());
static AVG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^total average iteration time: ([\d.]+) ms").unwrap());
static MEMORY: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^device memory usage: (\d+) MiB / (\d+) MiB").unwrap());

/// One optimizer step as llm.c printed it.
#[derive(Clone, Debug, PartialEq)]
pub struct StepLine {
    /// Optimizer steps done (1-based; the C trainer's 0-based count + 1).
    pub step: usize,
    /// Steps of the run, where the line says.
    pub of: Option<usize>,
    pub loss: f64,
    /// Gradient norm before clipping (current CUDA trainer).
    pub grad_norm: Option<f64>,
    pub lr: Option<f64>,
    /// The step's time: CUDA events around forward, backward and update.
    pub ms: f64,
    /// llm.c's own MFU estimate, percent (negative: a GPU it has no peak for).
    pub mfu_percent: Option<f64>,
    /// The current trainer prints a bias-corrected running mean (EMA) here, not the step's
    /// own rate.
    pub tok_per_s: Option<f64>,
}

/// A line of llm.c's stdout that carries a number.
#[derive(Clone, Debug, PartialEq)]
pub enum Line {
    Step(StepLine),
    /// `val loss X`: mean loss over the validation batches (`-m` of them).
    ValLoss(f64),
    /// `HellaSwag: n/N = acc`.
    HellaSwag(f64),
    /// `total average iteration time: X ms`, over every step but the first.
    AverageMs(f64),
    /// `device memory usage: X MiB / Y MiB` (cudaMemGetInfo once everything is allocated).
    DeviceMemory {
        used_mib: u64,
        total_mib: u64,
    },
}

fn f(s: &str) -> f64 {
    s.trim().parse().unwrap_or(f64::NAN)
}

fn step_line(line: &str) -> Option<StepLine> {
    let n = |s: &str| s.parse::<usize>().ok();
    if let Some(c) = STEP_CUDA.captures(line) {
        return Some(StepLine {
            step: n(&c[1])?,
            of: n(&c[2]),
            loss: f(&c[3]),
            grad_norm: Some(f(&c[4])),
            lr: Some(f(&c[5])),
            ms: f(&c[6]),
            mfu_percent: c.get(7).map(|m| f(m.as_str())),
            tok_per_s: Some(f(&c[8])),
        });
    }
    if let Some(c) = STEP_OLD_CUDA.captures(line) {
        return Some(StepLine {
            step: n(&c[1])?,
            of: n(&c[2]),
            loss: f(&c[3]),
            grad_norm: None,
            lr: None,
            ms: f(&c[4]),
            mfu_percent: None,
            tok_per_s: Some(f(&c[5])),
        });
    }
    let c = STEP_C.captures(line)?;
    Some(StepLine {
        // A 0-based step of usize::MAX has no 1-based count: not a step line (#38 fuzzing).
        step: n(&c[1])?.checked_add(1)?,
        of: None,
        loss: f(&c[2]),
        grad_norm: None,
        lr: None,
        ms: f(&c[3]),
        mfu_percent: None,
        tok_per_s: None,
    })
}

/// The number a line of llm.c's stdout carries; None for every other line (its parameter
/// table, warnings, generated samples).
pub fn parse_line(line: &str) -> Option<Line> {
    let line = line.trim_end();
    if let Some(s) = step_line(line) {
        return Some(Line::Step(s));
    }
    let one = |re: &Regex| re.captures(line).map(|c| f(&c[1]));
    if let Some(v) = one(&VAL) {
        return Some(Line::ValLoss(v));
    }
    if let Some(v) = one(&HELLASWAG) {
        return Some(Line::HellaSwag(v));
    }
    if let Some(v) = one(&AVG) {
        return Some(Line::AverageMs(v));
    }
    let c = MEMORY.captures(line)?;
    Some(Line::DeviceMemory {
        used_mib: c[1].parse().ok()?,
        total_mib: c[2].parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_generation_of_the_step_line() {
        let cuda = "step    2/10 | loss 10.947962 (+nanz)| norm 15.0123 (+nanz)| lr 1.71e-05 | 312.45 ms | 46.1% bf16 MFU | 1678023 tok/s";
        assert_eq!(
            parse_line(cuda),
            Some(Line::Step(StepLine {
                step: 2,
                of: Some(10),
                loss: 10.947962,
                grad_norm: Some(15.0123),
                lr: Some(1.71e-5),
                ms: 312.45,
                mfu_percent: Some(46.1),
                tok_per_s: Some(1678023.),
            }))
        );
        let Some(Line::Step(old)) =
            parse_line("step   61/74: train loss 3.213066 (312.014672 ms, 13127 tok/s)")
        else {
            panic!("old CUDA step line")
        };
        assert_eq!((old.step, old.of, old.ms), (61, Some(74), 312.014672));
        let Some(Line::Step(c)) = parse_line("step 20: train loss 4.52 (took 2636.6 ms)") else {
            panic!("C step line")
        };
        assert_eq!((c.step, c.loss, c.ms), (21, 4.52, 2636.6));
    }

    #[test]
    fn evaluation_memory_and_other_lines() {
        assert_eq!(
            parse_line("val loss 10.402117"),
            Some(Line::ValLoss(10.402117))
        );
        assert_eq!(
            parse_line("device memory usage: 7843 MiB / 81090 MiB"),
            Some(Line::DeviceMemory {
                used_mib: 7843,
                total_mib: 81090
            })
        );
        assert_eq!(
            parse_line("total average iteration time: 312.583250 ms"),
            Some(Line::AverageMs(312.58325))
        );
        assert_eq!(parse_line("allocated 474 MiB for model parameters"), None);
        assert_eq!(parse_line("step    5/10 | loss 10.5#garbled"), None);
    }
}
