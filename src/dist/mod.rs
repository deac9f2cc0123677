//! Multi-process runs without mpirun: who this process is ([`world`]), how the ranks meet and
//! notice each other's death ([`rendezvous`]), and one command that starts every rank
//! ([`spawn`]). Nothing here needs a GPU or NCCL: the rendezvous carries an opaque id (NCCL's
//! unique id for tensor / data parallelism), so the launcher is tested on CPU.

pub mod collective;
pub mod group;
pub mod rendezvous;
pub mod spawn;
pub mod world;

pub use collective::AllReduce;
pub use rendezvous::{Peer, Rendezvous};
pub use world::{Launcher, World};
