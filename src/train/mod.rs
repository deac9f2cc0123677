//! Causal-LM fine-tuning in candle with HF Trainer's defaults and semantics.
//!
//! - Parameters: every tensor the model loads (same code path as inference, random or
//!   checkpoint) becomes an fp32 [`Var`](candle_core::Var), the master copy; the optimizer
//!   state is fp32 too.
//! - Precision (as HF `--bf16` / `--fp16`, i.e. autocast): each step the model is rebuilt from
//!   the masters cast to the compute dtype; `to_dtype` is differentiable, so the gradients land
//!   on the fp32 masters. fp16 scales the loss dynamically ([`GradScaler`], torch's defaults).
//! - Loss: mean cross-entropy of next-token prediction, labels = inputs shifted by one, in f32
//!   (HF `ForCausalLMLoss`). Gradient accumulation divides each micro-batch loss by the number
//!   of micro-batches (equal to HF's sum / num_items_in_batch for equal-length blocks).
//! - Step: clip the global L2 norm to `max_grad_norm` (torch `clip_grad_norm_`), AdamW with
//!   torch's update order ([`AdamW`]), learning rate from [`LinearSchedule`]
//!   (`get_linear_schedule_with_warmup`).
//! - Data parallelism ([`DataParallel`]): each rank computes the gradient of its share of the
//!   step's micro-batches; the gradients are summed over ranks in buckets and divided by the
//!   number of ranks, so every rank takes the same step as one process accumulating all the
//!   micro-batches. ZeRO-1 splits the optimizer state: each rank updates the parameters it
//!   owns, then every parameter is shared from its owner. ZeRO-2/3 ([`zero`]) shard the
//!   gradients and masters (and, at 3, the weights) unit by unit, as FSDP does.
//!
//! Files: [`trainer`] (the [`Trainer`]'s state and setup, [`Backward`], `--recompute`'s
//! [`Recompute`] from the log schema), [`step`] (one optimizer step, [`StepOutcome`]),
//! [`gradients`] (a step's gradients and the loss), [`data_parallel`] (the sums over ranks,
//! ZeRO-1's owners), [`zero`] (ZeRO-2/3), [`optim`] (AdamW, schedule, clipping, loss scale),
//! `params` (the fp32 masters and the backend serving them), `clock` (phase and collective
//! timing), [`gpt2_manual`] (GPT-2's hand-written backward).

mod clock;
pub mod data_parallel;
pub mod gpt2_manual;
pub mod gradients;
pub mod optim;
mod params;
pub mod step;
pub mod trainer;
pub mod zero;

pub use crate::record::Hyper;
pub use crate::record::Recompute;
pub use data_parallel::DataParallel;
pub use gradients::lm_loss;
pub use optim::{clip_coefficient, global_grad_norm, AdamW, Clip, GradScaler, LinearSchedule};
pub use step::StepOutcome;
pub use trainer::{Backward, Trainer};
pub use zero::ZeroStage;
