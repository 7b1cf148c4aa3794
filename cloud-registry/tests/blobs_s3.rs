//! The S3 blob store against a private `moto_server` (S3 API) started by
//! each test: objects keyed `<prefix>/<sha256>`, a repeat put stores
//! nothing new, ranged reads, deletes, and bytes that do not hash to
//! their key never become visible. A registry whose bucket is missing
//! does not start.

use std::sync::Arc;

use benchlink_testkit::{sha256_hex, MotoS3};
use cloud_registry::sessions::{
    BlobBackend, BlobError, BlobStore, BlobsConfig, S3BlobStore, StagedBlob,
};
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::ObjectStore;
use tempfile::TempDir;

fn config(moto: &MotoS3, bucket: &str) -> BlobsConfig {
    toml::from_str(
        moto.blobs_toml(bucket, Some("lab-a/artifacts"))
            .trim_start_matches("[blobs]\n"),
    )
    .expect("blobs table")
}

/// A store on a fresh bucket, its staging directory, and a plain client
/// of the same bucket to look at what is really there.
async fn store(moto: &MotoS3) -> (S3BlobStore, TempDir, Arc<dyn ObjectStore>) {
    moto.create_bucket("evidence").await;
    let dir = TempDir::new().unwrap();
    let cfg = config(moto, "evidence");
    assert_eq!(cfg.backend, BlobBackend::S3);
    let store = S3BlobStore::new(&cfg, &dir.path().join("staging")).unwrap();
    store.check_reachable().await.expect("bucket reachable");
    let raw = AmazonS3Builder::new()
        .with_bucket_name("evidence")
        .with_endpoint(&moto.endpoint)
        .with_region("us-east-1")
        .with_access_key_id("testing")
        .with_secret_access_key("testing")
        .with_allow_http(true)
        .build()
        .unwrap();
    (store, dir, Arc::new(raw))
}

async fn stage(store: &S3BlobStore, bytes: &[u8]) -> StagedBlob {
    let mut s = StagedBlob::create(&store.staging_dir()).await.unwrap();
    s.write(bytes).await.unwrap();
    s.finish().await.unwrap();
    s
}

async fn keys(raw: &Arc<dyn ObjectStore>) -> Vec<String> {
    let mut k: Vec<String> = raw
        .list(None)
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    k.sort();
    k
}

async fn read(content: cloud_registry::sessions::BlobContent) -> Vec<u8> {
    let chunks: Vec<bytes::Bytes> = content.stream.try_collect().await.unwrap();
    chunks.concat()
}

fn staging_files(store: &S3BlobStore) -> usize {
    std::fs::read_dir(store.staging_dir())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_file())
        .count()
}

#[tokio::test]
async fn a_blob_is_the_object_prefix_sha256_and_reads_back_whole_and_by_range() {
    let Some(moto) = MotoS3::start() else { return };
    let (store, _dir, raw) = store(&moto).await;
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let sum = sha256_hex(&bytes);
    assert!(store.put(&sum, stage(&store, &bytes).await).await.unwrap());
    assert_eq!(keys(&raw).await, [format!("lab-a/artifacts/{sum}")]);
    assert_eq!(staging_files(&store), 0, "the staged file is removed");
    assert!(store.exists(&sum).await.unwrap());

    let whole = store.open(&sum).await.unwrap().expect("stored");
    assert_eq!(whole.size_bytes, bytes.len() as u64);
    assert_eq!(sha256_hex(&read(whole).await), sum);
    let part = store.open_range(&sum, 1000..1100).await.unwrap().unwrap();
    assert_eq!(part.size_bytes, 100);
    assert_eq!(read(part).await, &bytes[1000..1100]);
    let tail = store
        .open_range(&sum, 299_990..300_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read(tail).await, &bytes[299_990..]);
    assert!(matches!(
        store.open_range(&sum, 299_990..300_010).await,
        Err(BlobError::BadRange { .. })
    ));
    let absent = "0".repeat(64);
    assert!(store.open(&absent).await.unwrap().is_none());
    assert!(store.open_range(&absent, 0..1).await.unwrap().is_none());
}

#[tokio::test]
async fn the_same_bytes_twice_keep_one_object_and_a_delete_removes_only_it() {
    let Some(moto) = MotoS3::start() else { return };
    let (store, _dir, raw) = store(&moto).await;
    let sum = sha256_hex(b"serial log");
    assert!(store
        .put(&sum, stage(&store, b"serial log").await)
        .await
        .unwrap());
    assert!(
        !store
            .put(&sum, stage(&store, b"serial log").await)
            .await
            .unwrap(),
        "already stored: not new"
    );
    assert_eq!(staging_files(&store), 0, "the duplicate is discarded");
    let other = sha256_hex(b"kept bytes");
    store
        .put(&other, stage(&store, b"kept bytes").await)
        .await
        .unwrap();
    assert_eq!(keys(&raw).await.len(), 2);

    assert!(store.delete(&sum).await.unwrap(), "removed");
    assert!(!store.exists(&sum).await.unwrap());
    assert!(!store.delete(&sum).await.unwrap(), "nothing left to remove");
    assert_eq!(keys(&raw).await, [format!("lab-a/artifacts/{other}")]);
    assert!(matches!(
        store.delete("../../etc/passwd").await,
        Err(BlobError::BadHash(_))
    ));
}

#[tokio::test]
async fn bytes_that_do_not_hash_to_their_key_leave_nothing_in_the_bucket() {
    let Some(moto) = MotoS3::start() else { return };
    let (store, _dir, raw) = store(&moto).await;
    let wrong = sha256_hex(b"something else");
    let refused = store
        .put(&wrong, stage(&store, b"the real bytes").await)
        .await;
    assert!(
        matches!(refused, Err(BlobError::Mismatch { .. })),
        "{refused:?}"
    );
    assert!(!store.exists(&wrong).await.unwrap());

    // Large enough for a multipart upload; the staged file changes on disk
    // after it was received, so the hash taken while streaming differs.
    let big: Vec<u8> = (0..20_000_000u32).map(|i| (i % 241) as u8).collect();
    let sum = sha256_hex(&big);
    let staged = stage(&store, &big).await;
    let mut changed = big.clone();
    changed[19_999_999] ^= 0xFF;
    std::fs::write(staged.path(), &changed).unwrap();
    let refused = store.put(&sum, staged).await;
    assert!(
        matches!(refused, Err(BlobError::Mismatch { .. })),
        "{refused:?}"
    );
    assert!(keys(&raw).await.is_empty(), "no object under any key");
    assert_eq!(staging_files(&store), 0);

    // The same size intact goes up in parts and reads back exactly.
    assert!(store.put(&sum, stage(&store, &big).await).await.unwrap());
    let got = read(store.open(&sum).await.unwrap().unwrap()).await;
    assert_eq!(got.len(), big.len());
    assert_eq!(sha256_hex(&got), sum);
}

#[tokio::test]
async fn a_registry_whose_bucket_is_missing_does_not_start_and_names_the_bucket() {
    let Some(moto) = MotoS3::start() else { return };
    let dir = TempDir::new().unwrap();
    let mut cfg = cloud_registry::config::Config::default();
    cfg.http.listen = "127.0.0.1:0".parse().unwrap();
    cfg.mqtt.listen = "127.0.0.1:0".parse().unwrap();
    cfg.store.path = dir.path().join("registry.sqlite3");
    cfg.blobs = config(&moto, "no-such-bucket");
    let err = cloud_registry::app::Registry::start(cfg)
        .await
        .err()
        .expect("refused");
    let msg = err.to_string();
    assert!(msg.contains("no-such-bucket"), "{msg}");
    assert!(msg.contains("artifact store"), "{msg}");
}
