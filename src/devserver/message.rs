//! A request as the handlers get it and the response they give: what http.rs
//! parses and writes and api.rs handles, kept apart so that neither file needs
//! the other's types (http.rs dispatches to api.rs).

/// Largest body handed to a handler (Consul's KV value limit).
pub const MAX_BODY: usize = 524_288;

#[derive(Debug)]
pub enum Body {
    Bytes(Vec<u8>),
    /// Larger than `MAX_BODY`; not kept.
    TooLarge,
}

#[derive(Debug)]
pub struct Request {
    pub method: String,
    /// Percent-decoded path (lossy UTF-8).
    pub path: String,
    pub raw_query: String,
    pub headers: Vec<(String, String)>,
    pub body: Body,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub close: bool,
}

impl Response {
    pub fn new(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Vec::new(),
            close: false,
        }
    }

    pub fn header(mut self, k: &str, v: impl Into<String>) -> Response {
        self.headers.push((k.to_string(), v.into()));
        self
    }

    pub fn body(mut self, b: Vec<u8>) -> Response {
        self.body = b;
        self
    }
}
