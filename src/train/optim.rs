//! AdamW with decoupled weight decay (Loshchilov & Hutter; PyTorch's `AdamW`), its state saved and restored
//! for resuming, and the linear warm-up and decay schedule.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{CpuStorage, DType, InplaceOp2, InplaceOp3, Layout, Tensor, Var};
use rayon::prelude::*;

use super::TrainError;

pub struct AdamW {
    vars: Vec<(String, Var)>,
    first: Vec<Tensor>,
    second: Vec<Tensor>,
    /// Updates taken so far (the bias corrections' t).
    pub steps: usize,
    weight_decay: f64,
}

const BETA1: f64 = 0.9;
const BETA2: f64 = 0.999;
const EPS: f64 = 1e-8;

impl AdamW {
    pub fn new(vars: Vec<(String, Var)>, weight_decay: f64) -> Result<AdamW, TrainError> {
        let zeros = |v: &Var| v.as_tensor().zeros_like();
        let first = vars.iter().map(|(_, v)| zeros(v)).collect::<candle_core::Result<Vec<_>>>()?;
        let second = vars.iter().map(|(_, v)| zeros(v)).collect::<candle_core::Result<Vec<_>>>()?;
        Ok(AdamW { vars, first, second, steps: 0, weight_decay })
    }

    /// One update with the given gradients (aligned with the variables). Biases and LayerNorm parameters
    /// (the one-dimensional variables) get no weight decay, as in BERT's own fine-tuning.
    pub fn step(&mut self, grads: &[Tensor], lr: f64) -> Result<(), TrainError> {
        self.steps += 1;
        let t = self.steps as i32;
        let (correct1, correct2) = (1.0 - BETA1.powi(t), 1.0 - BETA2.powi(t));
        for (i, ((_, var), grad)) in self.vars.iter().zip(grads).enumerate() {
            let decay = if var.rank() > 1 { lr * self.weight_decay } else { 0.0 };
            let grad = grad.detach();
            if var.device().is_cpu() && var.dtype() == DType::F32 && grad.dtype() == DType::F32 {
                // On the CPU, in place: three passes, where the tensor ops below allocate a dozen (a profile of
                // XLM-R's step, whose word embeddings alone are 768 MB, spent seconds there).
                let grad = grad.contiguous()?;
                self.first[i].inplace_op2(&grad, &Moment { beta: BETA1 as f32, square: false })?;
                self.second[i].inplace_op2(&grad, &Moment { beta: BETA2 as f32, square: true })?;
                let update = Update {
                    keep: (1.0 - decay) as f32,
                    step: (lr / correct1) as f32,
                    root2: correct2.sqrt() as f32,
                    eps: EPS as f32,
                };
                var.as_tensor().inplace_op3(&self.first[i], &self.second[i], &update)?;
                continue;
            }
            let m = ((&self.first[i] * BETA1)? + (&grad * (1.0 - BETA1))?)?;
            let v = ((&self.second[i] * BETA2)? + (grad.sqr()? * (1.0 - BETA2))?)?;
            let update = ((&m / correct1)? / ((&v / correct2)?.sqrt()? + EPS)?)?;
            let theta = var.as_tensor().detach();
            var.set(&((theta * (1.0 - decay))? - (update * lr)?)?)?;
            self.first[i] = m;
            self.second[i] = v;
        }
        Ok(())
    }

    pub fn save(&self, path: &Path) -> Result<(), TrainError> {
        let mut tensors = HashMap::new();
        for (i, (name, _)) in self.vars.iter().enumerate() {
            tensors.insert(format!("m.{name}"), self.first[i].clone());
            tensors.insert(format!("v.{name}"), self.second[i].clone());
        }
        candle_core::safetensors::save(&tensors, path).map_err(|e| TrainError::io(path, e))
    }

    pub fn load(&mut self, path: &Path, steps: usize) -> Result<(), TrainError> {
        let device = self.vars.first().map(|(_, v)| v.device().clone()).unwrap_or(candle_core::Device::Cpu);
        let tensors = candle_core::safetensors::load(path, &device).map_err(|e| TrainError::io(path, e))?;
        for (i, (name, _)) in self.vars.iter().enumerate() {
            let get = |key: String| tensors.get(&key).cloned().ok_or_else(|| TrainError::io(path, format!("no {key}")));
            self.first[i] = get(format!("m.{name}"))?;
            self.second[i] = get(format!("v.{name}"))?;
        }
        self.steps = steps;
        Ok(())
    }
}

/// Values of a contiguous f32 tensor on the CPU.
fn values<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> candle_core::Result<&'a [f32]> {
    match (storage, layout.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((start, end))) => Ok(&v[start..end]),
        _ => candle_core::bail!("{op} takes contiguous f32 tensors"),
    }
}

/// `values`, to update in place.
fn values_mut<'a>(storage: &'a mut CpuStorage, layout: &Layout, op: &str) -> candle_core::Result<&'a mut [f32]> {
    match (storage, layout.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((start, end))) => Ok(&mut v[start..end]),
        _ => candle_core::bail!("{op} takes contiguous f32 tensors"),
    }
}

/// Values worked on in parallel, a chunk per task.
const CHUNK: usize = 1 << 14;

/// A moment updated in place from the gradient: `m ← β·m + (1 − β)·g` (or `g²`).
struct Moment {
    beta: f32,
    square: bool,
}

impl InplaceOp2 for Moment {
    fn name(&self) -> &'static str {
        "adamw-moment"
    }

    fn cpu_fwd(&self, s1: &mut CpuStorage, l1: &Layout, s2: &CpuStorage, l2: &Layout) -> candle_core::Result<()> {
        let (grad, moment) = (values(s2, l2, self.name())?, values_mut(s1, l1, self.name())?);
        if moment.len() != grad.len() {
            candle_core::bail!("{}: {} values and a gradient of {}", self.name(), moment.len(), grad.len());
        }
        let (beta, rest) = (self.beta, 1.0 - self.beta);
        moment.par_chunks_mut(CHUNK).zip(grad.par_chunks(CHUNK)).for_each(|(m, g)| {
            for (m, &g) in m.iter_mut().zip(g) {
                *m = beta * *m + rest * if self.square { g * g } else { g };
            }
        });
        Ok(())
    }
}

/// A weight updated in place from its moments, as PyTorch's AdamW: `θ ← keep·θ − step · m / (√v / root2 + ε)`
/// (`keep` = 1 − lr·decay, `step` = lr / (1 − β₁ᵗ), `root2` = √(1 − β₂ᵗ)).
struct Update {
    keep: f32,
    step: f32,
    root2: f32,
    eps: f32,
}

impl InplaceOp3 for Update {
    fn name(&self) -> &'static str {
        "adamw-update"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<()> {
        let (first, second) = (values(s2, l2, self.name())?, values(s3, l3, self.name())?);
        let theta = values_mut(s1, l1, self.name())?;
        if theta.len() != first.len() || theta.len() != second.len() {
            candle_core::bail!(
                "{}: {} weights, moments of {} and {}",
                self.name(),
                theta.len(),
                first.len(),
                second.len()
            );
        }
        theta.par_chunks_mut(CHUNK).zip(first.par_chunks(CHUNK).zip(second.par_chunks(CHUNK))).for_each(
            |(t, (m, v))| {
                for ((t, &m), &v) in t.iter_mut().zip(m).zip(v) {
                    *t = self.keep * *t - self.step * m / (v.sqrt() / self.root2 + self.eps);
                }
            },
        );
        Ok(())
    }
}

/// The learning rate at `step` (1-based) of `total`: linear warm-up over `warmup` steps, then linear decay to 0.
pub fn learning_rate(base: f64, step: usize, warmup: usize, total: usize) -> f64 {
    if step <= warmup && warmup > 0 {
        return base * step as f64 / warmup as f64;
    }
    base * (total.saturating_sub(step) as f64 / total.saturating_sub(warmup).max(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    #[test]
    fn schedule_warms_up_then_decays_to_zero() {
        assert_eq!(learning_rate(1.0, 1, 4, 10), 0.25);
        assert_eq!(learning_rate(1.0, 4, 4, 10), 1.0);
        assert_eq!(learning_rate(1.0, 7, 4, 10), 0.5);
        assert_eq!(learning_rate(1.0, 10, 4, 10), 0.0);
        assert_eq!(learning_rate(2.0, 1, 0, 2), 1.0);
    }

    /// Two steps by hand: Adam's first step moves every weight by lr (sign of the gradient), and decay
    /// applies to matrices only.
    #[test]
    fn adamw_matches_a_hand_computation_and_resumes() {
        let device = Device::Cpu;
        let matrix = Var::from_tensor(&Tensor::new(&[[1.0f32, -2.0]], &device).unwrap()).unwrap();
        let bias = Var::from_tensor(&Tensor::new(&[0.5f32], &device).unwrap()).unwrap();
        let vars = vec![("w".to_string(), matrix.clone()), ("b".to_string(), bias.clone())];
        let mut adam = AdamW::new(vars.clone(), 0.1).unwrap();
        let grads = [Tensor::new(&[[0.3f32, -4.0]], &device).unwrap(), Tensor::new(&[2.0f32], &device).unwrap()];
        adam.step(&grads, 0.01).unwrap();
        let w = matrix.as_tensor().to_vec2::<f32>().unwrap();
        assert!((w[0][0] - (1.0 * (1.0 - 0.001) - 0.01)).abs() < 1e-6, "{w:?}");
        assert!((w[0][1] - (-2.0 * (1.0 - 0.001) + 0.01)).abs() < 1e-6, "{w:?}");
        assert!((bias.as_tensor().to_vec1::<f32>().unwrap()[0] - 0.49).abs() < 1e-6);

        // Saving after one step and resuming gives the same second step as going on.
        let dir = tempfile::tempdir().unwrap();
        adam.save(&dir.path().join("adam.safetensors")).unwrap();
        let copies: Vec<(String, Var)> =
            vars.iter().map(|(n, v)| (n.clone(), Var::from_tensor(&v.as_tensor().copy().unwrap()).unwrap())).collect();
        let mut resumed = AdamW::new(copies.clone(), 0.1).unwrap();
        resumed.load(&dir.path().join("adam.safetensors"), 1).unwrap();
        adam.step(&grads, 0.01).unwrap();
        resumed.step(&grads, 0.01).unwrap();
        for ((_, a), (_, b)) in vars.iter().zip(&copies) {
            let diff = (a.as_tensor() - b.as_tensor()).unwrap().abs().unwrap().sum_all().unwrap();
            assert_eq!(diff.to_dtype(DType::F32).unwrap().to_scalar::<f32>().unwrap(), 0.0);
        }
    }
}
