//! [`BlobStore`] on an S3-compatible bucket (`[blobs] backend = "s3"`;
//! docs/install-registry.md "Artifacts in S3").
//!
//! Uploads are staged on local disk exactly as for the filesystem store
//! (resumable uploads continue there). [`BlobStore::put`] then streams the
//! staged file to the object `<prefix>/<sha256>` while hashing it again: a
//! small file in one `PUT`, a large one as a multipart upload of
//! [`PART_BYTES`] parts that is completed only when the hash matched (S3
//! shows nothing under the key before completion) and aborted otherwise.
//! Memory stays bounded by a few parts, whatever the artifact's size.

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as Key;
use object_store::{
    ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig, WriteMultipart,
};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use shared_protocol::artifact::is_sha256_hex;

use super::blob_config::BlobsConfig;
use super::blobs::{clear_staging, BlobContent, BlobError, BlobStore, StagedBlob};

/// Size of one multipart part, bytes; files up to this size go in one PUT.
/// S3 wants at least 5 MiB for every part but the last.
pub const PART_BYTES: usize = 8 * 1024 * 1024;

/// Parts uploaded at the same time (memory: about this many parts plus one).
const PART_CONCURRENCY: usize = 2;

/// Read size from the staged file, bytes.
const FILE_CHUNK: usize = 256 * 1024;

/// A request to the S3 server fails after this many retries (or
/// [`RETRY_TIMEOUT`]), so an upload against a server that is down is
/// answered `503` in seconds rather than held for minutes.
const MAX_RETRIES: usize = 3;
const RETRY_TIMEOUT: Duration = Duration::from_secs(15);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// One request (a part of [`PART_BYTES`], a ranged read) must end within this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Artifact bytes in a bucket, keyed `<prefix>/<sha256>`.
pub struct S3BlobStore {
    store: Arc<AmazonS3>,
    bucket: String,
    prefix: Option<Key>,
    staging: PathBuf,
}

fn remote<'a>(
    op: &'static str,
    key: &'a Key,
) -> impl FnOnce(object_store::Error) -> BlobError + 'a {
    move |source| BlobError::Remote {
        op,
        key: key.to_string(),
        source: Box::new(source),
    }
}

impl S3BlobStore {
    /// A client for the bucket `config` names (settings in the file win
    /// over the `AWS_*` environment variables), staging uploads in
    /// `staging` (created when missing; leftover staging files of an earlier
    /// run are removed). Makes no request: see [`S3BlobStore::check_reachable`].
    ///
    /// Errors: [`BlobError::Config`] (no bucket, a key the client refuses),
    /// I/O on `staging`.
    pub fn new(config: &BlobsConfig, staging: &Path) -> Result<Self, BlobError> {
        let bucket = config
            .bucket
            .clone()
            .ok_or_else(|| BlobError::Config("blobs.bucket is required".into()))?;
        let mut b = AmazonS3Builder::from_env()
            .with_bucket_name(&bucket)
            .with_allow_http(config.allow_http)
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(CONNECT_TIMEOUT)
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_allow_http(config.allow_http),
            )
            .with_retry(RetryConfig {
                max_retries: MAX_RETRIES,
                retry_timeout: RETRY_TIMEOUT,
                ..Default::default()
            });
        if let Some(e) = &config.endpoint {
            // MinIO, Ceph and moto serve `endpoint/bucket/key`.
            b = b.with_endpoint(e).with_virtual_hosted_style_request(false);
        }
        if let Some(r) = &config.region {
            b = b.with_region(r);
        }
        if let (Some(id), Some(secret)) = (&config.access_key_id, &config.secret_access_key) {
            b = b.with_access_key_id(id).with_secret_access_key(secret);
        }
        let store = b
            .build()
            .map_err(|e| BlobError::Config(format!("blobs: {e}")))?;
        let prefix = match &config.prefix {
            Some(p) => {
                Some(Key::parse(p).map_err(|e| BlobError::Config(format!("blobs.prefix: {e}")))?)
            }
            None => None,
        };
        clear_staging(staging)?;
        Ok(Self {
            store: Arc::new(store),
            bucket,
            prefix,
            staging: staging.to_path_buf(),
        })
    }

    /// List the first object under the prefix: the bucket exists, the
    /// server answers and the credentials may read it.
    ///
    /// Errors: [`BlobError::Remote`] with the server's or the network's
    /// reason.
    pub async fn check_reachable(&self) -> Result<(), BlobError> {
        let mut list = self.store.list(self.prefix.as_ref());
        match list.next().await {
            None | Some(Ok(_)) => Ok(()),
            Some(Err(e)) => Err(BlobError::Remote {
                op: "list",
                key: format!("s3://{}/{}", self.bucket, self.prefix_str()),
                source: Box::new(e),
            }),
        }
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    fn prefix_str(&self) -> String {
        self.prefix
            .as_ref()
            .map(|p| p.to_string())
            .unwrap_or_default()
    }

    /// The object key of `sha256`: `<prefix>/<sha256>`.
    ///
    /// Errors: [`BlobError::BadHash`].
    pub fn key(&self, sha256: &str) -> Result<Key, BlobError> {
        if !is_sha256_hex(sha256) {
            return Err(BlobError::BadHash(sha256.to_string()));
        }
        Ok(match &self.prefix {
            Some(p) => p.clone().join(sha256),
            None => Key::from(sha256),
        })
    }

    /// Stream the staged file to `key`, hashing it; visible only when the
    /// hash is `sha256`.
    async fn upload(&self, key: &Key, sha256: &str, path: &Path) -> Result<(), BlobError> {
        let io_err = |source| BlobError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = tokio::fs::File::open(path).await.map_err(io_err)?;
        let size = file.metadata().await.map_err(io_err)?.len();
        let mut hasher = Sha256::new();
        let mismatch = |actual: String| BlobError::Mismatch {
            expected: sha256.to_string(),
            actual,
        };
        if size <= PART_BYTES as u64 {
            let mut buf = Vec::with_capacity(size as usize);
            file.read_to_end(&mut buf).await.map_err(io_err)?;
            hasher.update(&buf);
            let actual = hex::encode(hasher.finalize());
            if actual != sha256 {
                return Err(mismatch(actual));
            }
            self.store
                .put(key, buf.into())
                .await
                .map_err(remote("put", key))?;
            return Ok(());
        }
        let upload = self
            .store
            .put_multipart(key)
            .await
            .map_err(remote("put", key))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let mut buf = vec![0u8; FILE_CHUNK];
        let streamed: Result<(), BlobError> = async {
            loop {
                let n = file.read(&mut buf).await.map_err(io_err)?;
                if n == 0 {
                    return Ok(());
                }
                hasher.update(&buf[..n]);
                writer
                    .wait_for_capacity(PART_CONCURRENCY)
                    .await
                    .map_err(remote("put", key))?;
                writer.write(&buf[..n]);
            }
        }
        .await;
        let actual = hex::encode(hasher.finalize());
        let refused = match streamed {
            Err(e) => Some(e),
            Ok(()) if actual != sha256 => Some(mismatch(actual)),
            Ok(()) => None,
        };
        if let Some(e) = refused {
            if let Err(abort) = writer.abort().await {
                tracing::warn!(%key, error = %abort, "S3 multipart upload not aborted; the bucket's lifecycle rule removes it");
            }
            return Err(e);
        }
        writer.finish().await.map_err(remote("put", key))?;
        Ok(())
    }

    fn content(&self, result: object_store::GetResult) -> BlobContent {
        let size_bytes = result.range.end - result.range.start;
        let stream = result.into_stream().map_err(io::Error::other);
        BlobContent {
            size_bytes,
            stream: Box::pin(stream),
        }
    }
}

fn not_found(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. })
}

#[async_trait::async_trait]
impl BlobStore for S3BlobStore {
    fn staging_dir(&self) -> PathBuf {
        self.staging.clone()
    }

    async fn put(&self, sha256: &str, mut staged: StagedBlob) -> Result<bool, BlobError> {
        let key = self.key(sha256)?;
        let staged_sum = staged.sha256_hex();
        if staged_sum != sha256 {
            staged.discard();
            return Err(BlobError::Mismatch {
                expected: sha256.to_string(),
                actual: staged_sum,
            });
        }
        match self.store.head(&key).await {
            Ok(_) => {
                staged.discard();
                return Ok(false);
            }
            Err(e) if not_found(&e) => {}
            Err(e) => return Err(remote("head", &key)(e)),
        }
        let result = self.upload(&key, sha256, staged.path()).await;
        if matches!(result, Ok(()) | Err(BlobError::Mismatch { .. })) {
            // Stored, or bytes that changed on disk since they were
            // received: neither is continued.
            staged.discard();
        }
        result.map(|()| true)
    }

    async fn open(&self, sha256: &str) -> Result<Option<BlobContent>, BlobError> {
        let key = self.key(sha256)?;
        match self.store.get(&key).await {
            Ok(r) => Ok(Some(self.content(r))),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(remote("get", &key)(e)),
        }
    }

    async fn open_range(
        &self,
        sha256: &str,
        range: Range<u64>,
    ) -> Result<Option<BlobContent>, BlobError> {
        let key = self.key(sha256)?;
        if range.is_empty() {
            return Err(BlobError::BadRange {
                sha256: sha256.to_string(),
                range,
            });
        }
        let options = GetOptions::default().with_range(Some(GetRange::Bounded(range.clone())));
        match self.store.get_opts(&key, options).await {
            Ok(r) if r.range != range => Err(BlobError::BadRange {
                sha256: sha256.to_string(),
                range,
            }),
            Ok(r) => Ok(Some(self.content(r))),
            Err(e) if not_found(&e) => Ok(None),
            Err(e) => Err(remote("get", &key)(e)),
        }
    }

    async fn exists(&self, sha256: &str) -> Result<bool, BlobError> {
        let key = self.key(sha256)?;
        match self.store.head(&key).await {
            Ok(_) => Ok(true),
            Err(e) if not_found(&e) => Ok(false),
            Err(e) => Err(remote("head", &key)(e)),
        }
    }

    async fn delete(&self, sha256: &str) -> Result<bool, BlobError> {
        // S3's DELETE answers the same whether the object was there, so
        // ask first to tell the caller.
        if !self.exists(sha256).await? {
            return Ok(false);
        }
        let key = self.key(sha256)?;
        match self.store.delete(&key).await {
            Ok(()) => Ok(true),
            Err(e) if not_found(&e) => Ok(false),
            Err(e) => Err(remote("delete", &key)(e)),
        }
    }
}
