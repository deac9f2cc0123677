//! Compares this engine with reference fixtures made by HF transformers
//! (`scripts/hf_fixtures/make_fixtures.py`): full logits of a padded batch, and per-passage LAMBADA
//! tokens, log-likelihoods and greedy flags. Used by the tests and by `bench verify`.

use crate::device::{DeviceSpec, Precision};
use crate::engines::Request;
use crate::error::{Error, Result};
use crate::models::{ModelSpec, WeightSource};
use crate::scenarios::lambada::data::{build_request, score_batch};
use crate::tokenizer::TextTokenizer;
use candle_core::{DType, Device, Tensor};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// `reference.safetensors`: full logits of a right-padded batch.
#[derive(Clone, Debug, Serialize)]
pub struct LogitsCheck {
    pub n_positions: usize,
    pub max_abs_err: f64,
    pub max_abs_ref: f64,
    /// max |ours − ref| / max |ref|, over the positions where attention_mask == 1.
    pub max_rel_err: f64,
}

/// One passage of `lambada_reference.json`.
#[derive(Clone, Debug, Deserialize)]
pub struct RefPassage {
    pub text: String,
    pub context_tokens: Vec<u32>,
    pub target_tokens: Vec<u32>,
    pub ll: f64,
    pub greedy: bool,
}

#[derive(Clone, Debug, Deserialize)]
pub struct LambadaReference {
    pub transformers: String,
    pub dtype: String,
    pub passages: Vec<RefPassage>,
}

#[derive(Clone, Debug, Serialize)]
pub struct LambadaCheck {
    pub n_passages: usize,
    /// Passages whose context and target tokens equal the reference's.
    pub tokens_equal: usize,
    pub ll_max_abs_err: f64,
    /// max over passages of |ours − ref| / |ref|.
    pub ll_max_rel_err: f64,
    pub greedy_equal: usize,
    pub greedy_ours: usize,
    pub greedy_ref: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct VerifyReport {
    pub logits: Option<LogitsCheck>,
    pub lambada: Option<LambadaCheck>,
}

pub fn verify(
    dir: &Path,
    device: DeviceSpec,
    precision: Precision,
    batch_size: usize,
) -> Result<VerifyReport> {
    let device = device.open()?;
    precision.apply_matmul_mode(&device);
    let spec = ModelSpec::from_dir(dir)?;
    let model = spec.load(
        &WeightSource::Dir(dir.to_path_buf()),
        precision.dtype(),
        &device,
    )?;

    let logits_path = dir.join("reference.safetensors");
    let logits = if logits_path.is_file() {
        Some(check_logits(model.as_ref(), &logits_path, &device)?)
    } else {
        None
    };

    let lambada_path = dir.join("lambada_reference.json");
    let lambada = if lambada_path.is_file() {
        let text = std::fs::read_to_string(&lambada_path)
            .map_err(|e| Error::io(format!("reading {}", lambada_path.display()), e))?;
        let reference: LambadaReference = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: {e}", lambada_path.display())))?;
        let tok = TextTokenizer::for_model(Some(dir), spec.architecture())?;
        Some(check_lambada(
            model.as_ref(),
            &tok,
            &reference,
            &device,
            batch_size,
        )?)
    } else {
        None
    };
    if logits.is_none() && lambada.is_none() {
        return Err(Error::NotFound {
            what: "reference fixtures".into(),
            path: dir.to_path_buf(),
            hint: "make them with scripts/hf_fixtures/make_fixtures.py (reference.safetensors, lambada_reference.json)".into(),
        });
    }
    Ok(VerifyReport { logits, lambada })
}

fn check_logits(
    model: &dyn crate::models::CausalLm,
    path: &Path,
    device: &Device,
) -> Result<LogitsCheck> {
    let r = candle_core::safetensors::load(path, device)?;
    let get = |k: &str| {
        r.get(k)
            .cloned()
            .ok_or_else(|| Error::Config(format!("{}: no tensor '{k}'", path.display())))
    };
    let ids = get("input_ids")?.to_dtype(DType::U32)?; // (B, T)
    let mask = get("attention_mask")?.to_dtype(DType::U32)?; // (B, T)
    let want = get("logits")?.to_dtype(DType::F32)?; // (B, T, V)
    let (b, t) = ids.dims2()?;
    let hidden = model.hidden_states(&ids, &mask)?; // (B, T, C)
    let got = model
        .logits(&hidden.reshape((b * t, ()))?)?
        .to_dtype(DType::F32)?; // (B·T, V)
    let want = want.reshape((b * t, ()))?;
    let keep = mask.flatten_all()?.to_vec1::<u32>()?;
    let rows: Vec<u32> = (0..b * t)
        .filter(|&i| keep[i] == 1)
        .map(|i| i as u32)
        .collect();
    let rows_t = Tensor::from_vec(rows.clone(), rows.len(), device)?;
    let (got, want) = (
        got.index_select(&rows_t, 0)?,
        want.index_select(&rows_t, 0)?,
    );
    let max_abs_err = (got - &want)?.abs()?.max_all()?.to_scalar::<f32>()? as f64;
    let max_abs_ref = want.abs()?.max_all()?.to_scalar::<f32>()? as f64;
    Ok(LogitsCheck {
        n_positions: rows.len(),
        max_abs_err,
        max_abs_ref,
        max_rel_err: max_abs_err / max_abs_ref,
    })
}

fn check_lambada(
    model: &dyn crate::models::CausalLm,
    tok: &TextTokenizer,
    reference: &LambadaReference,
    device: &Device,
    batch_size: usize,
) -> Result<LambadaCheck> {
    let requests = reference
        .passages
        .iter()
        .enumerate()
        .map(|(i, p)| build_request(tok, i, &p.text, model.max_positions()))
        .collect::<Result<Vec<Request>>>()?;
    let mut results = vec![];
    for batch in requests.chunks(batch_size.max(1)) {
        results.extend(score_batch(model, batch, device)?);
    }
    let mut c = LambadaCheck {
        n_passages: requests.len(),
        tokens_equal: 0,
        ll_max_abs_err: 0.,
        ll_max_rel_err: 0.,
        greedy_equal: 0,
        greedy_ours: 0,
        greedy_ref: 0,
    };
    for ((req, res), want) in requests.iter().zip(&results).zip(&reference.passages) {
        c.tokens_equal += (req.context_tokens == want.context_tokens
            && req.target_tokens == want.target_tokens) as usize;
        let err = (res.ll - want.ll).abs();
        c.ll_max_abs_err = c.ll_max_abs_err.max(err);
        c.ll_max_rel_err = c
            .ll_max_rel_err
            .max(err / want.ll.abs().max(f64::MIN_POSITIVE));
        c.greedy_equal += (res.greedy == want.greedy) as usize;
        c.greedy_ours += res.greedy as usize;
        c.greedy_ref += want.greedy as usize;
    }
    Ok(c)
}
