//! `plot`'s flags ([`Args`]): the CSV, the metric, which rows, how the chart is laid out.

use clap::Parser;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "plot",
    version,
    about = "Draws a chart (PNG or SVG) of one metric from an extract-metrics CSV.",
    after_help = "Examples:\n  plot --metric samples_per_second --fp32     (reads out.csv, writes samples_per_second_fp32.png)\n  plot -i out.csv -o fig.png --metric samples_per_second --bf16 --fp16 --x model --batch-size 16\n  plot -i out.csv -o mem.svg --metric peak_memory_bytes --where model=gpt2 --where suite=lambada\n  plot -i sweep.csv -o tput.png --metric samples_per_second --x batch_size\n  plot -i all.csv -o decode.png --metric decode_tokens_per_second --where suite=generation --log-y\n  plot -i serving.csv -o curve.png --curve --x requests_per_second --metric ttft_ms_p99"
)]
pub struct Args {
    /// CSV written by extract-metrics.
    #[arg(short, long, value_name = "CSV", default_value = "out.csv")]
    pub input: PathBuf,
    /// Output image; the extension picks the format (.png or .svg)
    /// [default: METRIC_PRECISION….png, e.g. samples_per_second_fp32.png].
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Numeric column to plot.
    #[arg(long, default_value = "samples_per_second")]
    pub metric: String,
    /// Only fp32 runs (precision flags combine; none = all precisions).
    #[arg(long)]
    pub fp32: bool,
    #[arg(long)]
    pub tf32: bool,
    #[arg(long)]
    pub fp16: bool,
    #[arg(long)]
    pub bf16: bool,
    /// Only this model.
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long)]
    pub suite: Option<String>,
    #[arg(long)]
    pub engine: Option<String>,
    /// Only GPUs whose name contains this.
    #[arg(long)]
    pub gpu: Option<String>,
    #[arg(long)]
    pub batch_size: Option<f64>,
    /// Keep only rows whose column KEY equals VALUE (KEY!=VALUE: differs; repeatable; numbers
    /// compare as numbers).
    #[arg(long = "where", value_name = "KEY=VALUE")]
    pub filters: Vec<String>,
    /// x axis: model (× batch size where it varies), gpu or any text column: bars;
    /// batch_size, seq_len, prompt_len, new_tokens, tp or dp: lines.
    #[arg(long, default_value = "model")]
    pub x: String,
    /// Side-by-side panels, one per value of this column (dtype, gpu, suite…): auto = by GPU
    /// where the rows come from several, else for lines by model; none = one panel.
    #[arg(long, value_name = "COLUMN", default_value = "auto")]
    pub facet: String,
    /// Latency–throughput curve: --x is a measured numeric column (requests_per_second,
    /// output_tokens_per_second), each run (or the median of a load's repeats) a point at
    /// (x, metric), one line a configuration, joined in x order, each point labelled with its
    /// offered rate.
    #[arg(long)]
    pub curve: bool,
    /// Logarithmic y axis (values that differ by orders of magnitude).
    #[arg(long)]
    pub log_y: bool,
    /// One bar per engine setting and build (attention, --fused set, commit) instead of each
    /// engine's newest.
    #[arg(long)]
    pub all_configs: bool,
    #[arg(long)]
    pub title: Option<String>,
}

impl Args {
    /// The precisions asked for, in flag order (none = all).
    pub fn precisions(&self) -> Vec<&'static str> {
        [
            ("fp32", self.fp32),
            ("tf32", self.tf32),
            ("fp16", self.fp16),
            ("bf16", self.bf16),
        ]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(p, _)| *p)
        .collect()
    }

    /// `-o`, or `METRIC[_PRECISION…].png`.
    pub fn output_path(&self) -> PathBuf {
        self.output.clone().unwrap_or_else(|| {
            let suffix: String = self.precisions().iter().map(|p| format!("_{p}")).collect();
            PathBuf::from(format!("{}{suffix}.png", self.metric))
        })
    }
}
