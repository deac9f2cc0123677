//! Loading a model through [`super::ModelSpec`] (a test of weights.rs's loader, here so that
//! weights.rs need not import the specs that import it).

use super::weights::{safetensors_payload, save_checkpoint, Recorder, WeightSource};
use candle_core::{DType, Device};
use indicatif::ProgressBar;

/// The loader's byte count is the checkpoint's tensor payload: every stored byte, once.
#[test]
fn a_load_counts_the_safetensors_payload() {
    for name in ["gpt2-tiny", "bloom-tiny"] {
        let spec = crate::models::ModelSpec::preset(name).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let random = WeightSource::Random { seed: 1 };
        let made = ProgressBar::hidden();
        let record = Recorder::default();
        spec.load_watched(
            &random,
            DType::F32,
            &Device::Cpu,
            Some(record.clone()),
            &made,
        )
        .unwrap();
        let tensors = std::mem::take(&mut *record.lock().unwrap());
        save_checkpoint(dir.path(), &spec.hf_config(DType::F32), tensors).unwrap();
        let file = dir.path().join("model.safetensors");
        let payload = safetensors_payload(&file).unwrap();
        let bytes = std::fs::read(&file).unwrap();
        let header = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        assert_eq!(payload, bytes.len() as u64 - 8 - header, "{name}");
        assert_eq!(
            made.position(),
            payload,
            "{name}: random init counts what it made"
        );
        let n = spec.n_parameters();
        assert_eq!(
            random.payload_bytes(n, DType::F32).unwrap(),
            payload,
            "{name}"
        );

        let read = ProgressBar::hidden();
        let dir_source = WeightSource::Dir(dir.path().to_path_buf());
        spec.load_watched(&dir_source, DType::BF16, &Device::Cpu, None, &read)
            .unwrap();
        assert_eq!(
            read.position(),
            payload,
            "{name}: stored bytes, not bf16 ones"
        );
        assert_eq!(dir_source.payload_bytes(n, DType::BF16).unwrap(), payload);
    }
}
