//! The Earth natural-language command (docs/earth-command.md, "An Earth command"): the
//! entity service ([`entities`]), the deterministic [`resolver`] with its
//! [`regions`], the plan [`validate`]or and the [`command`] service that
//! records each command as an agent run; [`geo`] holds the catalog in force
//! and serves it as map layers; [`sources`] lays applied datasource settings
//! over it.

pub mod command;
pub mod entities;
pub mod geo;
pub mod regions;
pub mod resolver;
pub mod sources;
pub mod validate;
