//! Model outputs kept on disk (in the collection's directory), so they are computed once, not once per
//! process: a bi-encoder's segment embeddings, or a cross-encoder's (query, segment) outputs when
//! `store_scores` is on. Two append-only files: `NAME.keys` (u64 text keys) and `NAME.f32`
//! (`dims` floats per record, little-endian), record i in both. Vectors are written before keys, so a key
//! never points past its vector; a crash mid-append leaves a torn tail that the next open cuts off.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{load_err, ModelError};

#[allow(clippy::len_without_is_empty)]
pub struct VectorFile {
    path: PathBuf,
    dims: usize,
    inner: Mutex<Inner>,
}

struct Inner {
    keys: HashMap<u64, u64>,
    keys_file: File,
    vectors: File,
}

impl VectorFile {
    /// Opens (or creates) `dir/NAME.keys` and `dir/NAME.f32`.
    pub fn open(dir: &Path, name: &str, dims: usize) -> Result<VectorFile, ModelError> {
        std::fs::create_dir_all(dir).map_err(|e| load_err(dir, e))?;
        let path = dir.join(name);
        let open = |ext: &str| {
            let p = path.with_extension(ext);
            OpenOptions::new().read(true).append(true).create(true).open(&p).map_err(|e| load_err(&p, e))
        };
        let (mut keys_file, vectors) = (open("keys")?, open("f32")?);
        let record = (dims * 4) as u64;
        let vector_records = vectors.metadata().map_err(|e| load_err(&path, e))?.len() / record;
        let mut bytes = Vec::new();
        keys_file.read_to_end(&mut bytes).map_err(|e| load_err(&path, e))?;
        let records = ((bytes.len() / 8) as u64).min(vector_records);
        keys_file.set_len(records * 8).map_err(|e| load_err(&path, e))?;
        vectors.set_len(records * record).map_err(|e| load_err(&path, e))?;
        let keys = bytes
            .chunks_exact(8)
            .take(records as usize)
            .enumerate()
            .map(|(i, k)| (u64::from_le_bytes(k.try_into().expect("8 bytes")), i as u64))
            .collect();
        Ok(VectorFile { path, dims, inner: Mutex::new(Inner { keys, keys_file, vectors }) })
    }

    /// Vectors stored.
    pub fn len(&self) -> usize {
        self.lock().keys.len()
    }

    pub fn get(&self, key: u64) -> Option<Vec<f32>> {
        let inner = self.lock();
        let record = *inner.keys.get(&key)?;
        let mut bytes = vec![0u8; self.dims * 4];
        let offset = record * bytes.len() as u64;
        inner.vectors.read_exact_at(&mut bytes, offset).ok()?;
        Some(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect())
    }

    pub fn append(&self, key: u64, vector: &[f32]) -> Result<(), ModelError> {
        if vector.len() != self.dims {
            return Err(load_err(
                &self.path,
                format!("a {}-dimensional vector in a {}-dimensional file", vector.len(), self.dims),
            ));
        }
        let mut inner = self.lock();
        if inner.keys.contains_key(&key) {
            return Ok(());
        }
        let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
        let record = inner.keys.len() as u64;
        inner.vectors.write_all(&bytes).map_err(|e| load_err(&self.path, e))?;
        inner.keys_file.write_all(&key.to_le_bytes()).map_err(|e| load_err(&self.path, e))?;
        inner.keys.insert(key, record);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_survive_reopening_and_a_torn_tail_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let file = VectorFile::open(dir.path(), "m", 3).unwrap();
        file.append(7, &[1.0, 2.0, 3.0]).unwrap();
        file.append(9, &[4.0, 5.0, 6.0]).unwrap();
        file.append(7, &[0.0, 0.0, 0.0]).unwrap();
        assert!(file.append(1, &[1.0]).is_err());
        drop(file);
        // A crash after writing a vector but before its key.
        let mut torn = OpenOptions::new().append(true).open(dir.path().join("m.f32")).unwrap();
        torn.write_all(&[0u8; 6]).unwrap();
        let file = VectorFile::open(dir.path(), "m", 3).unwrap();
        assert_eq!(file.len(), 2);
        assert_eq!(file.get(7).unwrap(), [1.0, 2.0, 3.0]);
        assert_eq!(file.get(9).unwrap(), [4.0, 5.0, 6.0]);
        assert_eq!(file.get(8), None);
        file.append(8, &[7.0, 8.0, 9.0]).unwrap();
        assert_eq!(VectorFile::open(dir.path(), "m", 3).unwrap().get(8).unwrap(), [7.0, 8.0, 9.0]);
    }
}
