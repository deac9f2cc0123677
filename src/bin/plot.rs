fn main() -> std::process::ExitCode {
    transformer_bench::plot::main()
}
