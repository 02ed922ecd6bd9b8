//! Rotary position tables, as transformers computes them (in f32 whatever the model's dtype), for the
//! architectures that rotate queries and keys (`decoder`, `modernbert`).

use candle_core::{DType, Device, Tensor};

/// The tables `[len, head_dim / 2]` (cosines, sines) of base `theta`, in `dtype`.
pub(super) fn tables(
    head_dim: usize,
    theta: f64,
    len: usize,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let base = theta as f32;
    let inverse: Vec<f32> = (0..half).map(|i| 1.0 / base.powf((2 * i) as f32 / head_dim as f32)).collect();
    let angles: Vec<f32> = (0..len).flat_map(|p| inverse.iter().map(move |f| p as f32 * f)).collect();
    let angles = Tensor::from_vec(angles, (len, half), device)?;
    Ok((angles.cos()?.to_dtype(dtype)?, angles.sin()?.to_dtype(dtype)?))
}
