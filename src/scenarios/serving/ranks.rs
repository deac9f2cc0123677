//! The serving suite over tensor-parallel ranks (`--tp N`). Every forward all-reduces, so every
//! rank must make the same engine calls in the same order; but the scheduler decides by the wall
//! clock which requests join, and two ranks' clocks would decide differently. So rank 0 (the
//! leader) alone schedules, on its clock, and broadcasts each engine operation before it performs
//! it; the other ranks (followers) run no scheduler: after the same untimed warm-up they receive
//! each operation and perform it on their shard, until [`Op::End`].
//!
//! The broadcast is the group's all-reduce, as the skeleton's `group_stop` broadcasts rank 0's
//! decision: a message of `2 + B` f32 values (`B` = `--batch-size`) on the rank's device, rank
//! 0's values and zeros on the other ranks, summed, read back on the followers. Layout
//! `[code, a, b…]`, zeros after: end `[1]`, join `[2, slot, request]`, step `[3]`, leave
//! `[4, slot]`, a static call `[5, n, id₁ … idₙ]` (n ≤ B). Integers are exact in f32 below 2^24,
//! which [`Channel::new`] checks of the slots and request ids. One small all-reduce an operation,
//! inside the leader's timed requests (the followers' host round trip included).

use super::queue::Served;
use crate::dist::{AllReduce, Tp};
use crate::error::{Error, Result};
use candle_core::{DType, Device, Tensor};
use std::sync::Arc;

/// Integers below this are exact in f32 (its 24-bit significand).
const EXACT: usize = 1 << 24;

/// One engine operation of a serving run, as the leader makes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Continuous batching: prefill request `request`'s prompt into the free slot `slot`.
    Join { slot: usize, request: usize },
    /// Continuous batching: one decode step over the occupied slots.
    Step,
    /// Continuous batching: free `slot`.
    Leave { slot: usize },
    /// Static batching: one generation call of these requests.
    Call(Vec<usize>),
    /// The leader has stopped: no more operations.
    End,
}

/// The message of `op`, `len` values (the module's layout).
fn encode(op: &Op, len: usize) -> Vec<f32> {
    let values: Vec<usize> = match op {
        Op::End => vec![1],
        Op::Join { slot, request } => vec![2, *slot, *request],
        Op::Step => vec![3],
        Op::Leave { slot } => vec![4, *slot],
        Op::Call(ids) => [5, ids.len()]
            .into_iter()
            .chain(ids.iter().copied())
            .collect(),
    };
    // Channel::new checked the slots and ids against both limits.
    assert!(values.len() <= len, "{op:?} does not fit {len} values");
    assert!(
        values.iter().all(|&v| v < EXACT),
        "{op:?}: not exact in f32"
    );
    let mut m = vec![0f32; len];
    m.iter_mut().zip(values).for_each(|(m, v)| *m = v as f32);
    m
}

/// The operation a message holds, its slots below `max_batch` and its requests below
/// `num_requests`; an error for any other values (the ranks disagree).
fn decode(m: &[f32], (max_batch, num_requests): (usize, usize)) -> Result<Op> {
    let bad = || {
        Error::Engine(format!(
            "--tp serving: rank 0's message {:?} is no operation (the ranks disagree)",
            &m[..m.len().min(8)]
        ))
    };
    let int = |v: f32| (v >= 0. && v.fract() == 0. && v < EXACT as f32).then_some(v as usize);
    let ints: Vec<usize> = m
        .iter()
        .map(|&v| int(v).ok_or_else(bad))
        .collect::<Result<_>>()?;
    let op = match ints[..] {
        [1, ..] => Op::End,
        [2, slot, request, ..] if slot < max_batch && request < num_requests => {
            Op::Join { slot, request }
        }
        [3, ..] => Op::Step,
        [4, slot, ..] if slot < max_batch => Op::Leave { slot },
        [5, n, ref ids @ ..] if n <= ids.len() && ids[..n].iter().all(|&i| i < num_requests) => {
            Op::Call(ids[..n].to_vec())
        }
        _ => return Err(bad()),
    };
    // Nothing but the operation: the zeros after it too.
    match encode(&op, m.len()) == m {
        true => Ok(op),
        false => Err(bad()),
    }
}

/// f32 values a message of up to `max_batch` request ids has: 2 + `max_batch`, one more where
/// that would make whole 16-byte vectors. The one-shot sum (`kernels::oneshot_sum`) takes only
/// those, and its receive traps after 60 s; a follower waits for rank 0's next message as long
/// as the load's longest gap between arrivals, so the messages go through NCCL, which waits.
fn message_len(max_batch: usize) -> usize {
    let n = 2 + max_batch.max(1);
    match (n * 4).is_multiple_of(16) {
        true => n + 1,
        false => n,
    }
}

/// This rank's end of the broadcast: the group's all-reduce, on the rank's device.
pub struct Channel {
    reduce: Arc<dyn AllReduce>,
    device: Device,
    /// Values a message has ([`message_len`]).
    len: usize,
    /// (`--batch-size`, `--num-requests`): a message's slots and requests are below them.
    limits: (usize, usize),
}

impl Channel {
    /// Messages of up to `max_batch` request ids (the slots too are below it), each below
    /// `num_requests`: both below 2^24, exact in f32.
    pub fn new(
        reduce: Arc<dyn AllReduce>,
        device: Device,
        max_batch: usize,
        num_requests: usize,
    ) -> Result<Self> {
        if max_batch.max(num_requests) >= EXACT {
            return Err(Error::Config(format!(
                "--tp serving passes slots and request ids as f32, exact below 2^24: --batch-size {max_batch} and --num-requests {num_requests} must be smaller"
            )));
        }
        let (len, limits) = (message_len(max_batch), (max_batch.max(1), num_requests));
        Ok(Self {
            reduce,
            device,
            len,
            limits,
        })
    }

    /// The leader: `op` to every other rank (they add zeros to it).
    pub fn send(&self, op: &Op) -> Result<()> {
        let m = Tensor::from_vec(encode(op, self.len), self.len, &self.device)?;
        // The sum is the message itself: rank 0 has nothing to read back.
        self.reduce.all_reduce_sum(&m)?;
        Ok(())
    }

    /// A follower: rank 0's next operation.
    pub fn receive(&self) -> Result<Op> {
        let zeros = Tensor::zeros(self.len, DType::F32, &self.device)?;
        let m = self.reduce.all_reduce_sum(&zeros)?.to_vec1::<f32>()?;
        decode(&m, self.limits)
    }
}

/// This rank's part in a serving run.
pub enum Role {
    /// One process: the scheduler drives the engine.
    Alone,
    /// Rank 0 of a tensor-parallel group: schedules, and sends each operation before it
    /// performs it.
    Leader(Channel),
    /// Another rank: performs rank 0's operations, in order, until [`Op::End`].
    Follower(Channel),
}

impl Role {
    /// The role of rank `tp.rank` (on `device`) in a run of `max_batch` slots or requests a
    /// call and `num_requests` requests; [`Role::Alone`] without a group.
    pub fn of(tp: Option<(&Tp, &Device)>, max_batch: usize, num_requests: usize) -> Result<Self> {
        let Some((tp, Some(reduce), device)) = tp.map(|(t, d)| (t, t.reduce.clone(), d)) else {
            return Ok(Role::Alone);
        };
        let channel = Channel::new(reduce, device.clone(), max_batch, num_requests)?;
        Ok(match tp.rank {
            0 => Role::Leader(channel),
            _ => Role::Follower(channel),
        })
    }

    /// The channel the leader sends on; None for the other roles.
    pub fn leader(&self) -> Option<&Channel> {
        match self {
            Role::Leader(c) => Some(c),
            _ => None,
        }
    }
}

/// The header's `batching`, after the engine's words, on `size` ranks.
pub fn describe(size: usize) -> String {
    format!("; tensor parallel over {size} ranks: rank 0 schedules and, before each engine operation (a join, a decode step, a leave; a static call's requests), broadcasts it to the other ranks, which perform it on their shards: one small all-reduce an operation, inside the times")
}

/// A follower's serving: rank 0's operations, each performed as it comes, until [`Op::End`].
/// It serves no requests of its own (rank 0 times and logs them). An operation that fails
/// here ends this rank at once, with no further collective call, as a failed batch ends any
/// tensor-parallel rank: rank 0 failed at the same operation and stops too, or waits in its
/// next all-reduce until this rank's exit stops the group (the rendezvous' watch).
pub fn follow(channel: &Channel, perform: &mut dyn FnMut(Op) -> Result<()>) -> Result<Served> {
    loop {
        match channel.receive()? {
            Op::End => break,
            op => {
                if let Err(e) = perform(op) {
                    return Ok(Served::failed(e));
                }
            }
        }
    }
    Ok(Served {
        records: vec![],
        n_batches: 0,
        failure: None,
        batch_size_mean: None,
    })
}

/// The leader's last message once its scheduler has stopped (`served`): [`Op::End`], so that
/// the followers stop waiting; not after an engine operation failed on this rank (`failed`),
/// where every rank stops at the failure with no further collective call (see [`follow`]). An
/// End that cannot be sent is the run's failure.
pub fn end(leader: Option<&Channel>, failed: bool, served: Result<Served>) -> Result<Served> {
    let Some(channel) = leader.filter(|_| !failed) else {
        return served;
    };
    let sent = channel.send(&Op::End);
    let mut served = served?;
    if let Err(e) = sent {
        served.failure.get_or_insert(e);
    }
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dist::test_ranks::on_ranks;

    /// Every batch size's message fits its operations and is no whole number of 16-byte
    /// vectors (the one-shot sum's receive would trap during a long gap between arrivals).
    #[test]
    fn messages_stay_off_the_one_shot_sum() {
        for b in 0..200 {
            let n = message_len(b);
            assert!(n >= 2 + b.max(1), "{b}: {n}");
            assert!(!(n * 4).is_multiple_of(16), "{b}: {n} f32 values");
        }
    }

    fn ops() -> Vec<Op> {
        vec![
            Op::Join {
                slot: 3,
                request: EXACT - 2,
            },
            Op::Step,
            Op::Leave { slot: 0 },
            Op::Call(vec![7, 0, 2, 9]),
            Op::Call(vec![]),
            Op::End,
        ]
    }

    #[test]
    fn every_operation_round_trips_and_other_values_are_refused() {
        let limits = (4, EXACT);
        for op in ops() {
            assert_eq!(decode(&encode(&op, 6), limits).unwrap(), op);
        }
        assert_eq!(encode(&Op::Call(vec![4, 5]), 6), [5., 2., 4., 5., 0., 0.]);
        for bad in [
            &[0f32, 0., 0.][..],    // all zeros: rank 0 sent nothing
            &[6., 0., 0.],          // no such code
            &[3., 1., 0.],          // a step with a slot
            &[5., 4., 1., 2., 3.],  // 4 ids in room for 3
            &[2., 1.5, 0.],         // not an integer
            &[2., 1., 16_777_216.], // not exact in f32
            &[2., -1., 0.],         // negative
            &[2., 1., f32::NAN],    // two ranks added something else
            &[2., 4., 0.],          // no slot 4 of 4
        ] {
            assert!(decode(bad, limits).is_err(), "{bad:?}");
        }
        let beyond = |op: &Op, limits| decode(&encode(op, 6), limits).is_err();
        assert!(beyond(&Op::Call(vec![1, 9]), (4, 9)), "no request 9 of 9");
        assert!(beyond(&Op::Leave { slot: 4 }, (4, 9)));
        assert!(Channel::new(Arc::new(Never), Device::Cpu, 8, EXACT).is_err());
        assert!(Channel::new(Arc::new(Never), Device::Cpu, 8, EXACT - 1).is_ok());
    }

    /// An all-reduce never called.
    struct Never;

    impl AllReduce for Never {
        fn all_reduce_sum(&self, _: &Tensor) -> candle_core::Result<Tensor> {
            unreachable!()
        }
        fn describe(&self) -> String {
            "never".into()
        }
    }

    /// Over three CPU ranks, each follower performs rank 0's operations, in its order, and
    /// stops at the End.
    #[test]
    fn followers_perform_the_leader_s_operations_in_order() {
        let streams = on_ranks(3, |tp| {
            let role = Role::of(Some((&tp, &Device::Cpu)), 4, EXACT - 1).unwrap();
            let mut seen = vec![];
            match &role {
                Role::Leader(c) => {
                    for op in ops().iter().filter(|op| **op != Op::End) {
                        c.send(op).unwrap();
                        seen.push(op.clone());
                    }
                    end(
                        Some(c),
                        false,
                        Ok(Served::failed(Error::Engine("x".into()))),
                    )
                    .unwrap();
                }
                Role::Follower(c) => {
                    let mut perform = |op| {
                        seen.push(op);
                        Ok(())
                    };
                    let served = follow(c, &mut perform).unwrap();
                    assert!(served.failure.is_none() && served.records.is_empty());
                }
                Role::Alone => unreachable!(),
            }
            seen
        });
        let sent: Vec<Op> = ops().into_iter().filter(|op| *op != Op::End).collect();
        assert_eq!(streams, vec![sent; 3]);
        let alone = Role::of(None, 4, 100).unwrap();
        assert!(matches!(alone, Role::Alone) && alone.leader().is_none());
    }

    /// An operation that fails on every rank ends each at once: the follower returns its
    /// failure, the leader sends no End (which no rank would receive).
    #[test]
    fn a_failed_operation_ends_every_rank_with_no_further_message() {
        let failures = on_ranks(2, |tp| {
            let role = Role::of(Some((&tp, &Device::Cpu)), 2, 10).unwrap();
            let failed = || Error::Engine("out of memory".into());
            let served = match &role {
                Role::Leader(c) => {
                    c.send(&Op::Step).unwrap();
                    end(Some(c), true, Ok(Served::failed(failed()))).unwrap()
                }
                Role::Follower(c) => follow(c, &mut |_| Err(failed())).unwrap(),
                Role::Alone => unreachable!(),
            };
            served.failure.map(|e| e.to_string())
        });
        for f in failures {
            assert!(f.is_some_and(|f| f.contains("out of memory")));
        }
    }
}
