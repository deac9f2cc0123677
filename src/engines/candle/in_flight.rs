//! The candle engine's continuous batching: [`crate::models::slots`] (a slot KV cache that
//! requests join and leave between decode steps) behind the [`InFlight`] capability.

use super::CandleEngine;
use crate::engines::InFlight;
use crate::error::{Error, Result};
use crate::models::slots::Slots;

impl InFlight for CandleEngine {
    fn open_slots(
        &mut self,
        slots: usize,
        longest: usize,
        pad_id: u32,
        eos_ids: &[u32],
    ) -> Result<()> {
        self.slots = None; // the old cache's memory goes back before the new one is made
        self.cache = None; // and the static path's
        let model = self.model.as_ref();
        self.slots = Some(Slots::new(model, slots, longest, pad_id, eos_ids.to_vec())?);
        Ok(())
    }

    fn join(&mut self, slot: usize, prompt: &[u32]) -> Result<u32> {
        let _profiled = crate::profile::window(&self.device);
        let slots = self.slots.as_mut().ok_or_else(not_open)?;
        slots.join(self.model.as_ref(), slot, prompt)
    }

    fn step(&mut self) -> Result<Vec<(usize, u32)>> {
        let _profiled = crate::profile::window(&self.device);
        let slots = self.slots.as_mut().ok_or_else(not_open)?;
        slots.step(self.model.as_ref())
    }

    fn leave(&mut self, slot: usize) -> Result<()> {
        self.slots.as_mut().ok_or_else(not_open)?.leave(slot)
    }

    fn describe(&self) -> String {
        "a slot KV cache of --batch-size rows; each arrival's prompt prefilled alone into a free slot before the next decode step, one decode step over the occupied slots, a request leaving its slot at its last token; no CUDA graph (steps eager, ids read back each step)".into()
    }
}

fn not_open() -> Error {
    Error::Engine("continuous batching before its slots were opened (open_slots)".into())
}
