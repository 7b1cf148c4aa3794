//! The HTTP client the gateways share (model, speech, web search): built
//! once per settings generation. When the machine's CA certificates cannot
//! be loaded (no `ca-certificates` package), building a TLS client fails;
//! the registry must still start, so [`build`] falls back to a client
//! that trusts no certificate authority: plain-HTTP endpoints (a local
//! gateway) keep working and HTTPS calls fail with a certificate error
//! that names the cause, instead of the process panicking at start.

/// A client from `make()`; when it cannot be built, one from `make()`
/// with no built-in roots, after a warning naming `what` and the cause.
pub fn build(what: &str, make: impl Fn() -> reqwest::ClientBuilder) -> reqwest::Client {
    match make().build() {
        Ok(client) => client,
        Err(e) => {
            tracing::warn!(
                client = what,
                error = %e,
                "cannot load the system's CA certificates (install ca-certificates); \
                 HTTPS calls will fail until they can be loaded"
            );
            // Without roots nothing is loaded from the system, so this
            // builds wherever the first one failed for its certificates.
            make()
                .tls_certs_only(std::iter::empty())
                .build()
                .expect("an HTTP client that trusts no certificate authority")
        }
    }
}
