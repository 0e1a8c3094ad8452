//! Blocking HTTP client for the parts of Consul's API that conlock uses.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};

use crate::resolve::NameCache;

use super::config::{ConnConfig, FileSetting};
use super::types::{AgentSelf, KvPair, QueryMeta, SessionCreated, SessionEntry, SessionRequest};

/// Bodies larger than this are refused as answers (a full prefix listing stays far below).
const MAX_ANSWER_BYTES: u64 = 64 << 20;
/// Cap on how much of an error body is shown.
const MAX_ERROR_TEXT: usize = 300;

#[derive(Debug, thiserror::Error)]
pub enum ConsulError {
    #[error("cannot reach Consul at {addr} (address from {origin}): {detail}")]
    Unreachable {
        addr: String,
        origin: String,
        detail: String,
    },
    #[error("Consul denied {what} (403 {body}); {token_hint}")]
    AclDenied {
        what: String,
        body: String,
        /// "check the ACL token from …", or what to set when no token was sent.
        token_hint: String,
    },
    #[error("Consul rejected {what} ({status}): {body}")]
    Rejected {
        what: String,
        status: u16,
        body: String,
    },
    #[error("Consul failed {what} ({status}): {body}")]
    Server {
        what: String,
        status: u16,
        body: String,
    },
    #[error(
        "no answer from Consul at {addr} to {what} within {secs:.1}s{}",
        limit.as_deref().map(|l| format!(" ({l})")).unwrap_or_default()
    )]
    Timeout {
        what: String,
        addr: String,
        secs: f64,
        /// What cut the wait short, when the client's deadline did (`with_deadline`).
        limit: Option<String>,
    },
    /// The client's deadline had passed before the request was sent.
    #[error("no time left to send {what} to Consul at {addr} ({limit})")]
    OutOfTime {
        what: String,
        addr: String,
        limit: String,
    },
    #[error("unexpected answer from Consul at {addr} to {what}: {detail}")]
    BadAnswer {
        what: String,
        addr: String,
        detail: String,
    },
    #[error("cannot set up TLS: {0}")]
    Tls(String),
}

impl ConsulError {
    /// True for failures that may pass: the network, timeouts and 5xx answers, except
    /// those that say the request itself is wrong.
    pub fn is_retryable(&self) -> bool {
        match self {
            ConsulError::Server { body, .. } => !is_permanent(body),
            ConsulError::Unreachable { .. } | ConsulError::Timeout { .. } => true,
            _ => false,
        }
    }
}

impl ConsulError {
    /// Consul saying the session does not exist (any more).
    pub fn is_invalid_session(&self) -> bool {
        match self {
            ConsulError::Server { body, .. } | ConsulError::Rejected { body, .. } => {
                body.contains("invalid session") || body.contains("not found")
            }
            _ => false,
        }
    }

    /// The client's deadline (`Client::with_deadline`) ended the request, not Consul.
    pub fn cut_short(&self) -> bool {
        matches!(
            self,
            ConsulError::Timeout { limit: Some(_), .. } | ConsulError::OutOfTime { .. }
        )
    }
}

/// Consul's 500 answers to a session create that no retry can change (as recorded from
/// Consul 1.0.8: tests/fixtures/consul-1.0.8/03-session-create-validation.json). A node
/// not registered yet (an agent starting) or a critical check may pass, so they are
/// retried.
fn is_permanent(body: &str) -> bool {
    (body.starts_with("Missing check '") && body.ends_with("' registration"))
        || body.starts_with("Invalid Session TTL")
        || body.starts_with("Invalid Behavior")
        || (body.starts_with("Session TTL '") && body.contains("invalid"))
}

pub type Result<T> = std::result::Result<T, ConsulError>;

/// Options of a read: blocking (index + wait) or plain.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueryOptions {
    pub index: u64,
    pub wait: Option<Duration>,
    /// `?consistent`: the leader confirms it still leads before answering, so the answer
    /// is never older than the moment the request was sent.
    pub consistent: bool,
}

impl QueryOptions {
    pub fn blocking(index: u64, wait: Duration) -> Self {
        QueryOptions {
            index,
            wait: Some(wait),
            consistent: false,
        }
    }

    /// A plain read in consistent mode.
    pub fn consistent() -> Self {
        QueryOptions {
            consistent: true,
            ..Default::default()
        }
    }

    /// The same read in consistent mode.
    pub fn and_consistent(self) -> Self {
        QueryOptions {
            consistent: true,
            ..self
        }
    }
}

/// Consul's documented index rules for a follow-up blocking query: reset to 0 when the
/// index went backwards, otherwise never below 1.
pub fn next_index(previous: u64, returned: u64) -> u64 {
    if returned < previous {
        0
    } else {
        returned.max(1)
    }
}

/// Tries of a request that may be repeated safely, when it fails in a way that passes.
pub const TRANSIENT_TRIES: u32 = 4;
/// Pause between those tries.
pub const TRANSIENT_PAUSE: Duration = Duration::from_secs(1);

/// Runs `f` again after a retryable failure (the network, a timeout, a 5xx), up to
/// `TRANSIENT_TRIES` times in all, and not once `deadline` (the client's) would pass
/// during the pause. Only for requests whose repetition is harmless.
pub fn retry_transient<T>(
    what: &str,
    deadline: Option<Instant>,
    mut f: impl FnMut() -> Result<T>,
) -> Result<T> {
    let mut tries = 1;
    loop {
        match f() {
            Err(e)
                if e.is_retryable()
                    && tries < TRANSIENT_TRIES
                    && !deadline.is_some_and(|d| Instant::now() + TRANSIENT_PAUSE >= d) =>
            {
                crate::ui::notice(format_args!("{what}: {e}; retrying"));
                tries += 1;
                std::thread::sleep(TRANSIENT_PAUSE);
            }
            other => return other,
        }
    }
}

/// Options of a KV write.
#[derive(Debug, Clone, Copy, Default)]
pub struct PutOptions<'a> {
    pub flags: u64,
    pub cas: Option<u64>,
    pub acquire: Option<&'a str>,
    pub release: Option<&'a str>,
}

#[derive(Debug, Clone)]
pub struct Client {
    agent: ureq::Agent,
    /// The settings as given (what `config()` hands on, e.g. to the guardian).
    cfg: Arc<ConnConfig>,
    /// Where requests go: `cfg.base_url`, or with a TLS server name that name (the
    /// resolver connects to the real address).
    base_url: Arc<str>,
    /// The agent's resolver, shared with `with_own_connections`' agents (one name cache).
    resolver: AgentResolver,
    /// Timeout of a non-blocking call.
    pub request_timeout: Duration,
    /// No call lasts past this (see `with_deadline`), and what set it, for messages.
    deadline: Option<(Instant, Arc<str>)>,
}

struct Answer {
    status: u16,
    index: Option<u64>,
    content_type: String,
    body: Vec<u8>,
}

/// Sizes of each connection's read and write buffers.
const INPUT_BUFFER: usize = 32 * 1024;
const OUTPUT_BUFFER: usize = 16 * 1024;

impl Client {
    pub fn new(cfg: ConnConfig) -> Result<Client> {
        let tls = build_tls(&cfg)?;
        let mut builder = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .tls_config(tls)
            .user_agent(concat!("conlock/", env!("CARGO_PKG_VERSION")))
            .max_idle_connections_per_host(8)
            // ureq zeroes 128 KiB each way per connection by default: about 64 page faults
            // in every short run. Headers are far smaller, and bodies pass through the
            // buffers in pieces, so larger values still arrive whole. The header limit
            // stays below the input buffer, so that headers too large (a proxy's) are
            // reported as such instead of as a dropped connection.
            .input_buffer_size(INPUT_BUFFER)
            .output_buffer_size(OUTPUT_BUFFER)
            .max_response_header_size(INPUT_BUFFER - 1024);
        if cfg.is_loopback() {
            builder = builder.proxy(None);
        }
        let mut resolver = AgentResolver::default();
        let mut base_url = cfg.base_url.clone();
        if let (true, Some(name)) = (cfg.is_https(), cfg.tls.server_name.clone()) {
            // rustls takes the name to send (SNI) and to verify from the URL's host, so
            // the URL names the server and the resolver connects to the real address.
            let port = cfg
                .addr
                .rsplit_once(':')
                .map_or("8501", |(_, p)| p)
                .to_string();
            // A proxy would be asked (CONNECT) for the server name, not for the agent's
            // address (`consul lock` asks it for the address): go direct where NO_PROXY
            // says so for the address, else refuse rather than reach another agent.
            if !cfg.is_loopback() {
                let host = cfg.host();
                if no_proxy_matches(&host) {
                    builder = builder.proxy(None);
                } else if let Some((var, value)) = env_proxy() {
                    return Err(ConsulError::Tls(format!(
                        "--tls-server-name {name} cannot go through the proxy in {var} ({value}): it would be asked for {name}, not for the agent at {}; add {host} to NO_PROXY or unset {var}",
                        cfg.addr
                    )));
                }
            }
            resolver.pin = Some(Arc::new(Pin {
                name: format!("{}:{port}", host_for_url(&name)),
                real: cfg.base_url.clone(),
            }));
            base_url = format!("https://{}:{port}", host_for_url(&name));
        }
        let agent = ureq::Agent::with_parts(
            builder.build(),
            ureq::unversioned::transport::DefaultConnector::default(),
            resolver.clone(),
        );
        Ok(Client {
            agent,
            cfg: Arc::new(cfg),
            base_url: base_url.into(),
            resolver,
            request_timeout: Duration::from_secs(10),
            deadline: None,
        })
    }

    /// A client whose calls all end by `deadline` (one already past fails at once with
    /// `OutOfTime`): for best-effort cleanup that must not hold up the exit, and for the
    /// wait that `--timeout` bounds. `limit` says what set it, in error messages.
    pub fn with_deadline(&self, deadline: Instant, limit: &str) -> Client {
        Client {
            deadline: Some((deadline, limit.into())),
            ..self.clone()
        }
    }

    /// When calls must end (see `with_deadline`).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline.as_ref().map(|(d, _)| *d)
    }

    /// The same client with a pool of connections of its own. A blocking query on it (a
    /// monitor's) then never holds the connection this one's next request would reuse:
    /// the release after the command no longer waits for a new connection.
    pub fn with_own_connections(&self) -> Client {
        Client {
            agent: ureq::Agent::with_parts(
                self.agent.config().clone(),
                ureq::unversioned::transport::DefaultConnector::default(),
                self.resolver.clone(),
            ),
            ..self.clone()
        }
    }

    pub fn config(&self) -> &ConnConfig {
        &self.cfg
    }

    pub fn agent_self(&self) -> Result<AgentSelf> {
        let a = self.call(
            "GET",
            "/v1/agent/self",
            &[],
            None,
            self.request_timeout,
            "agent self",
        )?;
        self.decode(&a, "agent self")
    }

    pub fn session_create(&self, req: &SessionRequest) -> Result<String> {
        let body = serde_json::to_vec(req).expect("session request serializes");
        let what = "session create";
        let a = self.call(
            "PUT",
            "/v1/session/create",
            &[],
            Some(&body),
            self.request_timeout,
            what,
        )?;
        let created: SessionCreated = self.decode(&a, what)?;
        Ok(created.id)
    }

    /// Renews a session; `Ok(None)` means Consul no longer knows it.
    pub fn session_renew(&self, id: &str, timeout: Duration) -> Result<Option<SessionEntry>> {
        let path = format!("/v1/session/renew/{}", encode_segment(id));
        let what = "session renew";
        match self.call("PUT", &path, &[], None, timeout, what) {
            Ok(a) => {
                let list: Vec<SessionEntry> = self.decode(&a, what)?;
                Ok(list.into_iter().next())
            }
            Err(ConsulError::Rejected { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn session_destroy(&self, id: &str) -> Result<bool> {
        let path = format!("/v1/session/destroy/{}", encode_segment(id));
        let a = self.call(
            "PUT",
            &path,
            &[],
            None,
            self.request_timeout,
            "session destroy",
        )?;
        self.decode(&a, "session destroy")
    }

    pub fn session_info(
        &self,
        id: &str,
        q: QueryOptions,
    ) -> Result<(Option<SessionEntry>, QueryMeta)> {
        let path = format!("/v1/session/info/{}", encode_segment(id));
        let (list, meta): (Vec<SessionEntry>, _) = self.read(&path, &[], q, "session info")?;
        Ok((list.into_iter().next(), meta))
    }

    pub fn session_list(&self, q: QueryOptions) -> Result<(Vec<SessionEntry>, QueryMeta)> {
        self.read("/v1/session/list", &[], q, "session list")
    }

    /// One key; `None` when it does not exist.
    pub fn kv_get(&self, key: &str, q: QueryOptions) -> Result<(Option<KvPair>, QueryMeta)> {
        let path = kv_path(key);
        let what = format!("read of key {key:?}");
        let (a, meta) = self.read_raw(&path, &[], q, &what)?;
        if a.status == 404 {
            return Ok((None, meta));
        }
        let list: Vec<KvPair> = self.decode(&a, &what)?;
        Ok((list.into_iter().find(|p| p.key == key), meta))
    }

    /// Every key under a prefix (empty when there is none).
    pub fn kv_list(&self, prefix: &str, q: QueryOptions) -> Result<(Vec<KvPair>, QueryMeta)> {
        let what = format!("listing of prefix {prefix:?}");
        let (a, meta) = self.read_raw(&kv_path(prefix), &[("recurse", "")], q, &what)?;
        if a.status == 404 {
            return Ok((Vec::new(), meta));
        }
        Ok((self.decode(&a, &what)?, meta))
    }

    pub fn kv_keys(
        &self,
        prefix: &str,
        separator: Option<&str>,
        q: QueryOptions,
    ) -> Result<(Vec<String>, QueryMeta)> {
        let what = format!("key listing of prefix {prefix:?}");
        let mut params = vec![("keys", "")];
        if let Some(sep) = separator {
            params.push(("separator", sep));
        }
        let (a, meta) = self.read_raw(&kv_path(prefix), &params, q, &what)?;
        if a.status == 404 {
            return Ok((Vec::new(), meta));
        }
        Ok((self.decode(&a, &what)?, meta))
    }

    /// A KV write; the answer is Consul's `true`/`false`.
    pub fn kv_put(&self, key: &str, value: &[u8], opts: PutOptions<'_>) -> Result<bool> {
        let flags = opts.flags.to_string();
        let cas = opts.cas.map(|c| c.to_string());
        let mut params: Vec<(&str, &str)> = Vec::new();
        if opts.flags != 0 {
            params.push(("flags", &flags));
        }
        if let Some(c) = &cas {
            params.push(("cas", c));
        }
        if let Some(s) = opts.acquire {
            params.push(("acquire", s));
        }
        if let Some(s) = opts.release {
            params.push(("release", s));
        }
        let what = format!("write of key {key:?}");
        let a = self.call(
            "PUT",
            &kv_path(key),
            &params,
            Some(value),
            self.request_timeout,
            &what,
        )?;
        self.decode(&a, &what)
    }

    pub fn kv_delete(&self, key: &str, cas: Option<u64>, recurse: bool) -> Result<bool> {
        let cas = cas.map(|c| c.to_string());
        let mut params: Vec<(&str, &str)> = Vec::new();
        if let Some(c) = &cas {
            params.push(("cas", c));
        }
        if recurse {
            params.push(("recurse", ""));
        }
        let what = format!("delete of key {key:?}");
        let a = self.call(
            "DELETE",
            &kv_path(key),
            &params,
            None,
            self.request_timeout,
            &what,
        )?;
        self.decode(&a, &what)
    }

    fn read<T: DeserializeOwned>(
        &self,
        path: &str,
        params: &[(&str, &str)],
        q: QueryOptions,
        what: &str,
    ) -> Result<(T, QueryMeta)> {
        let (a, meta) = self.read_raw(path, params, q, what)?;
        Ok((self.decode(&a, what)?, meta))
    }

    /// A GET that may block; a 404 is returned as an answer, not an error.
    fn read_raw(
        &self,
        path: &str,
        params: &[(&str, &str)],
        q: QueryOptions,
        what: &str,
    ) -> Result<(Answer, QueryMeta)> {
        let mut params = params.to_vec();
        let index = q.index.to_string();
        let wait;
        let mut timeout = self.request_timeout;
        // Index 0 never blocks: it would return at once anyway.
        if let (Some(w), true) = (q.wait, q.index > 0) {
            wait = format!("{}ms", w.as_millis().max(1));
            params.push(("index", &index));
            params.push(("wait", &wait));
            // Consul adds up to wait/16 of jitter.
            timeout = w + w / 16 + Duration::from_secs(5);
        }
        if q.consistent {
            params.push(("consistent", ""));
        }
        let answer = self.call("GET", path, &params, None, timeout, what)?;
        let meta = QueryMeta {
            index: answer.index.unwrap_or(0),
        };
        Ok((answer, meta))
    }

    fn call(
        &self,
        method: &str,
        path: &str,
        params: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
        what: &str,
    ) -> Result<Answer> {
        let url = self.url(path, params);
        // What cuts this call short, if the deadline does.
        let mut limit = None;
        let timeout = match &self.deadline {
            Some((d, why)) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ConsulError::OutOfTime {
                        what: what.to_string(),
                        addr: self.cfg.addr.clone(),
                        limit: why.to_string(),
                    });
                }
                if left < timeout {
                    limit = Some(why.to_string());
                }
                timeout.min(left)
            }
            None => timeout,
        };
        let answer = self
            .send(method, &url, body, timeout, what)
            .map_err(|e| match e {
                ConsulError::Timeout {
                    what, addr, secs, ..
                } => ConsulError::Timeout {
                    what,
                    addr,
                    secs,
                    limit,
                },
                e => e,
            })?;
        match answer.status {
            200..=299 => Ok(answer),
            404 if method == "GET" && path.starts_with("/v1/kv/") && answer.index.is_some() => {
                Ok(answer)
            }
            403 => Err(ConsulError::AclDenied {
                what: what.to_string(),
                body: error_text(&answer.body),
                token_hint: self.token_hint(),
            }),
            status @ 500..=599 => Err(ConsulError::Server {
                what: what.to_string(),
                status,
                body: self.name_datacenter(error_text(&answer.body)),
            }),
            status => Err(ConsulError::Rejected {
                what: what.to_string(),
                status,
                body: error_text(&answer.body),
            }),
        }
    }

    /// Consul's "No path to datacenter" does not say which one: name it.
    fn name_datacenter(&self, body: String) -> String {
        match &self.cfg.datacenter {
            Some(dc) if body.contains("No path to datacenter") => {
                format!("{body} {dc:?} (check --datacenter or CONSUL_DATACENTER)")
            }
            _ => body,
        }
    }

    fn token_hint(&self) -> String {
        if self.cfg.token.is_some() {
            format!("check the ACL token from {}", self.cfg.token_origin)
        } else {
            "no ACL token was sent: set CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE or --token".into()
        }
    }

    fn send(
        &self,
        method: &str,
        url: &str,
        body: Option<&[u8]>,
        timeout: Duration,
        what: &str,
    ) -> Result<Answer> {
        let token = self.cfg.token.as_deref();
        let result = match method {
            "GET" => with_token(self.agent.get(url), token)
                .config()
                .timeout_global(Some(timeout))
                .build()
                .call(),
            "DELETE" => with_token(self.agent.delete(url), token)
                .config()
                .timeout_global(Some(timeout))
                .build()
                .call(),
            _ => {
                let req = with_token(self.agent.put(url), token)
                    .config()
                    .timeout_global(Some(timeout))
                    .build();
                match body {
                    Some(b) => req.send(b),
                    None => req.send_empty(),
                }
            }
        };
        let mut resp = result.map_err(|e| self.transport_error(e, what, timeout))?;
        let status = resp.status().as_u16();
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let index = header("X-Consul-Index").and_then(|v| v.parse().ok());
        let content_type = header("Content-Type").unwrap_or_default();
        let mut body = Vec::new();
        resp.body_mut()
            .with_config()
            .limit(MAX_ANSWER_BYTES)
            .reader()
            .read_to_end(&mut body)
            .map_err(|e| self.transport_error(ureq::Error::Io(e), what, timeout))?;
        Ok(Answer {
            status,
            index,
            content_type,
            body,
        })
    }

    fn transport_error(&self, e: ureq::Error, what: &str, timeout: Duration) -> ConsulError {
        let addr = self.cfg.addr.clone();
        match e {
            ureq::Error::Timeout(_) => ConsulError::Timeout {
                what: what.to_string(),
                addr,
                secs: timeout.as_secs_f64(),
                limit: None,
            },
            ureq::Error::Io(ref io) if io.kind() == std::io::ErrorKind::TimedOut => {
                ConsulError::Timeout {
                    what: what.to_string(),
                    addr,
                    secs: timeout.as_secs_f64(),
                    limit: None,
                }
            }
            other => {
                let mut detail = other.to_string();
                if self.cfg.is_https()
                    && (detail.contains("InvalidContentType") || detail.contains("corrupt message"))
                {
                    // rustls's view of an HTTP answer to its TLS hello.
                    detail = format!(
                        "the agent at {} answered plain HTTP; use http:// or check CONSUL_HTTP_SSL",
                        self.cfg.addr
                    );
                } else if detail.contains("response header is too big") {
                    detail = format!(
                        "its response headers are larger than {} KiB (a proxy in between?)",
                        (INPUT_BUFFER - 1024) / 1024
                    );
                } else if detail.contains("not valid for name") {
                    detail.push_str(
                        " (name the certificate's host with --tls-server-name or CONSUL_TLS_SERVER_NAME, or check CONSUL_CACERT/--ca-file)",
                    );
                } else if detail.contains("certificate")
                    || detail.contains("Tls")
                    || detail.contains("tls")
                {
                    detail.push_str(" (check CONSUL_CACERT/--ca-file, or CONSUL_HTTP_SSL_VERIFY)");
                }
                ConsulError::Unreachable {
                    addr,
                    origin: self.cfg.addr_origin.clone(),
                    detail,
                }
            }
        }
    }

    fn decode<T: DeserializeOwned>(&self, a: &Answer, what: &str) -> Result<T> {
        serde_json::from_slice(&a.body).map_err(|e| {
            let shown = String::from_utf8_lossy(&a.body[..a.body.len().min(80)]).replace('\n', " ");
            let kind = if a.content_type.is_empty() {
                String::new()
            } else {
                format!(" ({})", a.content_type)
            };
            ConsulError::BadAnswer {
                what: what.to_string(),
                addr: self.cfg.addr.clone(),
                detail: format!("invalid JSON{kind}: {e}; the answer began with {shown:?}; is this a Consul agent?"),
            }
        })
    }

    fn url(&self, path: &str, params: &[(&str, &str)]) -> String {
        let mut url = format!("{}{}", self.base_url, path);
        let mut sep = '?';
        let extra = [
            ("dc", self.cfg.datacenter.as_deref()),
            ("ns", self.cfg.namespace.as_deref()),
        ];
        let all = params
            .iter()
            .map(|&(k, v)| (k, Some(v)))
            .chain(extra.into_iter().filter(|(_, v)| v.is_some()));
        for (k, v) in all {
            url.push(sep);
            sep = '&';
            url.push_str(k);
            match v {
                Some(v) if !v.is_empty() => {
                    url.push('=');
                    url.push_str(&encode_query(v));
                }
                _ => {}
            }
        }
        url
    }
}

/// The proxy from the environment that ureq would use, as (variable, value).
fn env_proxy() -> Option<(&'static str, String)> {
    [
        "ALL_PROXY",
        "all_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
    ]
    .into_iter()
    .find_map(|v| {
        std::env::var(v)
            .ok()
            .filter(|x| !x.trim().is_empty())
            .map(|x| (v, x))
    })
}

/// Whether NO_PROXY (or no_proxy) exempts `host`, as Go reads it: `*`, the host itself,
/// or a domain it lies in (`example.com` or `.example.com`).
fn no_proxy_matches(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let list = std::env::var("NO_PROXY")
        .or_else(|_| std::env::var("no_proxy"))
        .unwrap_or_default();
    list.split(',').map(str::trim).any(|e| {
        let e = e.trim_start_matches('[').trim_end_matches(']');
        let e = e.strip_prefix('.').unwrap_or(e);
        e == "*"
            || (!e.is_empty()
                && (host.eq_ignore_ascii_case(e)
                    || host
                        .to_ascii_lowercase()
                        .ends_with(&format!(".{}", e.to_ascii_lowercase()))))
    })
}

fn host_for_url(name: &str) -> String {
    match name.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
        _ => name.to_string(),
    }
}

/// The agent's resolver: literals and `localhost` without a lookup, other names cached
/// (see `crate::resolve`), and a TLS server name pinned to the agent's real address.
#[derive(Debug, Default, Clone)]
struct AgentResolver {
    /// Shared by the clones (a client's agents): one lookup serves them all.
    names: NameCache,
    /// With a TLS server name: the URL names that server, this is where it really is.
    pin: Option<Arc<Pin>>,
}

/// The TLS server name (as it appears in the URL) and the agent's real address.
#[derive(Debug)]
struct Pin {
    /// `name:port` as in the URL.
    name: String,
    /// `https://host:port` of the agent.
    real: String,
}

impl Resolver for AgentResolver {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: ureq::unversioned::transport::NextTimeout,
    ) -> std::result::Result<ResolvedSocketAddrs, ureq::Error> {
        let real;
        let uri = match &self.pin {
            Some(pin)
                if uri
                    .authority()
                    .map(|a| a.as_str().to_ascii_lowercase())
                    .as_deref()
                    == Some(pin.name.as_str()) =>
            {
                real = pin
                    .real
                    .parse::<ureq::http::Uri>()
                    .map_err(|_| ureq::Error::BadUri(pin.real.clone()))?;
                &real
            }
            _ => uri,
        };
        self.names.resolve(uri, config, timeout)
    }
}

fn with_token<B>(req: ureq::RequestBuilder<B>, token: Option<&str>) -> ureq::RequestBuilder<B> {
    match token {
        Some(t) => req.header("X-Consul-Token", t),
        None => req,
    }
}

fn error_text(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let one_line = text.trim().replace(['\n', '\r'], " ");
    if one_line.is_empty() {
        return "(empty answer)".into();
    }
    match one_line.char_indices().nth(MAX_ERROR_TEXT) {
        Some((cut, _)) => format!("{}…", &one_line[..cut]),
        None => one_line,
    }
}

fn kv_path(key: &str) -> String {
    let mut p = String::from("/v1/kv/");
    for (i, seg) in key.split('/').enumerate() {
        if i > 0 {
            p.push('/');
        }
        p.push_str(&encode_segment(seg));
    }
    p
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~')
}

/// Percent-encodes one path segment (UTF-8 bytes).
pub fn encode_segment(s: &str) -> String {
    encode(s, |b| {
        is_unreserved(b)
            || matches!(
                b,
                b':' | b'@' | b'!' | b'$' | b'\'' | b'(' | b')' | b'*' | b',' | b';' | b'='
            )
    })
}

fn encode_query(s: &str) -> String {
    encode(s, is_unreserved)
}

fn encode(s: &str, keep: impl Fn(u8) -> bool) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if keep(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn read_pem_file(f: &FileSetting) -> Result<Vec<u8>> {
    crate::readfile::read_bounded(
        &f.path,
        crate::readfile::PEM_LIMIT,
        "the certificate file limit",
    )
    .map_err(|e| ConsulError::Tls(format!("{} (from {}): {e}", f.path.display(), f.origin)))
}

fn certs_from_pem(bytes: &[u8], f: &FileSetting) -> Result<Vec<ureq::tls::Certificate<'static>>> {
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(bytes) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => {
                return Err(ConsulError::Tls(format!(
                    "invalid PEM in {} (from {}): {e}",
                    f.path.display(),
                    f.origin
                )))
            }
        }
    }
    Ok(certs)
}

fn build_tls(cfg: &ConnConfig) -> Result<ureq::tls::TlsConfig> {
    use ureq::tls::{ClientCert, PemItem, RootCerts, TlsConfig};
    let t = &cfg.tls;
    let mut builder = TlsConfig::builder().disable_verification(!t.verify);
    let mut roots = Vec::new();
    if let Some(f) = &t.ca_file {
        let certs = certs_from_pem(&read_pem_file(f)?, f)?;
        if certs.is_empty() {
            return Err(ConsulError::Tls(format!(
                "no certificate in {} (from {})",
                f.path.display(),
                f.origin
            )));
        }
        roots.extend(certs);
    }
    if let Some(dir) = &t.ca_path {
        let entries = std::fs::read_dir(&dir.path).map_err(|e| {
            ConsulError::Tls(format!(
                "cannot read {} (from {}): {e}",
                dir.path.display(),
                dir.origin
            ))
        })?;
        for entry in entries.flatten() {
            let f = FileSetting {
                path: entry.path(),
                origin: dir.origin.clone(),
            };
            if f.path.is_file() {
                roots.extend(certs_from_pem(&read_pem_file(&f)?, &f)?);
            }
        }
    }
    if !roots.is_empty() {
        builder = builder.root_certs(RootCerts::new_with_certs(&roots));
    }
    match (&t.client_cert, &t.client_key) {
        (Some(cf), Some(kf)) => {
            let chain = certs_from_pem(&read_pem_file(cf)?, cf)?;
            let key_pem = read_pem_file(kf)?;
            let key = ureq::tls::parse_pem(&key_pem)
                .filter_map(|i| match i {
                    Ok(PemItem::PrivateKey(k)) => Some(k),
                    _ => None,
                })
                .next()
                .ok_or_else(|| {
                    ConsulError::Tls(format!(
                        "no private key in {} (from {})",
                        kf.path.display(),
                        kf.origin
                    ))
                })?;
            builder = builder.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
        }
        (Some(f), None) | (None, Some(f)) => {
            return Err(ConsulError::Tls(format!(
                "{} (from {}) needs its pair: set both CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY",
                f.path.display(),
                f.origin
            )))
        }
        (None, None) => {}
    }
    Ok(builder.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The monitor's agent (other connections) resolves the agent's name through the same
    /// cache as the main one: no second lookup (and no lookup thread) when it starts.
    #[test]
    fn own_connections_share_the_name_cache() {
        let flags = crate::consul::ConnFlags {
            http_addr: Some("consul.example:8500".into()),
            ..Default::default()
        };
        let a = Client::new(ConnConfig::resolve(&flags, &|_| None).unwrap()).unwrap();
        let b = a.with_own_connections();
        assert!(a.resolver.names.is_shared_with(&b.resolver.names));
        assert!(!a.resolver.names.is_shared_with(&NameCache::default()));
        assert_eq!(&*b.base_url, "http://consul.example:8500");
    }

    /// With a TLS server name the requests name that server, but `config()` stays as
    /// given: a client built from it (the guardian's) reaches the real address again.
    #[test]
    fn config_keeps_the_address_given_with_a_tls_server_name() {
        let flags = crate::consul::ConnFlags {
            http_addr: Some("https://127.0.0.1:8501".into()),
            tls_server_name: Some("consul.test".into()),
            ..Default::default()
        };
        let a = Client::new(ConnConfig::resolve(&flags, &|_| None).unwrap()).unwrap();
        assert_eq!(&*a.base_url, "https://consul.test:8501");
        assert_eq!(a.config().base_url, "https://127.0.0.1:8501");
        let again = Client::new(a.config().clone()).unwrap();
        assert_eq!(&*again.base_url, "https://consul.test:8501");
        let pin = again.resolver.pin.as_ref().unwrap();
        assert_eq!(
            (pin.name.as_str(), pin.real.as_str()),
            ("consul.test:8501", "https://127.0.0.1:8501")
        );
    }

    #[test]
    fn index_rules() {
        assert_eq!(next_index(10, 12), 12);
        assert_eq!(next_index(10, 10), 10);
        assert_eq!(next_index(10, 3), 0);
        assert_eq!(next_index(0, 0), 1);
    }

    #[test]
    fn keys_are_percent_encoded_per_segment() {
        assert_eq!(kv_path("a/b c/é"), "/v1/kv/a/b%20c/%C3%A9");
        assert_eq!(kv_path("x?y#z"), "/v1/kv/x%3Fy%23z");
        assert_eq!(encode_query("a b&c"), "a%20b%26c");
    }
}
