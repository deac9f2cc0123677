fn main() -> std::process::ExitCode {
    transformer_bench::extract::main()
}
