//! Typed settings, each declared once with its default (`config.toml` shows them all, and a test checks the
//! two agree). Precedence, lowest first: the defaults, `config.toml` (or `--config FILE`), `LONGRANK_*`
//! environment variables (the setting's path in capitals: `LONGRANK_DATA_DIR`, `LONGRANK_SERVER_ADDR`,
//! `LONGRANK_MODEL_SEGMENTS_STRATEGY`), then command-line flags.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::index::{Bm25Params, BuildOptions, OnError};
use crate::model::{Kind, Quantize, Recipe};
use crate::preselect::{Preselect, Selector};
use crate::segment::SegmentOptions;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where collections (and later the database) live.
    pub data_dir: PathBuf,
    /// Collection used when a request names none; empty: the only collection, if there is just one.
    pub default_collection: String,
    pub server: ServerConfig,
    pub limits: Limits,
    pub bm25: Bm25Params,
    pub index: IndexConfig,
    pub batch: BatchConfig,
    pub store: StoreConfig,
    pub model: ModelConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("data"),
            default_collection: String::new(),
            server: ServerConfig::default(),
            limits: Limits::default(),
            bm25: Bm25Params::default(),
            index: IndexConfig::default(),
            batch: BatchConfig::default(),
            store: StoreConfig::default(),
            model: ModelConfig::default(),
        }
    }
}

impl Config {
    /// The embedded SQLite database (jobs, runs, query log).
    pub fn database_path(&self) -> PathBuf {
        self.data_dir.join("longrank.db")
    }

    /// The database's URL: `store.url`, else the SQLite file in the data directory.
    pub fn store_url(&self) -> String {
        match self.store.url.is_empty() {
            true => sqlite_url(&self.database_path()),
            false => self.store.url.clone(),
        }
    }

    /// The configuration as a run records it (a job's provenance, `OUT.provenance.json`): secrets replaced,
    /// paths absolute.
    pub fn recorded(&self) -> Config {
        let mut config = self.clone();
        let hide = |keys: &mut Vec<String>| keys.iter_mut().for_each(|k| *k = REDACTED.into());
        hide(&mut config.server.admin_keys);
        hide(&mut config.server.search_keys);
        config.store.url = redact_url(&config.store.url);
        // Relative paths made absolute: a provenance read from another directory still names the same files.
        config.data_dir = absolute(&config.data_dir);
        config.model.path = local_absolute(&config.model.path);
        for model in config.model.named.values_mut() {
            match model {
                NamedModel::Source(path) | NamedModel::With(ModelSource { path, .. }) => *path = local_absolute(path),
            }
        }
        config
    }
}

/// `path` from the working directory (as it is when that cannot be known).
pub fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A model source made absolute when it is a local directory (a hub id stays as it is).
pub fn local_absolute(source: &str) -> String {
    match Path::new(source).exists() {
        true => absolute(Path::new(source)).to_string_lossy().into_owned(),
        false => source.to_string(),
    }
}

/// What a secret reads as where the configuration is stored or shown.
pub const REDACTED: &str = "<redacted>";

/// `url` with the password of its `user:password@` part replaced by [`REDACTED`].
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else { return url.to_string() };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:{REDACTED}{}", &rest[at..]),
        None => url.to_string(),
    }
}

/// The URL of the SQLite file at `path` (created if missing); `%`, `?` and `#` escaped, as sqlx decodes them.
pub fn sqlite_url(path: &Path) -> String {
    let path = path.to_string_lossy().replace('%', "%25").replace('?', "%3F").replace('#', "%23");
    format!("sqlite://{path}?mode=rwc")
}

/// Where jobs, runs, tasks and the query log are kept, and the object store collections travel through.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// `postgres://USER:PASSWORD@HOST:PORT/DATABASE` (shared by replicas) or `sqlite://PATH`; empty: SQLite
    /// in the data directory (`longrank.db`).
    pub url: String,
    /// `file:///PATH` or `s3://BUCKET/PREFIX`: each committed version of a collection is published there, and
    /// replicas fetch their collections from it (needs a PostgreSQL `url`). Empty: collections stay local.
    pub objects: String,
    /// Versions no replica serves (older than their collection's newest), and objects no version lists, are
    /// deleted this long after they were published or last used.
    pub retention_ms: u64,
    /// How long a writer tries to publish a task's change while the object store or the database does not
    /// answer; past it the task fails and its change is discarded (no replica, the writer included, ever serves
    /// it).
    pub publish_timeout_ms: u64,
}

impl Default for StoreConfig {
    fn default() -> StoreConfig {
        StoreConfig { url: String::new(), objects: String::new(), retention_ms: 3_600_000, publish_timeout_ms: 60_000 }
    }
}

/// The models the re-ranking pipelines (firstp, maxp, sump, avgp) use, and how they are served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// The default model: a Hugging Face directory or hub id (a cross-encoder or a sentence-transformers
    /// bi-encoder); empty: none, first-stage pipelines only.
    pub path: String,
    /// What the default model is: `auto` (detected: `modules.json` means a bi-encoder), `cross-encoder` or
    /// `bi-encoder`.
    pub kind: Kind,
    /// A decoder reranker's recipe (`qwen3-reranker`, `mxbai-rerank-v2`, `bge-reranker-gemma`): its prompt
    /// template and answer tokens [default: detected from the hub id or a converted checkpoint's config].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recipe: Option<Recipe>,
    /// More models a request may name (`"model": "NAME"`): NAME = "directory or hub id", or
    /// `{ path = "...", kind = "bi-encoder" }`.
    pub named: BTreeMap<String, NamedModel>,
    /// `cpu`, `cuda` or `cuda:N` (CUDA needs a build with `--features cuda`).
    pub device: String,
    /// `auto` (f16 on a GPU, f32 on the CPU), `f32`, `f16` or `bf16`.
    pub dtype: String,
    /// The default model's linear layers: `none` (in `dtype`) or `int8` (CPU only: our kernel on CPUs with
    /// AVX-512 VNNI, candle's Q8_0 elsewhere; named models say their own: `{ path = "...", quantize = "int8" }`).
    pub quantize: Quantize,
    /// Read hub models from the cache only (also `HF_HUB_OFFLINE=1`).
    pub offline: bool,
    /// Longest model input in word pieces (query, segment and special tokens).
    pub max_length: usize,
    /// Queries are cut to this many word pieces; segments get the rest of `max_length`.
    pub max_query_tokens: usize,
    /// Padded tokens per forward pass (inputs × longest input).
    pub max_batch_tokens: usize,
    /// Inputs waiting for a model beyond which requests are answered 429.
    pub max_queued_inputs: usize,
    /// Cached cross-encoder scores or bi-encoder embeddings per model (an embedding of 384 floats is 1.5 KB).
    pub cache_entries: usize,
    /// Keep cross-encoder outputs of (query, segment) pairs on disk, in the collection's `scores/`
    /// directory, so that runs over the same topics with the same weights (an experiment's MaxP and Co-BERT
    /// runs, a rerun) score each pair once, across processes. The files grow with every new query: meant
    /// for batch experiments (`longrank batch --store-scores`), not for serving.
    pub store_scores: bool,
    /// How documents are cut into segments, unless a request says otherwise.
    pub segments: SegmentOptions,
    /// Which segments `maxp` reads, unless a request says otherwise (`preselect`): by default each
    /// candidate's two best by BM25 (EXPERIMENTS.md, "Preselection in front of a cross-encoder").
    pub preselect: Preselect,
    /// Weight of the first stage's min-max normalized score mixed into a bi-encoder's re-ranked score, unless a
    /// request says otherwise (`interpolate`); 0 mixes nothing. 0.5: it wins on three collections and loses
    /// significantly on none (EXPERIMENTS.md, "Dense and hybrid first stages"). Cross-encoders, whose default
    /// was not measured here, mix nothing unless asked.
    pub bi_encoder_interpolate: f32,
    /// Segments (of a collection's commit) from which a dense first stage searches the collection's vector
    /// index (`longrank embed` builds it), where one was built, rather than comparing the query with every
    /// segment; below, exact search is as fast (BENCHMARKS.md, "The dense first stage at scale"). 0: the index
    /// whenever there is one.
    pub approximate_from: usize,
}

/// A `[model.named]` entry: a source alone, or a source with its kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NamedModel {
    Source(String),
    With(ModelSource),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSource {
    /// Directory or hub id.
    pub path: String,
    #[serde(default)]
    pub kind: Kind,
    /// A decoder reranker's recipe (see `[model] recipe`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipe: Option<Recipe>,
    #[serde(default)]
    pub quantize: Quantize,
    /// This model's longest input in tokens [default: `max_length` of `[model]`]: a model of longer positions
    /// (ModernBERT's 8,192) reads longer segments with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<usize>,
}

impl NamedModel {
    pub fn source(&self) -> &str {
        match self {
            NamedModel::Source(path) | NamedModel::With(ModelSource { path, .. }) => path,
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            NamedModel::Source(_) => Kind::Auto,
            NamedModel::With(source) => source.kind,
        }
    }

    pub fn recipe(&self) -> Option<Recipe> {
        match self {
            NamedModel::Source(_) => None,
            NamedModel::With(source) => source.recipe,
        }
    }

    pub fn quantize(&self) -> Quantize {
        match self {
            NamedModel::Source(_) => Quantize::None,
            NamedModel::With(source) => source.quantize,
        }
    }

    pub fn max_length(&self) -> Option<usize> {
        match self {
            NamedModel::Source(_) => None,
            NamedModel::With(source) => source.max_length,
        }
    }
}

/// The quick start's re-ranker: a real MS MARCO cross-encoder from the hub.
pub const DEFAULT_MODEL: &str = "cross-encoder/ms-marco-MiniLM-L-6-v2";

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            path: DEFAULT_MODEL.into(),
            kind: Kind::Auto,
            recipe: None,
            named: BTreeMap::new(),
            device: "cpu".into(),
            dtype: "auto".into(),
            quantize: Quantize::None,
            offline: false,
            max_length: 256,
            max_query_tokens: 64,
            max_batch_tokens: 8192,
            max_queued_inputs: 10_000,
            cache_entries: 100_000,
            store_scores: false,
            segments: SegmentOptions::default(),
            preselect: Preselect { selector: Selector::Bm25, per_doc: Some(2), ..Preselect::default() },
            bi_encoder_interpolate: 0.5,
            approximate_from: 10_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BatchConfig {
    /// Topics of jobs that re-rank with a model this replica runs at once, and as many of jobs that need none
    /// (each worker claims one topic at a time, round-robin across its lane's jobs).
    #[serde(alias = "max_concurrent_jobs")]
    pub workers: usize,
    /// How long a worker holds a claimed topic without renewing its lease (renewed every third of it); past
    /// it, another worker (of any replica) runs the topic again.
    pub lease_ms: u64,
    /// How long a job that no live replica can run (none serves its index files and model weights) waits
    /// before it fails with the reason (0: until one can).
    pub stranded_fail_after_ms: u64,
    /// At start, resume the jobs a crash or restart cut off from their last finished topic (false: mark
    /// them interrupted).
    pub resume_interrupted: bool,
    /// Finished jobs kept (with their runs), the newest; older ones are deleted as new ones finish. 0 keeps all.
    pub keep_finished_jobs: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            workers: 1,
            lease_ms: 30_000,
            stranded_fail_after_ms: 600_000,
            resume_interrupted: true,
            keep_finished_jobs: 1000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub addr: String,
    /// A request still running after this long is answered 503 `timeout`.
    pub request_timeout_ms: u64,
    /// Larger request bodies are answered 413.
    pub max_body_bytes: usize,
    /// Index the built-in demo collection at start when the data directory holds no collection (never on a
    /// replica, which does not write its collections).
    pub demo_when_empty: bool,
    /// Keys that open every route (`Authorization: Bearer KEY`): batch jobs and everything that writes.
    pub admin_keys: Vec<String>,
    /// Keys that open the read-only routes: search, rerank, documents, collections, pipelines, reading jobs.
    pub search_keys: Vec<String>,
    /// `/metrics` without a key even when keys are set (for a scraper on a trusted network).
    pub public_metrics: bool,
    /// Origins (`scheme://host[:port]`) whose pages may call the API from a browser (CORS), besides the
    /// server's own.
    pub cors_origins: Vec<String>,
    /// Host names the server answers to besides the loopback ones (localhost, 127.0.0.1, [::1]).
    pub allowed_hosts: Vec<String>,
    /// Searches kept in the query log, the newest (0: no query log).
    pub query_log_entries: usize,
    /// Searches waiting to be written to the query log at most; beyond them an entry is dropped and counted
    /// (`longrank_query_log_entries_total{outcome="dropped_full"}`), so that logging holds bounded memory.
    pub query_log_queue: usize,
    /// Connections open at once; beyond them the one idle longest is closed to make room, and when every one
    /// has a request in flight, new clients wait to be accepted.
    pub max_connections: usize,
    /// Requests whose engine work (search, re-ranking, documents) runs at once; 0: four per core (re-ranking
    /// requests spend part of their time waiting on the model's queue, which batches several requests'
    /// pairs). The others wait for their turn, and beyond `max_waiting_requests` waiting, or when their turn
    /// would come too late to end within `request_timeout_ms`, are answered 429 `overloaded`.
    pub max_concurrent_work: usize,
    pub max_waiting_requests: usize,
    /// A client that has not sent a request's headers this long after connecting, or after its previous
    /// answer (an idle keep-alive connection), is disconnected.
    pub header_read_timeout_ms: u64,
    /// How often the server looks at the data directory for collections another process built, rebuilt with
    /// `--replace` or deleted (0: never; documents added to an open collection show without it).
    pub catalog_poll_ms: u64,
    /// This replica's name in the leases of batch topics, `/health` and `/metrics`; empty: the host:port it
    /// listens on. Replicas that share a store need distinct names.
    pub replica_id: String,
    /// The URL the other replicas reach this one at (`http://HOST:PORT`), when it writes a cluster's
    /// collections and they forward uploads to it; empty: the address it listens on.
    pub advertise_url: String,
}

impl ServerConfig {
    /// `max_concurrent_work`, with 0 meaning four per core.
    pub fn concurrent_work(&self) -> usize {
        match self.max_concurrent_work {
            0 => 4 * std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            addr: "127.0.0.1:8080".into(),
            request_timeout_ms: 30_000,
            max_body_bytes: 10 << 20,
            demo_when_empty: true,
            admin_keys: Vec::new(),
            search_keys: Vec::new(),
            public_metrics: false,
            cors_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            query_log_entries: 100_000,
            query_log_queue: 10_000,
            max_connections: 1024,
            max_concurrent_work: 0,
            max_waiting_requests: 1000,
            header_read_timeout_ms: 10_000,
            catalog_poll_ms: 1000,
            replica_id: String::new(),
            advertise_url: String::new(),
        }
    }
}

/// Request limits, checked in one place (the rank pipeline) for HTTP and CLI alike.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    pub max_query_chars: usize,
    pub default_k: usize,
    pub max_k: usize,
    pub default_depth: usize,
    pub max_depth: usize,
    /// RM3's feedback documents and terms (each feedback document is read and analyzed whole).
    pub max_fb_docs: usize,
    pub max_fb_terms: usize,
    /// Topics in one batch (a job's, or `longrank batch`'s).
    pub max_topics: usize,
    /// Bytes of one document upload (`POST /collections/{name}/documents`), streamed to disk: not bounded by
    /// `server.max_body_bytes` nor `server.request_timeout_ms`.
    pub max_upload_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_query_chars: 4096,
            default_k: 10,
            max_k: 10_000,
            default_depth: 100,
            max_depth: 10_000,
            max_fb_docs: 100,
            max_fb_terms: 200,
            max_topics: 20_000,
            max_upload_bytes: 4 << 30,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IndexConfig {
    pub memory_budget_mb: usize,
    pub threads: usize,
    pub commit_every: u64,
    pub on_error: OnError,
}

impl Default for IndexConfig {
    fn default() -> Self {
        let d = BuildOptions::default();
        IndexConfig {
            memory_budget_mb: d.memory_budget_mb,
            threads: d.threads,
            commit_every: d.commit_every,
            on_error: d.on_error,
        }
    }
}

impl IndexConfig {
    pub fn build_options(&self, replace: bool) -> BuildOptions {
        BuildOptions {
            on_error: self.on_error,
            replace,
            memory_budget_mb: self.memory_budget_mb,
            threads: self.threads,
            commit_every: self.commit_every,
            ..BuildOptions::default()
        }
    }
}

const ENV_PREFIX: &str = "LONGRANK_";

/// `LONGRANK_*` variables that are not settings: the configuration file's path, the BLAS library, test hooks.
const NOT_SETTINGS: [&str; 5] = ["CONFIG", "BLAS", "TEST_HOLD", "TEST_SLOW", "TEST_FAIL"];

impl Config {
    /// Parses a configuration file's text (`path` names it in errors): unknown keys and wrong types are
    /// reported by name.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string() })
    }

    /// Loads `path` if given (it must exist), else `./config.toml` if present, else the defaults; then
    /// applies the environment (a `LONGRANK_*` name that is no setting is reported and ignored).
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let default_path = Path::new("config.toml");
        let path = path.or_else(|| default_path.exists().then_some(default_path));
        let mut value = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
                toml::Value::try_from(Config::parse(&text, path)?).expect("config serializes")
            }
            None => toml::Value::try_from(Config::default()).expect("config serializes"),
        };
        for var in apply_env(&mut value, std::env::vars())? {
            tracing::warn!("environment variable {var} names no setting; ignored");
        }
        value
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Env { var: "LONGRANK_*".into(), message: e.to_string() })
    }
}

/// Overrides settings from `LONGRANK_<KEY>` variables, KEY the setting's path in capitals with `_` between
/// tables (`LONGRANK_SERVER_ADDR`, `LONGRANK_MODEL_SEGMENTS_STRATEGY`, `LONGRANK_MODEL_NAMED_MINILM`). Values
/// are read as TOML (numbers, booleans, inline tables) and fall back to strings; a setting the defaults leave
/// out (an optional key, a named model) is added where its table is. Returns the variables that name no
/// setting.
fn apply_env(
    value: &mut toml::Value,
    vars: impl Iterator<Item = (String, String)>,
) -> Result<Vec<String>, ConfigError> {
    let mut unknown = Vec::new();
    for (var, raw) in vars {
        let Some(name) = var.strip_prefix(ENV_PREFIX) else { continue };
        if NOT_SETTINGS.contains(&name) {
            continue;
        }
        let Some(root) = value.as_table_mut() else { break };
        let before = root.clone();
        let found = set(root, &name.to_ascii_lowercase(), &raw);
        let found = found.map_err(|message| ConfigError::Env { var: var.clone(), message })?;
        // A key added where no setting is makes the typed configuration refuse it: undone, and reported.
        match value.clone().try_into::<Config>() {
            Ok(_) if found => {}
            Err(e) if found && !e.to_string().contains("unknown field") => {
                return Err(ConfigError::Env { var, message: e.to_string() });
            }
            _ => {
                *value = toml::Value::Table(before);
                unknown.push(var);
            }
        }
    }
    Ok(unknown)
}

/// Sets the setting `name` names below `table` (keys joined by `_`, though keys hold `_` themselves: the
/// longest key that fits first). A name matching no key adds one to the deepest table it reached.
fn set(table: &mut toml::Table, name: &str, raw: &str) -> Result<bool, String> {
    let mut keys: Vec<String> = table.keys().cloned().collect();
    keys.sort_by_key(|k| std::cmp::Reverse(k.len()));
    for key in &keys {
        let slot = table.get_mut(key).expect("a listed key");
        if let Some(rest) = name.strip_prefix(key.as_str()).and_then(|r| r.strip_prefix('_')) {
            if let Some(inner) = slot.as_table_mut() {
                return set(inner, rest, raw);
            }
        } else if name == key && !slot.is_table() {
            *slot = typed(raw, slot)?;
            return Ok(true);
        }
    }
    if name.is_empty() {
        return Ok(false);
    }
    table.insert(name.to_string(), parse(raw).unwrap_or_else(|| toml::Value::String(raw.to_string())));
    Ok(true)
}

/// A TOML value, if the text is one.
fn parse(raw: &str) -> Option<toml::Value> {
    toml::from_str::<toml::Table>(&format!("v = {raw}")).ok().and_then(|mut t| t.remove("v"))
}

/// The text as the type of the value it replaces (a list of strings may be given as `a,b`).
fn typed(raw: &str, slot: &toml::Value) -> Result<toml::Value, String> {
    match parse(raw) {
        Some(v) if v.same_type(slot) => Ok(v),
        Some(toml::Value::Integer(i)) if slot.is_float() => Ok(toml::Value::Float(i as f64)),
        _ if slot.is_str() => Ok(toml::Value::String(raw.to_string())),
        _ if slot.is_array() => Ok(toml::Value::Array(
            raw.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| toml::Value::String(s.into())).collect(),
        )),
        _ => Err(format!("{raw:?} is not a valid {}", slot.type_str())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Iterator<Item = (String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>().into_iter()
    }

    #[test]
    fn environment_overrides_typed_settings() {
        let mut v = toml::Value::try_from(Config::default()).unwrap();
        let vars = env(&[
            ("LONGRANK_DATA_DIR", "/tmp/x"),
            ("LONGRANK_SERVER_ADDR", "0.0.0.0:9000"),
            ("LONGRANK_BM25_K1", "1.2"),
            ("LONGRANK_BM25_B", "1"),
            ("LONGRANK_LIMITS_MAX_K", "50"),
            ("LONGRANK_INDEX_ON_ERROR", "abort"),
            ("LONGRANK_UNRELATED", "x"),
        ]);
        assert_eq!(apply_env(&mut v, vars).unwrap(), ["LONGRANK_UNRELATED"]);
        let c: Config = v.try_into().unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(c.server.addr, "0.0.0.0:9000");
        assert_eq!((c.bm25.k1, c.bm25.b), (1.2, 1.0));
        assert_eq!(c.limits.max_k, 50);
        assert_eq!(c.index.on_error, OnError::Abort);
    }

    #[test]
    fn nested_tables_and_keys_the_defaults_leave_out_are_reachable() {
        let mut v = toml::Value::try_from(Config::default()).unwrap();
        let vars = env(&[
            ("LONGRANK_MODEL_SEGMENTS_STRATEGY", "windows"),
            ("LONGRANK_MODEL_SEGMENTS_REPEAT_TITLE", "true"),
            ("LONGRANK_MODEL_MAX_BATCH_TOKENS", "1024"),
            ("LONGRANK_MODEL_NAMED_MINILM", "/models/minilm"),
            ("LONGRANK_MODEL_SEGMENTS_NOPE", "1"),
            ("LONGRANK_SERVER_ADDRESS", "x"),
            ("LONGRANK_CONFIG", "config.toml"),
        ]);
        assert_eq!(apply_env(&mut v, vars).unwrap(), ["LONGRANK_MODEL_SEGMENTS_NOPE", "LONGRANK_SERVER_ADDRESS"]);
        let c: Config = v.try_into().unwrap();
        assert_eq!(c.model.segments.strategy, crate::segment::StrategyKind::Windows);
        assert!(c.model.segments.repeat_title);
        assert_eq!(c.model.max_batch_tokens, 1024);
        assert_eq!(c.model.named["minilm"].source(), "/models/minilm");
    }

    #[test]
    fn keys_come_from_the_environment_as_lists_and_are_redacted() {
        let mut v = toml::Value::try_from(Config::default()).unwrap();
        let vars = env(&[("LONGRANK_SERVER_ADMIN_KEYS", "a1, a2"), ("LONGRANK_SERVER_SEARCH_KEYS", "s1")]);
        assert!(apply_env(&mut v, vars).unwrap().is_empty());
        let c: Config = v.try_into().unwrap();
        assert_eq!(
            (c.server.admin_keys.clone(), c.server.search_keys.clone()),
            (vec!["a1".into(), "a2".into()], vec!["s1".into()])
        );
        let shown = serde_json::to_string(&c.recorded()).unwrap();
        assert!(!shown.contains("a1") && !shown.contains("s1") && shown.contains(REDACTED), "{shown}");
    }

    /// Recorded paths are absolute: local model directories too, hub ids as they are.
    #[test]
    fn recorded_paths_are_absolute() {
        let mut c = Config { data_dir: "data".into(), ..Default::default() };
        c.model.path = "src".into(); // a directory of the crate, the tests' working directory
        c.model.named.insert("local".into(), NamedModel::Source("src".into()));
        c.model.named.insert("hub".into(), NamedModel::Source("org/model".into()));
        let recorded = c.recorded();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(recorded.data_dir, cwd.join("data"));
        assert_eq!(recorded.model.path, cwd.join("src").to_string_lossy());
        assert_eq!(recorded.model.named["local"].source(), cwd.join("src").to_string_lossy());
        assert_eq!(recorded.model.named["hub"].source(), "org/model");
    }

    #[test]
    fn store_passwords_are_redacted() {
        assert_eq!(redact_url("postgres://u:s3cr%40t@h:5432/db?x=1"), "postgres://u:<redacted>@h:5432/db?x=1");
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("postgres://h/db?options=a@b:c"), "postgres://h/db?options=a@b:c");
        assert_eq!(redact_url(""), "");
        let mut c = Config::default();
        c.store.url = "postgresql://me:pw@db/x".into();
        assert_eq!(c.recorded().store.url, "postgresql://me:<redacted>@db/x");
        assert_eq!(Config::default().store_url(), sqlite_url(Path::new("data/longrank.db")));
    }

    #[test]
    fn bad_environment_value_names_the_variable() {
        let mut v = toml::Value::try_from(Config::default()).unwrap();
        let err = apply_env(&mut v, env(&[("LONGRANK_LIMITS_MAX_K", "many")])).unwrap_err();
        assert_eq!(err.to_string(), "environment variable LONGRANK_LIMITS_MAX_K: \"many\" is not a valid integer");
    }

    #[test]
    fn shipped_config_file_equals_the_defaults() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config.toml")).unwrap();
        let parsed: Config = toml::from_str(&text).unwrap();
        assert_eq!(parsed, Config::default());
    }
}
