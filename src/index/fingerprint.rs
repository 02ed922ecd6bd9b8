//! A collection's fingerprint: a hash over the sorted names and contents of its committed index files
//! (tantivy's `meta.json` and the files of the segments it lists), so replicas can tell whether they serve the
//! same index, whatever else the directory holds (`embeddings/`, `scores/`, locks, segments a merge left for
//! garbage collection). Segment files never change once written: each file's hash is kept per process, keyed by
//! its path, length and modification time, so only a commit's new files are read.

use std::path::Path;

use crate::hash::{FileMemo, Fnv};

use super::IndexError;

/// The committed files named by `meta` (the content of `meta.json`), among `names` (the directory's files),
/// sorted; `meta.json` itself included.
pub fn committed_files(meta: &[u8], names: &[String]) -> Result<Vec<String>, String> {
    let meta: serde_json::Value = serde_json::from_slice(meta).map_err(|e| format!("meta.json: {e}"))?;
    let segments = meta["segments"].as_array().ok_or("meta.json lists no segments")?;
    let mut files = vec!["meta.json".to_string()];
    for segment in segments {
        let id = segment["segment_id"].as_str().ok_or("meta.json: a segment without an id")?.replace('-', "");
        let deletes = segment["deletes"]["opstamp"].as_u64().map(|opstamp| format!("{id}.{opstamp}.del"));
        for name in names {
            let Some(rest) = name.strip_prefix(&id).and_then(|r| r.strip_prefix('.')) else { continue };
            // A segment's own files, and its deletes as of the commit (older ones await garbage collection).
            if !rest.ends_with(".del") || deletes.as_deref() == Some(name.as_str()) {
                files.push(name.clone());
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The fingerprint of the index in `dir` as last committed, in hex.
pub fn fingerprint(dir: &Path) -> Result<String, IndexError> {
    let (meta, files) = committed(dir)?;
    let mut hash = Fnv::default();
    for name in files {
        let path = dir.join(&name);
        let content = match name.as_str() {
            "meta.json" => content_hash(&meta),
            _ => HASHES.get(&path).map_err(|source| IndexError::Io { path, source })?,
        };
        hash.write(name.as_bytes());
        hash.write(&[0]);
        hash.write(&content.to_le_bytes());
    }
    Ok(hash.hex())
}

/// `meta.json`'s content in `dir`, and the committed files it names there.
fn committed(dir: &Path) -> Result<(Vec<u8>, Vec<String>), IndexError> {
    let io = |path: &Path, source| IndexError::Io { path: path.to_path_buf(), source };
    let meta_path = dir.join("meta.json");
    let meta = std::fs::read(&meta_path).map_err(|e| io(&meta_path, e))?;
    let entries = std::fs::read_dir(dir).map_err(|e| io(dir, e))?;
    let names: Vec<String> = entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
    let files = committed_files(&meta, &names)
        .map_err(|message| io(&meta_path, std::io::Error::new(std::io::ErrorKind::InvalidData, message)))?;
    Ok((meta, files))
}

fn content_hash(bytes: &[u8]) -> u64 {
    let mut hash = Fnv::default();
    hash.write(bytes);
    hash.0
}

/// Each index file's content hash, read once.
static HASHES: FileMemo<u64> = FileMemo::new(|path| Ok(content_hash(&std::fs::read(path)?)));

/// What a copy of the collection in `dir` needs, as committed: the index files (`committed_files`) and
/// longrank's description of the collection (`longrank.json`); caches (`scores/`, `embeddings/`) and locks
/// are not part of it.
pub fn published_files(dir: &Path) -> Result<Vec<String>, IndexError> {
    let mut files = committed(dir)?.1;
    files.push(super::META_FILE.to_string());
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_files_are_the_listed_segments_and_their_current_deletes() {
        let meta = br#"{"segments": [
            {"segment_id": "364e5a12-8b46-4824-9293-f701be1c3e19", "max_doc": 29, "deletes": {"num_deleted_docs": 1, "opstamp": 7}},
            {"segment_id": "aaaa0000-0000-0000-0000-000000000000", "max_doc": 3, "deletes": null}]}"#;
        let names: Vec<String> = [
            "364e5a128b4648249293f701be1c3e19.idx",
            "364e5a128b4648249293f701be1c3e19.store",
            "364e5a128b4648249293f701be1c3e19.7.del",
            "364e5a128b4648249293f701be1c3e19.3.del",
            "aaaa0000000000000000000000000000.term",
            "1f9e5d16809c488790ba24cefcb19d43.idx",
            "meta.json",
            ".tantivy-writer.lock",
            "longrank.json",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            committed_files(meta, &names).unwrap(),
            [
                "364e5a128b4648249293f701be1c3e19.7.del",
                "364e5a128b4648249293f701be1c3e19.idx",
                "364e5a128b4648249293f701be1c3e19.store",
                "aaaa0000000000000000000000000000.term",
                "meta.json"
            ]
        );
        assert!(committed_files(b"{}", &names).is_err());
    }

    #[test]
    fn a_copy_has_the_same_fingerprint_and_a_changed_file_another() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let meta = r#"{"segments": [{"segment_id": "00000000-0000-0000-0000-000000000001", "deletes": null}]}"#;
        for dir in [a.path(), b.path()] {
            std::fs::write(dir.join("meta.json"), meta).unwrap();
            std::fs::write(dir.join("00000000000000000000000000000001.idx"), "postings").unwrap();
            std::fs::create_dir(dir.join("embeddings")).unwrap();
        }
        std::fs::write(b.path().join("embeddings").join("x"), "not part of the index").unwrap();
        assert_eq!(fingerprint(a.path()).unwrap(), fingerprint(b.path()).unwrap());
        std::fs::write(b.path().join("00000000000000000000000000000001.idx"), "postingz").unwrap();
        assert_ne!(fingerprint(a.path()).unwrap(), fingerprint(b.path()).unwrap());
    }
}
