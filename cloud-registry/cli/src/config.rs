//! Where the registry's URL and the caller's token come from, first found
//! wins: the flags `--url` / `--token` / `--token-file`, the environment
//! (`BENCHLINK_URL`, `BENCHLINK_TOKEN`, `BENCHLINK_TOKEN_FILE`), then the
//! config file (`--config`, `BENCHLINK_CONFIG`, or
//! `$XDG_CONFIG_HOME/benchlink/config.toml`, default
//! `~/.config/benchlink/config.toml`):
//!
//! ```toml
//! url = "http://127.0.0.1:8080"
//! token_file = "/home/me/.config/benchlink/token"   # mode 0600
//! ca_file = "/etc/benchlink/lab-ca.pem"   # an https:// registry's private CA
//! ```
//!
//! `--ca-file` / `BENCHLINK_CA_FILE` win over the file's `ca_file`.
//!
//! A token file must not be readable by group or others (mode 0600 or
//! stricter); otherwise it is refused as a usage error.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::exit::Failure;

/// The config file's keys (every key optional, unknown keys refused).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// The registry's base URL, e.g. `http://127.0.0.1:8080`.
    pub url: Option<String>,
    /// A file holding the bearer token (its first line); mode 0600.
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA certificates to trust for an `https://` URL.
    pub ca_file: Option<PathBuf>,
}

/// What the command line gave (already merged with the environment by
/// clap's `env` attributes).
#[derive(Debug, Default, Clone)]
pub struct Given {
    /// `--url` / `BENCHLINK_URL`.
    pub url: Option<String>,
    /// `--token` / `BENCHLINK_TOKEN`.
    pub token: Option<String>,
    /// `--token-file` / `BENCHLINK_TOKEN_FILE`.
    pub token_file: Option<PathBuf>,
    /// `--config` / `BENCHLINK_CONFIG`.
    pub config: Option<PathBuf>,
    /// `--ca-file` / `BENCHLINK_CA_FILE`.
    pub ca_file: Option<PathBuf>,
}

/// The resolved URL and token.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Base URL without a trailing `/`.
    pub url: String,
    /// Bearer token.
    pub token: String,
    /// The only CA certificates to trust (PEM file), when given.
    pub ca_file: Option<PathBuf>,
}

/// The default config file path (`$XDG_CONFIG_HOME` or `~/.config`).
pub fn default_config_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("benchlink").join("config.toml"))
}

/// Read a token file: its first line, trimmed.
///
/// Errors (usage): unreadable, empty, or readable by group or others.
pub fn read_token_file(path: &Path) -> Result<String, Failure> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(path)
            .map_err(|e| Failure::usage(format!("token file {}: {e}", path.display())))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(Failure::usage(format!(
                "token file {} has mode {mode:04o}; others may read it: chmod 600 {}",
                path.display(),
                path.display()
            )));
        }
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("token file {}: {e}", path.display())))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        return Err(Failure::usage(format!(
            "token file {} is empty",
            path.display()
        )));
    }
    Ok(token)
}

/// `url` without a trailing `/`, when it is an absolute `http` or
/// `https` URL with a host.
///
/// Errors (usage): anything else, e.g. `not-a-url` or `ftp://host`.
pub fn check_url(url: &str) -> Result<String, Failure> {
    let bad = |why: &str| {
        Failure::usage(format!(
            "registry URL {url:?} {why}; give one like http://127.0.0.1:8080"
        ))
    };
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(&format!("is not a URL ({e})")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("is not http or https"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("has no host"));
    }
    Ok(url.trim_end_matches('/').to_string())
}

impl Given {
    /// From the flags' (or environment's) raw values; an empty value is
    /// treated as not given, so `BENCHLINK_TOKEN_FILE=` falls through to
    /// the next source.
    pub fn from_values(
        url: Option<String>,
        token: Option<String>,
        token_file: Option<String>,
        config: Option<String>,
    ) -> Given {
        let given = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
        Given {
            url: given(url),
            token: given(token),
            token_file: given(token_file).map(PathBuf::from),
            config: given(config).map(PathBuf::from),
            ca_file: None,
        }
    }

    /// Resolve the URL and the token.
    ///
    /// Errors (usage): a config file named explicitly that is missing or
    /// does not parse, no URL or no token anywhere, a bad token file.
    pub fn resolve(&self) -> Result<Settings, Failure> {
        let (path, explicit) = match &self.config {
            Some(p) => (Some(p.clone()), true),
            None => (default_config_path(), false),
        };
        let file = match path {
            Some(p) if explicit || p.exists() => {
                let text = std::fs::read_to_string(&p)
                    .map_err(|e| Failure::usage(format!("config file {}: {e}", p.display())))?;
                toml::from_str::<ConfigFile>(&text)
                    .map_err(|e| Failure::usage(format!("config file {}: {e}", p.display())))?
            }
            _ => ConfigFile::default(),
        };
        let url = self.url.clone().or(file.url).ok_or_else(|| {
            Failure::usage(
                "no registry URL: pass --url, set BENCHLINK_URL, or `url` in the config file",
            )
        })?;
        let token = match (&self.token, &self.token_file, &file.token_file) {
            (Some(t), _, _) => t.trim().to_string(),
            (None, Some(f), _) | (None, None, Some(f)) => read_token_file(f)?,
            (None, None, None) => {
                return Err(Failure::usage(
                    "no token: pass --token or --token-file, set BENCHLINK_TOKEN, or `token_file` in the config file",
                ))
            }
        };
        Ok(Settings {
            url: check_url(&url)?,
            token,
            ca_file: self.ca_file.clone().or(file.ca_file),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_token_file_others_may_read_is_refused_and_flags_win() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("token");
        std::fs::write(&f, "secret-token\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = read_token_file(&f).unwrap_err();
        assert_eq!(e.code, 2);
        assert!(e.message.contains("chmod 600"), "{}", e.message);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read_token_file(&f).unwrap(), "secret-token");

        let cfg = dir.path().join("config.toml");
        std::fs::write(
            &cfg,
            format!(
                "url = \"http://file:1/\"\ntoken_file = {:?}\n",
                f.display().to_string()
            ),
        )
        .unwrap();
        let from_file = Given {
            config: Some(cfg.clone()),
            ..Given::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(from_file.url, "http://file:1");
        assert_eq!(from_file.token, "secret-token");
        let flags = Given {
            url: Some("http://flag:2".into()),
            token: Some("flag-token".into()),
            config: Some(cfg),
            ..Given::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(
            (flags.url.as_str(), flags.token.as_str()),
            ("http://flag:2", "flag-token")
        );
        for bad in ["not-a-url", "ftp://host:21", "http://"] {
            let e = Given {
                url: Some(bad.into()),
                token: Some("t".into()),
                ..Given::default()
            }
            .resolve()
            .unwrap_err();
            assert_eq!(e.code, 2, "{bad}");
            assert!(e.message.contains(bad), "{}", e.message);
        }
        let empty = Given::from_values(
            Some("http://h:1".into()),
            None,
            Some(String::new()),
            Some(cfg_path_string(&dir)),
        );
        assert_eq!(empty.token_file, None);
        let e = empty.resolve().unwrap_err();
        assert!(
            e.message.starts_with("no token:"),
            "an empty BENCHLINK_TOKEN_FILE counts as not given: {}",
            e.message
        );
        let missing = Given {
            config: Some(dir.path().join("nope.toml")),
            ..Given::default()
        }
        .resolve()
        .unwrap_err();
        assert_eq!(missing.code, 2);
    }

    fn cfg_path_string(dir: &tempfile::TempDir) -> String {
        let p = dir.path().join("empty.toml");
        std::fs::write(&p, "").unwrap();
        p.display().to_string()
    }
}
