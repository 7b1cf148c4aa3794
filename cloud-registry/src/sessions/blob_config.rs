//! `[blobs]`: where artifact bytes are kept (docs/install-registry.md
//! "Artifacts in S3"): the local directory (`backend = "fs"`, the default)
//! or an S3-compatible bucket (`backend = "s3"`: AWS S3, MinIO, Ceph RGW).

use serde::Deserialize;

/// Which [`BlobStore`](super::BlobStore) implementation holds the bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlobBackend {
    /// Files under `sessions.artifact_dir` ([`FsBlobStore`](super::FsBlobStore)).
    #[default]
    Fs,
    /// Objects in an S3 bucket ([`S3BlobStore`](super::S3BlobStore)).
    S3,
}

/// `[blobs]`. Every key but `backend` is about the S3 backend; credentials
/// not in the file come from the standard AWS environment variables
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
/// `AWS_REGION`, `AWS_ENDPOINT_URL`) or the instance's role.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BlobsConfig {
    /// `"fs"` (default) or `"s3"`.
    pub backend: BlobBackend,
    /// Bucket name (required for `"s3"`): 3 to 63 lowercase letters,
    /// digits, `.` and `-`.
    pub bucket: Option<String>,
    /// Base URL of an S3-compatible server (MinIO, Ceph, moto), e.g.
    /// `http://127.0.0.1:9000`; unset: AWS's endpoint for `region`.
    pub endpoint: Option<String>,
    /// Region; unset: `AWS_REGION` or `us-east-1`.
    pub region: Option<String>,
    /// Key prefix inside the bucket, e.g. `lab-a/artifacts`: a blob is the
    /// object `<prefix>/<sha256>` (`<sha256>` without a prefix).
    pub prefix: Option<String>,
    /// Access key id; set together with `secret_access_key`.
    pub access_key_id: Option<String>,
    /// Secret access key; set together with `access_key_id`.
    pub secret_access_key: Option<String>,
    /// Allow a plain `http://` endpoint (a server on the same host or a
    /// test server); default false.
    pub allow_http: bool,
}

impl std::fmt::Debug for BlobsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobsConfig")
            .field("backend", &self.backend)
            .field("bucket", &self.bucket)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("prefix", &self.prefix)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field("allow_http", &self.allow_http)
            .finish()
    }
}

/// Whether `name` follows S3's bucket naming rules (3 to 63 characters of
/// lowercase letters, digits, `.` and `-`, starting and ending with a letter
/// or digit).
fn is_bucket_name(name: &str) -> bool {
    let ok_end = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (3..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        && ok_end(name.chars().next())
        && ok_end(name.chars().last())
        && !name.contains("..")
}

impl BlobsConfig {
    /// Every broken rule as `(dotted key, message)`, in file order.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut bad = |key: &str, message: String| out.push((format!("blobs.{key}"), message));
        if self.backend == BlobBackend::Fs {
            for (key, set) in [
                ("bucket", self.bucket.is_some()),
                ("endpoint", self.endpoint.is_some()),
                ("prefix", self.prefix.is_some()),
                ("access_key_id", self.access_key_id.is_some()),
                ("secret_access_key", self.secret_access_key.is_some()),
            ] {
                if set {
                    bad(
                        key,
                        "only applies to backend = \"s3\"; set blobs.backend = \"s3\" or remove it"
                            .into(),
                    );
                }
            }
            return out;
        }
        match self.bucket.as_deref() {
            None => bad("bucket", "is required when blobs.backend = \"s3\"".into()),
            Some(b) if !is_bucket_name(b) => bad(
                "bucket",
                format!("`{b}` is not a bucket name (3 to 63 lowercase letters, digits, `.` and `-`, starting and ending with a letter or digit)"),
            ),
            Some(_) => {}
        }
        if let Some(e) = &self.endpoint {
            match reqwest::Url::parse(e) {
                Err(err) => bad("endpoint", format!("`{e}` is not a URL: {err}")),
                Ok(u) if !matches!(u.scheme(), "http" | "https") => bad(
                    "endpoint",
                    format!("`{e}` must be an http:// or https:// URL"),
                ),
                Ok(u) if u.scheme() == "http" && !self.allow_http => bad(
                    "endpoint",
                    format!("`{e}` is plain HTTP; set blobs.allow_http = true to allow it"),
                ),
                Ok(_) => {}
            }
        }
        if let Some(r) = &self.region {
            if r.trim().is_empty() || r.trim() != r {
                bad(
                    "region",
                    format!("`{r}` must be a region name such as `eu-west-1`"),
                );
            }
        }
        if let Some(p) = &self.prefix {
            if let Err(e) = object_store::path::Path::parse(p) {
                bad("prefix", format!("`{p}` is not a key prefix: {e}"));
            } else if p.is_empty() || p.starts_with('/') || p.ends_with('/') {
                bad(
                    "prefix",
                    format!("`{p}` must be non-empty, without a leading or trailing `/`"),
                );
            }
        }
        match (&self.access_key_id, &self.secret_access_key) {
            (Some(_), None) => bad(
                "secret_access_key",
                "is required when blobs.access_key_id is set".into(),
            ),
            (None, Some(_)) => bad(
                "access_key_id",
                "is required when blobs.secret_access_key is set".into(),
            ),
            (Some(a), _) if a.trim().is_empty() => bad("access_key_id", "must not be empty".into()),
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(f: impl FnOnce(&mut BlobsConfig)) -> Vec<String> {
        let mut c = BlobsConfig {
            backend: BlobBackend::S3,
            bucket: Some("lab-artifacts".into()),
            ..Default::default()
        };
        f(&mut c);
        c.problems().into_iter().map(|(k, _)| k).collect()
    }

    #[test]
    fn each_bad_s3_value_is_named_by_its_key() {
        assert!(s3(|_| {}).is_empty());
        assert_eq!(s3(|c| c.bucket = None), ["blobs.bucket"]);
        assert_eq!(
            s3(|c| c.bucket = Some("Lab_Artifacts".into())),
            ["blobs.bucket"]
        );
        assert_eq!(
            s3(|c| c.endpoint = Some("http://127.0.0.1:9000".into())),
            ["blobs.endpoint"]
        );
        assert!(s3(|c| {
            c.endpoint = Some("http://127.0.0.1:9000".into());
            c.allow_http = true;
        })
        .is_empty());
        assert_eq!(
            s3(|c| c.endpoint = Some("not a url".into())),
            ["blobs.endpoint"]
        );
        assert_eq!(s3(|c| c.prefix = Some("/lab-a/".into())), ["blobs.prefix"]);
        assert_eq!(s3(|c| c.prefix = Some("a//b".into())), ["blobs.prefix"]);
        assert_eq!(
            s3(|c| c.access_key_id = Some("AKIA".into())),
            ["blobs.secret_access_key"]
        );
        assert_eq!(s3(|c| c.region = Some(" ".into())), ["blobs.region"]);
    }

    #[test]
    fn s3_keys_under_the_fs_backend_are_refused_and_the_secret_is_never_printed() {
        let c = BlobsConfig {
            bucket: Some("lab-artifacts".into()),
            secret_access_key: Some("hunter2".into()),
            ..Default::default()
        };
        let keys: Vec<String> = c.problems().into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["blobs.bucket", "blobs.secret_access_key"]);
        assert!(!format!("{c:?}").contains("hunter2"));
    }
}
