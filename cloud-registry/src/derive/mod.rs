//! Derived evidence (docs/audit-trail.md "Derived evidence"): when an
//! artifact's bytes arrive and verify, the registry derives
//! `detection_json` (colour regions of an image), `ocr_text` (text regions
//! of an image, or a whole screenshot) and `transcript` (an audio clip,
//! through the speech gateway), and stores each as an artifact of the same
//! session, content-addressed, with its own `artifact_uploaded` event on
//! the hash chain.
//!
//! - [`Deriver`]: the bounded queue, the jobs (at most
//!   `max_concurrent_jobs` at once, the work in `spawn_blocking` and
//!   child processes), and the sweep that picks up what a restart or a
//!   full queue left;
//! - [`colour`]: colour naming and region measurement; [`ocr`]: the OCR
//!   program; [`sql`]: the bookkeeping tables.

pub mod colour;
pub mod ocr;
pub mod sql;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use shared_protocol::artifact::{ArtifactType, CapabilityArtifact};
use shared_protocol::capability::CapabilityType;
use shared_protocol::event::{CapabilityEvent, EventType};
use shared_protocol::regions::{self, Region, RegionKind};
use tokio::sync::{mpsc, watch, Semaphore};

use crate::agents::speech::{AudioUpload, SpeechGateway};
use crate::db::Db;
use crate::events::EventBus;
use crate::providers::ProviderStore;
use crate::sessions::{Sessions, StagedBlob};

/// Longest `metadata_json.text` of a derived artifact, characters.
pub const SUMMARY_TEXT_CHARS: usize = 4096;

/// The derived artifact types.
pub const DERIVED_TYPES: [ArtifactType; 3] = [
    ArtifactType::DetectionJson,
    ArtifactType::OcrText,
    ArtifactType::Transcript,
];

/// `[derived_evidence.feeds]`: which artifact types each deriver reads.
/// An empty list turns that deriver off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Feeds {
    /// Sources of `detection_json` (`["image"]`).
    pub detection_json: Vec<ArtifactType>,
    /// Sources of `ocr_text` (`["image"]`).
    pub ocr_text: Vec<ArtifactType>,
    /// Sources of `transcript` (`["audio_clip"]`).
    pub transcript: Vec<ArtifactType>,
}

impl Default for Feeds {
    fn default() -> Self {
        Feeds {
            detection_json: vec![ArtifactType::Image],
            ocr_text: vec![ArtifactType::Image],
            transcript: vec![ArtifactType::AudioClip],
        }
    }
}

impl Feeds {
    fn of(&self, kind: ArtifactType) -> &[ArtifactType] {
        match kind {
            ArtifactType::DetectionJson => &self.detection_json,
            ArtifactType::OcrText => &self.ocr_text,
            _ => &self.transcript,
        }
    }

    /// Every type some deriver reads.
    pub fn sources(&self) -> Vec<ArtifactType> {
        let mut out: Vec<ArtifactType> = Vec::new();
        for t in self
            .detection_json
            .iter()
            .chain(&self.ocr_text)
            .chain(&self.transcript)
        {
            if !out.contains(t) {
                out.push(*t);
            }
        }
        out
    }
}

/// `[derived_evidence]` of the registry's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeriveConfig {
    /// Derive evidence at all (true).
    pub enabled: bool,
    /// The OCR program and its arguments; `{input}` is replaced by the
    /// path of a PNG, and its stdout is the text
    /// (`["tesseract", "{input}", "stdout", "--psm", "6"]`).
    pub ocr_command: Vec<String>,
    /// Longest one OCR run or transcription may take, seconds (30);
    /// longer ones are killed and fail the derivation.
    pub timeout_seconds: u64,
    /// Most derivations running at once (2).
    pub max_concurrent_jobs: usize,
    /// Most sources waiting to be derived (256); when full, newly uploaded
    /// sources wait for the next sweep.
    pub queue_capacity: usize,
    /// How often the registry looks for uploaded sources not yet derived
    /// (after a restart, or a full queue), seconds (60).
    pub sweep_interval_seconds: u64,
    /// Largest source read, bytes (64 MiB); larger ones fail.
    pub max_source_bytes: u64,
    /// Language passed to the speech gateway for transcripts (`en`).
    pub transcript_language: String,
    /// Which artifact types feed which deriver.
    pub feeds: Feeds,
}

impl Default for DeriveConfig {
    fn default() -> Self {
        DeriveConfig {
            enabled: true,
            ocr_command: ["tesseract", "{input}", "stdout", "--psm", "6"]
                .map(String::from)
                .to_vec(),
            timeout_seconds: 30,
            max_concurrent_jobs: 2,
            queue_capacity: 256,
            sweep_interval_seconds: 60,
            max_source_bytes: 64 * 1024 * 1024,
            transcript_language: "en".into(),
            feeds: Feeds::default(),
        }
    }
}

impl DeriveConfig {
    /// Broken rules as `(dotted key, message)`.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut bad = |k: &str, m: &str| out.push((format!("derived_evidence.{k}"), m.to_string()));
        if self.ocr_command.is_empty() || self.ocr_command[0].trim().is_empty() {
            bad(
                "ocr_command",
                "must name a program: [\"tesseract\", \"{input}\", \"stdout\"]",
            );
        } else if !self.ocr_command.iter().any(|a| a.contains("{input}")) {
            bad(
                "ocr_command",
                "must pass the image: one argument must contain {input}",
            );
        }
        if !(1..=3600).contains(&self.timeout_seconds) {
            bad("timeout_seconds", "must be 1 to 3600 seconds");
        }
        if !(1..=64).contains(&self.max_concurrent_jobs) {
            bad("max_concurrent_jobs", "must be 1 to 64");
        }
        if !(1..=100_000).contains(&self.queue_capacity) {
            bad("queue_capacity", "must be 1 to 100000");
        }
        if !(1..=86_400).contains(&self.sweep_interval_seconds) {
            bad("sweep_interval_seconds", "must be 1 to 86400 seconds");
        }
        if self.max_source_bytes == 0 {
            bad("max_source_bytes", "must be at least 1");
        }
        let lang = &self.transcript_language;
        if lang.is_empty()
            || lang.len() > 16
            || !lang.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            bad(
                "transcript_language",
                "must be a language code such as `en`",
            );
        }
        for (key, list, allowed) in [
            (
                "feeds.detection_json",
                &self.feeds.detection_json,
                &[ArtifactType::Image][..],
            ),
            (
                "feeds.ocr_text",
                &self.feeds.ocr_text,
                &[ArtifactType::Image][..],
            ),
            (
                "feeds.transcript",
                &self.feeds.transcript,
                &[ArtifactType::AudioClip][..],
            ),
        ] {
            for t in list {
                if !allowed.contains(t) {
                    let names: Vec<&str> = allowed.iter().map(|a| a.as_str()).collect();
                    bad(
                        key,
                        &format!(
                            "`{t}` cannot feed this deriver; it reads {}",
                            names.join(", ")
                        ),
                    );
                }
            }
        }
        out
    }
}

/// The deriver that makes `kind`, as named in `metadata_json.deriver`.
fn deriver_name(kind: ArtifactType, cfg: &DeriveConfig) -> String {
    match kind {
        ArtifactType::DetectionJson => "region_colour".into(),
        ArtifactType::OcrText => format!(
            "ocr:{}",
            cfg.ocr_command
                .first()
                .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
                .unwrap_or_default()
        ),
        _ => "speech".into(),
    }
}

/// The id of the `kind` artifact derived from `source_artifact_id`: the
/// same for every attempt, so a source never gets two of one kind.
pub fn derived_id(source_artifact_id: &str, kind: ArtifactType) -> String {
    let h = hex::encode(Sha256::digest(source_artifact_id.as_bytes()));
    let short = match kind {
        ArtifactType::DetectionJson => "det",
        ArtifactType::OcrText => "ocr",
        _ => "asr",
    };
    format!("art_{short}_{}", &h[..32])
}

/// What one derivation produced.
struct Derived {
    body: Vec<u8>,
    deriver: String,
    /// Extra `metadata_json` keys (`text`, `regions`, `regions_text`).
    summary: Map<String, Value>,
}

/// The derived-evidence service: see the module docs. Create with
/// [`Deriver::start`].
pub struct Deriver {
    db: Db,
    bus: EventBus,
    sessions: Arc<Sessions>,
    providers: Arc<dyn ProviderStore>,
    speech: Option<Arc<SpeechGateway>>,
    cfg: DeriveConfig,
    tx: mpsc::Sender<String>,
    /// Sources queued or being derived (so a sweep does not queue them
    /// twice).
    in_flight: Mutex<HashSet<String>>,
}

impl Deriver {
    /// Start deriving (a no-op service when `cfg.enabled` is false):
    /// registers the upload hook on `sessions`, spawns the job runner and
    /// the sweep (the first sweep at once: what a restart left). Both end
    /// when `shutdown` turns true.
    pub fn start(
        db: Db,
        bus: EventBus,
        sessions: Arc<Sessions>,
        providers: Arc<dyn ProviderStore>,
        speech: Option<Arc<SpeechGateway>>,
        cfg: DeriveConfig,
        shutdown: watch::Receiver<bool>,
    ) -> (Arc<Deriver>, Vec<tokio::task::JoinHandle<()>>) {
        let (tx, rx) = mpsc::channel(cfg.queue_capacity.max(1));
        let d = Arc::new(Deriver {
            db,
            bus,
            sessions: sessions.clone(),
            providers,
            speech,
            cfg,
            tx,
            in_flight: Mutex::new(HashSet::new()),
        });
        if !d.cfg.enabled {
            return (d, Vec::new());
        }
        let weak = Arc::downgrade(&d);
        sessions.on_artifact_uploaded(Arc::new(move |ev: &CapabilityEvent| {
            if let Some(d) = weak.upgrade() {
                d.notice(ev);
            }
        }));
        let runner = tokio::spawn(d.clone().run(rx, shutdown.clone()));
        let sweep = tokio::spawn(d.clone().sweep_loop(shutdown));
        (d, vec![runner, sweep])
    }

    /// An `artifact_uploaded` event: queue its artifact when some deriver
    /// reads its type and it is not derived itself.
    fn notice(&self, ev: &CapabilityEvent) {
        if ev.event_type != EventType::ArtifactUploaded {
            return;
        }
        let Some(id) = &ev.artifact_id else { return };
        let derived = ev
            .data
            .get("metadata_json")
            .and_then(|m| m.get("derived_from"))
            .is_some();
        let feeds = self.cfg.feeds.sources();
        let typed = ev
            .data
            .get("artifact_type")
            .and_then(Value::as_str)
            .and_then(|t| t.parse::<ArtifactType>().ok())
            .is_some_and(|t| feeds.contains(&t));
        if derived || !typed {
            return;
        }
        self.enqueue(id.clone());
    }

    fn enqueue(&self, id: String) {
        {
            let mut f = crate::leases::lock(&self.in_flight);
            if !f.insert(id.clone()) {
                return;
            }
        }
        if let Err(e) = self.tx.try_send(id) {
            let id = match e {
                mpsc::error::TrySendError::Full(id) | mpsc::error::TrySendError::Closed(id) => id,
            };
            crate::leases::lock(&self.in_flight).remove(&id);
            tracing::debug!(artifact_id = %id, "derivation queue full; the next sweep picks it up");
        }
    }

    async fn run(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<String>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let jobs = Arc::new(Semaphore::new(self.cfg.max_concurrent_jobs.max(1)));
        loop {
            let id = tokio::select! {
                id = rx.recv() => match id { Some(id) => id, None => return },
                _ = shutdown.wait_for(|s| *s) => return,
            };
            let Ok(permit) = jobs.clone().acquire_owned().await else {
                return;
            };
            let me = self.clone();
            tokio::spawn(async move {
                me.derive_source(&id).await;
                crate::leases::lock(&me.in_flight).remove(&id);
                drop(permit);
            });
        }
    }

    async fn sweep_loop(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let every = Duration::from_secs(self.cfg.sweep_interval_seconds.max(1));
        loop {
            self.sweep().await;
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.wait_for(|s| *s) => return,
            }
        }
    }

    /// Queue the uploaded sources not yet derived (as many as fit).
    pub async fn sweep(&self) {
        let types = self.cfg.feeds.sources();
        let limit = self.cfg.queue_capacity;
        match self
            .db
            .read(move |c| sql::pending_sources(c, &types, limit))
            .await
        {
            Ok(Ok(ids)) => {
                if !ids.is_empty() {
                    tracing::info!(sources = ids.len(), "deriving evidence left from before");
                }
                for id in ids {
                    self.enqueue(id);
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot list sources to derive"),
            Err(e) => tracing::warn!(error = %e, "cannot list sources to derive"),
        }
    }

    /// Derive everything due from the source `id` and mark it handled.
    async fn derive_source(&self, id: &str) {
        let sid = id.to_string();
        let source = match self.db.read(move |c| sql::load_source(c, &sid)).await {
            Ok(Ok(Some(s))) => s,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                return tracing::warn!(artifact_id = id, error = %e, "cannot load an artifact to derive from")
            }
            Err(e) => {
                return tracing::warn!(artifact_id = id, error = %e, "cannot load an artifact to derive from")
            }
        };
        let capability = match self
            .providers
            .get_capability(&source.session.session.capability_id)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                // Retried by a later sweep: nothing is marked.
                return tracing::warn!(artifact_id = id, error = %e, "cannot read the capability of an artifact to derive from");
            }
        };
        let a = &source.artifact.artifact;
        let (regions, regions_error) = match capability
            .as_ref()
            .map(|c| regions::parse(&c.metadata_json))
        {
            Some(Ok(r)) => (r, None),
            Some(Err(e)) => (
                Vec::new(),
                Some(format!("the capability's regions are invalid: {e}")),
            ),
            None => (Vec::new(), None),
        };
        let is_screen = capability
            .as_ref()
            .is_some_and(|c| c.capability_type == CapabilityType::ScreenCapture);
        let mut kinds = Vec::new();
        for kind in DERIVED_TYPES {
            if source.decided.contains(&kind) || !self.cfg.feeds.of(kind).contains(&a.artifact_type)
            {
                continue;
            }
            let due = match kind {
                ArtifactType::DetectionJson => {
                    regions_error.is_some() || regions.iter().any(|r| r.kind == RegionKind::Colour)
                }
                ArtifactType::OcrText => {
                    regions_error.is_some()
                        || regions.iter().any(|r| r.kind == RegionKind::Text)
                        || is_screen
                }
                _ => self.speech.as_ref().is_some_and(|s| s.is_configured()),
            };
            if due {
                kinds.push(kind);
            }
        }
        if !kinds.is_empty() {
            let bytes = self.read_source(a).await;
            for kind in kinds {
                let result = match (&bytes, &regions_error) {
                    (Err(e), _) => Err(e.clone()),
                    (_, Some(e)) if kind != ArtifactType::Transcript => Err(e.clone()),
                    (Ok(b), _) => {
                        self.derive_one(kind, a, b.clone(), &regions, is_screen)
                            .await
                    }
                };
                self.store(&source, kind, result).await;
            }
        }
        let (sid, now) = (id.to_string(), Utc::now());
        if let Err(e) = self
            .db
            .write(move |c| sql::mark_handled(c, &sid, now))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            tracing::warn!(artifact_id = id, error = %e, "cannot mark an artifact as derived from");
        }
    }

    async fn read_source(&self, a: &CapabilityArtifact) -> Result<bytes::Bytes, String> {
        use futures::StreamExt;
        if a.size_bytes > self.cfg.max_source_bytes {
            return Err(format!(
                "the source is {} bytes, more than derived_evidence.max_source_bytes ({})",
                a.size_bytes, self.cfg.max_source_bytes
            ));
        }
        let Some(mut content) = self
            .sessions
            .blobs()
            .open(&a.checksum)
            .await
            .map_err(|e| format!("cannot read the source's bytes: {e}"))?
        else {
            return Err("the source's bytes are not in the artifact store".into());
        };
        let mut buf = Vec::with_capacity(content.size_bytes as usize);
        while let Some(chunk) = content.stream.next().await {
            let chunk = chunk.map_err(|e| format!("cannot read the source's bytes: {e}"))?;
            buf.extend_from_slice(&chunk);
            if buf.len() as u64 > self.cfg.max_source_bytes {
                return Err("the source is larger than derived_evidence.max_source_bytes".into());
            }
        }
        Ok(bytes::Bytes::from(buf))
    }

    async fn derive_one(
        &self,
        kind: ArtifactType,
        a: &CapabilityArtifact,
        bytes: bytes::Bytes,
        regions: &[Region],
        is_screen: bool,
    ) -> Result<Derived, String> {
        let deriver = deriver_name(kind, &self.cfg);
        match kind {
            ArtifactType::DetectionJson => {
                let regions = regions.to_vec();
                let source_id = a.artifact_id.clone();
                let (body, found) = tokio::task::spawn_blocking(move || {
                    let img = decode(&bytes)?;
                    let found = colour::detect(&img, &regions);
                    let body = json!({
                        "source_artifact_id": source_id,
                        "width": img.width(),
                        "height": img.height(),
                        "regions": found,
                    });
                    Ok::<_, String>((serde_json::to_vec_pretty(&body).unwrap_or_default(), found))
                })
                .await
                .map_err(|e| format!("the colour deriver stopped: {e}"))??;
                let mut summary = Map::new();
                summary.insert("regions".into(), Value::Array(found));
                Ok(Derived {
                    body,
                    deriver,
                    summary,
                })
            }
            ArtifactType::OcrText => {
                let text_regions: Vec<Region> = regions
                    .iter()
                    .filter(|r| r.kind == RegionKind::Text)
                    .cloned()
                    .collect();
                let dir = self.sessions.blobs().staging_dir();
                let whole = text_regions.is_empty() && is_screen;
                let inputs = tokio::task::spawn_blocking(move || {
                    let img = decode(&bytes)?;
                    let mut out = Vec::new();
                    if whole {
                        let crop = ocr::prepare_crop(&img, (0, 0, img.width(), img.height()));
                        out.push((
                            None,
                            ocr::write_png(&dir, &crop).map_err(|e| e.to_string())?,
                        ));
                    }
                    for r in &text_regions {
                        let crop = ocr::prepare_crop(&img, r.pixels(img.width(), img.height()));
                        out.push((
                            Some(r.name.clone()),
                            ocr::write_png(&dir, &crop).map_err(|e| e.to_string())?,
                        ));
                    }
                    Ok::<_, String>(out)
                })
                .await
                .map_err(|e| format!("the OCR deriver stopped: {e}"))??;
                let timeout = Duration::from_secs(self.cfg.timeout_seconds.max(1));
                let mut lines = Vec::new();
                let mut per_region = BTreeMap::new();
                for (name, path) in &inputs {
                    let text = ocr::run(&self.cfg.ocr_command, path, timeout)
                        .await
                        .map_err(|e| e.to_string())?;
                    match name {
                        Some(n) => {
                            lines.push(format!(
                                "{n}: {}",
                                text.split_whitespace().collect::<Vec<_>>().join(" ")
                            ));
                            per_region.insert(n.clone(), Value::String(text));
                        }
                        None => lines.push(text),
                    }
                }
                drop(inputs);
                let text = lines.join("\n");
                let mut summary = Map::new();
                summary.insert(
                    "text".into(),
                    Value::String(text.chars().take(SUMMARY_TEXT_CHARS).collect()),
                );
                if !per_region.is_empty() {
                    summary.insert(
                        "regions_text".into(),
                        Value::Object(per_region.into_iter().collect()),
                    );
                }
                let mut body = text.into_bytes();
                body.push(b'\n');
                Ok(Derived {
                    body,
                    deriver,
                    summary,
                })
            }
            _ => {
                let Some(speech) = &self.speech else {
                    return Err("speech recognition is not configured".into());
                };
                let provider = speech.config().provider.as_str().to_string();
                let upload = AudioUpload {
                    bytes,
                    file_name: Some(format!("{}.wav", a.artifact_id)),
                    content_type: Some(a.content_type.clone()),
                };
                let t = speech
                    .transcribe(upload, &self.cfg.transcript_language)
                    .await
                    .map_err(|e| e.to_string())?;
                let mut summary = Map::new();
                summary.insert(
                    "text".into(),
                    Value::String(t.text.chars().take(SUMMARY_TEXT_CHARS).collect()),
                );
                if let Some(c) = t.confidence {
                    summary.insert("confidence".into(), json!(c));
                }
                let mut body = t.text.into_bytes();
                body.push(b'\n');
                Ok(Derived {
                    body,
                    deriver: format!("{deriver}:{provider}"),
                    summary,
                })
            }
        }
    }

    /// Store a derivation's outcome: the artifact and its event, or the
    /// failure event.
    async fn store(
        &self,
        source: &sql::Source,
        kind: ArtifactType,
        result: Result<Derived, String>,
    ) {
        let a = &source.artifact.artifact;
        let now = Utc::now();
        let stored = match result {
            Ok(d) => self.store_artifact(source, kind, d).await,
            Err(reason) => {
                tracing::warn!(artifact_id = %a.artifact_id, artifact_type = %kind, %reason, "evidence could not be derived");
                let (src, deriver) = (source.clone(), deriver_name(kind, &self.cfg));
                self.db
                    .write(move |c| sql::record_failed(c, &src, kind, &deriver, &reason, now))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()))
            }
        };
        match stored {
            Ok(Some(ev)) => self.bus.publish([ev]),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(artifact_id = %a.artifact_id, artifact_type = %kind, error = %e, "cannot store derived evidence")
            }
        }
    }

    async fn store_artifact(
        &self,
        source: &sql::Source,
        kind: ArtifactType,
        d: Derived,
    ) -> Result<Option<CapabilityEvent>, String> {
        let a = &source.artifact.artifact;
        let blobs = self.sessions.blobs();
        let mut staged = StagedBlob::create(&blobs.staging_dir())
            .await
            .map_err(|e| e.to_string())?;
        staged.write(&d.body).await.map_err(|e| e.to_string())?;
        let sha = staged.finish().await.map_err(|e| e.to_string())?;
        let size = staged.size_bytes();
        let mut metadata = Map::new();
        metadata.insert("derived_from".into(), json!(a.artifact_id));
        metadata.insert("source_sha256".into(), json!(a.checksum));
        metadata.insert("deriver".into(), json!(d.deriver));
        metadata.extend(d.summary);
        let id = derived_id(&a.artifact_id, kind);
        let artifact = CapabilityArtifact {
            storage_uri: crate::sessions::sql::content_uri(&id),
            artifact_id: id,
            session_id: a.session_id.clone(),
            artifact_type: kind,
            content_type: if kind == ArtifactType::DetectionJson {
                "application/json".into()
            } else {
                "text/plain; charset=utf-8".into()
            },
            captured_at: a.captured_at,
            duration_ms: if kind == ArtifactType::Transcript {
                a.duration_ms
            } else {
                None
            },
            checksum: sha.clone(),
            size_bytes: size,
            metadata_json: metadata,
            uploaded: true,
        };
        let gc = self.sessions.hold_blobs().await;
        blobs.put(&sha, staged).await.map_err(|e| e.to_string())?;
        let (src, now) = (source.clone(), Utc::now());
        let out = self
            .db
            .write(move |c| sql::record_derived(c, &src, &artifact, now))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        drop(gc);
        if let Ok(Some(_)) = &out {
            tracing::info!(source_artifact_id = %a.artifact_id, artifact_type = %kind, size_bytes = size, "evidence derived");
        }
        out
    }
}

/// Decode a JPEG or PNG.
fn decode(bytes: &[u8]) -> Result<image::RgbImage, String> {
    image::load_from_memory(bytes)
        .map(|i| i.to_rgb8())
        .map_err(|e| format!("the image cannot be decoded: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_and_bad_values_are_named() {
        assert!(DeriveConfig::default().problems().is_empty());
        let cfg = DeriveConfig {
            ocr_command: vec!["tesseract".into(), "stdout".into()],
            timeout_seconds: 0,
            max_concurrent_jobs: 0,
            feeds: Feeds {
                detection_json: vec![ArtifactType::AudioClip],
                ..Feeds::default()
            },
            ..DeriveConfig::default()
        };
        let keys: Vec<String> = cfg.problems().into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "derived_evidence.ocr_command",
                "derived_evidence.timeout_seconds",
                "derived_evidence.max_concurrent_jobs",
                "derived_evidence.feeds.detection_json"
            ]
        );
    }

    #[test]
    fn derived_ids_are_stable_per_source_and_kind() {
        let a = derived_id("art_1", ArtifactType::DetectionJson);
        assert_eq!(a, derived_id("art_1", ArtifactType::DetectionJson));
        assert_ne!(a, derived_id("art_1", ArtifactType::OcrText));
        assert_ne!(a, derived_id("art_2", ArtifactType::DetectionJson));
        shared_protocol::validate::check_id("artifact_id", &a).unwrap();
    }
}
