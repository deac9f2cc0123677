//! `bench`: see `bench --help`.
fn main() -> std::process::ExitCode {
    transformer_bench::cli::main()
}
