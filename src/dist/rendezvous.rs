//! Ranks meet over TCP at rank 0, which hands every rank the same opaque id (NCCL's unique
//! id) and the list of all ranks. The connections then stay open as a liveness channel: when a
//! rank's process dies its socket closes, rank 0 tells every other rank which one died, and each
//! rank exits with an error naming it, even while its main thread is blocked in a collective.
//!
//! Wire format: one JSON object per line. rank → 0: `{"hello": Peer}`, later `{"done": true}`;
//! 0 → rank: `{"id": hex, "peers": [Peer…]}`, or `{"failed": k, "why": …}`.

use super::world::World;
use crate::error::{Error, Result};
use crate::progress::Status;
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What a rank tells the others about itself (for rank 0's log header).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Peer {
    pub rank: usize,
    pub host: String,
    pub pid: u32,
    /// Free-form facts, e.g. the GPU name and UUID.
    #[serde(default)]
    pub info: Value,
}

/// A finished rendezvous: the shared id and every rank, in rank order.
pub struct Rendezvous {
    pub world: World,
    pub id: Vec<u8>,
    pub peers: Vec<Peer>,
    link: Link,
}

enum Link {
    Server {
        /// Ranks that said `done` (their connection closing is then no failure).
        done: Arc<(Mutex<BTreeSet<usize>>, Condvar)>,
    },
    Client {
        stream: TcpStream,
        finishing: Arc<AtomicBool>,
    },
}

/// Exit status of a rank stopped because another rank failed (so that a launcher can tell
/// the culprit from the ranks that stopped after it).
pub const STOPPED_BY_PEER: i32 = 75;

/// Stops this process because another rank failed: the other ranks may be blocked in a collective
/// that will never complete, so exiting is the only way not to hang.
fn stop(me: usize, why: &str) -> ! {
    // One write: the ranks share the launcher's stderr, and eprintln! may write in pieces.
    let line = format!("error: {why}; stopping rank {me}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    std::process::exit(STOPPED_BY_PEER)
}

fn send(stream: &mut TcpStream, v: &Value) -> std::io::Result<()> {
    stream.write_all(format!("{v}\n").as_bytes())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Rendezvous {
    /// Meets the other ranks of `world` within `timeout`. On rank 0 `make_id` makes the id
    /// every rank receives; elsewhere it is not called. With `progress`, rank 0 shows how many
    /// ranks have joined (the others show nothing: they share its stderr).
    pub fn join(
        world: &World,
        me: Peer,
        make_id: impl FnOnce() -> Result<Vec<u8>>,
        timeout: Duration,
        progress: bool,
    ) -> Result<Self> {
        if world.rank == 0 {
            Self::serve(world, me, make_id, timeout, progress)
        } else {
            Self::connect(world, me, timeout)
        }
    }

    fn serve(
        world: &World,
        me: Peer,
        make_id: impl FnOnce() -> Result<Vec<u8>>,
        timeout: Duration,
        progress: bool,
    ) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let listener = TcpListener::bind(world.master).map_err(|e| {
            Error::Config(format!(
                "rank 0 cannot listen on {}: {e} (another job holds that port: pick a free MASTER_PORT, or set {} to a free port on every rank)",
                world.master,
                super::world::ENV_RDZV_PORT
            ))
        })?;
        let status = Status::spinner(progress, waiting(1, world.size, timeout));
        let mut clients = accept_ranks(world, &listener, (deadline, timeout), status.bar())?;
        let secs = status.elapsed().as_secs_f64();
        status.done(format!("all {} ranks joined in {secs:.1} s", world.size));
        let id = make_id()?;
        let mut peers: Vec<Peer> = clients.iter().map(|(p, _)| p.clone()).collect();
        peers.push(me);
        peers.sort_by_key(|p| p.rank);
        let reply = json!({"id": hex(&id), "peers": peers});
        for (_, stream) in clients.iter_mut() {
            send(stream, &reply)?;
        }
        let done = Arc::new((Mutex::new(BTreeSet::new()), Condvar::new()));
        let writers: Arc<Mutex<Vec<(usize, TcpStream)>>> = Arc::new(Mutex::new(
            clients
                .iter()
                .map(|(p, s)| Ok((p.rank, s.try_clone()?)))
                .collect::<std::io::Result<_>>()?,
        ));
        for (peer, stream) in clients {
            let (done, writers) = (done.clone(), writers.clone());
            std::thread::spawn(move || watch_client(peer, stream, done, writers));
        }
        Ok(Self {
            world: world.clone(),
            id,
            peers,
            link: Link::Server { done },
        })
    }

    fn connect(world: &World, me: Peer, timeout: Duration) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        // Rank 0 may not be listening yet: retry until the deadline.
        let mut stream = loop {
            match TcpStream::connect_timeout(&world.master, Duration::from_secs(1)) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(Error::Config(format!(
                        "rank {} could not reach rank 0 at {} within {} s ({e}): is rank 0 running, and MASTER_ADDR / MASTER_PORT the same on every rank?",
                        world.rank,
                        world.master,
                        timeout.as_secs()
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        send(&mut stream, &json!({ "hello": me }))?;
        let left = deadline.saturating_duration_since(Instant::now());
        stream.set_read_timeout(Some(left.max(Duration::from_secs(1))))?;
        let mut reader = BufReader::new(stream.try_clone()?);
        let mut line = String::new();
        reader.read_line(&mut line).map_err(|e| {
            Error::Config(format!(
                "rank {}: rank 0 accepted but sent no id within {} s ({e}): another rank may not have started",
                world.rank,
                timeout.as_secs()
            ))
        })?;
        let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        if let Some(k) = v["failed"].as_u64() {
            stop(
                world.rank,
                &format!("rank {k} failed during the rendezvous"),
            );
        }
        let id = v["id"].as_str().and_then(unhex);
        let peers = serde_json::from_value::<Vec<Peer>>(v["peers"].clone());
        let (Some(id), Ok(peers)) = (id, peers) else {
            return Err(Error::Config(format!(
                "rank {}: rank 0 sent {line:?}, not an id and a rank list: is MASTER_PORT another program's?",
                world.rank
            )));
        };
        stream.set_read_timeout(None)?;
        let finishing = Arc::new(AtomicBool::new(false));
        let me_rank = world.rank;
        let flag = finishing.clone();
        std::thread::spawn(move || watch_server(me_rank, reader, flag));
        Ok(Self {
            world: world.clone(),
            id,
            peers,
            link: Link::Client { stream, finishing },
        })
    }

    /// A clean end: a rank says it is done (its exit is then no failure); rank 0 waits up
    /// to `timeout` for every rank to say so, so that its own exit is not taken for a crash.
    pub fn finish(self, timeout: Duration) -> Result<()> {
        match self.link {
            Link::Client {
                mut stream,
                finishing,
            } => {
                finishing.store(true, Ordering::SeqCst);
                send(&mut stream, &json!({"done": true}))?;
                Ok(())
            }
            Link::Server { done } => {
                let (lock, cvar) = &*done;
                let guard = lock.lock().expect("rendezvous lock");
                let n = self.world.size - 1;
                let (guard, _) = cvar
                    .wait_timeout_while(guard, timeout, |d| d.len() < n)
                    .expect("rendezvous lock");
                if guard.len() < n {
                    return Err(Error::Config(format!(
                        "rank 0 finished but only {} of {n} other ranks did within {} s",
                        guard.len(),
                        timeout.as_secs()
                    )));
                }
                Ok(())
            }
        }
    }
}

/// `waiting for ranks: 1/4 joined (timeout 120 s)`.
fn waiting(joined: usize, size: usize, timeout: Duration) -> String {
    format!(
        "waiting for ranks: {joined}/{size} joined (timeout {} s)",
        timeout.as_secs()
    )
}

/// Rank 0 accepts every other rank of `world` (each says hello first) until `deadline`
/// (`timeout` after the start), counting them on `bar`.
fn accept_ranks(
    world: &World,
    listener: &TcpListener,
    (deadline, timeout): (Instant, Duration),
    bar: &ProgressBar,
) -> Result<Vec<(Peer, TcpStream)>> {
    listener.set_nonblocking(true)?;
    let mut clients: Vec<(Peer, TcpStream)> = vec![];
    while clients.len() + 1 < world.size {
        match listener.accept() {
            Ok((stream, _)) => {
                let peer = read_hello(world, &stream, deadline, &clients)?;
                clients.push((peer, stream));
                bar.set_message(waiting(clients.len() + 1, world.size, timeout));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(missing_ranks(world, &clients, timeout));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(clients)
}

/// The hello of a new connection: a rank of `world` that has not joined yet.
fn read_hello(
    world: &World,
    stream: &TcpStream,
    deadline: Instant,
    clients: &[(Peer, TcpStream)],
) -> Result<Peer> {
    stream.set_nonblocking(false)?;
    let left = deadline.saturating_duration_since(Instant::now());
    stream.set_read_timeout(Some(left.max(Duration::from_millis(100))))?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    let hello: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
    let peer: Peer = serde_json::from_value(hello["hello"].clone()).map_err(|_| {
        Error::Config(format!(
            "rank 0: a connection to {} did not say hello ({line:?}): another program on MASTER_PORT?",
            world.master
        ))
    })?;
    let known = clients.iter().any(|(p, _)| p.rank == peer.rank);
    if peer.rank == 0 || peer.rank >= world.size || known {
        return Err(Error::Config(format!(
            "rank 0: a process says it is rank {} of {} (duplicate or out of range): check RANK / WORLD_SIZE",
            peer.rank, world.size
        )));
    }
    stream.set_read_timeout(None)?;
    Ok(peer)
}

/// The error naming the ranks that did not join within `timeout`.
fn missing_ranks(world: &World, clients: &[(Peer, TcpStream)], timeout: Duration) -> Error {
    let joined: BTreeSet<usize> = clients.iter().map(|(p, _)| p.rank).collect();
    let missing: Vec<String> = (1..world.size)
        .filter(|r| !joined.contains(r))
        .map(|r| r.to_string())
        .collect();
    Error::Config(format!(
        "rank(s) {} did not join within {} s (did they start? look at their output; raise --rdzv-timeout for slow starts)",
        missing.join(", "),
        timeout.as_secs()
    ))
}

/// Rank 0's watch over one rank: `done`, or a closed connection = that rank failed.
fn watch_client(
    peer: Peer,
    stream: TcpStream,
    done: Arc<(Mutex<BTreeSet<usize>>, Condvar)>,
    writers: Arc<Mutex<Vec<(usize, TcpStream)>>>,
) {
    let mut lines = BufReader::new(stream).lines();
    while let Some(Ok(line)) = lines.next() {
        if serde_json::from_str::<Value>(&line).is_ok_and(|v| v["done"] == json!(true)) {
            let (lock, cvar) = &*done;
            lock.lock().expect("rendezvous lock").insert(peer.rank);
            cvar.notify_all();
            return;
        }
    }
    let why = format!(
        "rank {} (pid {} on {}) exited or lost its connection",
        peer.rank, peer.pid, peer.host
    );
    let msg = json!({"failed": peer.rank, "why": why});
    for (rank, w) in writers.lock().expect("rendezvous lock").iter_mut() {
        if *rank != peer.rank {
            let _ = send(w, &msg);
        }
    }
    stop(0, &why)
}

/// A rank's watch over rank 0: a `failed` message, or rank 0's connection closing.
fn watch_server(me: usize, reader: BufReader<TcpStream>, finishing: Arc<AtomicBool>) {
    for line in reader.lines() {
        let Ok(line) = line else { break };
        let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        if v["failed"].is_u64() {
            let why = v["why"].as_str().unwrap_or("a rank failed").to_string();
            stop(me, &why);
        }
    }
    if !finishing.load(Ordering::SeqCst) {
        stop(me, "rank 0 exited or its connection was lost");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let id: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&id)).unwrap(), id);
        assert_eq!(unhex("0g"), None);
    }
}
