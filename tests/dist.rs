//! The multi-process launcher and rendezvous as users run them (`bench dist-check`), on CPU:
//! self-spawned ranks, ranks started by an outside launcher (torchrun / Open MPI / Slurm
//! variables), a rank that dies, rank 0 dying, and a rank that never starts.

mod common;
use common::{bench, text};

use std::process::{Child, Output};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The id digests the ranks printed: one per rank.
fn ids(stdout: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.split("id sha256 ").nth(1))
        .map(|rest| rest.split(' ').next().unwrap().to_string())
        .collect()
}

#[test]
fn self_spawned_ranks_meet_and_share_one_id() {
    let o = bench()
        .args(["dist-check", "--nproc", "3"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let ids = ids(&o.stdout);
    assert_eq!(ids.len(), 3, "{}", text(&o));
    assert!(ids.iter().all(|i| i == &ids[0]), "{ids:?}");
    assert!(text(&o).contains("ranks [0, 1, 2]"));
}

#[test]
fn a_dead_rank_stops_every_other_rank_with_its_name() {
    let t = Instant::now();
    // The survivors would work for 10 minutes; the rendezvous watchdog must stop them.
    let o = bench()
        .args(["dist-check", "--nproc", "3", "--work-ms", "600000"])
        .env("BENCH_DIST_CHECK_DIE", "1")
        .output()
        .unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("rank 1 exited with status 3"), "{err}");
    assert!(
        err.contains("stopping rank 0") && err.contains("stopping rank 2"),
        "{err}"
    );
}

/// Two ranks started as an outside launcher would, with `vars(rank)` set.
fn launch_two(vars: impl Fn(usize) -> Vec<(String, String)>, die: Option<usize>) -> Vec<Child> {
    (0..2)
        .map(|rank| {
            let mut c = bench();
            // With a rank to die, the other would work for 10 minutes unless stopped.
            let work = if die.is_some() { "600000" } else { "0" };
            c.args(["dist-check", "--rdzv-timeout", "20", "--work-ms", work]);
            c.envs(vars(rank));
            if let Some(d) = die {
                c.env("BENCH_DIST_CHECK_DIE", d.to_string());
            }
            c.spawn().unwrap()
        })
        .collect()
}

fn master(port: u16) -> Vec<(String, String)> {
    vec![
        ("MASTER_ADDR".into(), "127.0.0.1".into()),
        ("MASTER_PORT".into(), port.to_string()),
    ]
}

#[test]
fn torchrun_variables_make_a_world() {
    let port = free_port();
    let ranks = launch_two(
        |r| {
            let mut v = master(port);
            v.push(("RANK".into(), r.to_string()));
            v.push(("WORLD_SIZE".into(), "2".into()));
            v.push(("LOCAL_RANK".into(), r.to_string()));
            v
        },
        None,
    );
    let outs: Vec<Output> = ranks
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for o in &outs {
        assert!(o.status.success(), "{}", text(o));
        assert!(text(o).contains("(Torchrun)"), "{}", text(o));
    }
    assert_eq!(ids(&outs[0].stdout), ids(&outs[1].stdout));
}

#[test]
fn rank_0_dying_stops_the_others_under_open_mpi_variables() {
    let port = free_port();
    let t = Instant::now();
    let ranks = launch_two(
        |r| {
            let mut v = master(port);
            v.push(("OMPI_COMM_WORLD_RANK".into(), r.to_string()));
            v.push(("OMPI_COMM_WORLD_SIZE".into(), "2".into()));
            v.push(("OMPI_COMM_WORLD_LOCAL_RANK".into(), r.to_string()));
            v
        },
        Some(0),
    );
    let outs: Vec<Output> = ranks
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(outs[0].status.code(), Some(3));
    let survivor = text(&outs[1]);
    assert_eq!(outs[1].status.code(), Some(75), "{survivor}");
    assert!(survivor.contains("rank 0 exited"), "{survivor}");
}

#[test]
fn a_rank_that_never_starts_is_named_after_the_timeout() {
    let port = free_port();
    let o = bench()
        .args(["dist-check", "--rdzv-timeout", "2"])
        .env("SLURM_PROCID", "0")
        .env("SLURM_NTASKS", "3")
        .env("SLURM_LOCALID", "0")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("rank(s) 1, 2 did not join within 2 s"),
        "{err}"
    );
}

#[test]
fn launcher_variables_without_a_master_address_are_a_one_line_error() {
    let o = bench()
        .args(["dist-check"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env("LOCAL_RANK", "0")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("MASTER_ADDR"), "{err}");
}
