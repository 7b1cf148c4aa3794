//! Artifact bytes, stored content-addressed by their SHA-256 (DESIGN.md
//! "Scale": the blob store is an interface; [`FsBlobStore`] serves one
//! machine, [`S3BlobStore`](super::S3BlobStore) a bucket shared by several;
//! `[blobs]` picks one, docs/install-registry.md "Artifacts in S3").
//!
//! Uploads are staged first: the HTTP handler streams the request body into
//! a [`StagedBlob`] (a file in the store's staging directory) while hashing
//! it, and only a staged file whose hash matched is handed to
//! [`BlobStore::put`]. Nothing half-written or unverified is ever visible
//! under a hash.

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use bytes::Bytes;
use futures::Stream;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use shared_protocol::artifact::is_sha256_hex;

/// Why a blob operation failed. Names the hash or path it is about.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// Not 64 lowercase hex digits.
    #[error("`{0}` is not a sha256 (64 lowercase hex digits)")]
    BadHash(String),
    /// File system trouble at `path`.
    #[error("blob store I/O at {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// A blocking task failed.
    #[error("blob store task: {0}")]
    Task(String),
    /// The bytes handed to [`BlobStore::put`] hash to `actual`, not to the
    /// `expected` key: nothing was stored.
    #[error("bytes hash to {actual}, not to {expected}: not stored")]
    Mismatch { expected: String, actual: String },
    /// A ranged read outside the stored bytes (or empty).
    #[error("byte range {}..{} is outside the blob {sha256}", range.start, range.end)]
    BadRange { sha256: String, range: Range<u64> },
    /// The object store server failed or could not be reached (`op` is
    /// `put`, `get`, `head`, `list` or `delete`, on the object `key`).
    #[error("object store {op} of {key}: {source}")]
    Remote {
        op: &'static str,
        key: String,
        source: Box<object_store::Error>,
    },
    /// The store cannot be set up from its configuration.
    #[error("{0}")]
    Config(String),
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> BlobError + '_ {
    move |source| BlobError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The bytes of one blob as a stream of chunks, with their total length.
pub struct BlobContent {
    /// Byte length.
    pub size_bytes: u64,
    /// The bytes, in order.
    pub stream: Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>,
}

/// An upload being received: a file in the staging directory, the running
/// SHA-256 and the byte count. Dropping it without [`BlobStore::put`]
/// removes the file, unless it was [suspended](StagedBlob::suspend) (a
/// resumable upload whose connection broke).
pub struct StagedBlob {
    path: PathBuf,
    file: Option<tokio::fs::File>,
    hasher: Sha256,
    size_bytes: u64,
    /// Keep the file on drop.
    keep: bool,
}

impl StagedBlob {
    /// Create an empty staging file in `dir`.
    pub async fn create(dir: &Path) -> Result<Self, BlobError> {
        tokio::fs::create_dir_all(dir).await.map_err(io_at(dir))?;
        let path = dir.join(format!("{}.part", uuid::Uuid::new_v4().simple()));
        let file = tokio::fs::File::create(&path).await.map_err(io_at(&path))?;
        Ok(Self {
            path,
            file: Some(file),
            hasher: Sha256::new(),
            size_bytes: 0,
            keep: false,
        })
    }

    /// Continue the partial upload kept at `path` (created empty when
    /// missing; emptied first when `restart`): the bytes already there are
    /// hashed again (on the blocking pool) and new writes append to them.
    /// The file is kept when this drops (also when the request is
    /// cancelled mid-body), unless [`StagedBlob::discard`] was called or
    /// the blob store took it.
    ///
    /// Errors: I/O at `path`.
    pub async fn resume(path: &Path, restart: bool) -> Result<Self, BlobError> {
        let owned = path.to_path_buf();
        let (hasher, size_bytes) = tokio::task::spawn_blocking(move || {
            use std::io::Read;
            if let Some(dir) = owned.parent() {
                std::fs::create_dir_all(dir).map_err(io_at(dir))?;
            }
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(restart)
                .read(true)
                .write(true)
                .open(&owned)
                .map_err(io_at(&owned))?;
            let mut hasher = Sha256::new();
            let mut size = 0u64;
            let mut buf = vec![0u8; READ_CHUNK];
            loop {
                let n = f.read(&mut buf).map_err(io_at(&owned))?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                size += n as u64;
            }
            Ok::<_, BlobError>((hasher, size))
        })
        .await
        .map_err(|e| BlobError::Task(e.to_string()))??;
        let file = tokio::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .await
            .map_err(io_at(path))?;
        Ok(Self {
            path: path.to_path_buf(),
            file: Some(file),
            hasher,
            size_bytes,
            keep: true,
        })
    }

    /// Flush what was written and keep the file when this drops: a
    /// resumable upload broke off and may continue later from
    /// [`StagedBlob::size_bytes`].
    ///
    /// Errors: I/O (the file is kept anyway; a later resume reads what
    /// reached it).
    pub async fn suspend(mut self) -> Result<u64, BlobError> {
        self.keep = true;
        let path = self.path.clone();
        if let Some(mut f) = self.file.take() {
            f.flush().await.map_err(io_at(&path))?;
        }
        Ok(self.size_bytes)
    }

    /// Append `chunk` (hashing it).
    pub async fn write(&mut self, chunk: &[u8]) -> Result<(), BlobError> {
        self.hasher.update(chunk);
        self.size_bytes += chunk.len() as u64;
        let path = self.path.clone();
        match self.file.as_mut() {
            Some(f) => f.write_all(chunk).await.map_err(io_at(&path)),
            None => Err(BlobError::Io {
                path,
                source: io::Error::other("staged blob already finished"),
            }),
        }
    }

    /// Remove the file when this drops (bytes that must not be continued:
    /// they hashed to something else, or are stored already).
    pub fn discard(&mut self) {
        self.keep = false;
    }

    /// Bytes written so far.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Flush and fsync the file (the edge deletes its copy once the
    /// registry confirms, so the bytes must be on disk by then) and return
    /// the lowercase hex SHA-256 of everything written.
    pub async fn finish(&mut self) -> Result<String, BlobError> {
        let path = self.path.clone();
        if let Some(mut f) = self.file.take() {
            f.flush().await.map_err(io_at(&path))?;
            f.sync_all().await.map_err(io_at(&path))?;
        }
        Ok(hex::encode(self.hasher.clone().finalize()))
    }

    /// Where the staged bytes are.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lowercase hex SHA-256 of everything written so far.
    pub fn sha256_hex(&self) -> String {
        hex::encode(self.hasher.clone().finalize())
    }
}

/// Remove the files (not the directories: partial uploads keep theirs) in
/// the staging directory `dir`, creating it when missing: what an upload
/// in flight during a crash left.
///
/// Errors: `dir` cannot be created.
pub fn clear_staging(dir: &Path) -> Result<(), BlobError> {
    std::fs::create_dir_all(dir).map_err(io_at(dir))?;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_file()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(())
}

impl Drop for StagedBlob {
    fn drop(&mut self) {
        // After a successful put the file has been renamed away and this
        // finds nothing; otherwise it removes a rejected or partial upload.
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Content-addressed storage of artifact bytes.
///
/// Every method is keyed by the lowercase hex SHA-256 of the bytes; storing
/// the same bytes twice keeps one copy.
#[async_trait::async_trait]
pub trait BlobStore: Send + Sync + 'static {
    /// Directory on local disk where uploads are staged before
    /// [`BlobStore::put`] (an S3 implementation stages locally too).
    fn staging_dir(&self) -> PathBuf;

    /// Take a finished staged upload whose hash is `sha256` into the
    /// store. Returns `true` when the blob is new, `false` when these bytes
    /// were already stored (the staged copy is discarded).
    ///
    /// Errors: [`BlobError::BadHash`]; [`BlobError::Mismatch`] when the
    /// staged bytes do not hash to `sha256` (nothing becomes visible);
    /// I/O; [`BlobError::Remote`].
    async fn put(&self, sha256: &str, staged: StagedBlob) -> Result<bool, BlobError>;

    /// The bytes stored under `sha256`, or `None` when there are none.
    async fn open(&self, sha256: &str) -> Result<Option<BlobContent>, BlobError>;

    /// The bytes `range` (offsets in bytes, end exclusive) of the blob
    /// stored under `sha256`, or `None` when there is none.
    /// [`BlobContent::size_bytes`] is the length of the range.
    ///
    /// Errors: [`BlobError::BadRange`] when `range` is empty or reaches
    /// past the blob's end; [`BlobError::BadHash`], I/O,
    /// [`BlobError::Remote`].
    async fn open_range(
        &self,
        sha256: &str,
        range: Range<u64>,
    ) -> Result<Option<BlobContent>, BlobError>;

    /// Whether bytes are stored under `sha256`.
    async fn exists(&self, sha256: &str) -> Result<bool, BlobError>;

    /// Remove the bytes stored under `sha256`. Returns `true` when a blob
    /// was removed, `false` when there was none. The caller makes sure no
    /// artifact still needs them (the store is content-addressed: one blob
    /// may serve several artifacts).
    ///
    /// Errors: [`BlobError::BadHash`], I/O.
    async fn delete(&self, sha256: &str) -> Result<bool, BlobError>;
}

/// [`BlobStore`] on a local directory: the blob with hash `abcdef…` is the
/// file `<root>/sha256/ab/cdef…`; uploads are staged in `<root>/staging/`
/// (same file system, so taking one in is an atomic rename).
pub struct FsBlobStore {
    root: PathBuf,
}

impl FsBlobStore {
    /// A store rooted at `root` (created when missing). Leftover staging
    /// files of an earlier run (a crash mid-upload) are removed.
    ///
    /// Errors: the directories cannot be created.
    pub fn open(root: &Path) -> Result<Self, BlobError> {
        std::fs::create_dir_all(root.join("sha256")).map_err(io_at(root))?;
        clear_staging(&root.join("staging"))?;
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/sha256/ab/cdef…` for `abcdef…`.
    pub fn blob_path(&self, sha256: &str) -> Result<PathBuf, BlobError> {
        if !is_sha256_hex(sha256) {
            return Err(BlobError::BadHash(sha256.to_string()));
        }
        Ok(self
            .root
            .join("sha256")
            .join(&sha256[..2])
            .join(&sha256[2..]))
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BlobError> + Send + 'static,
) -> Result<T, BlobError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BlobError::Task(e.to_string()))?
}

/// Chunk size of blob reads, bytes.
const READ_CHUNK: usize = 64 * 1024;

#[async_trait::async_trait]
impl BlobStore for FsBlobStore {
    fn staging_dir(&self) -> PathBuf {
        self.root.join("staging")
    }

    async fn put(&self, sha256: &str, mut staged: StagedBlob) -> Result<bool, BlobError> {
        let target = self.blob_path(sha256)?;
        let staged_sum = staged.sha256_hex();
        if staged_sum != sha256 {
            staged.discard();
            return Err(BlobError::Mismatch {
                expected: sha256.to_string(),
                actual: staged_sum,
            });
        }
        blocking(move || {
            if target.exists() {
                // `staged` is dropped here, which removes the duplicate.
                let mut staged = staged;
                staged.discard();
                return Ok(false);
            }
            let dir = target
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("."));
            std::fs::create_dir_all(&dir).map_err(io_at(&dir))?;
            std::fs::rename(staged.path(), &target).map_err(io_at(&target))?;
            // Make the rename itself durable.
            if let Ok(d) = std::fs::File::open(&dir) {
                let _ = d.sync_all();
            }
            drop(staged);
            Ok(true)
        })
        .await
    }

    async fn open(&self, sha256: &str) -> Result<Option<BlobContent>, BlobError> {
        let path = self.blob_path(sha256)?;
        let file = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_at(&path)(e)),
        };
        let size_bytes = file.metadata().await.map_err(io_at(&path))?.len();
        let stream = futures::stream::try_unfold(file, |mut f| async move {
            let mut buf = vec![0u8; READ_CHUNK];
            let n = f.read(&mut buf).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.truncate(n);
            Ok(Some((Bytes::from(buf), f)))
        });
        Ok(Some(BlobContent {
            size_bytes,
            stream: Box::pin(stream),
        }))
    }

    async fn open_range(
        &self,
        sha256: &str,
        range: Range<u64>,
    ) -> Result<Option<BlobContent>, BlobError> {
        let path = self.blob_path(sha256)?;
        let mut file = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_at(&path)(e)),
        };
        let len = file.metadata().await.map_err(io_at(&path))?.len();
        if range.is_empty() || range.end > len {
            return Err(BlobError::BadRange {
                sha256: sha256.to_string(),
                range,
            });
        }
        file.seek(io::SeekFrom::Start(range.start))
            .await
            .map_err(io_at(&path))?;
        let size_bytes = range.end - range.start;
        let stream = futures::stream::try_unfold(
            (file.take(size_bytes), size_bytes),
            |(mut f, left)| async move {
                if left == 0 {
                    return Ok(None);
                }
                let mut buf = vec![0u8; READ_CHUNK.min(left as usize)];
                let n = f.read(&mut buf).await?;
                if n == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "blob shorter than the range read",
                    ));
                }
                buf.truncate(n);
                Ok(Some((Bytes::from(buf), (f, left - n as u64))))
            },
        );
        Ok(Some(BlobContent {
            size_bytes,
            stream: Box::pin(stream),
        }))
    }

    async fn exists(&self, sha256: &str) -> Result<bool, BlobError> {
        let path = self.blob_path(sha256)?;
        Ok(tokio::fs::try_exists(&path).await.unwrap_or(false))
    }

    async fn delete(&self, sha256: &str) -> Result<bool, BlobError> {
        let path = self.blob_path(sha256)?;
        blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_at(&path)(e)),
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::TryStreamExt;

    async fn stage(store: &FsBlobStore, bytes: &[u8]) -> (StagedBlob, String) {
        let mut s = StagedBlob::create(&store.staging_dir()).await.unwrap();
        s.write(bytes).await.unwrap();
        let sum = s.finish().await.unwrap();
        (s, sum)
    }

    #[tokio::test]
    async fn a_blob_is_stored_under_its_sha256_and_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path()).unwrap();
        let bytes: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let (staged, sum) = stage(&store, &bytes).await;
        assert_eq!(sum, hex::encode(Sha256::digest(&bytes)));
        assert!(store.put(&sum, staged).await.unwrap(), "new blob");
        let path = store.blob_path(&sum).unwrap();
        assert!(path.ends_with(format!("sha256/{}/{}", &sum[..2], &sum[2..])));
        assert!(store.exists(&sum).await.unwrap());
        let content = store.open(&sum).await.unwrap().expect("stored");
        assert_eq!(content.size_bytes, bytes.len() as u64);
        let chunks: Vec<Bytes> = content.stream.try_collect().await.unwrap();
        assert_eq!(chunks.concat(), bytes);
        let staging_left = std::fs::read_dir(store.staging_dir()).unwrap().count();
        assert_eq!(staging_left, 0, "the staged file was moved, not copied");
    }

    #[tokio::test]
    async fn storing_the_same_bytes_twice_keeps_one_copy_and_no_staging_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path()).unwrap();
        let (a, sum) = stage(&store, b"serial log").await;
        assert!(store.put(&sum, a).await.unwrap());
        let (b, sum2) = stage(&store, b"serial log").await;
        assert_eq!(sum, sum2);
        assert!(!store.put(&sum, b).await.unwrap(), "already stored");
        assert_eq!(std::fs::read_dir(store.staging_dir()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn a_deleted_blob_is_gone_and_deleting_it_again_finds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path()).unwrap();
        let (a, sum) = stage(&store, b"stray bytes").await;
        store.put(&sum, a).await.unwrap();
        let (b, other) = stage(&store, b"kept bytes").await;
        store.put(&other, b).await.unwrap();
        assert!(store.delete(&sum).await.unwrap(), "removed");
        assert!(!store.exists(&sum).await.unwrap());
        assert!(!store.blob_path(&sum).unwrap().exists());
        assert!(!store.delete(&sum).await.unwrap(), "nothing left to remove");
        assert!(store.exists(&other).await.unwrap(), "other blobs untouched");
        assert!(matches!(
            store.delete("../../etc/passwd").await,
            Err(BlobError::BadHash(_))
        ));
    }

    #[tokio::test]
    async fn an_abandoned_upload_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path()).unwrap();
        let mut s = StagedBlob::create(&store.staging_dir()).await.unwrap();
        s.write(b"half of it").await.unwrap();
        drop(s);
        assert_eq!(std::fs::read_dir(store.staging_dir()).unwrap().count(), 0);
        assert!(store.open(&"0".repeat(64)).await.unwrap().is_none());
        assert!(matches!(
            store.blob_path("../etc/passwd"),
            Err(BlobError::BadHash(_))
        ));
    }
}
