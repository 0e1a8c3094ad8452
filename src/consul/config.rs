//! Where to reach Consul and with what credentials: flags first, then Consul's
//! standard environment variables, then defaults. Every value remembers its origin
//! so that errors can say which flag or variable to fix.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub const DEFAULT_ADDR: &str = "127.0.0.1:8500";

/// Connection flags as given on the command line (all optional).
#[derive(Debug, Clone, Default)]
pub struct ConnFlags {
    pub http_addr: Option<String>,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub ca_path: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub datacenter: Option<String>,
    pub namespace: Option<String>,
    pub tls_server_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSetting {
    pub path: PathBuf,
    pub origin: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsSettings {
    pub ca_file: Option<FileSetting>,
    pub ca_path: Option<FileSetting>,
    pub client_cert: Option<FileSetting>,
    pub client_key: Option<FileSetting>,
    pub verify: bool,
    /// The name sent as SNI and checked against the agent's certificate, instead of
    /// the address's host (`consul lock -tls-server-name`).
    pub server_name: Option<String>,
}

/// Resolved connection settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnConfig {
    /// `http://host:port` or `https://host:port`, without a trailing slash.
    pub base_url: String,
    /// `host:port` as shown in messages.
    pub addr: String,
    pub addr_origin: String,
    pub token: Option<String>,
    pub token_origin: String,
    pub datacenter: Option<String>,
    pub namespace: Option<String>,
    pub tls: TlsSettings,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("invalid Consul address {value:?} (from {origin}): {reason}; expected host:port, http://host:port or https://host:port")]
    InvalidAddr {
        value: String,
        origin: String,
        reason: String,
    },
    #[error("cannot read the Consul token file {path} (from {origin}): {reason}")]
    TokenFile {
        path: String,
        origin: String,
        reason: String,
    },
    #[error("invalid value {value:?} for {var}: expected true or false")]
    InvalidBool { var: String, value: String },
    #[error("the ACL token from {origin} contains a control character; check it for stray bytes")]
    TokenControl { origin: String },
    #[error(
        "invalid TLS server name {value:?} (from {origin}): expected a DNS name or an IP address"
    )]
    InvalidServerName { value: String, origin: String },
}

impl ConnConfig {
    /// Resolves settings from flags and the process environment.
    pub fn from_env(flags: &ConnFlags) -> Result<Self, ConfigError> {
        Self::resolve(flags, &|name| std::env::var(name).ok())
    }

    /// Resolves settings from flags and the given environment lookup.
    pub fn resolve(
        flags: &ConnFlags,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        let env_bool = |name: &str| -> Result<Option<bool>, ConfigError> {
            match env(name) {
                None => Ok(None),
                Some(v) => parse_bool(&v).map(Some).ok_or(ConfigError::InvalidBool {
                    var: name.into(),
                    value: v,
                }),
            }
        };

        let (raw_addr, addr_origin) = match (&flags.http_addr, env("CONSUL_HTTP_ADDR")) {
            (Some(a), _) => (a.clone(), "--http-addr".to_string()),
            (None, Some(a)) => (a, "CONSUL_HTTP_ADDR".to_string()),
            (None, None) => (DEFAULT_ADDR.to_string(), "the default".to_string()),
        };
        let ssl = env_bool("CONSUL_HTTP_SSL")?.unwrap_or(false);
        let (scheme, addr) =
            split_addr(&raw_addr, ssl).map_err(|reason| ConfigError::InvalidAddr {
                value: raw_addr.clone(),
                origin: addr_origin.clone(),
                reason,
            })?;

        let (token, token_origin) = resolve_token(flags, &env)?;

        let file = |flag: &Option<PathBuf>, flag_name: &str, var: &str| -> Option<FileSetting> {
            match (flag, env(var)) {
                (Some(p), _) => Some(FileSetting {
                    path: p.clone(),
                    origin: flag_name.to_string(),
                }),
                (None, Some(p)) => Some(FileSetting {
                    path: PathBuf::from(p),
                    origin: var.to_string(),
                }),
                (None, None) => None,
            }
        };
        let tls = TlsSettings {
            ca_file: file(&flags.ca_file, "--ca-file", "CONSUL_CACERT"),
            ca_path: file(&flags.ca_path, "--ca-path", "CONSUL_CAPATH"),
            client_cert: file(&flags.client_cert, "--client-cert", "CONSUL_CLIENT_CERT"),
            client_key: file(&flags.client_key, "--client-key", "CONSUL_CLIENT_KEY"),
            verify: env_bool("CONSUL_HTTP_SSL_VERIFY")?.unwrap_or(true),
            server_name: resolve_server_name(flags, &env)?,
        };

        Ok(ConnConfig {
            base_url: format!("{scheme}://{addr}"),
            addr,
            addr_origin,
            token,
            token_origin,
            datacenter: flags
                .datacenter
                .clone()
                .or_else(|| env("CONSUL_DATACENTER")),
            namespace: flags.namespace.clone().or_else(|| env("CONSUL_NAMESPACE")),
            tls,
        })
    }

    pub fn is_https(&self) -> bool {
        self.base_url.starts_with("https://")
    }

    /// The agent's host, without brackets or port.
    pub fn host(&self) -> String {
        match self.addr.rsplit_once(':') {
            Some((h, _)) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']'),
            _ => self.addr.as_str(),
        }
        .to_string()
    }

    /// Loopback addresses never go through a proxy from the environment.
    pub fn is_loopback(&self) -> bool {
        let host = self.host();
        let host = host.as_str();
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .map(|ip| ip.is_loopback())
                .unwrap_or(false)
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "yes" => Some(true),
        "0" | "f" | "false" | "no" => Some(false),
        _ => None,
    }
}

/// Splits `http://h:p`, `https://h:p` or `h:p` into scheme and `h:p`.
fn split_addr(raw: &str, ssl: bool) -> Result<(&'static str, String), String> {
    let raw = raw.trim();
    // Schemes are case-insensitive (RFC 3986), as Go's url.Parse treats them.
    let lower = raw.get(..8).unwrap_or(raw).to_ascii_lowercase();
    let (scheme, rest) = if lower.starts_with("https://") {
        ("https", &raw[8..])
    } else if lower.starts_with("http://") {
        ("http", &raw[7..])
    } else if raw.contains("://") {
        return Err("unsupported scheme (unix sockets are not supported)".into());
    } else if ssl {
        ("https", raw)
    } else {
        ("http", raw)
    };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() {
        return Err("empty host".into());
    }
    if rest.contains('/') || rest.contains(char::is_whitespace) || rest.contains('@') {
        return Err("a path, user or spaces are not allowed".into());
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(':') || h.starts_with('[') => (h, Some(p)),
        _ => (rest, None),
    };
    if host.is_empty() {
        return Err("empty host".into());
    }
    let port: u16 = match port {
        Some(p) => p.parse().map_err(|_| format!("invalid port {p:?}"))?,
        None if scheme == "https" => 8501,
        None => 8500,
    };
    if port == 0 {
        return Err("port 0 is not a valid port".into());
    }
    Ok((scheme, format!("{host}:{port}")))
}

fn resolve_token(
    flags: &ConnFlags,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Option<String>, String), ConfigError> {
    let (token, origin) = resolve_token_unchecked(flags, env)?;
    // A control character would make the request header invalid, which the HTTP library
    // reports as if Consul were unreachable.
    if token
        .as_deref()
        .is_some_and(|t| t.chars().any(char::is_control))
    {
        return Err(ConfigError::TokenControl { origin });
    }
    Ok((token, origin))
}

fn resolve_token_unchecked(
    flags: &ConnFlags,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Option<String>, String), ConfigError> {
    if let Some(t) = &flags.token {
        return Ok((Some(t.clone()), "--token".into()));
    }
    let read = |path: &PathBuf, origin: &str| -> Result<(Option<String>, String), ConfigError> {
        let bytes = crate::readfile::read_bounded(
            path,
            crate::readfile::TOKEN_LIMIT,
            "the token file limit",
        )
        .map_err(|reason| ConfigError::TokenFile {
            path: path.display().to_string(),
            origin: origin.to_string(),
            reason,
        })?;
        let text = String::from_utf8_lossy(&bytes);
        let token = text.trim().to_string();
        Ok((
            (!token.is_empty()).then_some(token),
            format!("{origin} ({})", path.display()),
        ))
    };
    if let Some(p) = &flags.token_file {
        return read(p, "--token-file");
    }
    // As in Consul's api package, a token file from the environment wins over a token.
    if let Some(p) = env("CONSUL_HTTP_TOKEN_FILE") {
        return read(&PathBuf::from(p), "CONSUL_HTTP_TOKEN_FILE");
    }
    if let Some(t) = env("CONSUL_HTTP_TOKEN") {
        return Ok((Some(t), "CONSUL_HTTP_TOKEN".into()));
    }
    Ok((None, "no token".into()))
}

fn resolve_server_name(
    flags: &ConnFlags,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, ConfigError> {
    let (name, origin) = match (&flags.tls_server_name, env("CONSUL_TLS_SERVER_NAME")) {
        (Some(n), _) => (n.clone(), "--tls-server-name"),
        (None, Some(n)) => (n, "CONSUL_TLS_SERVER_NAME"),
        (None, None) => return Ok(None),
    };
    let ok = !name.is_empty()
        && name.len() <= 253
        && (name.parse::<std::net::IpAddr>().is_ok()
            || name.split('.').all(|l| {
                !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            }));
    if !ok {
        return Err(ConfigError::InvalidServerName {
            value: name,
            origin: origin.into(),
        });
    }
    Ok(Some(name.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve(flags: &ConnFlags, vars: &[(&str, &str)]) -> Result<ConnConfig, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ConnConfig::resolve(flags, &move |k| map.get(k).cloned())
    }

    #[test]
    fn default_address() {
        let c = resolve(&ConnFlags::default(), &[]).unwrap();
        assert_eq!(c.base_url, "http://127.0.0.1:8500");
        assert_eq!(c.addr_origin, "the default");
        assert!(c.is_loopback());
    }

    #[test]
    fn address_forms_and_precedence() {
        let c = resolve(
            &ConnFlags::default(),
            &[("CONSUL_HTTP_ADDR", "https://consul.example:9501")],
        )
        .unwrap();
        assert_eq!(c.base_url, "https://consul.example:9501");
        assert_eq!(c.addr_origin, "CONSUL_HTTP_ADDR");
        assert!(!c.is_loopback());
        let c = resolve(
            &ConnFlags::default(),
            &[
                ("CONSUL_HTTP_ADDR", "10.0.0.1:8500"),
                ("CONSUL_HTTP_SSL", "true"),
            ],
        )
        .unwrap();
        assert_eq!(c.base_url, "https://10.0.0.1:8500");
        let flags = ConnFlags {
            http_addr: Some("http://localhost:1234".into()),
            ..Default::default()
        };
        let c = resolve(&flags, &[("CONSUL_HTTP_ADDR", "other:1")]).unwrap();
        assert_eq!(c.base_url, "http://localhost:1234");
        assert_eq!(c.addr_origin, "--http-addr");
        let c = resolve(&ConnFlags::default(), &[("CONSUL_HTTP_ADDR", "[::1]:8500")]).unwrap();
        assert!(c.is_loopback());
    }

    #[test]
    fn invalid_addresses_name_their_origin() {
        for bad in [
            "unix:///tmp/sock",
            "host:notaport",
            "host:0",
            "http://",
            "a b:1",
            "h:1/path",
        ] {
            let err = resolve(&ConnFlags::default(), &[("CONSUL_HTTP_ADDR", bad)]).unwrap_err();
            assert!(err.to_string().contains("CONSUL_HTTP_ADDR"), "{bad}: {err}");
        }
        let err = resolve(&ConnFlags::default(), &[("CONSUL_HTTP_SSL", "maybe")]).unwrap_err();
        assert!(err.to_string().contains("CONSUL_HTTP_SSL"));
    }

    #[test]
    fn token_precedence() {
        let dir = std::env::temp_dir().join(format!("conlock-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "from-file\n").unwrap();
        let file_s = file.to_str().unwrap();

        let c = resolve(&ConnFlags::default(), &[("CONSUL_HTTP_TOKEN", "env-tok")]).unwrap();
        assert_eq!(
            (c.token.as_deref(), c.token_origin.as_str()),
            (Some("env-tok"), "CONSUL_HTTP_TOKEN")
        );
        let c = resolve(
            &ConnFlags::default(),
            &[
                ("CONSUL_HTTP_TOKEN", "env-tok"),
                ("CONSUL_HTTP_TOKEN_FILE", file_s),
            ],
        )
        .unwrap();
        assert_eq!(c.token.as_deref(), Some("from-file"));
        assert!(c.token_origin.starts_with("CONSUL_HTTP_TOKEN_FILE"));
        let flags = ConnFlags {
            token: Some("flag-tok".into()),
            ..Default::default()
        };
        let c = resolve(&flags, &[("CONSUL_HTTP_TOKEN_FILE", file_s)]).unwrap();
        assert_eq!(
            (c.token.as_deref(), c.token_origin.as_str()),
            (Some("flag-tok"), "--token")
        );
        let err = resolve(
            &ConnFlags::default(),
            &[("CONSUL_HTTP_TOKEN_FILE", "/nonexistent/tok")],
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("/nonexistent/tok")
                && err.to_string().contains("CONSUL_HTTP_TOKEN_FILE")
        );
        let flags = ConnFlags {
            token: Some("bad\u{1}tok".into()),
            ..Default::default()
        };
        let err = resolve(&flags, &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the ACL token from --token contains a control character; check it for stray bytes"
        );
        let err = resolve(
            &ConnFlags::default(),
            &[("CONSUL_HTTP_TOKEN_FILE", "/dev/zero")],
        )
        .unwrap_err();
        assert!(err.to_string().contains("larger than 65536 bytes"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn upper_case_schemes_and_server_names() {
        let c = resolve(&ConnFlags::default(), &[("CONSUL_HTTP_ADDR", "HTTP://h:1")]).unwrap();
        assert_eq!(c.base_url, "http://h:1");
        let c = resolve(&ConnFlags::default(), &[("CONSUL_HTTP_ADDR", "Https://h")]).unwrap();
        assert_eq!(c.base_url, "https://h:8501");
        let c = resolve(
            &ConnFlags::default(),
            &[("CONSUL_TLS_SERVER_NAME", "Consul.Example")],
        )
        .unwrap();
        assert_eq!(c.tls.server_name.as_deref(), Some("consul.example"));
        let flags = ConnFlags {
            tls_server_name: Some("a b".into()),
            ..Default::default()
        };
        assert!(resolve(&flags, &[])
            .unwrap_err()
            .to_string()
            .contains("--tls-server-name"));
    }
}
