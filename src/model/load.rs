//! Reading model directories: the configuration (of any family `family` knows) and tokenizer, the weight files (safetensors, sharded or
//! not, else `pytorch_model.bin`), their fingerprints, and the device and dtype by name.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::Config;

use super::error::{load_err, ModelError};
use super::family::Family;
use super::tokenize::Pieces;

/// A directory's configuration, BERT-shaped whatever its family (`Family::configuration`), and tokenizer.
pub(super) fn read_config(dir: &Path) -> Result<(Config, Pieces), ModelError> {
    let config_path = dir.join("config.json");
    let raw: serde_json::Map<String, serde_json::Value> = read_json(&config_path)?;
    let (config, family) = Family::configuration(raw).map_err(|e| load_err(&config_path, e))?;
    let tokenizer_path = dir.join("tokenizer.json");
    let pad_id = Some(config.pad_token_id as u32);
    let pieces = Pieces::load(&tokenizer_path, family.max_len(&config), pad_id, family.is_decoder())?;
    if pieces.vocab_size() > config.vocab_size {
        let message = format!(
            "holds {} tokens where config.json's vocab_size is {}: the two files are of different models",
            pieces.vocab_size(),
            config.vocab_size
        );
        return Err(load_err(&tokenizer_path, message));
    }
    Ok((config, pieces))
}

/// The weight files of a directory: every `*.safetensors` (sharded checkpoints too) in name order, else
/// `pytorch_model.bin`.
pub(super) fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| load_err(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() && dir.join("pytorch_model.bin").exists() {
        files.push(dir.join("pytorch_model.bin"));
    }
    Ok(files)
}

/// A device by name: `cpu`, `cuda` or `cuda:N` (the latter with the `cuda` feature).
pub fn device(name: &str) -> Result<Device, ModelError> {
    let unsupported = |m: String| ModelError::Unsupported(m);
    match name {
        "cpu" => Ok(Device::Cpu),
        _ => {
            let ordinal = match name.strip_prefix("cuda") {
                Some("") => 0,
                Some(n) => n
                    .strip_prefix(':')
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| unsupported(format!("device {name:?}: expected cpu, cuda or cuda:N")))?,
                None => return Err(unsupported(format!("device {name:?}: expected cpu, cuda or cuda:N"))),
            };
            if cfg!(feature = "cuda") {
                Ok(Device::new_cuda(ordinal)?)
            } else {
                let _ = ordinal;
                Err(unsupported(format!("device {name:?}: this build has no CUDA (cargo build --features cuda)")))
            }
        }
    }
}

/// The weights' dtype: `f32`, `f16`, `bf16`, or `auto` (f16 on a GPU, f32 on the CPU, where candle's
/// half-precision kernels are slow).
pub fn dtype(name: &str, device: &Device) -> Result<DType, ModelError> {
    match name {
        "auto" if device.is_cuda() => Ok(DType::F16),
        "auto" | "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        _ => Err(ModelError::Unsupported(format!("dtype {name:?}: expected auto, f32, f16 or bf16"))),
    }
}

pub(super) fn weights(dir: &Path, device: &Device, dtype: DType) -> Result<VarBuilder<'static>, ModelError> {
    let files: Vec<PathBuf> =
        weight_files(dir)?.into_iter().filter(|p| p.extension().is_some_and(|x| x == "safetensors")).collect();
    if !files.is_empty() {
        // SAFETY: the files are memory-mapped read-only; a file changed while mapped is the caller's problem,
        // as with every mmap-based loader.
        return unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, device) }.map_err(|e| load_err(dir, e));
    }
    let bin = dir.join("pytorch_model.bin");
    if bin.exists() {
        return VarBuilder::from_pth(&bin, dtype, device).map_err(|e| load_err(&bin, e));
    }
    Err(load_err(dir, "no *.safetensors or pytorch_model.bin"))
}

pub(super) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ModelError> {
    let bytes = std::fs::read(path).map_err(|e| load_err(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| load_err(path, e))
}
