//! One command starts every rank: this binary re-runs itself N times with the `BENCH_*`
//! variables set, one process per GPU, rank 0 hosting the rendezvous on a free local port.
//! No mpirun, no files: the children die with the launcher (`PR_SET_PDEATHSIG`).

use crate::dist::rendezvous::STOPPED_BY_PEER;
use crate::dist::world::{ENV_LOCAL_RANK, ENV_MASTER, ENV_RANK, ENV_WORLD_SIZE};
use crate::error::{Error, Result};
use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// How long the launcher waits for the other ranks to stop on their own (the rendezvous
/// watchdog) after one failed, before it kills them.
const GRACE: Duration = Duration::from_secs(30);

/// Runs `args` (this binary's arguments) as `n` ranks on this host and waits for all of them.
/// Errors name the first rank that failed and how.
pub fn spawn_ranks(n: usize, args: &[OsString]) -> Result<()> {
    let exe = std::env::current_exe()?;
    // A free port: bound and released here, bound again by rank 0 right away.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut children: Vec<(usize, Child)> = vec![];
    for rank in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(args)
            .env(ENV_RANK, rank.to_string())
            .env(ENV_WORLD_SIZE, n.to_string())
            .env(ENV_LOCAL_RANK, rank.to_string())
            .env(ENV_MASTER, format!("127.0.0.1:{port}"));
        die_with_parent(&mut cmd);
        match cmd.spawn() {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                kill_all(&mut children);
                return Err(Error::Config(format!("cannot start rank {rank}: {e}")));
            }
        }
    }
    let mut failures: Vec<(usize, ExitStatus)> = vec![];
    let mut failed_at: Option<Instant> = None;
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            match children[i].1.try_wait()? {
                Some(status) => {
                    let (rank, _) = children.remove(i);
                    if !status.success() {
                        failures.push((rank, status));
                        failed_at.get_or_insert_with(Instant::now);
                    }
                }
                None => i += 1,
            }
        }
        if failed_at.is_some_and(|t| t.elapsed() > GRACE) {
            kill_all(&mut children);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    match culprit(&failures) {
        None => Ok(()),
        Some((rank, status)) => Err(Error::Config(format!(
            "rank {rank} {}; the other ranks were stopped",
            describe(status)
        ))),
    }
}

/// The child gets SIGKILL when this process dies, so a killed launcher or sweep leaves no
/// child holding a GPU; if we died before prctl took effect, the child's parent is already
/// init and it exits at once.
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid, _exit).
    unsafe {
        let parent = libc::getpid();
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}

/// The rank to blame among `failures` (in the order seen): one SIGKILLed (by hand or the
/// out-of-memory killer, never in answer to a peer; the launcher's own kills are not
/// failures), else the first that is not a rank its watchdog stopped after a peer. A peer of
/// a killed rank can fail on its own (a broken connection) and be seen dead in the same poll,
/// before the killed one in rank order.
fn culprit(failures: &[(usize, ExitStatus)]) -> Option<(usize, ExitStatus)> {
    failures
        .iter()
        .find(|(_, s)| s.signal() == Some(libc::SIGKILL))
        .or_else(|| {
            failures
                .iter()
                .find(|(_, s)| s.code() != Some(STOPPED_BY_PEER))
        })
        .or(failures.first())
        .copied()
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(9)) => "was killed (SIGKILL: out of host memory, or killed by hand?)".into(),
        (None, Some(s)) => format!("died of signal {s}"),
        _ => format!("ended with {status}"),
    }
}

fn kill_all(children: &mut Vec<(usize, Child)>) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    children.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    fn killed(signal: i32) -> ExitStatus {
        ExitStatus::from_raw(signal)
    }

    /// Rank 1 killed by hand, rank 0 failing on the broken connection and seen first: rank 1
    /// is named; without a signal, the first rank its watchdog did not stop.
    #[test]
    fn the_culprit_is_the_killed_rank_else_the_first_not_stopped_by_a_peer() {
        let seen = [(0, exited(2)), (1, killed(libc::SIGKILL))];
        assert_eq!(culprit(&seen).map(|(r, _)| r), Some(1));
        // A rank that aborts is no proof of being first: the order seen decides.
        let seen = [(0, exited(2)), (1, killed(libc::SIGABRT))];
        assert_eq!(culprit(&seen).map(|(r, _)| r), Some(0));
        let seen = [(0, exited(STOPPED_BY_PEER)), (1, exited(2))];
        assert_eq!(culprit(&seen).map(|(r, _)| r), Some(1));
        let seen = [(1, exited(STOPPED_BY_PEER))];
        assert_eq!(culprit(&seen).map(|(r, _)| r), Some(1));
        assert_eq!(culprit(&[]), None);
        assert!(describe(killed(libc::SIGKILL)).starts_with("was killed"));
    }
}
