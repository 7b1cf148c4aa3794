//! Artifacts in S3 across real processes: a lab (registry, simulated
//! bench, edge daemon) whose registry has `[blobs] backend = "s3"` against
//! a private `moto_server`. The camera's snapshot uploads from the edge's
//! outbox, the object `<prefix>/<sha256>` is in the bucket (listed with a
//! client of its own), the whole download hashes to the artifact's
//! checksum, a `Range` download is exactly its slice (206), and the event
//! log still verifies.

use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT};
use benchlink_e2e::client::{sha256_hex, Agent};
use benchlink_testkit::s3::{MOTO_ACCESS_KEY_ID, MOTO_REGION, MOTO_SECRET_ACCESS_KEY};
use benchlink_testkit::MotoS3;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::ObjectStore;
use reqwest::StatusCode;

const BUCKET: &str = "lab-evidence";
const PREFIX: &str = "bench-lab/artifacts";

#[tokio::test]
async fn a_snapshot_uploads_to_the_bucket_under_its_sha256_and_downloads_whole_and_by_range() {
    let Some(moto) = MotoS3::start() else { return };
    moto.create_bucket(BUCKET).await;
    let lab = Lab::start(LabOptions {
        registry_extra_toml: format!("\n{}", moto.blobs_toml(BUCKET, Some(PREFIX))),
        ..Default::default()
    })
    .await
    .expect("lab with the registry on S3");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);

    let lease = hw.lease_ok(caps::CAMERA, "evidence in S3").await.unwrap();
    let session = hw
        .act_ok(&lease, "snapshot", serde_json::json!({}))
        .await
        .expect("snapshot");
    let artifact_id = session["artifact_refs"][0].as_str().expect("an artifact");
    hw.wait_artifacts_uploaded(std::slice::from_ref(&lease), Duration::from_secs(30))
        .await
        .expect("bytes uploaded from the outbox");
    let artifact = hw
        .get_ok(&format!("/api/v1/artifacts/{artifact_id}"))
        .await
        .unwrap();
    let checksum = artifact["checksum"].as_str().unwrap().to_string();
    let size = artifact["size_bytes"].as_u64().unwrap();
    assert!(size > 200, "a real image: {artifact}");

    // The object is in the bucket under its sha256, at its size.
    let bucket = AmazonS3Builder::new()
        .with_bucket_name(BUCKET)
        .with_endpoint(&moto.endpoint)
        .with_region(MOTO_REGION)
        .with_access_key_id(MOTO_ACCESS_KEY_ID)
        .with_secret_access_key(MOTO_SECRET_ACCESS_KEY)
        .with_allow_http(true)
        .build()
        .unwrap();
    let objects: Vec<(String, u64)> = bucket
        .list(None)
        .map_ok(|m| (m.location.to_string(), m.size))
        .try_collect()
        .await
        .unwrap();
    let key = format!("{PREFIX}/{checksum}");
    assert!(
        objects.contains(&(key.clone(), size)),
        "{key} ({size} bytes) among {objects:?}"
    );
    assert!(
        objects.iter().all(|(k, _)| k.starts_with(PREFIX)),
        "{objects:?}"
    );

    let whole = hw.download(artifact_id).await.unwrap();
    assert_eq!(sha256_hex(&whole.bytes), checksum);
    assert_eq!(whole.checksum_header, checksum);

    let resp = hw
        .http()
        .get(format!(
            "{}/api/v1/artifacts/{artifact_id}/content",
            lab.base_url
        ))
        .bearer_auth(hw.token())
        .header("range", "bytes=10-109")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        resp.headers()["content-range"],
        format!("bytes 10-109/{size}").as_str()
    );
    assert_eq!(&resp.bytes().await.unwrap()[..], &whole.bytes[10..110]);

    let resp = hw
        .http()
        .get(format!(
            "{}/api/v1/artifacts/{artifact_id}/content",
            lab.base_url
        ))
        .bearer_auth(hw.token())
        .header("range", format!("bytes={size}-"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(
        resp.headers()["content-range"],
        format!("bytes */{size}").as_str()
    );
    hw.release(&lease).await.expect("release");

    lab.verify_audit_log()
        .await
        .expect("the event log's chain verifies");
}
