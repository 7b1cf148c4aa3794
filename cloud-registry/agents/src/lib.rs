//! The registry's agent runtime and the Earth command (docs/earth-command.md):
//! runs, steps, evidence and proposals; the tool registry and policy; the
//! OpenAI-compatible model and speech gateways; the prompt registry.
//! Stands on `registry-core` only, never on the bench side of the registry.
//!
//! Wiring (the registry app does this):
//! ```ignore
//! let db = Db::open(path, |c| { agents::migrate(c)?; /* other modules */ Ok(()) })?;
//! let catalog = Arc::new(EntityCatalog::load_with_remote(&cfg.agents.earth_data()).await?);
//! let svc = Arc::new(AgentService::new(db, catalog, cfg.agents.clone()).await?);
//! let app = Router::new().nest("/api/v1/agents", agents::router(svc))
//!     .layer(Extension(authenticator));
//! ```
//!
//! Module map, each layer using only the ones below it:
//! - [`api`]: the HTTP routes and the HTTP form of [`AgentError`];
//! - [`service`]: [`AgentService`], what the routes call;
//! - [`earth`]: the Earth command ([`earth::command`]) over the entity
//!   catalog, resolver and validator;
//! - [`runtime`]: the run engine (model loop, tool steps, stop signals);
//! - [`tools`] (registry), [`proposals`] (create/apply), [`policy`]
//!   (rules), [`model`] (chat gateway), [`protocol`] (JSON tool calls),
//!   [`prompts`], [`speech`] (ASR gateway), [`websearch`], [`integrations`]
//!   (where applied `external_integration` settings land);
//! - [`store`] (tables; hands each committed change to an
//!   [`events::AgentEventSink`]), [`events`], [`config`] (`[agents]`),
//!   [`error`].

pub mod api;
pub mod config;
pub mod earth;
pub mod error;
pub mod events;
pub mod http_client;
pub mod integrations;
pub mod model;
pub mod policy;
pub mod program;
pub mod prompts;
pub mod proposals;
pub mod protocol;
pub mod runtime;
pub mod service;
pub mod speech;
pub mod speech_command;
pub mod store;
pub mod tools;
pub mod websearch;

pub use api::{geo_router, router};
pub use config::AgentsConfig;
pub use error::AgentError;
pub use service::AgentService;
pub use store::migrate;
