//! Launchers decide which processes run a plan: this process (a plain run), a child process
//! per configuration ([`sweep`], like optimum-benchmark's process launcher), or one process
//! per rank of a tensor- or data-parallel group ([`ranks`], started by [`spawn`] or by an
//! outside launcher).

pub mod ranks;
pub mod spawn;
pub mod sweep;
