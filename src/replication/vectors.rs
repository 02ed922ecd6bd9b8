//! A version's dense vectors: for each bi-encoder whose vector index a collection holds (`longrank embed`
//! built one), its stored segment vectors (`model::VectorFile`) and the index over them (`model::Neighbours`),
//! so that a replica's dense first stage serves what the writer's does. The vector file only grows and its
//! records never move, so it travels as chunks of records (about 64 MiB each): a new version shares every full
//! chunk with the one before and sends only its tail, and a replica copies the chunks it holds from its own
//! file. The publish covers the records stored when it starts (more may be appended meanwhile) and the index as
//! it stood then (linked aside, so that an update renaming a new one into place does not change what is sent).
//!
//! On a replica the file is the published records only, rebuilt at each pull: what its own searches appended
//! (embeddings computed on demand) is a cache, and recomputed when needed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::manifest::{ManifestFile, ManifestVectors, SHAS};
use super::objects::sha256_bytes;
use super::{io, ReplicationError};
use crate::model::{IndexHeader, Neighbours, VectorFile, VectorWriter};

/// A chunk's bytes, at most: records of keys and vectors.
pub(super) const CHUNK_BYTES: u64 = 64 << 20;

/// A full chunk's hash, by (device, inode, first record, records): a full chunk of a file never changes, so a
/// writer hashes each once.
static CHUNKS: Mutex<Option<HashMap<ChunkKey, String>>> = Mutex::new(None);

type ChunkKey = (u64, u64, u64, u64);

/// What a publish sends of one vector file: its manifest entry, and where to read each part.
pub(super) struct Sealed {
    pub manifest: ManifestVectors,
    file: VectorFile,
    /// Records per chunk.
    per: u64,
    /// The index as the publish found it, linked aside; removed when dropped.
    index: PathBuf,
    header: PathBuf,
}

impl Sealed {
    /// Chunk `i`'s bytes.
    pub fn chunk(&self, i: usize) -> Result<Vec<u8>, ReplicationError> {
        let start = i as u64 * self.per;
        let records = self.manifest.chunks[i].bytes / (8 + 4 * self.manifest.dims as u64);
        Ok(self.file.chunk(start..start + records)?)
    }

    pub fn index(&self) -> &Path {
        &self.index
    }

    pub fn header(&self) -> &Path {
        &self.header
    }
}

impl Drop for Sealed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.index);
    }
}

/// The vector files of the collection committed in `dir` that have an index, sealed for a publish in chunks of
/// at most `chunk_bytes` (`CHUNK_BYTES`).
pub(super) fn seal(dir: &Path, chunk_bytes: u64) -> Result<Vec<Sealed>, ReplicationError> {
    let embeddings = dir.join("embeddings");
    let mut sealed = vec![];
    for IndexHeader { vectors: name, dims, .. } in Neighbours::indexed(&embeddings)? {
        let stem = embeddings.join(&name);
        let (index, header) = Neighbours::files(&stem);
        if !index.exists() {
            continue; // a header written, nothing indexed yet
        }
        // The index first: the records stored after it are at least those it covers.
        let aside = embeddings.join(format!(".{name}.usearch.{}.publishing", std::process::id()));
        let _ = std::fs::remove_file(&aside);
        std::fs::hard_link(&index, &aside).map_err(io(&index))?;
        let file = VectorFile::open(&embeddings, &name, dims)?;
        let per = (chunk_bytes / (8 + 4 * dims as u64)).max(1);
        let manifest = ManifestVectors {
            chunks: chunks(&file, &name, per)?,
            index: described(&aside, &format!("{name}.usearch"))?,
            header: described(&header, &format!("{name}.usearch.json"))?,
            name,
            dims,
        };
        sealed.push(Sealed { manifest, file, per, index: aside, header });
    }
    Ok(sealed)
}

fn described(path: &Path, name: &str) -> Result<ManifestFile, ReplicationError> {
    let bytes = std::fs::metadata(path).map_err(io(path))?.len();
    Ok(ManifestFile { name: name.to_string(), bytes, sha256: SHAS.get(path).map_err(io(path))? })
}

/// The chunks of `file`'s records, `per` to a chunk, hashed (full ones once per process).
fn chunks(file: &VectorFile, name: &str, per: u64) -> Result<Vec<ManifestFile>, ReplicationError> {
    let (records, (device, inode)) = (file.records()?, file.identity());
    let mut chunks = vec![];
    for (i, start) in (0..records).step_by(per as usize).enumerate() {
        let end = records.min(start + per);
        let key = (device, inode, start, end - start);
        let known = CHUNKS.lock().unwrap_or_else(|e| e.into_inner()).as_ref().and_then(|c| c.get(&key).cloned());
        let sha256 = match known {
            Some(sha256) => sha256,
            None => {
                let sha256 = sha256_bytes(&file.chunk(start..end)?);
                if end - start == per {
                    let mut memo = CHUNKS.lock().unwrap_or_else(|e| e.into_inner());
                    memo.get_or_insert_with(HashMap::new).insert(key, sha256.clone());
                }
                sha256
            }
        };
        let bytes = (end - start) * (8 + 4 * file.dims() as u64);
        chunks.push(ManifestFile { name: format!("{name}.{i:06}"), bytes, sha256 });
    }
    Ok(chunks)
}

/// Where a pull finds a part of a version's vectors: the replica's own copy (held from the version before),
/// or the object store.
pub(super) trait Source {
    /// The object `sha256`'s bytes, checked against it.
    fn bytes(&self, sha256: &str) -> Result<Vec<u8>, ReplicationError>;
    /// The object `sha256` into the file `to`, checked against it; its bytes.
    fn file(&self, sha256: &str, to: &Path) -> Result<u64, ReplicationError>;
}

/// Writes `vectors` (a version's) into `staging/embeddings`, copying from `dir/embeddings` (the directory of
/// the version `held`, if any) what that version shares with it and fetching the rest from `source`; the
/// objects and bytes fetched.
pub(super) fn assemble(
    source: &dyn Source,
    held: &[ManifestVectors],
    dir: &Path,
    staging: &Path,
    vectors: &[ManifestVectors],
) -> Result<(usize, u64), ReplicationError> {
    let (from, to) = (dir.join("embeddings"), staging.join("embeddings"));
    std::fs::create_dir_all(&to).map_err(io(&to))?;
    let (mut files, mut bytes) = (0, 0);
    for v in vectors {
        if v.name.is_empty() || v.name.contains('/') || v.name.starts_with('.') {
            return Err(ReplicationError::Vectors(format!("a vector file named {:?}", v.name)));
        }
        let before = held.iter().find(|h| h.name == v.name && h.dims == v.dims);
        // The chunks this replica holds already: those both versions begin with, whole in its file.
        let mut shared = before.map_or(0, |b| b.chunks.iter().zip(&v.chunks).take_while(|(a, b)| a == b).count());
        let record = 8 + 4 * v.dims as u64;
        let mut shared_records: u64 = v.chunks[..shared].iter().map(|c| c.bytes / record).sum();
        let holds = |ext: &str, width: u64| {
            let path = from.join(&v.name).with_extension(ext);
            std::fs::metadata(path).is_ok_and(|m| m.len() >= shared_records * width)
        };
        if !(holds("keys", 8) && holds("f32", record - 8)) {
            (shared, shared_records) = (0, 0); // the copy held is not whole: fetched again
        }
        let mut writer = VectorWriter::create(&to.join(&v.name), v.dims)?;
        if shared_records > 0 {
            writer.copy(&from.join(&v.name), 0..shared_records)?;
        }
        for chunk in &v.chunks[shared..] {
            let got = source.bytes(&chunk.sha256)?;
            writer.chunk(&got)?;
            (files, bytes) = (files + 1, bytes + got.len() as u64);
        }
        writer.finish()?;
        let (index, header) = Neighbours::files(&to.join(&v.name));
        for (part, path, held_part) in
            [(&v.index, index, before.map(|b| &b.index)), (&v.header, header, before.map(|b| &b.header))]
        {
            let local = from.join(&part.name);
            let same = held_part == Some(part) && SHAS.get(&local).is_ok_and(|s| s == part.sha256);
            if same && std::fs::hard_link(&local, &path).is_ok() {
                continue;
            }
            bytes += source.file(&part.sha256, &path)?;
            files += 1;
        }
    }
    Ok((files, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Objects from a map, counting what was asked for.
    #[derive(Default)]
    struct Objects {
        stored: HashMap<String, Vec<u8>>,
        fetched: Mutex<usize>,
    }

    impl Objects {
        fn put(&mut self, bytes: Vec<u8>) {
            self.stored.insert(sha256_bytes(&bytes), bytes);
        }
    }

    impl Source for Objects {
        fn bytes(&self, sha256: &str) -> Result<Vec<u8>, ReplicationError> {
            *self.fetched.lock().unwrap() += 1;
            self.stored.get(sha256).cloned().ok_or_else(|| ReplicationError::Vectors(format!("no object {sha256}")))
        }

        fn file(&self, sha256: &str, to: &Path) -> Result<u64, ReplicationError> {
            let bytes = self.bytes(sha256)?;
            std::fs::write(to, &bytes).map_err(io(to))?;
            Ok(bytes.len() as u64)
        }
    }

    /// A writer's vectors and index sealed and sent, rebuilt in a replica's directory record for record; the
    /// next version, grown by a few records, fetches only its last chunk and the new index.
    #[test]
    fn a_version_s_vectors_are_rebuilt_from_its_chunks_and_the_next_sends_only_what_changed() {
        // Chunks of 100 records: 250 make three.
        let (dims, chunk_bytes) = (8, 100 * (8 + 4 * 8));
        let (writer, replica) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let embeddings = writer.path().join("embeddings");
        let file = VectorFile::open(&embeddings, "m-f32", dims).unwrap();
        let vector =
            |i: u64| (0..dims).map(|j| ((i * 31 + j as u64 * 7 + i * i) % 97) as f32 - 48.0).collect::<Vec<f32>>();
        let version = |objects: &mut Objects| {
            let sealed = seal(writer.path(), chunk_bytes).unwrap();
            for s in &sealed {
                for i in 0..s.manifest.chunks.len() {
                    objects.put(s.chunk(i).unwrap());
                }
                objects.put(std::fs::read(s.index()).unwrap());
                objects.put(std::fs::read(s.header()).unwrap());
            }
            sealed.iter().map(|s| s.manifest.clone()).collect::<Vec<_>>()
        };
        let pull = |objects: &Objects, held: &[ManifestVectors], manifest: &[ManifestVectors]| {
            let staging = replica.path().join("staging");
            let got = assemble(objects, held, &replica.path().join("held"), &staging, manifest).unwrap();
            let held = replica.path().join("held");
            let _ = std::fs::remove_dir_all(&held);
            std::fs::rename(&staging, &held).unwrap();
            got
        };
        for i in 0..250 {
            file.append(i, &vector(i)).unwrap();
        }
        Neighbours::update(&file, "m", 0, &|_| {}).unwrap();
        let mut objects = Objects::default();
        let first = version(&mut objects);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].chunks.len(), 3);
        assert_eq!(pull(&objects, &[], &first).0, 5, "three chunks, the index and its header");

        for i in 250..260 {
            file.append(i, &vector(i)).unwrap();
        }
        Neighbours::update(&file, "m", 0, &|_| {}).unwrap();
        let second = version(&mut objects);
        assert_eq!(second[0].chunks[..2], first[0].chunks[..2]);
        assert_eq!(pull(&objects, &first, &second).0, 2, "the last chunk and the new index");
        let copy = VectorFile::open(&replica.path().join("held/embeddings"), "m-f32", dims).unwrap();
        assert_eq!(copy.records().unwrap(), 260);
        for i in [0, 99, 100, 259] {
            assert_eq!(copy.get(i).unwrap(), vector(i), "record {i}");
        }
        let served = Neighbours::open(&copy, "m").unwrap().unwrap();
        assert_eq!(served.covered(), 260);
        assert_eq!(served.search(&vector(255), 1, |_| true).unwrap(), [255]);
        // Nothing changed: nothing fetched.
        let third = version(&mut objects);
        assert_eq!(third, second);
        assert_eq!(pull(&objects, &second, &third).0, 0);
        // Sealing leaves nothing beside the files.
        let left: Vec<_> = std::fs::read_dir(&embeddings).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.iter().all(|n| !n.to_string_lossy().ends_with(".publishing")), "{left:?}");
    }
}
