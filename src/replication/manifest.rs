//! What a version is: its files named by their content's SHA-256 (`Manifest`), and the version a collection's
//! directory holds (`version.json`, written there by a publish or a pull; not one of the version's files).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{io, objects, ReplicationError};
use crate::hash::FileMemo;
use crate::index;

/// A version's files: what a replica needs to serve it, each named by its content's SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub collection: String,
    /// The index fingerprint (`index::fingerprint`); empty for a deleted collection.
    pub fingerprint: String,
    pub files: Vec<ManifestFile>,
    /// The segment vectors and vector index of each bi-encoder `longrank embed` indexed the collection for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vectors: Vec<ManifestVectors>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
}

/// One vector file and its index in a version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestVectors {
    /// The vector file's name in the collection's `embeddings` (the model's outputs fingerprint and dtype).
    pub name: String,
    pub dims: usize,
    /// Its records in chunks of equal count (the last may hold fewer): each object holds its records' keys, then
    /// their vectors.
    pub chunks: Vec<ManifestFile>,
    /// `NAME.usearch` and `NAME.usearch.json`.
    pub index: ManifestFile,
    pub header: ManifestFile,
}

/// The version a collection's directory holds.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Held {
    pub id: i64,
    pub manifest: Manifest,
}

const HELD_FILE: &str = "version.json";

pub(super) fn held(dir: &Path) -> Option<Held> {
    serde_json::from_slice(&std::fs::read(dir.join(HELD_FILE)).ok()?).ok()
}

pub(super) fn write_held(dir: &Path, held: &Held) -> Result<(), ReplicationError> {
    let (path, partial) = (dir.join(HELD_FILE), dir.join(format!("{HELD_FILE}.partial")));
    std::fs::write(&partial, serde_json::to_vec_pretty(held).unwrap_or_default()).map_err(io(&partial))?;
    std::fs::rename(&partial, &path).map_err(io(&path))
}

/// Each published file's SHA-256, read once.
pub(super) static SHAS: FileMemo<String> = FileMemo::new(objects::sha256_file);

impl Manifest {
    /// The manifest of the collection `name` as committed in `dir`, its vectors left to the publish
    /// (`vectors::seal`).
    pub fn of_dir(dir: &Path, name: &str) -> Result<Manifest, ReplicationError> {
        let fingerprint = index::fingerprint(dir)?;
        let files = index::published_files(dir)?
            .into_iter()
            .map(|name| {
                let path = dir.join(&name);
                let bytes = std::fs::metadata(&path).map_err(io(&path))?.len();
                let sha256 = SHAS.get(&path).map_err(io(&path))?;
                Ok(ManifestFile { name, bytes, sha256 })
            })
            .collect::<Result<_, ReplicationError>>()?;
        Ok(Manifest { collection: name.to_string(), fingerprint, files, vectors: vec![] })
    }
}
