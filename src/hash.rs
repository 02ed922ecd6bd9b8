//! Stable hashes: the same bytes give the same value in every process, version and machine (cache keys that
//! persist on disk, weight and index fingerprints compared across replicas).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// A file as of its last write: path, length, modification time.
type FileKey = (PathBuf, u64, Option<SystemTime>);

/// A hash of files' contents, computed once per (path, length, modification time): index segment files never
/// change once written, so a process reads each once however often it fingerprints or publishes.
pub struct FileMemo<T> {
    hashes: Mutex<Option<HashMap<FileKey, T>>>,
    hash: fn(&Path) -> std::io::Result<T>,
}

impl<T: Clone> FileMemo<T> {
    pub const fn new(hash: fn(&Path) -> std::io::Result<T>) -> FileMemo<T> {
        FileMemo { hashes: Mutex::new(None), hash }
    }

    pub fn get(&self, path: &Path) -> std::io::Result<T> {
        let metadata = std::fs::metadata(path)?;
        let key = (path.to_path_buf(), metadata.len(), metadata.modified().ok());
        let hashes = || self.hashes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hash) = hashes().as_ref().and_then(|h| h.get(&key)) {
            return Ok(hash.clone());
        }
        let hash = (self.hash)(path)?;
        hashes().get_or_insert_with(HashMap::new).insert(key, hash.clone());
        Ok(hash)
    }
}

/// 64-bit FNV-1a.
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    /// The hash in hex (16 digits).
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn fnv1a64_known_values() {
        let hash = |s: &str| {
            let mut h = super::Fnv::default();
            h.write(s.as_bytes());
            h.hex()
        };
        assert_eq!(hash(""), "cbf29ce484222325");
        assert_eq!(hash("a"), "af63dc4c8601ec8c");
    }
}
