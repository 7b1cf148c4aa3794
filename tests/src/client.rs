//! The registry's HTTP client the tests use: [`benchlink::client`], the
//! `benchlink` CLI's own library, re-exported under its old path.

pub use benchlink::client::*;
