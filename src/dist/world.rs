//! Which rank this process is, from the variables of the launcher that started it.

use crate::error::{Error, Result};
use std::net::{SocketAddr, ToSocketAddrs};

/// Who started the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// `bench … --tp N` / `--nproc N` started them itself (`BENCH_*` variables).
    SelfSpawned,
    /// torchrun / torch.distributed.run (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`).
    Torchrun,
    /// Open MPI's mpirun (`OMPI_COMM_WORLD_*`).
    OpenMpi,
    /// srun (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`).
    Slurm,
}

/// This process's place among the ranks, and where rank 0 listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct World {
    pub rank: usize,
    pub size: usize,
    /// Rank on this node: the GPU it uses.
    pub local_rank: usize,
    /// Rank 0's rendezvous address (`MASTER_ADDR:MASTER_PORT`).
    pub master: SocketAddr,
    pub launcher: Launcher,
}

/// Variables the self-spawning launcher sets for its children.
pub const ENV_RANK: &str = "BENCH_RANK";
pub const ENV_WORLD_SIZE: &str = "BENCH_WORLD_SIZE";
pub const ENV_LOCAL_RANK: &str = "BENCH_LOCAL_RANK";
pub const ENV_MASTER: &str = "BENCH_MASTER";
/// The port rank 0's rendezvous listens on, for any launcher: where `MASTER_PORT` (or, under
/// torchrun, `MASTER_PORT + 1`) is taken.
pub const ENV_RDZV_PORT: &str = "BENCH_RDZV_PORT";
/// Set by torchrun (torch.distributed.run) for its workers; its agent's store holds
/// `MASTER_PORT` on the master node, so our rendezvous takes the next port.
const TORCHRUN_MARK: &str = "TORCHELASTIC_RUN_ID";

impl World {
    /// From the environment: our own variables first, then torchrun's, Open MPI's, Slurm's.
    /// None when no launcher variables are set (a single-process run).
    pub fn from_env() -> Result<Option<World>> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// As [`World::from_env`], reading variables through `get` (for tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<World>> {
        let schemes: [(Launcher, [&str; 3]); 4] = [
            (
                Launcher::SelfSpawned,
                [ENV_RANK, ENV_WORLD_SIZE, ENV_LOCAL_RANK],
            ),
            (Launcher::Torchrun, ["RANK", "WORLD_SIZE", "LOCAL_RANK"]),
            (
                Launcher::OpenMpi,
                [
                    "OMPI_COMM_WORLD_RANK",
                    "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK",
                ],
            ),
            (
                Launcher::Slurm,
                ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"],
            ),
        ];
        let Some((launcher, names)) = schemes
            .into_iter()
            .find(|(_, names)| get(names[0]).is_some())
        else {
            return Ok(None);
        };
        let num = |name: &str| -> Result<usize> {
            let v = get(name).ok_or_else(|| {
                Error::Config(format!(
                    "{} is set but {name} is not: the launcher must set {}",
                    names[0],
                    names.join(", ")
                ))
            })?;
            v.trim()
                .parse()
                .map_err(|_| Error::Config(format!("{name}={v:?} is not a non-negative integer")))
        };
        let (rank, size, local_rank) = (num(names[0])?, num(names[1])?, num(names[2])?);
        if size == 0 || rank >= size {
            return Err(Error::Config(format!(
                "{}={rank} is not below {}={size}",
                names[0], names[1]
            )));
        }
        let master = match launcher {
            Launcher::SelfSpawned => get(ENV_MASTER).ok_or_else(|| {
                Error::Config(format!("{ENV_RANK} is set but {ENV_MASTER} is not"))
            })?,
            _ => match (get("MASTER_ADDR"), get("MASTER_PORT")) {
                (Some(a), Some(p)) => format!("{a}:{}", rendezvous_port(&get, &p)?),
                (None, _) if size == 1 => "127.0.0.1:29500".into(),
                _ => {
                    return Err(Error::Config(format!(
                        "{launcher:?} started {size} ranks but MASTER_ADDR / MASTER_PORT are not both set: \
                         export MASTER_ADDR=<rank 0's host> MASTER_PORT=<a free port> on every rank \
                         (torchrun sets them; with mpirun pass -x MASTER_ADDR -x MASTER_PORT)"
                    )))
                }
            },
        };
        let master = master
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| Error::Config(format!("cannot resolve rendezvous address {master}")))?;
        Ok(Some(World {
            rank,
            size,
            local_rank,
            master,
            launcher,
        }))
    }
}

/// The rendezvous port beside `MASTER_PORT`: `BENCH_RDZV_PORT` if set; under torchrun
/// `MASTER_PORT + 1` (its agent's store listens on `MASTER_PORT`); else `MASTER_PORT`.
fn rendezvous_port(get: &impl Fn(&str) -> Option<String>, master_port: &str) -> Result<u16> {
    let parse = |name: &str, v: &str| -> Result<u16> {
        v.trim()
            .parse()
            .map_err(|_| Error::Config(format!("{name}={v:?} is not a port number")))
    };
    if let Some(p) = get(ENV_RDZV_PORT) {
        return parse(ENV_RDZV_PORT, &p);
    }
    let port = parse("MASTER_PORT", master_port)?;
    match get(TORCHRUN_MARK) {
        Some(_) => port.checked_add(1).ok_or_else(|| {
            Error::Config(format!(
                "MASTER_PORT={port}: under torchrun bench listens on MASTER_PORT + 1; pick a lower port or set {ENV_RDZV_PORT}"
            ))
        }),
        None => Ok(port),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn world(vars: &[(&str, &str)]) -> Result<Option<World>> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        World::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn reads_each_launchers_variables() {
        assert_eq!(world(&[]).unwrap(), None);
        let master = [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29400")];
        let cases: [(&[(&str, &str)], Launcher); 3] = [
            (
                &[("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1")],
                Launcher::Torchrun,
            ),
            (
                &[
                    ("OMPI_COMM_WORLD_RANK", "1"),
                    ("OMPI_COMM_WORLD_SIZE", "4"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
                ],
                Launcher::OpenMpi,
            ),
            (
                &[
                    ("SLURM_PROCID", "1"),
                    ("SLURM_NTASKS", "4"),
                    ("SLURM_LOCALID", "1"),
                ],
                Launcher::Slurm,
            ),
        ];
        for (vars, launcher) in cases {
            let all: Vec<_> = vars.iter().chain(&master).copied().collect();
            let w = world(&all).unwrap().unwrap();
            assert_eq!((w.rank, w.size, w.local_rank), (1, 4, 1));
            assert_eq!(w.launcher, launcher);
            assert_eq!(w.master, "127.0.0.1:29400".parse().unwrap());
        }
    }

    #[test]
    fn under_torchrun_the_rendezvous_takes_the_port_after_its_store() {
        let torchrun = [
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "none"),
        ];
        let port = |extra: &[(&str, &str)]| {
            let all: Vec<_> = torchrun.iter().chain(extra).copied().collect();
            world(&all).map(|w| w.unwrap().master.port())
        };
        assert_eq!(port(&[]).unwrap(), 29501);
        assert_eq!(port(&[(ENV_RDZV_PORT, "31000")]).unwrap(), 31000);
        // RANK and friends set by hand (no torchrun agent): MASTER_PORT itself.
        let by_hand: Vec<_> = torchrun[..5].to_vec();
        assert_eq!(world(&by_hand).unwrap().unwrap().master.port(), 29500);
        let bad = port(&[(ENV_RDZV_PORT, "70000")]).unwrap_err().to_string();
        assert!(bad.contains(ENV_RDZV_PORT), "{bad}");
    }

    #[test]
    fn bad_launcher_variables_are_errors_that_name_the_fix() {
        let no_master = world(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")]);
        assert!(no_master.unwrap_err().to_string().contains("MASTER_ADDR"));
        let rank_too_big = world(&[
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "0"),
        ]);
        assert!(rank_too_big.unwrap_err().to_string().contains("not below"));
        let missing = world(&[("OMPI_COMM_WORLD_RANK", "0")]);
        assert!(missing
            .unwrap_err()
            .to_string()
            .contains("OMPI_COMM_WORLD_SIZE"));
        let garbage = world(&[("RANK", "x"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "0")]);
        assert!(garbage.unwrap_err().to_string().contains("\"x\""));
    }
}
