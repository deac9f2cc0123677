//! `--recompute`: what GPT-2's manual step keeps of each block for its backward. A part of the
//! log schema (the sweep log and the header's `engine_info` name it); `train` re-exports it.

/// What the manual step's forward keeps for its backward (`--recompute`), activation
/// checkpointing at two granularities.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Every activation the backward reads (16 C a token and block for GPT-2).
    #[default]
    Off,
    /// Each block's input only (C); the backward runs the whole block's forward again, about
    /// a third more compute a step.
    #[value(alias = "on")]
    Blocks,
    /// The attention half's activations (x, qkv, the attention output and its log-sum-exp,
    /// x_mid: 6 C); the backward runs the two LayerNorms, the MLP's first matmul and its
    /// activation again: a third of a forward's matmul FLOPs (a ninth of the step's) and no
    /// attention. Megatron-LM's "selective" recompute the other way round: with the fused
    /// attention keeping no probabilities, the MLP's 9 C are the bulk.
    Mlp,
}

impl Recompute {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Blocks => "blocks",
            Self::Mlp => "mlp",
        }
    }
}
