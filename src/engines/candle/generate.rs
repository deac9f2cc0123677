//! The candle engine's generation: [`crate::models::generate`] (a preallocated KV cache,
//! prefill then one-token decode steps) behind the [`Generate`] capability.

use super::CandleEngine;
use crate::engines::{Generate, GenerateRequest};
use crate::error::Result;
use crate::kernels::{enabled, Fused, GEMV_MAX_ROWS, SKINNY_MAX_ROWS};
use crate::models::generate::{generate_in, left_pad_to, Greedy};
use crate::trackers::StepClock;

impl CandleEngine {
    /// The weights laid out for decode steps of `rows` rows, once: where the decode GEMV
    /// takes them (CUDA, `--fused gemv`, at most [`GEMV_MAX_ROWS`] rows) or the tensor-core
    /// kernel (`--fused skinny-proj`, at most [`SKINNY_MAX_ROWS`]); the norms folded too, once,
    /// where a step of these rows takes them ([`crate::models::CausalLm::fold_norms`]).
    fn lay_out_for_decode(&mut self, rows: usize) -> Result<()> {
        let gemv = enabled(Fused::Gemv) && rows <= GEMV_MAX_ROWS;
        let skinny = enabled(Fused::SkinnyProj) && rows <= SKINNY_MAX_ROWS;
        if self.device.is_cuda() && (gemv || skinny) && !self.laid_out_for_decode {
            self.model.prepare_decode()?;
            self.laid_out_for_decode = true;
        }
        // After the layout (GPT-2's fold takes nn.Linear weights); the model folds only where
        // a step of these rows takes the folded projections, and once.
        if self.laid_out_for_decode {
            self.model.fold_norms(rows)?;
        }
        Ok(())
    }
}

impl Generate for CandleEngine {
    fn max_positions(&self) -> usize {
        self.model.max_positions()
    }

    fn generate(&mut self, req: &GenerateRequest, clock: &mut StepClock) -> Result<Vec<Vec<u32>>> {
        self.lay_out_for_decode(req.prompts.len())?; // once, before the clock
        let _profiled = crate::profile::window(&self.device);
        clock.start(&self.device)?;
        let prompts = left_pad_to(req.prompts, req.pad_id, req.padded_len, &self.device)?;
        let greedy = Greedy {
            new_tokens: req.new_tokens,
            banned: req.eos_ids.to_vec(),
        };
        let device = self.device.clone();
        let mut hook = |_phase| clock.lap(&device);
        let (rows, need) = (prompts.batch(), prompts.len() + req.new_tokens);
        let fits = |c: &crate::models::KvCache| c.batch() == rows && c.max_len() >= need;
        if !self.cache.as_ref().is_some_and(fits) {
            self.cache = None; // the old one's memory goes back before the new one is made
            self.cache = Some(self.model.new_cache(rows, need)?);
        }
        let cache = self.cache.as_mut().expect("made above");
        let ids = generate_in(self.model.as_ref(), cache, &prompts, &greedy, &mut hook)?;
        // to_vec2 copied the ids to the host: the device is done.
        clock.stop()?;
        Ok(ids)
    }

    fn kv_cache_bytes(&self) -> Option<u64> {
        self.cache.as_ref().map(|c| c.bytes() as u64)
    }

    fn in_flight(&mut self) -> Option<&mut dyn crate::engines::InFlight> {
        Some(self)
    }
}
