//! The entity catalog in force and the map layers served from it
//! (docs/earth-command.md, "Layers"): [`SharedCatalog`] holds the catalog
//! every command, tool and layer reads and lets a reload swap it in one
//! step; [`LayerCache`] keeps each layer's serialized GeoJSON with its ETag
//! so that repeated fetches cost a hash-map look-up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use chrono::{DateTime, SubsecRound, Utc};

use super::entities::{EntityCatalog, Layer};
use crate::error::AgentError;

/// The catalog in force. Readers take a snapshot ([`SharedCatalog::current`],
/// an `Arc` clone under a read lock held for nanoseconds) and keep using it
/// even if a reload replaces it meanwhile.
#[derive(Debug)]
pub struct SharedCatalog {
    inner: RwLock<Arc<EntityCatalog>>,
}

impl SharedCatalog {
    /// Starts with `catalog`.
    pub fn new(catalog: Arc<EntityCatalog>) -> SharedCatalog {
        SharedCatalog {
            inner: RwLock::new(catalog),
        }
    }

    /// The catalog in force now.
    pub fn current(&self) -> Arc<EntityCatalog> {
        Arc::clone(&self.inner.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Puts `catalog` in force; returns the one it replaces.
    pub fn replace(&self, catalog: Arc<EntityCatalog>) -> Arc<EntityCatalog> {
        let mut g = self.inner.write().unwrap_or_else(|e| e.into_inner());
        std::mem::replace(&mut *g, catalog)
    }
}

/// A layer body ready to send.
#[derive(Debug, Clone)]
pub struct LayerBody {
    /// Strong ETag, quoted: `"satellites-{catalog version}-{unix s}"`, or
    /// without the time for layers that do not depend on it.
    pub etag: String,
    /// The FeatureCollection, serialized.
    pub body: Bytes,
}

/// The last body built for each layer. A body is reused while the catalog
/// version (and, for satellites, the requested second) is the same.
#[derive(Debug, Default)]
pub struct LayerCache {
    entries: Mutex<HashMap<Layer, LayerBody>>,
}

/// `at` truncated to whole seconds: the resolution of the satellites layer.
pub fn layer_time(at: DateTime<Utc>) -> DateTime<Utc> {
    at.trunc_subsecs(0)
}

impl LayerCache {
    /// The ETag `layer` has in `catalog` at `at` (already whole seconds).
    pub fn etag(catalog: &EntityCatalog, layer: Layer, at: DateTime<Utc>) -> String {
        if layer.is_timed() {
            format!(
                "\"{}-{}-{}\"",
                layer.as_str(),
                catalog.version(),
                at.timestamp()
            )
        } else {
            format!("\"{}-{}\"", layer.as_str(), catalog.version())
        }
    }

    /// The body of `layer` in `catalog` at `at` (whole seconds): the cached
    /// one when its ETag matches, else built on a blocking thread and
    /// cached. Errors: [`AgentError::Internal`] if that thread dies or the
    /// collection does not serialize.
    pub async fn get(
        &self,
        catalog: Arc<EntityCatalog>,
        layer: Layer,
        at: DateTime<Utc>,
    ) -> Result<LayerBody, AgentError> {
        let etag = Self::etag(&catalog, layer, at);
        if let Some(hit) = self
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&layer)
            .filter(|b| b.etag == etag)
        {
            return Ok(hit.clone());
        }
        let body = tokio::task::spawn_blocking(move || {
            serde_json::to_vec(&catalog.layer_collection(layer, at))
        })
        .await
        .map_err(|e| AgentError::Internal(format!("layer task died: {e}")))?
        .map_err(|e| AgentError::Internal(format!("layer did not serialize: {e}")))?;
        let built = LayerBody {
            etag,
            body: Bytes::from(body),
        };
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(layer, built.clone());
        Ok(built)
    }
}
