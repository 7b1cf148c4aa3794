//! Resumable uploads (docs/architecture.md "Artifact bytes (HTTP)"): the
//! bytes a ranged `PUT` (`Content-Range: bytes START-END/TOTAL`) received
//! so far, kept across connection drops until the upload completes.
//!
//! One file per (provider, artifact id, sha256) under
//! `<staging>/partial/<provider>/<artifact_id>.<sha256>.part`; its length
//! is what the registry holds. Only one ranged PUT writes a file at a time
//! ([`Partials::claim`]). Bounded per provider in bytes
//! (`sessions.max_partial_bytes_per_provider`) and in age: the sessions
//! watchdog removes files not written for
//! `sessions.partial_upload_ttl_seconds` ([`Partials::sweep`]).
//! Completed uploads are verified whole (sha256) and taken into the blob
//! store like a plain PUT.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use shared_protocol::validate::check_id;

/// Where the partial uploads are and which are being written.
pub struct Partials {
    dir: PathBuf,
    busy: Arc<Mutex<HashSet<PathBuf>>>,
}

/// The right to write one partial file; released on drop.
pub struct Claim {
    path: PathBuf,
    busy: Arc<Mutex<HashSet<PathBuf>>>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        crate::leases::lock(&self.busy).remove(&self.path);
    }
}

/// A partial upload the sweep removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swept {
    /// `<artifact_id>.<sha256>.part`.
    pub file: String,
    /// The provider's directory name.
    pub provider: String,
    /// Bytes removed.
    pub size_bytes: u64,
}

impl Partials {
    /// Partial uploads under `<staging_dir>/partial`.
    pub fn new(staging_dir: &Path) -> Self {
        Self {
            dir: staging_dir.join("partial"),
            busy: Arc::default(),
        }
    }

    /// The provider's directory: its name when that is a safe file name
    /// (an id), else a digest of it.
    fn provider_dir(&self, provider: &str) -> PathBuf {
        if check_id("provider", provider).is_ok() && !provider.starts_with('.') {
            self.dir.join(provider)
        } else {
            self.dir.join(format!(
                "h-{}",
                &hex::encode(Sha256::digest(provider))[..32]
            ))
        }
    }

    /// The file of (`provider`, `artifact_id`, `sha256`); `artifact_id` is
    /// a checked id and `sha256` 64 hex digits.
    pub fn path(&self, provider: &str, artifact_id: &str, sha256: &str) -> PathBuf {
        self.provider_dir(provider)
            .join(format!("{artifact_id}.{sha256}.part"))
    }

    /// Bytes held for `path` (0 when none).
    pub async fn held(&self, path: &Path) -> u64 {
        tokio::fs::metadata(path)
            .await
            .map(|m| m.len())
            .unwrap_or(0)
    }

    /// Claim `path` for one ranged PUT; `None` while another holds it.
    pub fn claim(&self, path: &Path) -> Option<Claim> {
        let mut busy = crate::leases::lock(&self.busy);
        if !busy.insert(path.to_path_buf()) {
            return None;
        }
        Some(Claim {
            path: path.to_path_buf(),
            busy: self.busy.clone(),
        })
    }

    /// Bytes of `provider`'s partial uploads other than `except`.
    pub async fn provider_bytes(&self, provider: &str, except: &Path) -> u64 {
        let dir = self.provider_dir(provider);
        let except = except.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                return 0;
            };
            entries
                .flatten()
                .filter(|e| e.path() != except)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .await
        .unwrap_or(0)
    }

    /// Remove partial uploads last written more than `max_age` ago (by
    /// their modification time), except those being written now. Runs on
    /// the blocking pool.
    pub async fn sweep(&self, max_age: Duration) -> Vec<Swept> {
        let dir = self.dir.clone();
        let busy = self.busy.clone();
        tokio::task::spawn_blocking(move || {
            let mut swept = Vec::new();
            let Ok(providers) = std::fs::read_dir(&dir) else {
                return swept;
            };
            let now = SystemTime::now();
            for p in providers.flatten() {
                let Ok(files) = std::fs::read_dir(p.path()) else {
                    continue;
                };
                for f in files.flatten() {
                    let path = f.path();
                    let Ok(meta) = f.metadata() else { continue };
                    let age = meta
                        .modified()
                        .ok()
                        .and_then(|t| now.duration_since(t).ok())
                        .unwrap_or_default();
                    if age < max_age || crate::leases::lock(&busy).contains(&path) {
                        continue;
                    }
                    if std::fs::remove_file(&path).is_ok() {
                        swept.push(Swept {
                            file: f.file_name().to_string_lossy().into_owned(),
                            provider: p.file_name().to_string_lossy().into_owned(),
                            size_bytes: meta.len(),
                        });
                    }
                }
            }
            swept
        })
        .await
        .unwrap_or_default()
    }
}

/// A parsed `Content-Range: bytes START-END/TOTAL` (END inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentRange {
    /// First byte of the body in the whole upload.
    pub start: u64,
    /// Last byte of the body (inclusive).
    pub end: u64,
    /// Size of the whole upload, bytes.
    pub total: u64,
}

impl ContentRange {
    /// Parse `bytes START-END/TOTAL`, with `START <= END < TOTAL` (so a
    /// piece carries at least one byte; `bytes */TOTAL` is refused: ask
    /// `upload-status` instead).
    ///
    /// Errors: a message saying what is wrong.
    pub fn parse(v: &str) -> Result<Self, String> {
        let rest = v
            .trim()
            .strip_prefix("bytes ")
            .ok_or_else(|| format!("`{v}` does not start with `bytes `"))?;
        let (range, total) = rest
            .split_once('/')
            .ok_or_else(|| format!("`{v}` lacks `/TOTAL`"))?;
        let (start, end) = range
            .split_once('-')
            .ok_or_else(|| format!("`{v}` lacks `START-END`"))?;
        let num = |s: &str, what: &str| {
            s.trim()
                .parse::<u64>()
                .map_err(|_| format!("{what} of `{v}` is not a number of bytes"))
        };
        let r = Self {
            start: num(start, "START")?,
            end: num(end, "END")?,
            total: num(total, "TOTAL")?,
        };
        if r.start > r.end || r.end >= r.total {
            return Err(format!("`{v}` needs START <= END < TOTAL"));
        }
        Ok(r)
    }

    /// Bytes in the body.
    pub fn body_len(&self) -> u64 {
        self.end - self.start + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_ranges_parse_and_bad_ones_are_named() {
        let r = ContentRange::parse("bytes 100-199/1000").unwrap();
        assert_eq!(
            (r.start, r.end, r.total, r.body_len()),
            (100, 199, 1000, 100)
        );
        for bad in [
            "bytes 5-4/10",
            "bytes 0-10/10",
            "bytes */10",
            "items 0-1/2",
            "bytes 0-x/2",
        ] {
            assert!(ContentRange::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_claimed_file_is_not_claimed_twice_and_old_files_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let p = Partials::new(dir.path());
        let path = p.path("bench-1", "a1", &"ab".repeat(32));
        let c = p.claim(&path).expect("free");
        assert!(p.claim(&path).is_none(), "busy");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"12345").unwrap();
        assert_eq!(p.held(&path).await, 5);
        assert!(p.sweep(Duration::ZERO).await.is_empty(), "in use");
        drop(c);
        let swept = p.sweep(Duration::ZERO).await;
        assert_eq!(swept.len(), 1);
        assert_eq!(swept[0].size_bytes, 5);
        assert!(!path.exists());
        assert_ne!(
            p.path("../x", "a", "b"),
            dir.path().join("partial/../x/a.b.part")
        );
    }
}
