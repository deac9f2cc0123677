//! The trainable parameters: [`Params`], every tensor the model loads as an fp32 master
//! [`Var`] by checkpoint name, and [`ParamBackend`], the var-builder backend that creates them
//! on the first load and afterwards hands the model the masters cast to the compute dtype.

use candle_core::{DType, Device, Result, Shape, Tensor, Var};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::Init;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Hands the model its parameters: on the first load it takes each tensor from the real source
/// (checkpoint or random init) in fp32 and makes it a [`Var`]; afterwards it serves those Vars
/// cast to the dtype asked for (a differentiable cast; a no-op for fp32).
pub struct ParamBackend {
    pub source: Option<Box<dyn SimpleBackend>>,
    pub params: Arc<Mutex<Params>>,
    /// Serve detached tensors (inference kernels, no gradients).
    pub detached: bool,
}

/// The trainable parameters by checkpoint name, in load order.
#[derive(Default)]
pub struct Params {
    pub names: Vec<String>,
    pub vars: Vec<Var>,
    /// Each name's position in `names` and `vars`.
    pub index: HashMap<String, usize>,
}

impl SimpleBackend for ParamBackend {
    fn get(&self, s: Shape, name: &str, h: Init, dtype: DType, dev: &Device) -> Result<Tensor> {
        let mut params = self.params.lock().expect("params lock");
        let var = match (params.index.get(name), &self.source) {
            (Some(&i), _) => params.vars[i].clone(),
            (None, Some(source)) => {
                let var = Var::from_tensor(&source.get(s.clone(), name, h, DType::F32, dev)?)?;
                let i = params.vars.len();
                params.index.insert(name.to_string(), i);
                params.names.push(name.to_string());
                params.vars.push(var.clone());
                var
            }
            (None, None) => candle_core::bail!("no parameter '{name}'"),
        };
        if var.shape() != &s {
            candle_core::bail!("parameter '{name}' is {:?}, asked for {s:?}", var.shape());
        }
        let t = if self.detached {
            var.as_detached_tensor()
        } else {
            var.as_tensor().clone()
        };
        t.to_dtype(dtype)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> Result<Tensor> {
        candle_core::bail!("training needs a shape for '{name}'")
    }

    fn contains_tensor(&self, name: &str) -> bool {
        let known = self
            .params
            .lock()
            .expect("params lock")
            .index
            .contains_key(name);
        known
            || self
                .source
                .as_ref()
                .is_some_and(|s| s.contains_tensor(name))
    }
}
