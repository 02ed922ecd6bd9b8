//! A model to fine-tune: an encoder of a Hugging Face directory (BERT, RoBERTa and XLM-R, ELECTRA, DistilBERT,
//! DeBERTa, ModernBERT: our encoders with their backward passes) as candle variables named as the family's
//! checkpoints name them, forward passes on the autograd graph, and checkpoints that are the family's own
//! sequence classifier. Either a cross-encoder (from a cross-encoder, whose head it keeps, or a bare, masked-LM or
//! sentence-transformers encoder to which the family's head with one label is added; `CrossEncoder::load`) or a
//! sentence-transformers bi-encoder's encoder with its pooling (`BiEncoder::load`: the learned preselection).
//!
//! Variables are kept in f32 (the optimizer's master copy); with a half-precision `dtype` every pass casts
//! them, so updates are never lost to rounding.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device, IndexOp, Shape, Tensor, Var};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::bert::Config;
use parking_lot::Mutex;

use super::bert::{encoder_root, Bert, Positions};
use super::cobert::{CoBert, CoBertConfig, CoBertHeads};
use super::deberta::Deberta;
use super::dropout::{Dropout, Rates};
use super::encoder::{Backbone, SentenceLayout};
use super::family::Family;
use super::head::Head;
use super::modernbert::ModernBert;
use super::network::Network;
use super::{load_err, read_config, weights, BiEncoder, CrossEncoder, Encoded, Fnv, Inputs, ModelError, Pieces};
use crate::rng::Rng;

/// Tokenizer and vocabulary files copied into every checkpoint, when the source has them.
const TOKENIZER_FILES: [&str; 4] = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"];

pub struct TrainableEncoder {
    varmap: VarMap,
    /// The f32 model over the variables themselves (`None` when passes cast to half precision).
    model: Option<Heads>,
    pieces: Pieces,
    config: Config,
    config_json: serde_json::Value,
    /// A cross-encoder's labels (`None`: a bi-encoder).
    labels: Option<usize>,
    source: PathBuf,
    device: Device,
    dtype: DType,
    /// Variables that the source checkpoint lacked and were initialized (seeded).
    initialized: Vec<String>,
    /// Co-BERT's heads, when training them (their variables are named `cobert.*`).
    cobert: Option<CoBertHeads>,
    /// The cross-encoder whose first round a Co-BERT checkpoint keeps beside its own trained backbone.
    first_round: Option<PathBuf>,
    /// A bi-encoder's pooling (`None`: a cross-encoder).
    sentence: Option<SentenceLayout>,
    /// Off but in a training step (`train::Dropping`).
    dropout: Dropout,
}

/// Co-BERT heads to add to a trainable model: their shape, and whether their layers start as copies of the
/// backbone's last layers (else drawn from the seed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoBertInit {
    pub config: CoBertConfig,
    pub from_backbone: bool,
}

/// The encoder with, on a cross-encoder, its family's classification head (`head::Head`, as served: BERT's
/// pooler, RoBERTa's and ELECTRA's `classifier.dense`, DistilBERT's `pre_classifier`, DeBERTa's context pooler,
/// ModernBERT's dense layer and norm, then the output layer).
/// The variables are named as the family's checkpoints name them, so that a checkpoint is the variables.
struct Heads {
    backbone: Trained,
    head: Option<Head>,
}

/// The encoder in training: BERT's (and its kin's), DeBERTa's (BERT's layers with the disentangled attention), or
/// ModernBERT's.
enum Trained {
    Bert(Bert),
    Deberta(Deberta),
    ModernBert(ModernBert),
}

impl Heads {
    fn build(
        vb: VarBuilder,
        config: &Config,
        labels: Option<usize>,
        origin: &Path,
        dropout: &Dropout,
    ) -> Result<Heads, ModelError> {
        let family = Family::from_config(config);
        let backbone = match family {
            Family::Deberta => Trained::Deberta(Deberta::trainable(vb.clone(), config, origin, dropout.clone())?),
            Family::ModernBert => Trained::ModernBert(ModernBert::trainable(vb.clone(), origin, dropout.clone())?),
            _ => Trained::Bert(
                Bert::trainable(family.bert_names(vb.clone()).pp(family.prefix()), config, dropout.clone())
                    .map_err(|e| load_err(origin, format!("building the model: {e}")))?,
            ),
        };
        let head = labels.map(|labels| Head::with_labels(&vb, config, origin, labels)).transpose()?;
        let head = head.map(|head| head.dropping(dropout.clone()));
        Ok(Heads { backbone, head })
    }

    /// The final hidden states `[batch, len, hidden]`.
    fn hidden(&self, inputs: &Inputs) -> candle_core::Result<Tensor> {
        match &self.backbone {
            Trained::Bert(bert) => {
                bert.forward(&inputs.ids, &inputs.types, inputs.padded.then_some(&inputs.mask), Positions::All)
            }
            Trained::Deberta(deberta) => deberta.forward(inputs, Positions::All),
            Trained::ModernBert(modernbert) => Network::forward(modernbert, inputs, Positions::All),
        }
    }

    /// The final `[CLS]` states `[batch, hidden]`.
    fn cls(&self, inputs: &Inputs) -> candle_core::Result<Tensor> {
        self.hidden(inputs)?.i((.., 0))?.contiguous()
    }

    fn forward(&self, inputs: &Inputs) -> candle_core::Result<Tensor> {
        let Some(head) = &self.head else {
            candle_core::bail!("a bi-encoder has no classifier");
        };
        head.forward(&self.hidden(inputs)?, &inputs.mask)
    }
}

impl TrainableEncoder {
    /// A cross-encoder from the weights in `dir`; what it lacks (a pooler, the one-logit classifier) is drawn
    /// from `seed` as BERT initializes it (normal with the config's `initializer_range`, zero biases).
    pub fn init(dir: &Path, device: &Device, dtype: DType, seed: u64) -> Result<TrainableEncoder, ModelError> {
        TrainableEncoder::init_with(dir, device, dtype, seed, None)
    }

    /// `init`, with Co-BERT heads when `cobert` is given.
    pub fn init_with(
        dir: &Path,
        device: &Device,
        dtype: DType,
        seed: u64,
        cobert: Option<CoBertInit>,
    ) -> Result<TrainableEncoder, ModelError> {
        TrainableEncoder::build(dir, device, dtype, seed, cobert, false)
    }

    /// The sentence-transformers bi-encoder in `dir` (its encoder and pooling), to train its encoder.
    pub fn init_bi_encoder(dir: &Path, device: &Device, dtype: DType) -> Result<TrainableEncoder, ModelError> {
        // Nothing is drawn: the encoder is the checkpoint's whole.
        TrainableEncoder::build(dir, device, dtype, 0, None, true)
    }

    fn build(
        dir: &Path,
        device: &Device,
        dtype: DType,
        seed: u64,
        cobert: Option<CoBertInit>,
        bi_encoder: bool,
    ) -> Result<TrainableEncoder, ModelError> {
        let (config, pieces) = read_config(dir)?;
        let family = Family::from_config(&config);
        if !TRAINED.contains(&family) {
            let message = format!(
                "training takes BERT, RoBERTa and XLM-R, ELECTRA, DistilBERT, DeBERTa and ModernBERT models for \
                 now (every family serves); this is a {family:?}"
            );
            return Err(load_err(dir, message));
        }
        // Co-BERT's heads are BERT layers over any backbone's `[CLS]` states; they start as the backbone's last
        // layers only where those are BERT's.
        if cobert.is_some_and(|c| c.from_backbone) && matches!(family, Family::Deberta | Family::ModernBert) {
            return Err(load_err(
                dir,
                format!(
                    "Co-BERT's heads are BERT layers, and this {family:?}'s layers are not: they cannot start as its \
                     last layers; draw them from the seed (--heads random)"
                ),
            ));
        }
        let sentence = bi_encoder.then(|| SentenceLayout::read(dir, pieces.max_len)).transpose()?;
        let config_path = dir.join("config.json");
        let config_json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&config_path).map_err(|e| load_err(&config_path, e))?)
                .map_err(|e| load_err(&config_path, e))?;
        let std = config_json.get("initializer_range").and_then(|v| v.as_f64()).unwrap_or(0.02);
        let dropout = Dropout::new(Rates::from_config(&config_json, family).map_err(|e| load_err(&config_path, e))?);
        let source = weights(dir, &Device::Cpu, DType::F32)?;
        let varmap = VarMap::new();
        let initialized = Arc::new(Mutex::new(Vec::new()));
        // A cross-encoder keeps its source's output layer (1 or 2 labels, the last one's logit the score, as
        // served); a model without one gets one label.
        let labels = (!bi_encoder).then(|| Head::labels_in(&source, &config).unwrap_or(1));
        let initializer = Initializer {
            varmap: varmap.clone(),
            encoder: encoder_root(source.clone(), &config),
            root: source,
            prefix: family.prefix(),
            seed,
            std,
            initialized: initialized.clone(),
            layers: config.num_hidden_layers,
            cobert: cobert.filter(|c| c.from_backbone).map(|c| c.config),
        };
        let vb = VarBuilder::from_backend(Box::new(initializer), DType::F32, device.clone());
        let heads = Heads::build(vb.clone(), &config, labels, dir, &dropout)?;
        let cobert = cobert
            .map(|c| CoBertHeads::new(vb.pp("cobert"), &config, c.config, true))
            .transpose()
            .map_err(|e| load_err(dir, format!("building Co-BERT's heads: {e}")))?;
        let mut initialized = std::mem::take(&mut *initialized.lock());
        initialized.sort();
        let model = (dtype == DType::F32).then_some(heads);
        Ok(TrainableEncoder {
            varmap,
            model,
            pieces,
            config,
            config_json,
            labels,
            source: dir.to_path_buf(),
            device: device.clone(),
            dtype,
            initialized,
            cobert,
            first_round: None,
            sentence,
            dropout,
        })
    }

    /// Its dropout: off until a training step starts it.
    pub fn dropout(&self) -> &Dropout {
        &self.dropout
    }

    /// Makes every checkpoint carry `first_round` (a cross-encoder directory) as its first-round model:
    /// Co-BERT trained end to end, whose own backbone no longer scores the first round.
    pub fn keep_first_round(&mut self, first_round: &Path) {
        self.first_round = Some(first_round.to_path_buf());
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Co-BERT's heads, when the model was built with them.
    pub fn cobert(&self) -> Option<&CoBertHeads> {
        self.cobert.as_ref()
    }

    /// Names of the variables the source did not have.
    pub fn initialized(&self) -> &[String] {
        &self.initialized
    }

    pub fn encode(
        &self,
        query: &str,
        segment: &str,
        max_len: usize,
        max_query_tokens: usize,
    ) -> Result<Encoded, ModelError> {
        self.pieces.pair(query, segment, max_len, max_query_tokens)
    }

    pub fn count_tokens(&self, text: &str) -> Result<usize, ModelError> {
        self.pieces.count(text)
    }

    /// The segment budget of (query, segment) pairs, as the served cross-encoder has it
    /// (`Reranker::segment_budget`).
    pub fn segment_budget(&self, max_length: usize, max_query_tokens: usize) -> usize {
        self.pieces.segment_budget(max_length, max_query_tokens)
    }

    /// Logits `[batch]` on the autograd graph.
    pub fn forward(&self, batch: &[Encoded]) -> Result<Tensor, ModelError> {
        self.pass(batch, Heads::forward)
    }

    /// The final `[CLS]` states `[batch, hidden]` on the autograd graph (Co-BERT's interaction vectors).
    pub fn cls_states(&self, batch: &[Encoded]) -> Result<Tensor, ModelError> {
        self.pass(batch, Heads::cls)
    }

    /// Encodes one text for a bi-encoder, cut to its longest input.
    pub fn encode_text(&self, text: &str) -> Result<Encoded, ModelError> {
        self.pieces.single(text, self.layout()?.max_seq_length)
    }

    /// A bi-encoder's embeddings `[batch, hidden]` on the autograd graph, pooled as it pools when served and of
    /// unit length, so that their dot products are the cosines a served selector compares.
    pub fn embed(&self, batch: &[Encoded]) -> Result<Tensor, ModelError> {
        let layout = SentenceLayout { normalize: true, ..self.layout()? };
        self.pass(batch, |heads, inputs| layout.pool(&heads.hidden(inputs)?, &inputs.mask))
    }

    fn layout(&self) -> Result<SentenceLayout, ModelError> {
        self.sentence.ok_or_else(|| load_err(&self.source, "a cross-encoder does not embed texts"))
    }

    fn pass(
        &self,
        batch: &[Encoded],
        f: impl Fn(&Heads, &Inputs) -> candle_core::Result<Tensor>,
    ) -> Result<Tensor, ModelError> {
        let inputs = Inputs::new(batch, self.pieces.pad_id, &self.device)?;
        let out = match &self.model {
            Some(heads) => f(heads, &inputs)?,
            None => {
                let vb = VarBuilder::from_backend(
                    Box::new(Cast { varmap: self.varmap.clone(), dtype: self.dtype }),
                    self.dtype,
                    self.device.clone(),
                );
                f(&Heads::build(vb, &self.config, self.labels, &self.source, &self.dropout)?, &inputs)?
            }
        };
        Ok(out.to_dtype(DType::F32)?)
    }

    /// Every variable with its checkpoint name, sorted by name.
    pub fn variables(&self) -> Vec<(String, Var)> {
        let data = variables(&self.varmap);
        let mut vars: Vec<(String, Var)> = data.iter().map(|(n, v)| (n.clone(), v.clone())).collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        vars
    }

    /// An inference model over a copy of the current weights (fused kernels, no graph).
    pub fn snapshot(&self) -> Result<CrossEncoder, ModelError> {
        self.snapshot_on(&self.device, self.dtype)
    }

    /// An inference cross-encoder over a copy of the current weights, on another device or in another dtype.
    pub fn snapshot_on(&self, device: &Device, dtype: DType) -> Result<CrossEncoder, ModelError> {
        let vb = VarBuilder::from_tensors(self.weights()?, dtype, device);
        CrossEncoder::new(vb, &self.config, self.pieces.clone(), &self.source, None)
    }

    /// An inference bi-encoder over a copy of the current weights, pooled as the model is served.
    pub fn snapshot_bi_encoder(&self) -> Result<BiEncoder, ModelError> {
        let vb = VarBuilder::from_tensors(self.weights()?, self.dtype, &self.device);
        let backbone = Backbone::new(vb, &self.config, self.pieces.clone(), &self.source)?;
        Ok(BiEncoder { backbone, layout: self.layout()? })
    }

    /// An inference Co-BERT over a copy of the current weights: the cross-encoder (whose `[CLS]` states the
    /// heads read) and the heads, as a checkpoint of them would load (frozen backbone, one model).
    pub fn snapshot_cobert(&self) -> Result<CoBert, ModelError> {
        let heads = self.cobert.as_ref().ok_or_else(|| load_err(&self.source, "the model has no Co-BERT heads"))?;
        let vb = VarBuilder::from_tensors(self.weights()?, self.dtype, &self.device);
        let cross = CrossEncoder::new(vb.clone(), &self.config, self.pieces.clone(), &self.source, None)?;
        let heads = CoBertHeads::new(vb.pp("cobert"), &self.config, *heads.config(), false)
            .map_err(|e| load_err(&self.source, e))?;
        Ok(CoBert { cross, own: None, heads, backbone: self.config.clone() })
    }

    fn weights(&self) -> Result<HashMap<String, Tensor>, ModelError> {
        self.variables().into_iter().map(|(n, v)| Ok((n, v.as_tensor().detach().copy()?))).collect()
    }

    /// Writes a checkpoint its loader reads: a cross-encoder's `config.json` (a one-label sequence
    /// classifier), `model.safetensors`, and the source's tokenizer files; a bi-encoder's weights among the
    /// source's other files (its configuration, tokenizer and modules). The directory is replaced whole, so an
    /// interruption leaves the previous checkpoint.
    pub fn save(&self, dir: &Path) -> Result<(), ModelError> {
        let staging = staging_dir(dir);
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).map_err(|e| load_err(&staging, e))?;
        if self.sentence.is_some() {
            return self.save_bi_encoder(&staging, dir);
        }
        let (heads, backbone): (HashMap<String, Tensor>, HashMap<String, Tensor>) =
            self.weights()?.into_iter().partition(|(name, _)| name.starts_with("cobert."));
        let path = staging.join("model.safetensors");
        candle_core::safetensors::save(&backbone, &path).map_err(|e| load_err(&path, e))?;
        if let Some(cobert) = &self.cobert {
            let path = staging.join(super::cobert::WEIGHTS_FILE);
            candle_core::safetensors::save(&heads, &path).map_err(|e| load_err(&path, e))?;
            let path = staging.join(super::cobert::CONFIG_FILE);
            std::fs::write(&path, serde_json::to_vec_pretty(cobert.config()).unwrap_or_default())
                .map_err(|e| load_err(&path, e))?;
        }
        let mut config = self.config_json.clone();
        let labels = self.labels.unwrap_or(1);
        if let Some(map) = config.as_object_mut() {
            let model_type = map.get("model_type").and_then(|t| t.as_str()).unwrap_or("bert");
            map.insert("architectures".into(), serde_json::json!([sequence_classifier(model_type)]));
            map.insert("num_labels".into(), serde_json::json!(labels));
            let id2label: serde_json::Map<String, serde_json::Value> =
                (0..labels).map(|i| (i.to_string(), format!("LABEL_{i}").into())).collect();
            let label2id: serde_json::Map<String, serde_json::Value> =
                (0..labels).map(|i| (format!("LABEL_{i}"), i.into())).collect();
            map.insert("id2label".into(), id2label.into());
            map.insert("label2id".into(), label2id.into());
        }
        let config_path = staging.join("config.json");
        std::fs::write(&config_path, serde_json::to_vec_pretty(&config).unwrap_or_default())
            .map_err(|e| load_err(&config_path, e))?;
        copy_files(&self.source, &staging, &TOKENIZER_FILES)?;
        if let Some(first_round) = &self.first_round {
            let to = staging.join(super::cobert::FIRST_ROUND_DIR);
            std::fs::create_dir_all(&to).map_err(|e| load_err(&to, e))?;
            copy_files(first_round, &to, &["config.json", "model.safetensors", "pytorch_model.bin"])?;
            copy_files(first_round, &to, &TOKENIZER_FILES)?;
        }
        replace_dir(&staging, dir)
    }

    fn save_bi_encoder(&self, staging: &Path, dir: &Path) -> Result<(), ModelError> {
        let weight_file = |name: &str| {
            [".safetensors", ".bin", ".onnx", ".h5", ".msgpack", ".ot"].iter().any(|ext| name.ends_with(ext))
        };
        let entries = std::fs::read_dir(&self.source).map_err(|e| load_err(&self.source, e))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| load_err(&self.source, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if entry.path().is_file() && !weight_file(&name) {
                files.push(name);
            }
        }
        copy_files(&self.source, staging, &files.iter().map(String::as_str).collect::<Vec<_>>())?;
        // A module without settings (Normalize) may have no directory.
        for module in SentenceLayout::module_dirs(&self.source)?.iter().filter(|m| self.source.join(m).is_dir()) {
            let (from, to) = (self.source.join(module), staging.join(module));
            std::fs::create_dir_all(&to).map_err(|e| load_err(&to, e))?;
            let names: Vec<String> = std::fs::read_dir(&from)
                .map_err(|e| load_err(&from, e))?
                .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect();
            copy_files(&from, &to, &names.iter().map(String::as_str).collect::<Vec<_>>())?;
        }
        let path = staging.join("model.safetensors");
        candle_core::safetensors::save(&self.weights()?, &path).map_err(|e| load_err(&path, e))?;
        replace_dir(staging, dir)
    }

    /// The variables alone, as safetensors (for resuming).
    pub fn save_weights(&self, path: &Path) -> Result<(), ModelError> {
        candle_core::safetensors::save(&self.weights()?, path).map_err(|e| load_err(path, e))
    }

    /// Sets every variable from a file `save_weights` or `save` wrote.
    pub fn load_weights(&self, path: &Path) -> Result<(), ModelError> {
        let tensors = candle_core::safetensors::load(path, &self.device).map_err(|e| load_err(path, e))?;
        for (name, var) in self.variables() {
            let tensor = tensors.get(&name).ok_or_else(|| load_err(path, format!("no tensor {name}")))?;
            var.set(&tensor.to_dtype(var.dtype())?).map_err(|e| load_err(path, format!("{name}: {e}")))?;
        }
        Ok(())
    }
}

/// The families `longrank train` takes: the encoders whose kernels have their backward passes (the decoders'
/// training, LoRA, is another matter).
const TRAINED: [Family; 6] =
    [Family::Bert, Family::Roberta, Family::Electra, Family::DistilBert, Family::Deberta, Family::ModernBert];

/// transformers' sequence-classification architecture for a `model_type` longrank trains.
fn sequence_classifier(model_type: &str) -> &'static str {
    match model_type {
        "roberta" => "RobertaForSequenceClassification",
        "xlm-roberta" => "XLMRobertaForSequenceClassification",
        "electra" => "ElectraForSequenceClassification",
        "distilbert" => "DistilBertForSequenceClassification",
        "deberta-v2" => "DebertaV2ForSequenceClassification",
        "modernbert" => "ModernBertForSequenceClassification",
        _ => "BertForSequenceClassification",
    }
}

/// Copies the named files `from` has into `to`.
fn copy_files(from: &Path, to: &Path, names: &[&str]) -> Result<(), ModelError> {
    for name in names {
        let source = from.join(name);
        if source.exists() {
            std::fs::copy(&source, to.join(name)).map_err(|e| load_err(&source, e))?;
        }
    }
    Ok(())
}

fn staging_dir(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".partial");
    dir.with_file_name(name)
}

/// Swaps `staging` in for `dir` (the old one is removed after the new one is in place).
pub(crate) fn replace_dir(staging: &Path, dir: &Path) -> Result<(), ModelError> {
    let mut old = dir.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    old.push(".old");
    let old = dir.with_file_name(old);
    let _ = std::fs::remove_dir_all(&old);
    if dir.exists() {
        std::fs::rename(dir, &old).map_err(|e| load_err(dir, e))?;
    }
    std::fs::rename(staging, dir).map_err(|e| load_err(dir, e))?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(())
}

/// Creates each variable once: from the source checkpoint when it has the tensor with the right shape,
/// else drawn from the seed.
struct Initializer {
    varmap: VarMap,
    /// The source's top level, and its encoder root under BERT's names (Co-BERT's layers start from it).
    root: VarBuilder<'static>,
    encoder: VarBuilder<'static>,
    /// The family's encoder prefix (`bert`, `roberta`, …), which a bare encoder's checkpoint leaves out.
    prefix: &'static str,
    seed: u64,
    std: f64,
    initialized: Arc<Mutex<Vec<String>>>,
    /// The backbone's layer count, and the Co-BERT heads to start from its layers (if any).
    layers: usize,
    cobert: Option<CoBertConfig>,
}

impl Initializer {
    fn checkpoint_tensor(&self, shape: &Shape, name: &str) -> Option<Tensor> {
        if let Some(rest) = name.strip_prefix("cobert.") {
            return self.cobert_from_backbone(shape, rest);
        }
        self.names(name).find_map(|n| self.root.get(shape.clone(), n).ok())
    }

    /// Where the source may hold variable `name`: under it, or without the family's prefix (a bare encoder's
    /// checkpoint, a BERT pooler at the top).
    fn names<'n>(&self, name: &'n str) -> impl Iterator<Item = &'n str> {
        let bare = name.strip_prefix(self.prefix).and_then(|rest| rest.strip_prefix('.'));
        std::iter::once(name).chain(bare)
    }

    /// Co-BERT's encoder layers start as the backbone's last ones (layer i of c as layer L − c + i), their
    /// embeddings' LayerNorm, type and (calibrator) first two position rows as the backbone's; projections
    /// and scores are drawn.
    fn cobert_from_backbone(&self, shape: &Shape, name: &str) -> Option<Tensor> {
        let config = self.cobert?;
        let (part, rest) = name.split_once('.')?;
        let count = match part {
            "calibrator" => config.calibrator_layers,
            "groupwise" => config.groupwise_layers,
            _ => return None,
        };
        let source = if let Some(rest) = rest.strip_prefix("encoder.layer.") {
            let (i, tail) = rest.split_once('.')?;
            let i: usize = i.parse().ok()?;
            let layer = if count <= self.layers { self.layers - count + i } else { i % self.layers.max(1) };
            format!("encoder.layer.{layer}.{tail}")
        } else if rest.starts_with("embeddings.") {
            rest.to_string()
        } else {
            return None;
        };
        let tensor = self.encoder.get_unchecked(&source).ok()?;
        let rows = shape.dims().first().copied()?;
        let tensor =
            if tensor.rank() == 2 && tensor.dim(0).ok()? >= rows { tensor.narrow(0, 0, rows).ok()? } else { tensor };
        (tensor.shape() == shape).then_some(tensor)
    }

    fn fresh(&self, shape: &Shape, name: &str, dtype: DType, device: &Device) -> candle_core::Result<Tensor> {
        if name.ends_with(".bias") || name.ends_with("LayerNorm.beta") {
            return Tensor::zeros(shape, dtype, device);
        }
        if name.contains("LayerNorm") {
            return Tensor::ones(shape, dtype, device);
        }
        let mut hash = Fnv::default();
        hash.write(name.as_bytes());
        let mut rng = Rng::stream(self.seed, hash.0);
        let values: Vec<f32> = (0..shape.elem_count()).map(|_| (rng.normal() * self.std) as f32).collect();
        Tensor::from_vec(values, shape, device)?.to_dtype(dtype)
    }
}

impl SimpleBackend for Initializer {
    fn get(
        &self,
        shape: Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        device: &Device,
    ) -> candle_core::Result<Tensor> {
        let mut data = variables(&self.varmap);
        if let Some(var) = data.get(name) {
            return Ok(var.as_tensor().clone());
        }
        let tensor = match self.checkpoint_tensor(&shape, name) {
            Some(t) => t.to_dtype(dtype)?.to_device(device)?,
            None => {
                self.initialized.lock().push(name.to_string());
                self.fresh(&shape, name, dtype, device)?
            }
        };
        let var = Var::from_tensor(&tensor)?;
        let out = var.as_tensor().clone();
        data.insert(name.to_string(), var);
        Ok(out)
    }

    /// A variable whose shape the source says (ELECTRA's embedding width).
    fn get_unchecked(&self, name: &str, dtype: DType, device: &Device) -> candle_core::Result<Tensor> {
        if let Some(var) = variables(&self.varmap).get(name) {
            return Ok(var.as_tensor().clone());
        }
        let shape = self.names(name).find_map(|n| self.root.get_unchecked(n).ok()).map(|t| t.shape().clone());
        let shape = shape.ok_or_else(|| candle_core::Error::Msg(format!("the source has no {name}")))?;
        self.get(shape, name, candle_nn::Init::Const(0.0), dtype, device)
    }

    /// A variable made already, or one the source holds (ModernBERT's first layer has no `attn_norm`).
    fn contains_tensor(&self, name: &str) -> bool {
        variables(&self.varmap).contains_key(name) || self.names(name).any(|n| self.root.contains_tensor(n))
    }
}

/// The variables cast to the compute dtype on every pass (the casts stay on the graph).
struct Cast {
    varmap: VarMap,
    dtype: DType,
}

impl SimpleBackend for Cast {
    fn get(&self, shape: Shape, name: &str, _: candle_nn::Init, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        let data = variables(&self.varmap);
        let var = data.get(name).ok_or_else(|| candle_core::Error::Msg(format!("no variable {name}")))?;
        if var.shape() != &shape {
            candle_core::bail!("variable {name}: shape {:?}, expected {shape:?}", var.shape());
        }
        var.as_tensor().to_dtype(self.dtype)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        let data = variables(&self.varmap);
        let var = data.get(name).ok_or_else(|| candle_core::Error::Msg(format!("no variable {name}")))?;
        var.as_tensor().to_dtype(self.dtype)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        variables(&self.varmap).contains_key(name)
    }
}

/// candle's variables of a map (its mutex is std's: a panic while it was held leaves the map as it was).
fn variables(varmap: &VarMap) -> std::sync::MutexGuard<'_, HashMap<String, Var>> {
    varmap.data().lock().unwrap_or_else(|e| e.into_inner())
}
