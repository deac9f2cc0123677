//! The HF engine's serving: the worker replays the whole load on its own clock
//! ([`crate::engines::replay`]). `serve_mode` asks it how it will batch (`--batching static`:
//! static; else transformers' continuous batching where the model supports it, else the
//! suite's static batching), `serve`
//! sends the load and reads back each request's raw times.

use super::HfEngine;
use crate::engines::replay::{Batching, ModeChoice, Replay, ReplayLoad, Replayed};
use crate::error::{Error, Result};
use serde_json::{json, Value};

/// The worker's `serve_mode` request.
pub fn mode_request(want: Batching, max_batch: usize, pad_id: u32, eos_ids: &[u32]) -> Value {
    json!({
        "op": "serve_mode",
        "batching": want.as_str(),
        "max_batch": max_batch,
        "pad_id": pad_id,
        "eos_ids": eos_ids,
    })
}

/// The worker's `serve` request: the whole load (see worker.py's protocol).
pub fn serve_request(load: &ReplayLoad) -> Value {
    let requests: Vec<Value> = load
        .requests
        .iter()
        .map(|r| {
            json!({
                "scheduled_ms": r.scheduled_ms,
                "prompt": r.prompt,
                "output_len": r.output_len,
            })
        })
        .collect();
    let w = &load.warm;
    json!({
        "op": "serve",
        "requests": requests,
        "max_batch": load.max_batch,
        "max_concurrency": load.max_concurrency,
        "warm": { "prompts": w.prompts, "new_tokens": w.new_tokens, "calls": load.warm_calls },
        "pad_id": w.pad_id,
        "eos_ids": w.eos_ids,
        "pad_multiple": load.pad_multiple,
        "pad_cap": load.pad_cap,
    })
}

fn parse_mode(v: &Value, op: &str) -> Result<Batching> {
    match v["mode"].as_str() {
        Some("static") => Ok(Batching::Static),
        Some("continuous") => Ok(Batching::Continuous),
        _ => Err(Error::Engine(format!(
            "HF worker's {op} reply names no mode (static or continuous): {v}"
        ))),
    }
}

/// Parses the worker's `serve_mode` reply.
pub fn parse_mode_reply(v: &Value) -> Result<ModeChoice> {
    Ok(ModeChoice {
        mode: parse_mode(v, "serve_mode")?,
        why: v["why"].as_str().unwrap_or_default().to_string(),
    })
}

/// Parses the worker's `serve` reply: its mode, every request's times, the calls made, and the
/// error that ended the replay early (the worker's own words, one line).
pub fn parse_serve_reply(v: &Value) -> Result<Replayed> {
    let bad = |what: String| Error::Engine(format!("HF worker's serve reply: {what}"));
    let requests = serde_json::from_value(v["requests"].clone())
        .map_err(|e| bad(format!("'requests' is not a list of request times ({e})")))?;
    let n_batches = v["n_batches"]
        .as_u64()
        .ok_or_else(|| bad("no 'n_batches'".into()))? as usize;
    Ok(Replayed {
        mode: parse_mode(v, "serve")?,
        requests,
        n_batches,
        failure: v["error"].as_str().map(str::to_string),
    })
}

impl Replay for HfEngine {
    fn replay_mode(
        &mut self,
        want: Batching,
        max_batch: usize,
        pad_id: u32,
        eos_ids: &[u32],
    ) -> Result<ModeChoice> {
        let req = mode_request(want, max_batch, pad_id, eos_ids);
        let reply = self.request(&req)?;
        let choice = parse_mode_reply(&reply)?;
        if let Some(sdpa) = reply["sdpa"].as_str() {
            // On CUDA the worker serves without torch's cuDNN attention (worker.py's
            // serving_sdpa): the configuration, named in the header.
            self.info.insert("serving_sdpa".into(), sdpa.into());
        }
        let mode = choice.mode.as_str();
        let said = match choice.why.is_empty() {
            true => mode.to_string(),
            false => format!("{mode} ({})", choice.why),
        };
        self.info.insert("serving_batching".into(), said);
        if self.choose {
            // --hf-attn / --hf-compile best: a probe of generate calls would time neither
            // continuous batching nor the load; the configuration stays as loaded.
            let why = "as loaded (auto's attention, uncompiled unless --hf-compile on): serving probes no configuration";
            self.info.insert("attn_chosen_by".into(), why.into());
        }
        Ok(choice)
    }

    fn replay(&mut self, load: &ReplayLoad) -> Result<Replayed> {
        let v = self.request(&serve_request(load))?;
        self.count_compiles(&v);
        parse_serve_reply(&v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::replay::{ReplayRequest, ReplayedRequest};
    use crate::engines::GenerateRequest;

    /// The request as the worker reads it: one JSON object, every field named in worker.py.
    #[test]
    fn the_serve_request_carries_the_whole_load() {
        let (p0, p1, warm) = (vec![5, 6, 7], vec![9], vec![vec![1, 2, 3]]);
        let load = ReplayLoad {
            requests: vec![
                ReplayRequest {
                    scheduled_ms: 0.,
                    prompt: &p0,
                    output_len: 4,
                },
                ReplayRequest {
                    scheduled_ms: 12.5,
                    prompt: &p1,
                    output_len: 2,
                },
            ],
            max_batch: 8,
            max_concurrency: Some(3),
            warm: GenerateRequest {
                prompts: &warm,
                padded_len: 3,
                new_tokens: 4,
                pad_id: 50256,
                eos_ids: &[50256],
            },
            warm_calls: 2,
            pad_multiple: 8,
            pad_cap: 1020,
        };
        let golden: Value = serde_json::from_str(
            r#"{"op": "serve",
                "requests": [{"scheduled_ms": 0.0, "prompt": [5, 6, 7], "output_len": 4},
                             {"scheduled_ms": 12.5, "prompt": [9], "output_len": 2}],
                "max_batch": 8, "max_concurrency": 3,
                "warm": {"prompts": [[1, 2, 3]], "new_tokens": 4, "calls": 2},
                "pad_id": 50256, "eos_ids": [50256], "pad_multiple": 8, "pad_cap": 1020}"#,
        )
        .unwrap();
        assert_eq!(serve_request(&load), golden);
        let open = ReplayLoad {
            max_concurrency: None,
            ..load
        };
        assert_eq!(serve_request(&open)["max_concurrency"], Value::Null);
        assert_eq!(
            mode_request(Batching::Static, 4, 3, &[2]),
            json!({"op": "serve_mode", "batching": "static", "max_batch": 4, "pad_id": 3, "eos_ids": [2]})
        );
    }

    /// A reply as worker.py writes it (one JSON line), and the ways one can be wrong.
    #[test]
    fn the_worker_s_serve_reply_parses() {
        let line = r#"{"ok": true, "mode": "continuous", "n_batches": 2, "compiles": 0, "error": null,
            "requests": [
              {"request": 1, "batch": 0, "batch_size": 1, "arrival_ms": 12.5, "start_ms": 12.75,
               "token_ms": [14.0, 15.0], "finish_ms": 15.0},
              {"request": 0, "batch": 1, "batch_size": 2, "arrival_ms": 0.0, "start_ms": 0.5,
               "token_ms": [3.0, 4.0, 5.0, 6.0], "finish_ms": 6.25}]}"#;
        let r = parse_serve_reply(&serde_json::from_str(line).unwrap()).unwrap();
        assert_eq!(
            (r.mode, r.n_batches, r.failure),
            (Batching::Continuous, 2, None)
        );
        assert_eq!(
            r.requests[0],
            ReplayedRequest {
                request: 1,
                batch: 0,
                batch_size: 1,
                arrival_ms: 12.5,
                start_ms: 12.75,
                token_ms: vec![14., 15.],
                finish_ms: 15.,
            }
        );
        let failed = json!({"ok": true, "mode": "static", "n_batches": 0, "requests": [],
                            "error": "OutOfMemoryError: CUDA out of memory"});
        let r = parse_serve_reply(&failed).unwrap();
        assert_eq!(r.mode, Batching::Static);
        assert_eq!(
            r.failure.as_deref(),
            Some("OutOfMemoryError: CUDA out of memory")
        );
        for (bad, want) in [
            (
                json!({"ok": true, "mode": "static", "n_batches": 1}),
                "'requests' is not a list",
            ),
            (
                json!({"ok": true, "mode": "static", "requests": []}),
                "no 'n_batches'",
            ),
            (
                json!({"ok": true, "n_batches": 0, "requests": []}),
                "names no mode",
            ),
            (
                json!({"ok": true, "mode": "static", "n_batches": 1,
                       "requests": [{"request": 0, "start_ms": 1.0}]}),
                "'requests' is not a list",
            ),
        ] {
            let e = parse_serve_reply(&bad).unwrap_err().to_string();
            assert!(e.contains(want) && !e.contains('\n'), "{e}");
        }
        let m = parse_mode_reply(&json!({"ok": true, "mode": "static",
            "why": "BloomForCausalLM: no continuous batching"}))
        .unwrap();
        assert_eq!(m.mode, Batching::Static);
        assert!(m.why.starts_with("BloomForCausalLM"));
    }
}
