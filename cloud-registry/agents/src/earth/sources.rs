//! Earth data sources added by applied `datasource_config` proposals
//! (docs/earth-command.md, "Data sources by proposal").
//!
//! [`EarthSources`] keeps the catalog the registry loaded from its
//! configuration (the base) and the GeoJSON layers of every applied,
//! enabled source, and puts `base + sources` in force through
//! [`SharedCatalog::replace`] whenever one changes, so layers, tools and
//! the Earth command see it at once.
//!
//! ```text
//!  apply ──► DatasourceSpec::from_setting ──► fetch + parse ──► setting written ──► install
//!                 │ bad spec                      │ 404, bad JSON, timeout
//!                 └────────────► proposal `failed`, catalog unchanged
//!  refresh task (refresh_interval_seconds): fetch ──► install, or log and keep the old layer
//! ```

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::Value;
use shared_protocol::earth::EarthDomain;

use super::entities::{EntityCatalog, GeoLayerData};
use super::geo::SharedCatalog;

/// Default fetch timeout of a source without `timeout_seconds`, seconds.
pub const DEFAULT_SOURCE_TIMEOUT_SECONDS: u64 = 30;

/// What an applied `datasource_config` value asks for, checked for what
/// the registry can load: a GeoJSON (`geojson` or `json`) FeatureCollection
/// at an http(s) `endpoint` for the `news` or `vessels` layer.
#[derive(Debug, Clone, PartialEq)]
pub struct DatasourceSpec {
    /// The setting key (`target.datasource_id`).
    pub id: String,
    /// False: the source's entities are removed (no other field needed).
    pub enabled: bool,
    pub layer: EarthDomain,
    pub endpoint: String,
    /// Whole-fetch timeout.
    pub timeout: Duration,
    /// Period of the background refresh, when set.
    pub refresh: Option<Duration>,
}

impl DatasourceSpec {
    /// Reads a `datasource_config` value. Errors: one sentence naming the
    /// missing or unsupported field (`endpoint`, `layer`, `format`).
    pub fn from_setting(id: &str, value: &Value) -> Result<DatasourceSpec, String> {
        let enabled = value
            .get("enabled")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let secs = |k: &str| value.get(k).and_then(Value::as_u64);
        let timeout = Duration::from_secs(
            secs("timeout_seconds")
                .unwrap_or(DEFAULT_SOURCE_TIMEOUT_SECONDS)
                .max(1),
        );
        let refresh = secs("refresh_interval_seconds").map(|s| Duration::from_secs(s.max(1)));
        let str_field = |k: &str| value.get(k).and_then(Value::as_str).map(str::trim);
        if !enabled {
            return Ok(DatasourceSpec {
                id: id.to_string(),
                enabled,
                layer: EarthDomain::Vessels,
                endpoint: String::new(),
                timeout,
                refresh: None,
            });
        }
        let endpoint = str_field("endpoint")
            .filter(|e| !e.is_empty())
            .ok_or_else(|| format!("datasource {id}: `endpoint` is required to load it"))?;
        let layer = match str_field("layer") {
            Some("news") => EarthDomain::News,
            Some("vessels") => EarthDomain::Vessels,
            Some(other) => {
                return Err(format!(
                    "datasource {id}: layer `{other}` cannot be loaded from a proposal; \
                     the registry loads news and vessels sources (other layers come from \
                     the [agents.earth] configuration)"
                ))
            }
            None => return Err(format!("datasource {id}: `layer` is required to load it")),
        };
        match str_field("format") {
            Some("geojson") | Some("json") | None => {}
            Some(other) => {
                return Err(format!(
                    "datasource {id}: format `{other}` is not loadable for layer {}; \
                     use `geojson` (a FeatureCollection of Points)",
                    layer.as_str()
                ))
            }
        }
        Ok(DatasourceSpec {
            id: id.to_string(),
            enabled,
            layer,
            endpoint: endpoint.to_string(),
            timeout,
            refresh,
        })
    }

    /// Fetches and parses the source. Errors: one sentence naming the
    /// datasource and the URL (status, connection, timeout, size, JSON).
    pub async fn fetch(&self) -> Result<GeoLayerData, String> {
        GeoLayerData::fetch(
            &self.endpoint,
            self.layer,
            self.timeout,
            &format!("{} ({})", self.endpoint, self.id),
        )
        .await
        .map_err(|e| format!("datasource {}: {e}", self.id))
    }
}

/// One installed source.
struct Installed {
    spec: DatasourceSpec,
    data: GeoLayerData,
}

/// The base catalog, the installed sources and their refresh tasks.
pub struct EarthSources {
    base: Arc<EntityCatalog>,
    shared: Arc<SharedCatalog>,
    installed: Mutex<BTreeMap<String, Installed>>,
    refreshers: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
    /// Held from fetch to install by an apply, and by a refresh's install,
    /// so that two changes of sources never interleave.
    apply_lock: tokio::sync::Mutex<()>,
    /// Longest fetch while a proposal is applied (below the tool timeout).
    apply_fetch_limit: Duration,
}

impl std::fmt::Debug for EarthSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.lock_installed().keys().cloned().collect();
        f.debug_struct("EarthSources")
            .field("installed", &ids)
            .finish()
    }
}

impl Drop for EarthSources {
    fn drop(&mut self) {
        if let Ok(m) = self.refreshers.lock() {
            for h in m.values() {
                h.abort();
            }
        }
    }
}

impl EarthSources {
    /// Sources over `shared`, whose current catalog is the base (the one
    /// loaded from the configuration). A fetch while applying a proposal
    /// takes at most `apply_fetch_limit` (whatever its `timeout_seconds`),
    /// so that it ends before the apply tool's timeout.
    pub fn new(shared: Arc<SharedCatalog>, apply_fetch_limit: Duration) -> EarthSources {
        EarthSources {
            base: shared.current(),
            shared,
            installed: Mutex::new(BTreeMap::new()),
            refreshers: Mutex::new(HashMap::new()),
            apply_lock: tokio::sync::Mutex::new(()),
            apply_fetch_limit,
        }
    }

    /// See [`EarthSources::new`].
    pub fn apply_fetch_limit(&self) -> Duration {
        self.apply_fetch_limit
    }

    fn lock_installed(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Installed>> {
        self.installed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serializes source changes: hold the guard from fetching a proposal's
    /// source until [`EarthSources::install`] returns.
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.apply_lock.lock().await
    }

    /// Ids of the installed sources.
    pub fn installed(&self) -> Vec<String> {
        self.lock_installed().keys().cloned().collect()
    }

    /// Puts `spec` in force: with `data` its features replace the ones the
    /// source had (a disabled spec, or `None`, removes them), the catalog
    /// is rebuilt and swapped in, and the refresh task is (re)started when
    /// the spec has a period. Call with [`EarthSources::lock`] held. The
    /// catalog is rebuilt on a blocking thread (it copies every domain).
    pub async fn install(self: &Arc<Self>, spec: DatasourceSpec, data: Option<GeoLayerData>) {
        let id = spec.id.clone();
        let refresh = spec.refresh.filter(|_| spec.enabled);
        {
            let mut m = self.lock_installed();
            match data.filter(|_| spec.enabled) {
                Some(data) => {
                    m.insert(
                        id.clone(),
                        Installed {
                            spec: spec.clone(),
                            data,
                        },
                    );
                }
                None => {
                    m.remove(&id);
                }
            }
        }
        self.rebuild().await;
        let mut tasks = self.refreshers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = tasks.remove(&id) {
            old.abort();
        }
        if let Some(period) = refresh {
            let weak = Arc::downgrade(self);
            tasks.insert(id, tokio::spawn(refresh_loop(weak, spec, period)));
        }
    }

    /// [`EarthSources::rebuild_now`] on a blocking thread.
    async fn rebuild(self: &Arc<Self>) {
        let me = Arc::clone(self);
        if let Err(e) = tokio::task::spawn_blocking(move || me.rebuild_now()).await {
            tracing::error!(error = %e, "rebuilding the Earth catalog failed");
        }
    }

    /// Builds `base + installed sources` and puts it in force.
    fn rebuild_now(&self) {
        let m = self.lock_installed();
        let datas: Vec<&GeoLayerData> = m.values().map(|i| &i.data).collect();
        let next = if datas.is_empty() {
            Arc::clone(&self.base)
        } else {
            Arc::new(self.base.with_geo_sources(&datas))
        };
        drop(m);
        self.shared.replace(next);
    }

    /// Loads every stored, enabled source at start (fetched concurrently,
    /// each within its timeout capped at the apply limit). A source that
    /// cannot be fetched is logged and left out (its refresh task, if any,
    /// keeps trying); the registry starts regardless.
    pub async fn load_stored(self: &Arc<Self>, settings: Vec<(String, Value)>) {
        let _guard = self.lock().await;
        let specs: Vec<DatasourceSpec> = settings
            .into_iter()
            .filter_map(|(id, v)| match DatasourceSpec::from_setting(&id, &v) {
                Ok(s) if s.enabled => Some(s),
                Ok(_) => None,
                Err(e) => {
                    tracing::warn!(datasource = %id, error = %e, "stored datasource not loaded");
                    None
                }
            })
            .collect();
        // Bounded like an apply, so that a hanging source delays the start
        // by at most that long.
        let fetched = futures::future::join_all(specs.iter().map(|s| {
            let mut bounded = s.clone();
            bounded.timeout = s.timeout.min(self.apply_fetch_limit);
            async move { bounded.fetch().await }
        }))
        .await;
        for (spec, r) in specs.into_iter().zip(fetched) {
            match r {
                Ok(data) => {
                    tracing::info!(datasource = %spec.id, layer = spec.layer.as_str(),
                        features = data.len(), "datasource loaded");
                    self.install(spec, Some(data)).await;
                }
                Err(e) => {
                    tracing::warn!(datasource = %spec.id, error = %e,
                        "stored datasource could not be fetched at start; its layer lacks it");
                    // Keep refreshing it, when it has a period.
                    let refresh = spec.refresh;
                    if let Some(period) = refresh {
                        let weak = Arc::downgrade(self);
                        let id = spec.id.clone();
                        self.refreshers
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(id, tokio::spawn(refresh_loop(weak, spec, period)));
                    }
                }
            }
        }
    }
}

/// Refetches `spec` every `period` (tokio's monotonic clock) while the
/// sources live; a failed fetch is logged and the old features stay.
async fn refresh_loop(sources: Weak<EarthSources>, spec: DatasourceSpec, period: Duration) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let result = spec.fetch().await;
        let Some(s) = sources.upgrade() else {
            return;
        };
        match result {
            Ok(data) => {
                let _guard = s.lock().await;
                let superseded = {
                    let mut m = s.lock_installed();
                    // Only the spec this task was started for (a newer
                    // apply restarts the task; a source stored but not
                    // fetched at start has no entry yet).
                    let superseded = m.get(&spec.id).is_some_and(|i| i.spec != spec);
                    if !superseded {
                        m.insert(
                            spec.id.clone(),
                            Installed {
                                spec: spec.clone(),
                                data,
                            },
                        );
                    }
                    superseded
                };
                if superseded {
                    return;
                }
                s.rebuild().await;
                tracing::debug!(datasource = %spec.id, "datasource refreshed");
            }
            Err(e) => {
                tracing::warn!(datasource = %spec.id, error = %e,
                    "datasource refresh failed; the previous data stays in force");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_spec_needs_an_endpoint_and_a_loadable_layer_and_format() {
        let ok = DatasourceSpec::from_setting(
            "ais",
            &json!({"endpoint": "http://h/v.geojson", "layer": "vessels", "format": "geojson",
                    "refresh_interval_seconds": 60}),
        )
        .unwrap();
        assert_eq!(ok.layer, EarthDomain::Vessels);
        assert_eq!(ok.refresh, Some(Duration::from_secs(60)));
        let e = DatasourceSpec::from_setting("ais", &json!({"layer": "vessels"})).unwrap_err();
        assert!(e.contains("`endpoint` is required"), "{e}");
        let e = DatasourceSpec::from_setting(
            "tle",
            &json!({"endpoint": "http://h/a.txt", "layer": "satellites", "format": "tle"}),
        )
        .unwrap_err();
        assert!(e.contains("layer `satellites`"), "{e}");
        let e = DatasourceSpec::from_setting(
            "ais",
            &json!({"endpoint": "http://h/a.csv", "layer": "vessels", "format": "csv"}),
        )
        .unwrap_err();
        assert!(e.contains("format `csv`"), "{e}");
        let off = DatasourceSpec::from_setting("ais", &json!({"enabled": false})).unwrap();
        assert!(!off.enabled);
    }
}
