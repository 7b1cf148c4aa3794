//! Bearer tokens over HTTP: minting, listing, revoking, and `whoami`
//! (docs/http-api.md "Tokens"). The tokens themselves (hashes, roles, the
//! cache) are [`crate::auth`]'s; this folder is only their routes.

pub mod api;
