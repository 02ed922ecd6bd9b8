//! The training log, `log.jsonl` beside each model: one entry per optimizer step (loss, learning rate,
//! examples/s) and one per dev evaluation (every dev measure, and whether the checkpoint was selected).
//! Written and read here only.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::TrainError;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub step: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub examples_per_s: Option<f64>,
    /// Dev measures by name (`mrr@10`, `ndcg@10`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<BTreeMap<String, f64>>,
    /// Whether this evaluation's checkpoint became the selected one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected: Option<bool>,
}

pub struct Log {
    path: PathBuf,
    file: std::fs::File,
}

impl Log {
    /// Opens `path` for appending after keeping its entries up to `step` (a resumed run redoes the steps after
    /// its checkpoint); returns the kept entries. A torn last line is dropped.
    pub fn open(path: &Path, step: usize) -> Result<(Log, Vec<Entry>), TrainError> {
        let kept: Vec<Entry> = read(path)?.into_iter().filter(|e| e.step <= step).collect();
        let body: String = kept.iter().map(|e| format!("{}\n", serde_json::to_string(e).unwrap_or_default())).collect();
        std::fs::write(path, body).map_err(|e| TrainError::io(path, e))?;
        let file = std::fs::OpenOptions::new().append(true).open(path).map_err(|e| TrainError::io(path, e))?;
        Ok((Log { path: path.to_path_buf(), file }, kept))
    }

    pub fn append(&mut self, entry: &Entry) -> Result<(), TrainError> {
        writeln!(self.file, "{}", serde_json::to_string(entry).unwrap_or_default())
            .map_err(|e| TrainError::io(&self.path, e))
    }

    /// Makes what was appended durable (before a checkpoint that it describes).
    pub fn sync(&self) -> Result<(), TrainError> {
        self.file.sync_data().map_err(|e| TrainError::io(&self.path, e))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Every entry of a log (none when it does not exist yet).
pub fn read(path: &Path) -> Result<Vec<Entry>, TrainError> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_a_resume_keeps_those_up_to_its_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let (mut log, kept) = Log::open(&path, 0).unwrap();
        assert!(kept.is_empty());
        let step = |s: usize| Entry { step: s, loss: Some(s as f64), lr: Some(1e-5), ..Default::default() };
        let dev = Entry {
            step: 2,
            dev: Some([("mrr@10".to_string(), 0.5)].into()),
            selected: Some(true),
            ..Default::default()
        };
        for e in [step(1), step(2), dev.clone(), step(3)] {
            log.append(&e).unwrap();
        }
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"step\": 4, \"lo").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("{\"step\":1,\"loss\":1.0,\"lr\":0.00001}\n"), "{text}");
        let (_, kept) = Log::open(&path, 2).unwrap();
        assert_eq!(kept, vec![step(1), step(2), dev]);
        assert_eq!(read(&path).unwrap().len(), 3);
    }
}
