//! A small HTTP/1.1 server connection loop: keep-alive, pipelining,
//! Content-Length and chunked request bodies, `Expect: 100-continue`, caps
//! on header and body sizes, and abrupt closes on demand. Malformed input gets
//! the answers Go's net/http gives (400/431/501/505, then close).

use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::api::{self, Outcome};
use super::message::{Body, Request, Response, MAX_BODY};
use super::options::FaultMode;
use super::shared::{ConnHandle, Shared};

/// Largest header block accepted (Go's `http.DefaultMaxHeaderBytes` + 4096).
const MAX_HEAD: usize = (1 << 20) + 4096;
/// Oversized bodies up to this size are read and discarded so that the client
/// can see the 413 answer; beyond it the connection is just closed after it.
const DRAIN_CAP: u64 = 8 << 20;

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        301 => "Moved Permanently",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Request Entity Too Large",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

struct Conn {
    h: Arc<ConnHandle>,
    buf: Vec<u8>,
    pos: usize,
}

enum HeadErr {
    /// Not HTTP at all (a TLS handshake).
    Malformed,
    Closed,
    TooLarge,
}

impl Conn {
    fn fill(&mut self) -> std::io::Result<usize> {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match (&self.h.stream).read(&mut chunk) {
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads up to and including the blank line ending the header block.
    fn read_head(&mut self) -> Result<Vec<u8>, HeadErr> {
        // How many bytes of the unread data were already searched. Relative to `pos`,
        // because `fill` may move the unread data to the start of the buffer.
        let mut searched = 0usize;
        loop {
            // Skip empty lines before a request line (as Go does).
            while self.pos < self.buf.len() && matches!(self.buf[self.pos], b'\r' | b'\n') {
                self.pos += 1;
                searched = searched.saturating_sub(1);
            }
            let data = &self.buf[self.pos..];
            // A TLS handshake record (a client speaking https to this plain-HTTP server)
            // never ends a header block; a Consul agent answers it with a 400.
            if data.first() == Some(&0x16) {
                return Err(HeadErr::Malformed);
            }
            let from = searched.saturating_sub(3);
            if let Some(end) = find_head_end(data, from) {
                let head = data[..end].to_vec();
                self.pos += end;
                return Ok(head);
            }
            if data.len() > MAX_HEAD {
                return Err(HeadErr::TooLarge);
            }
            searched = data.len();
            match self.fill() {
                Ok(0) | Err(_) => return Err(HeadErr::Closed),
                Ok(_) => {}
            }
        }
    }

    fn read_exact_body(&mut self, n: usize) -> Option<Vec<u8>> {
        while self.buf.len() - self.pos < n {
            match self.fill() {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
        let out = self.buf[self.pos..self.pos + n].to_vec();
        self.pos += n;
        Some(out)
    }

    fn discard(&mut self, mut n: u64) -> bool {
        loop {
            let avail = (self.buf.len() - self.pos) as u64;
            let take = avail.min(n);
            self.pos += take as usize;
            n -= take;
            if n == 0 {
                return true;
            }
            self.buf.clear();
            self.pos = 0;
            match self.fill() {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
        }
    }

    fn read_line(&mut self, limit: usize) -> Option<Vec<u8>> {
        loop {
            if let Some(i) = self.buf[self.pos..].iter().position(|&b| b == b'\n') {
                let mut line = self.buf[self.pos..self.pos + i].to_vec();
                self.pos += i + 1;
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return Some(line);
            }
            if self.buf.len() - self.pos > limit {
                return None;
            }
            match self.fill() {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Decodes a chunked body. `Ok(None)` when it exceeds `MAX_BODY`.
    fn read_chunked(&mut self) -> Result<Option<Vec<u8>>, ()> {
        let mut out = Vec::new();
        loop {
            let line = self.read_line(4096).ok_or(())?;
            let size_part = line.split(|&b| b == b';').next().unwrap_or(&[]);
            let size_str = std::str::from_utf8(size_part).map_err(|_| ())?.trim();
            let size = u64::from_str_radix(size_str, 16).map_err(|_| ())?;
            if size == 0 {
                // trailers
                loop {
                    let l = self.read_line(64 * 1024).ok_or(())?;
                    if l.is_empty() {
                        return Ok(Some(out));
                    }
                }
            }
            if size > (MAX_BODY - out.len()) as u64 {
                return Ok(None);
            }
            let data = self.read_exact_body(size as usize).ok_or(())?;
            out.extend_from_slice(&data);
            let crlf = self.read_line(16).ok_or(())?;
            if !crlf.is_empty() {
                return Err(());
            }
        }
    }
}

fn find_head_end(data: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i < data.len() {
        if data[i] == b'\n' {
            if data.get(i + 1) == Some(&b'\n') {
                return Some(i + 2);
            }
            if data.get(i + 1) == Some(&b'\r') && data.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
        i += 1;
    }
    None
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn simple(status: u16, text: &str) -> Response {
    let mut r = Response::new(status)
        .header("Content-Type", "text/plain; charset=utf-8")
        .body(text.as_bytes().to_vec());
    r.close = true;
    r
}

fn write_response(h: &ConnHandle, resp: &Response, head_only: bool, keep_alive_hdr: bool) -> bool {
    let mut out = Vec::with_capacity(resp.body.len() + 256);
    out.extend_from_slice(
        format!("HTTP/1.1 {} {}\r\n", resp.status, reason(resp.status)).as_bytes(),
    );
    for (k, v) in &resp.headers {
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("Content-Length: {}\r\n", resp.body.len()).as_bytes());
    if resp.close {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if keep_alive_hdr {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !head_only {
        out.extend_from_slice(&resp.body);
    }
    (&h.stream).write_all(&out).is_ok() && (&h.stream).flush().is_ok()
}

/// Close after an answer while the client may still be sending: stop
/// writing, then read and discard for a short while so the kernel does not
/// reset the connection before the client has read the answer.
fn lingering_close(h: &ConnHandle) {
    let _ = h.stream.shutdown(Shutdown::Write);
    let _ = h.stream.set_read_timeout(Some(Duration::from_millis(500)));
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut sink = [0u8; 16 * 1024];
    let mut total = 0usize;
    while Instant::now() < deadline && total < (64 << 20) {
        match (&h.stream).read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
}

struct Head {
    method: String,
    target: String,
    minor: u8,
    headers: Vec<(String, String)>,
}

fn parse_head(raw: &[u8]) -> Result<Head, Response> {
    let bad = || simple(400, "400 Bad Request");
    let text = std::str::from_utf8(raw).map_err(|_| bad())?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let line = lines.next().ok_or_else(bad)?;
    let mut parts = line.splitn(3, ' ');
    let method = parts.next().unwrap_or("");
    let target = parts.next().ok_or_else(bad)?;
    let proto = parts.next().ok_or_else(bad)?;
    if method.is_empty() || !method.bytes().all(is_tchar) || target.is_empty() {
        return Err(bad());
    }
    let minor = match proto.strip_prefix("HTTP/") {
        Some(v) => {
            let (maj, min) = v.split_once('.').ok_or_else(bad)?;
            let maj: u32 = maj.parse().map_err(|_| bad())?;
            let min: u32 = min.parse().map_err(|_| bad())?;
            if maj != 1 {
                return Err(simple(505, "505 HTTP Version Not Supported"));
            }
            min.min(9) as u8
        }
        None => return Err(bad()),
    };
    let mut headers = Vec::new();
    for l in lines {
        if l.is_empty() {
            continue;
        }
        if l.starts_with(' ') || l.starts_with('\t') {
            return Err(bad());
        }
        let (k, v) = l.split_once(':').ok_or_else(bad)?;
        if k.is_empty() || !k.bytes().all(is_tchar) {
            return Err(bad());
        }
        headers.push((k.to_string(), v.trim_matches([' ', '\t']).to_string()));
    }
    Ok(Head {
        method: method.to_string(),
        target: target.to_string(),
        minor,
        headers,
    })
}

/// Splits a request-target into (decoded path, raw query).
fn parse_target(target: &str) -> Result<(String, String), Response> {
    let bad = || simple(400, "400 Bad Request");
    if target.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err(bad());
    }
    let rest = if target.starts_with('/') || target == "*" {
        target
    } else if let Some(i) = target.find("://") {
        let after = &target[i + 3..];
        match after.find(['/', '?']) {
            Some(j) if after.as_bytes()[j] == b'/' => &after[j..],
            Some(j) => &after[j..],
            None => "/",
        }
    } else {
        return Err(bad());
    };
    let (raw_path, raw_query) = match rest.split_once('?') {
        Some((p, q)) => (p, q),
        None => (rest, ""),
    };
    let raw_path = if raw_path.is_empty() { "/" } else { raw_path };
    let decoded = crate::gostd::unescape(raw_path, false).ok_or_else(bad)?;
    Ok((
        String::from_utf8_lossy(&decoded).into_owned(),
        raw_query.to_string(),
    ))
}

/// Serves one connection until it closes, errs, or is killed. A panic in a
/// handler only costs that connection.
pub fn serve_connection(shared: Arc<Shared>, id: u64, h: Arc<ConnHandle>) {
    let s = shared.clone();
    let h2 = h.clone();
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || serve(s, h2)));
    if res.is_err() {
        h.kill();
    }
    shared.unregister(id);
}

fn serve(shared: Arc<Shared>, h: Arc<ConnHandle>) {
    let _ = h.stream.set_nodelay(true);
    let mut conn = Conn {
        h: h.clone(),
        buf: Vec::new(),
        pos: 0,
    };
    loop {
        if shared.aborted(&h) {
            break;
        }
        let raw = match conn.read_head() {
            Ok(r) => r,
            Err(HeadErr::Closed) => break,
            Err(HeadErr::Malformed) => {
                if !shared.aborted(&h) {
                    write_response(&h, &simple(400, "400 Bad Request"), false, false);
                    lingering_close(&h);
                }
                break;
            }
            Err(HeadErr::TooLarge) => {
                let r = simple(431, "431 Request Header Fields Too Large");
                if !shared.aborted(&h) {
                    write_response(&h, &r, false, false);
                    lingering_close(&h);
                }
                break;
            }
        };
        let head = match parse_head(&raw) {
            Ok(hd) => hd,
            Err(r) => {
                if !shared.aborted(&h) {
                    write_response(&h, &r, false, false);
                    lingering_close(&h);
                }
                break;
            }
        };
        let get = |name: &str| {
            head.headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
                .collect::<Vec<_>>()
        };
        let conn_tokens: Vec<String> = get("Connection")
            .iter()
            .flat_map(|v| v.split(','))
            .map(|t| t.trim().to_ascii_lowercase())
            .collect();
        let mut close = conn_tokens.iter().any(|t| t == "close")
            || (head.minor == 0 && !conn_tokens.iter().any(|t| t == "keep-alive"));
        let keep_alive_hdr = head.minor == 0 && !close;
        let head_only = head.method == "HEAD";

        // Body framing.
        let fail = |r: Response| {
            if !shared.aborted(&h) {
                write_response(&h, &r, head_only, false);
                lingering_close(&h);
            }
        };
        let te = get("Transfer-Encoding");
        let chunked = if te.is_empty() {
            false
        } else if te.len() == 1 && te[0].eq_ignore_ascii_case("chunked") {
            true
        } else {
            fail(simple(501, "Unsupported transfer encoding"));
            break;
        };
        let mut content_length: Option<u64> = None;
        if !chunked {
            for v in get("Content-Length") {
                match v.parse::<u64>() {
                    Ok(n) if content_length.unwrap_or(n) == n && !v.starts_with('+') => {
                        content_length = Some(n)
                    }
                    _ => {
                        fail(simple(400, "400 Bad Request"));
                        return;
                    }
                }
            }
        }
        let expect_continue = get("Expect")
            .iter()
            .any(|v| v.eq_ignore_ascii_case("100-continue"));
        let send_continue = |h: &ConnHandle| {
            let _ = (&h.stream).write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
        };
        let body = if chunked {
            if expect_continue {
                send_continue(&h);
            }
            match conn.read_chunked() {
                Ok(Some(b)) => Body::Bytes(b),
                Ok(None) => {
                    close = true;
                    Body::TooLarge
                }
                Err(()) => {
                    fail(simple(400, "400 Bad Request"));
                    break;
                }
            }
        } else {
            match content_length {
                None | Some(0) => Body::Bytes(Vec::new()),
                Some(n) if n <= MAX_BODY as u64 => {
                    if expect_continue {
                        send_continue(&h);
                    }
                    match conn.read_exact_body(n as usize) {
                        Some(b) => Body::Bytes(b),
                        None => break,
                    }
                }
                Some(n) => {
                    close = true;
                    if !expect_continue && n <= DRAIN_CAP && !conn.discard(n) {
                        break;
                    }
                    Body::TooLarge
                }
            }
        };

        let (path, raw_query) = match parse_target(&head.target) {
            Ok(x) => x,
            Err(r) => {
                fail(r);
                break;
            }
        };
        let req = Request {
            method: head.method,
            path,
            raw_query,
            headers: head.headers,
            body,
        };
        let control = api::is_control(&req);
        let mut resp = match api::handle(&shared, &h, &req) {
            Outcome::Drop => {
                h.kill();
                break;
            }
            Outcome::Respond(r) => r,
        };
        if !control {
            // A partition that starts while the answer is being prepared
            // swallows the answer too.
            if shared.current_fault(Instant::now()) == FaultMode::Hang
                && shared.hold_while_hanging(&h)
            {
                break;
            }
            if shared.current_fault(Instant::now()) == FaultMode::Drop {
                h.kill();
                break;
            }
            // So is an answer ready while the agent is frozen: it is
            // delivered (already stale, as Consul's was) on thaw.
            if shared.hold_while_frozen(&h) {
                break;
            }
        }
        if shared.aborted(&h) {
            break;
        }
        if close {
            resp.close = true;
        }
        if !write_response(&h, &resp, head_only, keep_alive_hdr) {
            break;
        }
        if resp.close {
            lingering_close(&h);
            break;
        }
    }
}
