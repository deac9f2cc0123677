//! The extract schema: column order and one name per quantity, whatever tool logged it.
//!
//! The names are the bench log's (which follows HF Trainer where HF has a name):
//!
//! | quantity                                   | column              | HF Trainer      | llm.c stdout / main.log |
//! |--------------------------------------------|---------------------|-----------------|-------------------------|
//! | mean training loss over every step         | `train_loss`        | `train_loss`    | mean of the step losses |
//! | loss of the last logged step               | `train_loss_last`   | step log `loss` | `loss` / `trl`          |
//! | loss of the first step                     | `train_loss_first`  |                 |                         |
//! | learning rate of the last logged step      | `learning_rate_last`| `learning_rate` | `lr`                    |
//! | gradient norm of the last logged step      | `grad_norm_last`    | `grad_norm`     | `norm`                  |
//! | evaluation loss (the last one)             | `eval_loss`         | `eval_loss`     | `val loss` / `tel`      |
//! | optimizer steps                            | `n_steps`           | `global_step`   | last step number        |
//!
//! The bench log's own `first_loss` / `last_loss` are `train_loss_first` / `train_loss_last`.

/// Metadata columns, in output order (present ones only); others follow, sorted.
pub const META: &[&str] = &[
    "run",
    "file",
    "format",
    "engine",
    "suite",
    "model",
    "dtype",
    "device",
    "gpu",
    "driver",
    "attn",
    "attn_requested",
    "hf_compile",
    "backward",
    "recompute",
    "strategy",
    "dp_overlap",
    "dropout",
    "fused",
    "scoring",
    "mode",
    "gen_source",
    "arrivals",
    "batching",
    "batching_mode",
    "status",
    "error",
    "git_commit",
    "time_utc",
];

/// Other names of a quantity -> its column name.
const ALIASES: &[(&str, &str)] = &[
    // Step logs: HF Trainer `{'loss': …}`, llm.c main.log `trl:` `lr:` `norm:`.
    ("loss", "train_loss"),
    ("trl", "train_loss"),
    ("lr", "learning_rate"),
    ("norm", "grad_norm"),
    // Evaluation: llm.c `val loss` and main.log `tel:`; `eval:` is HellaSwag accuracy.
    ("val_loss", "eval_loss"),
    ("tel", "eval_loss"),
    ("eval", "hellaswag_accuracy"),
    // Run totals: HF trainer_state.json, the bench TrainSummary.
    ("global_step", "n_steps"),
    ("first_loss", "train_loss_first"),
    ("last_loss", "train_loss_last"),
];

/// The column name of a quantity another tool (or an older field) names `name`.
pub fn canonical(name: &str) -> &str {
    ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map_or(name, |(_, c)| c)
}

/// The column of a per-step value's last logged value: `loss` -> `train_loss_last`.
pub fn last(name: &str) -> String {
    format!("{}_last", canonical(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_s_name_maps_to_one_column() {
        assert_eq!(last("loss"), "train_loss_last");
        assert_eq!(last("trl"), "train_loss_last");
        assert_eq!(last("lr"), "learning_rate_last");
        assert_eq!(last("learning_rate"), "learning_rate_last");
        assert_eq!(canonical("tel"), "eval_loss");
        assert_eq!(canonical("val_loss"), "eval_loss");
        assert_eq!(canonical("last_loss"), "train_loss_last");
        assert_eq!(canonical("samples_per_second"), "samples_per_second");
    }
}
