//! Multi-process runs without mpirun: who this process is ([`world`]), how the ranks meet and
//! notice each other's death ([`rendezvous`]), and the collectives ([`collective`]: the
//! all-reduce, and [`Tp`], a rank's place in its group). The launcher that starts every rank
//! is [`crate::launch::spawn`]. Nothing here needs a GPU or NCCL: the rendezvous carries an opaque id (NCCL's
//! unique id for tensor / data parallelism), so the launcher is tested on CPU.

pub mod collective;
#[cfg(test)]
mod contract;
#[cfg(all(test, feature = "nccl"))]
mod gpu_tests;
pub mod group;
#[cfg(feature = "nccl")]
pub mod nccl;
#[cfg(feature = "nccl")]
mod pair_sum;
#[cfg(feature = "nccl")]
mod peer_sum;
pub mod rendezvous;
#[cfg(test)]
pub(crate) mod test_ranks;
pub mod world;

pub use collective::{part, AllReduce, Tp};
pub use rendezvous::{Peer, Rendezvous};
pub use world::{Launcher, World};
