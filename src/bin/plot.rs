//! `plot`: see `plot --help`.
fn main() -> std::process::ExitCode {
    transformer_bench::report::plot::main()
}
