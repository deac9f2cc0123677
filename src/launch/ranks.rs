//! Tensor- and data-parallel runs: as one rank (launcher variables set: ours, torchrun's,
//! Open MPI's or Slurm's), join the group and run; else start the N ranks of this same
//! command on this host and wait for them ([`crate::launch::spawn`]).

use super::spawn::spawn_ranks;
use crate::device::DeviceSpec;
use crate::dist::group::{GroupRank, RankContext};
use crate::dist::World;
use crate::error::{Error, Result};
use std::process::ExitCode;
use std::time::Duration;

/// How to run one rank: with its group's context, to an exit code.
pub type RankRun<'a> = Box<dyn FnOnce(RankContext) -> Result<ExitCode> + 'a>;

/// How the ranks meet: within `timeout`, rank 0 showing who has joined with `progress`.
pub struct Meeting {
    pub timeout: Duration,
    pub progress: bool,
}

/// Runs this process as one of `n` ranks (`flag` names the mode in errors), or, without
/// launcher variables, starts `n` ranks of this command and waits for them.
pub fn run_ranks(
    n: usize,
    flag: &str,
    device: DeviceSpec,
    meeting: Meeting,
    run: RankRun,
) -> Result<ExitCode> {
    let Meeting { timeout, progress } = meeting;
    let Some(world) = World::from_env()? else {
        let child_args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        spawn_ranks(n, &child_args)?;
        return Ok(ExitCode::SUCCESS);
    };
    if world.size != n {
        return Err(Error::Config(format!(
            "{flag} {n}, but the launcher started {} ranks: start exactly {n} (one per GPU)",
            world.size
        )));
    }
    let rank = GroupRank::join(world, device, timeout, progress)?;
    let code = run(rank.ctx.clone())?;
    rank.finish(timeout)?;
    Ok(code)
}
