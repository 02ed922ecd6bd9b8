//! Model outputs kept on disk (in the collection's directory), so they are computed once, not once per
//! process: a bi-encoder's segment embeddings, or a cross-encoder's (query, segment) outputs when
//! `store_scores` is on. Two files: `NAME.keys` (u64 text keys) and `NAME.f32` (`dims` floats per record,
//! little-endian), record i in both; the keys file's length says how many records there are. Processes
//! share the files (a server and a batch run, two experiment runs): appends take an exclusive `flock` on the
//! keys file, read what other processes appended since, and write the vector at its record's offset before
//! the key, so a key never points past its vector and a torn tail (a crash mid-append) is overwritten by the
//! next append; a lookup that misses reads the other processes' new keys under a shared lock.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::model::cpu::mapped::MappedVectors;
use crate::model::{load_err, ModelError};

#[allow(clippy::len_without_is_empty)]
pub struct VectorFile {
    path: PathBuf,
    dims: usize,
    /// The keys file's device and inode.
    identity: (u64, u64),
    /// Read and written at offsets (`pread`/`pwrite`), so outside the lock: a record is written before its key,
    /// and read only once its key was.
    vectors: File,
    inner: Mutex<Inner>,
}

struct Inner {
    keys: HashMap<u64, u64>,
    /// Records read from the keys file so far.
    records: u64,
    keys_file: File,
}

impl VectorFile {
    /// Opens (or creates) `dir/NAME.keys` and `dir/NAME.f32`.
    pub fn open(dir: &Path, name: &str, dims: usize) -> Result<VectorFile, ModelError> {
        std::fs::create_dir_all(dir).map_err(|e| load_err(dir, e))?;
        let path = dir.join(name);
        // Not in append mode: records are written at their offsets.
        let open = |ext: &str| {
            let p = path.with_extension(ext);
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&p).map_err(|e| load_err(&p, e))
        };
        let (keys_file, vectors) = (open("keys")?, open("f32")?);
        let meta = keys_file.metadata().map_err(|e| load_err(&path, e))?;
        let file = VectorFile {
            identity: (std::os::unix::fs::MetadataExt::dev(&meta), std::os::unix::fs::MetadataExt::ino(&meta)),
            path,
            dims,
            vectors,
            inner: Mutex::new(Inner { keys: HashMap::new(), records: 0, keys_file }),
        };
        {
            let mut inner = file.lock();
            let _shared = Locked::shared(&inner.keys_file).map_err(|e| load_err(&file.path, e))?;
            file.catch_up(&mut inner)?;
        }
        Ok(file)
    }

    /// Vectors stored.
    pub fn len(&self) -> usize {
        self.lock().keys.len()
    }

    pub fn dims(&self) -> usize {
        self.dims
    }

    /// Which file this is (its keys file's device and inode): records keep their numbers while it is the same
    /// file, and another file in the same place (a replica's copy rebuilt by a pull) numbers them anew.
    pub fn identity(&self) -> (u64, u64) {
        self.identity
    }

    /// `DIR/NAME`, the files' common stem.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: u64) -> Option<Vec<f32>> {
        let record = self.record(key)?;
        self.read(record..record + 1).ok()
    }

    /// The record holding `key`'s vector (records are numbered in the order they were appended, by any
    /// process, and never move).
    pub fn record(&self, key: u64) -> Option<u64> {
        let mut inner = self.lock();
        if !inner.keys.contains_key(&key) {
            // Another process may have stored it since.
            let _shared = Locked::shared(&inner.keys_file).ok()?;
            self.catch_up(&mut inner).ok()?;
        }
        inner.keys.get(&key).copied()
    }

    /// Records appended so far, by any process.
    pub fn records(&self) -> Result<u64, ModelError> {
        let mut inner = self.lock();
        let _shared = Locked::shared(&inner.keys_file).map_err(|e| load_err(&self.path, e))?;
        self.catch_up(&mut inner)?;
        Ok(inner.records)
    }

    /// The vectors of `records`, one after another.
    pub fn read(&self, records: std::ops::Range<u64>) -> Result<Vec<f32>, ModelError> {
        let record_bytes = (self.dims * 4) as u64;
        let mut bytes = vec![0u8; ((records.end - records.start) * record_bytes) as usize];
        self.vectors.read_exact_at(&mut bytes, records.start * record_bytes).map_err(|e| load_err(&self.path, e))?;
        Ok(bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))).collect())
    }

    /// The first `records` records (which the file holds), mapped for reading in place.
    pub fn mapped(&self, records: u64) -> Result<Option<MappedVectors>, ModelError> {
        MappedVectors::new(&self.vectors, self.dims, records).map_err(|e| load_err(&self.path, e))
    }

    /// Records `records` as they are stored: their keys (8 bytes each), then their vectors; what a
    /// `VectorWriter` takes. The records exist (below `records()`).
    pub fn chunk(&self, records: std::ops::Range<u64>) -> Result<Vec<u8>, ModelError> {
        let count = (records.end - records.start) as usize;
        let mut bytes = vec![0u8; count * (8 + self.dims * 4)];
        let (keys, vectors) = bytes.split_at_mut(count * 8);
        let io = |e| load_err(&self.path, e);
        self.lock().keys_file.read_exact_at(keys, records.start * 8).map_err(io)?;
        self.vectors.read_exact_at(vectors, records.start * (self.dims * 4) as u64).map_err(io)?;
        Ok(bytes)
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
        let _exclusive = Locked::exclusive(&inner.keys_file).map_err(|e| load_err(&self.path, e))?;
        self.catch_up(&mut inner)?;
        if inner.keys.contains_key(&key) {
            return Ok(());
        }
        let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
        let record = inner.records;
        let io = |e| load_err(&self.path, e);
        self.vectors.write_all_at(&bytes, record * bytes.len() as u64).map_err(io)?;
        inner.keys_file.write_all_at(&key.to_le_bytes(), record * 8).map_err(io)?;
        inner.keys.insert(key, record);
        inner.records += 1;
        Ok(())
    }

    /// Reads the keys appended (by any process) since the last read; the caller holds a `flock`.
    fn catch_up(&self, inner: &mut Inner) -> Result<(), ModelError> {
        let io = |e| load_err(&self.path, e);
        let records = inner.keys_file.metadata().map_err(io)?.len() / 8;
        if records <= inner.records {
            return Ok(());
        }
        let mut bytes = vec![0u8; ((records - inner.records) * 8) as usize];
        inner.keys_file.read_exact_at(&mut bytes, inner.records * 8).map_err(io)?;
        for (i, k) in bytes.chunks_exact(8).enumerate() {
            let key = u64::from_le_bytes(k.try_into().expect("8 bytes"));
            inner.keys.entry(key).or_insert(inner.records + i as u64);
        }
        inner.records = records;
        Ok(())
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.inner.lock()
    }
}

/// A vector file written anew, record after record, from chunks (`VectorFile::chunk`'s form) and from ranges of
/// records of another vector file: a replica's copy of a published version's vectors.
pub struct VectorWriter {
    stem: PathBuf,
    dims: usize,
    keys: std::io::BufWriter<File>,
    vectors: std::io::BufWriter<File>,
}

impl VectorWriter {
    /// Creates (or truncates) `STEM.keys` and `STEM.f32`.
    pub fn create(stem: &Path, dims: usize) -> Result<VectorWriter, ModelError> {
        let create = |ext: &str| {
            let path = stem.with_extension(ext);
            File::create(&path).map(std::io::BufWriter::new).map_err(|e| load_err(&path, e))
        };
        Ok(VectorWriter { stem: stem.to_path_buf(), dims, keys: create("keys")?, vectors: create("f32")? })
    }

    /// Appends a chunk's records.
    pub fn chunk(&mut self, bytes: &[u8]) -> Result<(), ModelError> {
        use std::io::Write;
        let record = 8 + self.dims * 4;
        if !bytes.len().is_multiple_of(record) {
            return Err(load_err(
                &self.stem,
                format!("a chunk of {} bytes, not of {record}-byte records", bytes.len()),
            ));
        }
        let (keys, vectors) = bytes.split_at(bytes.len() / record * 8);
        let io = |e| load_err(&self.stem, e);
        self.keys.write_all(keys).map_err(io)?;
        self.vectors.write_all(vectors).map_err(io)
    }

    /// Appends records `records` of the vector file `STEM` (`from`), copied byte for byte.
    pub fn copy(&mut self, from: &Path, records: std::ops::Range<u64>) -> Result<(), ModelError> {
        use std::io::{Read, Seek, SeekFrom};
        for (ext, width, sink) in [("keys", 8, &mut self.keys), ("f32", self.dims as u64 * 4, &mut self.vectors)] {
            let path = from.with_extension(ext);
            let io = |e| load_err(&path, e);
            let mut source = File::open(&path).map_err(io)?;
            source.seek(SeekFrom::Start(records.start * width)).map_err(io)?;
            let want = (records.end - records.start) * width;
            let copied = std::io::copy(&mut source.take(want), sink).map_err(io)?;
            if copied != want {
                return Err(load_err(&path, format!("{copied} bytes where records {records:?} need {want}")));
            }
        }
        Ok(())
    }

    /// Writes what is buffered and syncs both files to disk.
    pub fn finish(self) -> Result<(), ModelError> {
        for sink in [self.keys, self.vectors] {
            let file = sink.into_inner().map_err(|e| load_err(&self.stem, e.into_error()))?;
            file.sync_all().map_err(|e| load_err(&self.stem, e))?;
        }
        Ok(())
    }
}

/// An advisory lock on a file, held until dropped (`File::lock`, `flock(2)` on Linux: per open file, so it also
/// orders two opens of one file within a process). It holds a duplicate of the descriptor, which shares the
/// lock with the original, so the file stays free to use while locked.
struct Locked(File);

impl Locked {
    fn shared(file: &File) -> std::io::Result<Locked> {
        let file = file.try_clone()?;
        file.lock_shared()?;
        Ok(Locked(file))
    }

    fn exclusive(file: &File) -> std::io::Result<Locked> {
        let file = file.try_clone()?;
        file.lock()?;
        Ok(Locked(file))
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn vectors_survive_reopening_and_a_torn_tail_is_overwritten() {
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

    /// A file written from another's chunks and ranges reads as the other: same keys, same records.
    #[test]
    fn a_writer_rebuilds_a_file_from_chunks_and_copied_records() {
        let dir = tempfile::tempdir().unwrap();
        let file = VectorFile::open(dir.path(), "a", 2).unwrap();
        for i in 0..10u64 {
            file.append(100 + i, &[i as f32, 0.5]).unwrap();
        }
        let mut writer = VectorWriter::create(&dir.path().join("b"), 2).unwrap();
        writer.copy(&dir.path().join("a"), 0..4).unwrap();
        writer.chunk(&file.chunk(4..10).unwrap()).unwrap();
        writer.finish().unwrap();
        let mut bad = VectorWriter::create(&dir.path().join("c"), 2).unwrap();
        assert!(bad.chunk(&[0u8; 15]).is_err());
        assert!(bad.copy(&dir.path().join("a"), 8..12).is_err(), "records the file lacks");
        let copy = VectorFile::open(dir.path(), "b", 2).unwrap();
        assert_eq!(copy.records().unwrap(), 10);
        for i in 0..10u64 {
            assert_eq!((copy.record(100 + i), copy.get(100 + i)), (Some(i), Some(vec![i as f32, 0.5])));
        }
    }

    /// Two opens of one store (two processes, as far as `flock` goes) appending in turn: each finds the
    /// other's vectors, records stay aligned, and a key both append is stored once.
    #[test]
    fn two_writers_share_one_store() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (VectorFile::open(dir.path(), "m", 2).unwrap(), VectorFile::open(dir.path(), "m", 2).unwrap());
        for i in 0..10u64 {
            let writer = if i % 3 == 0 { &a } else { &b };
            writer.append(i, &[i as f32, -(i as f32)]).unwrap();
            // Keys the other open stored after this one last read its keys.
            a.append(3, &[3.0, -3.0]).unwrap();
            b.append(0, &[0.0, 0.0]).unwrap();
        }
        for reader in [&a, &b, &VectorFile::open(dir.path(), "m", 2).unwrap()] {
            for i in 0..10u64 {
                assert_eq!(reader.get(i).unwrap(), [i as f32, -(i as f32)], "key {i}");
            }
        }
        assert_eq!(std::fs::metadata(dir.path().join("m.keys")).unwrap().len(), 10 * 8, "each key once");
    }
}
