//! `bench` command line: parse options ([`args`]: [`Cli`]) -> a typed plan ([`plan`]) -> a
//! launcher and a scenario ([`commands`]) -> the printed summary.

pub mod args;
pub mod commands;
pub mod plan;

pub use args::{
    Cli, Command, DeviceArg, DistCheckArgs, DtypeArg, EnvArgs, Mode, RunArgs, ServeArgs, Strategy,
    TrainArgs, VerifyArgs, WeightsKind,
};
use clap::Parser;
use std::process::ExitCode;

/// Entry point of the `bench` binary.
pub fn main() -> ExitCode {
    let command_line: Vec<String> = std::env::args().collect();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Verify(v)) => commands::run_verify(v).map(commands::exit),
        Some(Command::Env(e)) => commands::run_env(e).map(commands::exit),
        Some(Command::DistCheck(d)) => commands::run_dist_check(d).map(|()| ExitCode::SUCCESS),
        None => commands::run_command(cli.run, command_line),
    };
    result.unwrap_or_else(|e| {
        eprintln!("Error: {e}");
        ExitCode::from(2)
    })
}
