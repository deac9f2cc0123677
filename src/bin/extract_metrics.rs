//! `extract-metrics`: see `extract-metrics --help`.
fn main() -> std::process::ExitCode {
    transformer_bench::report::extract::main()
}
