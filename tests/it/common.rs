//! Helpers shared by the integration tests: a dev server on a free port, a
//! tiny raw HTTP/1.1 client, and polling with deadlines.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use conlock::devserver::{DevServer, Options};

/// Starts a dev server on 127.0.0.1:0 with `session_ttl_min` lowered to 1 s.
#[allow(dead_code)]
pub fn start_server() -> DevServer {
    start_server_with(|_| {})
}

/// Like [`start_server`], after letting `f` adjust the options.
#[allow(dead_code)]
pub fn start_server_with(f: impl FnOnce(&mut Options)) -> DevServer {
    let mut opts = Options {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        session_ttl_min: Duration::from_secs(1),
        ..Options::default()
    };
    f(&mut opts);
    DevServer::start(opts).expect("start dev server")
}

/// An HTTP answer.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

#[allow(dead_code)]
impl Resp {
    /// Case-insensitive header lookup.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn has_header(&self, name: &str) -> bool {
        self.header(name).is_some()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.text()))
    }

    /// `X-Consul-Index` as a number.
    pub fn index(&self) -> u64 {
        self.header("X-Consul-Index")
            .unwrap_or_else(|| panic!("no X-Consul-Index in {self:?}"))
            .parse()
            .expect("numeric X-Consul-Index")
    }
}

/// Parses one HTTP/1.1 response from `raw` (None when there is no status line).
#[allow(dead_code)]
pub fn parse_response(raw: &[u8], head_only: bool) -> Option<Resp> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let mut parts = status_line.splitn(3, ' ');
    if !parts.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let status: u16 = parts.next()?.parse().ok()?;
    let mut headers = Vec::new();
    for l in lines {
        let (k, v) = l.split_once(':')?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
    let rest = &raw[end + 4..];
    let len = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("Content-Length"))
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(rest.len());
    let body = if head_only {
        Vec::new()
    } else {
        rest[..len.min(rest.len())].to_vec()
    };
    Some(Resp {
        status,
        headers,
        body,
    })
}

/// Sends raw bytes and reads until the server closes (or `timeout`).
#[allow(dead_code)]
pub fn send_raw(addr: SocketAddr, bytes: &[u8], timeout: Duration) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(bytes)?;
    // Nothing more will be sent: lets the server see the end of a partial
    // request at once.
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(out)
}

fn build_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    if let Some(b) = body {
        bytes.extend_from_slice(b);
    }
    bytes
}

/// One request on a fresh connection; `Err` when no HTTP answer came back
/// (connection refused, reset, or closed without a status line).
#[allow(dead_code)]
pub fn try_http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> std::io::Result<Resp> {
    try_http_timeout(addr, method, path, body, headers, Duration::from_secs(120))
}

#[allow(dead_code)]
pub fn try_http_timeout(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
    timeout: Duration,
) -> std::io::Result<Resp> {
    let raw = send_raw(
        addr,
        &build_request(addr, method, path, body, headers),
        timeout,
    )?;
    parse_response(&raw, method == "HEAD").ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("no HTTP answer ({} bytes)", raw.len()),
        )
    })
}

/// One request on a fresh connection; panics when there is no answer.
#[allow(dead_code)]
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    headers: &[(&str, &str)],
) -> Resp {
    try_http(addr, method, path, body, headers).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

#[allow(dead_code)]
pub fn get(addr: SocketAddr, path: &str) -> Resp {
    http(addr, "GET", path, None, &[])
}

#[allow(dead_code)]
pub fn put(addr: SocketAddr, path: &str, body: &[u8]) -> Resp {
    http(addr, "PUT", path, Some(body), &[])
}

/// Creates a session from a JSON body and returns its ID.
#[allow(dead_code)]
pub fn create_session(addr: SocketAddr, body: serde_json::Value) -> String {
    let r = put(addr, "/v1/session/create", body.to_string().as_bytes());
    assert_eq!(r.status, 200, "session create: {}", r.text());
    r.json()["ID"].as_str().expect("ID").to_string()
}

/// Polls `cond` until it holds or `deadline` has passed; returns whether it
/// held.
#[allow(dead_code)]
pub fn wait_until(deadline: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
