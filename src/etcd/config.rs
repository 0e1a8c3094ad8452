//! Where to reach etcd and with what credentials: flags first, then etcdctl's
//! environment variables (`ETCDCTL_*`), then defaults. Every value remembers its origin
//! so that errors can say which flag or variable to fix.

use std::path::PathBuf;

pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:2379";

/// Connection flags as given on the command line (all optional).
#[derive(Debug, Clone, Default)]
pub struct EtcdFlags {
    /// Comma-separated endpoints, as etcdctl's `--endpoints`.
    pub endpoints: Option<String>,
    pub cacert: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// `name` or `name:password`, as etcdctl's `--user`.
    pub user: Option<String>,
    pub password: Option<String>,
    pub insecure_skip_tls_verify: Option<bool>,
}

/// A file setting and the flag or variable it came from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EtcdFile {
    pub path: PathBuf,
    pub origin: String,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EtcdTls {
    pub cacert: Option<EtcdFile>,
    pub cert: Option<EtcdFile>,
    pub key: Option<EtcdFile>,
    /// False with `--insecure-skip-tls-verify` / `ETCDCTL_INSECURE_SKIP_TLS_VERIFY`.
    pub verify: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EtcdUser {
    pub name: String,
    pub password: String,
    /// Where the name came from (`--user`, `ETCDCTL_USER`).
    pub origin: String,
    /// Where the password came from.
    pub password_origin: String,
}

/// Resolved connection settings.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EtcdConfig {
    /// Base URLs, `http(s)://host:port` without a trailing slash, in the order given.
    pub endpoints: Vec<String>,
    pub endpoints_origin: String,
    pub tls: EtcdTls,
    pub user: Option<EtcdUser>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EtcdConfigError {
    #[error("invalid etcd endpoint {value:?} (from {origin}): {reason}; expected a comma-separated list of host:port, http://host:port or https://host:port")]
    InvalidEndpoint {
        value: String,
        origin: String,
        reason: String,
    },
    #[error("no etcd endpoint in {value:?} (from {origin}); expected a comma-separated list of host:port, http://host:port or https://host:port")]
    NoEndpoint { value: String, origin: String },
    #[error(
        "invalid etcd user {value:?} (from {origin}): {reason}; expected name or name:password"
    )]
    InvalidUser {
        value: String,
        origin: String,
        reason: String,
    },
    #[error("an etcd password is set ({origin}) but no user: set --user or ETCDCTL_USER")]
    PasswordWithoutUser { origin: String },
    #[error("the etcd password for user {user:?} is missing: give it as {origin} name:password, or set --password or ETCDCTL_PASSWORD")]
    MissingPassword { user: String, origin: String },
    #[error("invalid value {value:?} for {var}: expected true or false")]
    InvalidBool { var: String, value: String },
}

impl EtcdConfig {
    /// Resolves settings from flags and the process environment.
    pub fn from_env(flags: &EtcdFlags) -> Result<Self, EtcdConfigError> {
        Self::resolve(flags, &|name| std::env::var(name).ok())
    }

    /// Resolves settings from flags and the given environment lookup.
    pub fn resolve(
        flags: &EtcdFlags,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, EtcdConfigError> {
        let env = |name: &str| env(name).filter(|v| !v.trim().is_empty());

        let (raw, endpoints_origin) = match (&flags.endpoints, env("ETCDCTL_ENDPOINTS")) {
            (Some(e), _) => (e.clone(), "--endpoints".to_string()),
            (None, Some(e)) => (e, "ETCDCTL_ENDPOINTS".to_string()),
            (None, None) => (DEFAULT_ENDPOINT.to_string(), "the default".to_string()),
        };
        let mut endpoints = Vec::new();
        for part in raw.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let url = parse_endpoint(part).map_err(|reason| EtcdConfigError::InvalidEndpoint {
                value: part.to_string(),
                origin: endpoints_origin.clone(),
                reason,
            })?;
            if !endpoints.contains(&url) {
                endpoints.push(url);
            }
        }
        if endpoints.is_empty() {
            return Err(EtcdConfigError::NoEndpoint {
                value: raw,
                origin: endpoints_origin,
            });
        }

        let file = |flag: &Option<PathBuf>, flag_name: &str, var: &str| match (flag, env(var)) {
            (Some(p), _) => Some(EtcdFile {
                path: p.clone(),
                origin: flag_name.to_string(),
            }),
            (None, Some(p)) => Some(EtcdFile {
                path: PathBuf::from(p),
                origin: var.to_string(),
            }),
            (None, None) => None,
        };
        let skip_verify = match (
            flags.insecure_skip_tls_verify,
            env("ETCDCTL_INSECURE_SKIP_TLS_VERIFY"),
        ) {
            (Some(b), _) => b,
            (None, Some(v)) => parse_bool(&v).ok_or(EtcdConfigError::InvalidBool {
                var: "ETCDCTL_INSECURE_SKIP_TLS_VERIFY".into(),
                value: v,
            })?,
            (None, None) => false,
        };
        let tls = EtcdTls {
            cacert: file(&flags.cacert, "--etcd-cacert", "ETCDCTL_CACERT"),
            cert: file(&flags.cert, "--etcd-cert", "ETCDCTL_CERT"),
            key: file(&flags.key, "--etcd-key", "ETCDCTL_KEY"),
            verify: !skip_verify,
        };

        Ok(EtcdConfig {
            endpoints,
            endpoints_origin,
            tls,
            user: resolve_user(flags, &env)?,
        })
    }

    pub fn any_https(&self) -> bool {
        self.endpoints.iter().any(|e| e.starts_with("https://"))
    }

    /// Which flag or variable names the user, for messages.
    pub fn user_hint(&self) -> String {
        match &self.user {
            Some(u) => format!(
                "check the user {:?} (from {}) and its password (from {}): ETCDCTL_USER/--etcd-user (name or name:password), ETCDCTL_PASSWORD/--etcd-password",
                u.name, u.origin, u.password_origin
            ),
            None => "no user was given: set ETCDCTL_USER or --etcd-user (name or name:password)".into(),
        }
    }
}

fn resolve_user(
    flags: &EtcdFlags,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<EtcdUser>, EtcdConfigError> {
    let (raw, origin) = match (&flags.user, env("ETCDCTL_USER")) {
        (Some(u), _) => (Some(u.clone()), "--etcd-user"),
        (None, Some(u)) => (Some(u), "ETCDCTL_USER"),
        (None, None) => (None, ""),
    };
    let (password, password_origin) = match (&flags.password, env("ETCDCTL_PASSWORD")) {
        (Some(p), _) => (Some(p.clone()), "--etcd-password"),
        (None, Some(p)) => (Some(p), "ETCDCTL_PASSWORD"),
        (None, None) => (None, ""),
    };
    let Some(raw) = raw else {
        return match password {
            Some(_) => Err(EtcdConfigError::PasswordWithoutUser {
                origin: password_origin.into(),
            }),
            None => Ok(None),
        };
    };
    // As etcdctl: a separate password takes the whole value as the name.
    let (name, password, password_origin) = match (password, raw.split_once(':')) {
        (Some(p), _) => (raw.clone(), p, password_origin.to_string()),
        (None, Some((n, p))) => (n.to_string(), p.to_string(), origin.to_string()),
        (None, None) => {
            return Err(EtcdConfigError::MissingPassword {
                user: raw,
                origin: origin.into(),
            })
        }
    };
    if name.is_empty() {
        return Err(EtcdConfigError::InvalidUser {
            value: raw,
            origin: origin.into(),
            reason: "empty name".into(),
        });
    }
    Ok(Some(EtcdUser {
        name,
        password,
        origin: origin.into(),
        password_origin,
    }))
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "t" | "true" | "yes" => Some(true),
        "0" | "f" | "false" | "no" => Some(false),
        _ => None,
    }
}

/// `http://h:p`, `https://h:p` or `h:p` (meaning http) to a base URL.
fn parse_endpoint(raw: &str) -> Result<String, String> {
    let lower = raw.get(..8).unwrap_or(raw).to_ascii_lowercase();
    let (scheme, rest) = if lower.starts_with("https://") {
        ("https", &raw[8..])
    } else if lower.starts_with("http://") {
        ("http", &raw[7..])
    } else if raw.contains("://") {
        return Err(
            "unsupported scheme (only http and https; unix sockets are not supported)".into(),
        );
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
        Some((h, p)) if !h.ends_with(':') || h.starts_with('[') => (h, p),
        _ => return Err("no port (etcd's client port is usually 2379)".into()),
    };
    if host.is_empty() {
        return Err("empty host".into());
    }
    let port: u16 = port.parse().map_err(|_| format!("invalid port {port:?}"))?;
    if port == 0 {
        return Err("port 0 is not a valid port".into());
    }
    Ok(format!("{scheme}://{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve(flags: &EtcdFlags, vars: &[(&str, &str)]) -> Result<EtcdConfig, EtcdConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        EtcdConfig::resolve(flags, &move |k| map.get(k).cloned())
    }

    #[test]
    fn default_endpoint() {
        let c = resolve(&EtcdFlags::default(), &[]).unwrap();
        assert_eq!(c.endpoints, vec!["http://127.0.0.1:2379"]);
        assert_eq!(c.endpoints_origin, "the default");
        assert!(c.user.is_none() && c.tls.verify && !c.any_https());
    }

    #[test]
    fn endpoint_lists_and_precedence() {
        let c = resolve(
            &EtcdFlags::default(),
            &[(
                "ETCDCTL_ENDPOINTS",
                "10.0.0.1:2379, https://e2:2379/,HTTP://[::1]:23,10.0.0.1:2379",
            )],
        )
        .unwrap();
        assert_eq!(
            c.endpoints,
            vec!["http://10.0.0.1:2379", "https://e2:2379", "http://[::1]:23"]
        );
        assert_eq!(c.endpoints_origin, "ETCDCTL_ENDPOINTS");
        assert!(c.any_https());
        let flags = EtcdFlags {
            endpoints: Some("h:1".into()),
            ..Default::default()
        };
        let c = resolve(&flags, &[("ETCDCTL_ENDPOINTS", "other:2")]).unwrap();
        assert_eq!(
            (c.endpoints[0].as_str(), c.endpoints_origin.as_str()),
            ("http://h:1", "--endpoints")
        );
    }

    #[test]
    fn invalid_endpoints_name_value_origin_and_form() {
        for bad in [
            "unix:///tmp/s",
            "h:x",
            "h:0",
            "http://",
            "h:1/path",
            "hostonly",
            "a b:1",
        ] {
            let err = resolve(&EtcdFlags::default(), &[("ETCDCTL_ENDPOINTS", bad)]).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("ETCDCTL_ENDPOINTS") && text.contains("host:port"),
                "{bad}: {text}"
            );
        }
        let flags = EtcdFlags {
            endpoints: Some(" , ".into()),
            ..Default::default()
        };
        let err = resolve(&flags, &[]).unwrap_err();
        assert!(matches!(err, EtcdConfigError::NoEndpoint { .. }), "{err}");
        assert!(err.to_string().contains("--endpoints"));
    }

    #[test]
    fn users_and_passwords() {
        let c = resolve(&EtcdFlags::default(), &[("ETCDCTL_USER", "root:pw:x")]).unwrap();
        let u = c.user.unwrap();
        assert_eq!((u.name.as_str(), u.password.as_str()), ("root", "pw:x"));
        assert_eq!(
            (u.origin.as_str(), u.password_origin.as_str()),
            ("ETCDCTL_USER", "ETCDCTL_USER")
        );
        let c = resolve(
            &EtcdFlags::default(),
            &[("ETCDCTL_USER", "root"), ("ETCDCTL_PASSWORD", "s3cret")],
        )
        .unwrap();
        let u = c.user.unwrap();
        assert_eq!(
            (
                u.name.as_str(),
                u.password.as_str(),
                u.password_origin.as_str()
            ),
            ("root", "s3cret", "ETCDCTL_PASSWORD")
        );
        let flags = EtcdFlags {
            user: Some("alice:a".into()),
            ..Default::default()
        };
        let c = resolve(&flags, &[("ETCDCTL_USER", "root:pw")]).unwrap();
        assert_eq!(c.user.as_ref().unwrap().name, "alice");
        assert!(c.user_hint().contains("--etcd-user"));
        let err = resolve(&EtcdFlags::default(), &[("ETCDCTL_USER", "root")]).unwrap_err();
        assert!(
            err.to_string().contains("ETCDCTL_USER")
                && err.to_string().contains("ETCDCTL_PASSWORD"),
            "{err}"
        );
        let err = resolve(&EtcdFlags::default(), &[("ETCDCTL_PASSWORD", "pw")]).unwrap_err();
        assert!(err.to_string().contains("ETCDCTL_USER"), "{err}");
        let err = resolve(&EtcdFlags::default(), &[("ETCDCTL_USER", ":pw")]).unwrap_err();
        assert!(err.to_string().contains("empty name"), "{err}");
    }

    #[test]
    fn tls_files_and_verify() {
        let flags = EtcdFlags {
            cacert: Some("/f/ca.pem".into()),
            ..Default::default()
        };
        let c = resolve(
            &flags,
            &[
                ("ETCDCTL_CACERT", "/e/ca.pem"),
                ("ETCDCTL_CERT", "/e/c.pem"),
                ("ETCDCTL_KEY", "/e/k.pem"),
                ("ETCDCTL_INSECURE_SKIP_TLS_VERIFY", "true"),
            ],
        )
        .unwrap();
        assert_eq!(c.tls.cacert.unwrap().origin, "--etcd-cacert");
        assert_eq!(c.tls.cert.unwrap().origin, "ETCDCTL_CERT");
        assert_eq!(c.tls.key.unwrap().path, PathBuf::from("/e/k.pem"));
        assert!(!c.tls.verify);
        let err = resolve(
            &EtcdFlags::default(),
            &[("ETCDCTL_INSECURE_SKIP_TLS_VERIFY", "maybe")],
        )
        .unwrap_err();
        assert!(err.to_string().contains("ETCDCTL_INSECURE_SKIP_TLS_VERIFY"));
    }
}
