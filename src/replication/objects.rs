//! The object store collection versions travel through (`store.objects`): `file:///PATH`, or
//! `s3://BUCKET/PREFIX` with the usual AWS variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ALLOW_HTTP`), as Quickwit keeps tantivy's files. Objects are
//! immutable and named by the SHA-256 of their content (`PREFIX/objects/HEX`): a version's unchanged files are
//! never sent twice, and a download is checked against its name before it is used.

use std::path::Path as FsPath;
use std::sync::Arc;

use futures_util::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// What the object store answered, or what a transfer met.
#[derive(Debug, thiserror::Error)]
pub enum ObjectsError {
    #[error("object store {url}: {source}")]
    Store { url: String, source: object_store::Error },
    #[error("store.objects {url}: the scheme is neither file:// nor s3://")]
    Scheme { url: String },
    #[error(
        "store.objects {url}: the bucket {bucket} does not exist; create it first (`aws s3 mb s3://{bucket}`, or \
         an S3-compatible server's own way: `curl -X PUT $AWS_ENDPOINT_URL/{bucket}` for moto or MinIO)"
    )]
    NoBucket { url: String, bucket: String },
    #[error("{path}: {source}")]
    File { path: String, source: std::io::Error },
    #[error("uploading object {object}: {source}")]
    Upload { object: String, source: std::io::Error },
    #[error("object {object} is corrupt: its content hashes to {got}")]
    Corrupt { object: String, got: String },
}

impl ObjectsError {
    /// The store did not answer or a transfer broke: worth trying again.
    pub fn is_transient(&self) -> bool {
        matches!(self, ObjectsError::Store { .. } | ObjectsError::Upload { .. })
    }
}

/// The hex SHA-256 of a file's content, streamed.
pub fn sha256_file(path: &FsPath) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0; 1 << 20];
    loop {
        match file.read(&mut buffer)? {
            0 => return Ok(hex(&hasher.finalize())),
            n => hasher.update(&buffer[..n]),
        }
    }
}

/// The hex SHA-256 of `bytes`.
pub fn sha256_bytes(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// reqwest's TLS (S3, forwarded uploads) needs a process-wide provider: ring's; installing it twice is harmless.
pub fn install_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An object store and the prefix under which longrank keeps its objects.
#[derive(Clone)]
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    url: String,
}

impl Objects {
    /// Opens the store a `store.objects` URL names (a `file://` directory is created if missing).
    pub fn open(url: &str) -> Result<Objects, ObjectsError> {
        let err = |source| ObjectsError::Store { url: url.to_string(), source };
        let (store, prefix): (Arc<dyn ObjectStore>, &str) = if let Some(dir) = url.strip_prefix("file://") {
            std::fs::create_dir_all(dir).map_err(|source| ObjectsError::File { path: dir.to_string(), source })?;
            (Arc::new(LocalFileSystem::new_with_prefix(dir).map_err(err)?), "")
        } else if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            install_tls();
            let s3 = AmazonS3Builder::from_env().with_bucket_name(bucket).build().map_err(err)?;
            (Arc::new(s3), prefix.trim_matches('/'))
        } else {
            return Err(ObjectsError::Scheme { url: url.to_string() });
        };
        Ok(Objects { store, prefix: Path::from(prefix), url: url.to_string() })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Lists the prefix once, so that a store that cannot be written (a bucket missing, credentials refused, an
    /// endpoint down) is said at start rather than after a build; a missing bucket is named as such.
    pub async fn check(&self) -> Result<(), ObjectsError> {
        match self.store.list_with_delimiter(Some(&self.prefix)).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("NoSuchBucket") => {
                let bucket = self.url.trim_start_matches("s3://").split('/').next().unwrap_or_default().to_string();
                Err(ObjectsError::NoBucket { url: self.url.clone(), bucket })
            }
            Err(e) => Err(self.err(e)),
        }
    }

    fn path(&self, sha256: &str) -> Path {
        self.prefix.clone().join("objects").join(sha256)
    }

    fn err(&self, source: object_store::Error) -> ObjectsError {
        ObjectsError::Store { url: self.url.clone(), source }
    }

    /// Uploads `file` as the object named `sha256` (its content's hash), streamed (multipart when large).
    pub async fn put_file(&self, sha256: &str, file: &FsPath) -> Result<(), ObjectsError> {
        let io = |source| ObjectsError::File { path: file.display().to_string(), source };
        let mut source = tokio::fs::File::open(file).await.map_err(io)?;
        let mut sink = object_store::buffered::BufWriter::new(self.store.clone(), self.path(sha256));
        // The sink's errors are the object store's (a local file just committed reads, or its opening failed).
        let upload = |source| ObjectsError::Upload { object: self.path(sha256).to_string(), source };
        if let Err(e) = tokio::io::copy(&mut source, &mut sink).await {
            sink.abort().await.map_err(|e| self.err(e))?;
            return Err(upload(e));
        }
        sink.shutdown().await.map_err(upload)
    }

    /// Uploads `bytes` as the object named `sha256` (their hash), in one request.
    pub async fn put_bytes(&self, sha256: &str, bytes: Vec<u8>) -> Result<(), ObjectsError> {
        self.store.put(&self.path(sha256), bytes.into()).await.map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Downloads the object `sha256` into memory, checking its content against its name.
    pub async fn fetch_bytes(&self, sha256: &str) -> Result<Vec<u8>, ObjectsError> {
        let got = self.store.get(&self.path(sha256)).await.map_err(|e| self.err(e))?;
        let bytes = got.bytes().await.map_err(|e| self.err(e))?.to_vec();
        let hash = sha256_bytes(&bytes);
        if hash != sha256 {
            return Err(ObjectsError::Corrupt { object: self.path(sha256).to_string(), got: hash });
        }
        Ok(bytes)
    }

    /// Downloads the object `sha256` into `to`, checking its content against its name, and syncs it to disk.
    pub async fn fetch(&self, sha256: &str, to: &FsPath) -> Result<u64, ObjectsError> {
        let io = |source| ObjectsError::File { path: to.display().to_string(), source };
        let mut stream = self.store.get(&self.path(sha256)).await.map_err(|e| self.err(e))?.into_stream();
        let mut file = tokio::fs::File::create(to).await.map_err(io)?;
        let (mut hasher, mut bytes) = (Sha256::new(), 0u64);
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.err(e))?;
            hasher.update(&chunk);
            bytes += chunk.len() as u64;
            file.write_all(&chunk).await.map_err(io)?;
        }
        let got = hex(&hasher.finalize());
        if got != sha256 {
            return Err(ObjectsError::Corrupt { object: self.path(sha256).to_string(), got });
        }
        file.sync_all().await.map_err(io)?;
        Ok(bytes)
    }

    /// Deletes the object `sha256` (one already gone is no error).
    pub async fn delete(&self, sha256: &str) -> Result<(), ObjectsError> {
        match self.store.delete(&self.path(sha256)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_object_comes_back_as_it_went_and_a_changed_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::open(&format!("file://{}", dir.path().join("store").display())).unwrap();
        let file = dir.path().join("a");
        std::fs::write(&file, "segment bytes").unwrap();
        let sha = sha256_file(&file).unwrap();
        assert_eq!(sha, "560e67b96c49975a2cf9adba2682e00cc6b74a879f2b6897e03b63d7434098e8");
        objects.put_file(&sha, &file).await.unwrap();
        assert_eq!(objects.fetch_bytes(&sha).await.unwrap(), b"segment bytes");
        objects.put_bytes(&sha256_bytes(b"chunk"), b"chunk".to_vec()).await.unwrap();
        assert_eq!(objects.fetch_bytes(&sha256_bytes(b"chunk")).await.unwrap(), b"chunk");
        let back = dir.path().join("b");
        assert_eq!(objects.fetch(&sha, &back).await.unwrap(), 13);
        assert_eq!(std::fs::read(&back).unwrap(), b"segment bytes");
        std::fs::write(dir.path().join("store/objects").join(&sha), "tampered").unwrap();
        assert!(matches!(objects.fetch(&sha, &back).await, Err(ObjectsError::Corrupt { .. })));
        assert!(matches!(objects.fetch_bytes(&sha).await, Err(ObjectsError::Corrupt { .. })));
        objects.delete(&sha).await.unwrap();
        objects.delete(&sha).await.unwrap();
        assert!(objects.fetch(&sha, &back).await.is_err());
        assert!(matches!(Objects::open("ftp://x"), Err(ObjectsError::Scheme { .. })));
    }
}
