//! The PostgreSQL the replica tests share (127.0.0.1:5432, trust auth,
//! database `test`, or `$BENCHLINK_TEST_POSTGRES_URL`): a schema of its
//! own per test ([`PgSchema`]), dropped when the test ends. A missing
//! server follows the missing-service rule
//! ([`benchlink_testkit::skip_unless_ci`]).
//!
//! The sync `postgres` client runs on a thread of its own for each call:
//! it must never be used on a tokio worker.

use anyhow::{anyhow, Result};

/// The server's URL: `$BENCHLINK_TEST_POSTGRES_URL`, else
/// `postgres://postgres@127.0.0.1:5432/test`.
pub fn url() -> String {
    std::env::var("BENCHLINK_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// One test's schema on the shared server.
pub struct PgSchema {
    /// The server's URL ([`url`]).
    pub url: String,
    /// `bl_e2e_<tag>_<pid>_<n>`.
    pub name: String,
}

impl PgSchema {
    /// A fresh schema name (the registry creates the schema itself), or
    /// `None` after the missing-service rule when the server is not
    /// reachable.
    pub fn fresh(tag: &str) -> Option<PgSchema> {
        let url = url();
        let addr = url
            .parse::<postgres::Config>()
            .ok()
            .and_then(|c| {
                let host = match c.get_hosts().first()? {
                    postgres::config::Host::Tcp(h) => h.clone(),
                    #[allow(unreachable_patterns)]
                    _ => return None,
                };
                Some(format!(
                    "{host}:{}",
                    c.get_ports().first().copied().unwrap_or(5432)
                ))
            })
            .unwrap_or_else(|| "127.0.0.1:5432".into());
        let addr = addr.replace("localhost", "127.0.0.1");
        if !benchlink_testkit::reachable(&addr) {
            benchlink_testkit::skip_unless_ci(&format!(
                "PostgreSQL is not reachable at {addr} (./scripts/setup.sh, or set BENCHLINK_TEST_POSTGRES_URL)"
            ));
            return None;
        }
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("bl_e2e_{tag}_{}_{n}", std::process::id());
        Some(PgSchema { url, name })
    }

    /// The lines of the registry's `[store]` table that put it on this
    /// schema ([`crate::bench::LabOptions::registry_store_toml`]).
    pub fn store_toml(&self) -> String {
        format!(
            "backend = \"postgres\"\nurl = \"{}\"\nschema = \"{}\"\n",
            self.url, self.name
        )
    }

    /// Run `sql` in this schema and return every row, each column read as
    /// text (`NULL` as `None`). Casts in `sql` (`::text`) make other types
    /// readable.
    ///
    /// Errors: the server refuses the query.
    pub fn rows(&self, sql: &str) -> Result<Vec<Vec<Option<String>>>> {
        let (url, schema, sql) = (self.url.clone(), self.name.clone(), sql.to_string());
        std::thread::spawn(move || -> Result<Vec<Vec<Option<String>>>> {
            let mut c = postgres::Client::connect(&url, postgres::NoTls)?;
            c.batch_execute(&format!("SET search_path TO \"{schema}\""))?;
            let rows = c.query(sql.as_str(), &[])?;
            Ok(rows
                .iter()
                .map(|r| {
                    (0..r.len())
                        .map(|i| r.get::<_, Option<String>>(i))
                        .collect()
                })
                .collect())
        })
        .join()
        .map_err(|_| anyhow!("the PostgreSQL thread panicked"))?
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let (url, schema) = (self.url.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            if let Ok(mut c) = postgres::Client::connect(&url, postgres::NoTls) {
                let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"));
            }
        })
        .join();
    }
}
