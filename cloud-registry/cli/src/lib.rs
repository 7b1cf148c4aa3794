//! `benchlink`, the registry's client: the HTTP client library
//! ([`client`]), the command line ([`cli`]: definitions, [`run`]: what each
//! command does), the settings it reads ([`config`]) and `benchlink mcp`,
//! an MCP server for agent hosts ([`mcp`]); admins' maintenance
//! commands are in [`maintenance`]; [`bundle`] checks an audit bundle
//! offline.

pub mod bundle;
pub mod cli;
pub mod client;
pub mod config;
pub mod exit;
pub mod maintenance;
pub mod mcp;
pub mod run;
