//! Routing and the Consul endpoints (KV, sessions, agent, status), plus the
//! dev server's own control endpoint under `/v1/conlock-dev/`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::gojson::{go_decode_first, go_fmt_t, go_type, J};
use super::listen;
use super::message::{Body, Request, Response, MAX_BODY};
use super::options::{FaultMode, DEFAULT_DETECT};
use super::shared::{ConnHandle, Shared};
use super::store::{
    kv_json, serf_health_json, session_json, Behavior, NewSession, Store, TxnKvOp, TxnOutcome,
    Watch,
};
use super::util;
use crate::gostd::{
    base64_std_decode, clean_request_path, detect_content_type, float64_to_uint64, format_duration,
    is_print, parse_duration, parse_uint, path_escape, strconv_quote, Query,
};

/// What a handler wants done with the connection.
pub enum Outcome {
    Respond(Response),
    /// Close the connection abruptly, without an answer.
    Drop,
}

const CONTROL_PREFIX: &str = "/v1/conlock-dev/";
const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";
const DEFAULT_WAIT: Duration = Duration::from_secs(300);
const MAX_WAIT: Duration = Duration::from_secs(600);
const SESSION_TTL_MAX: Duration = Duration::from_secs(86_400);

pub fn is_control(req: &Request) -> bool {
    req.path.starts_with(CONTROL_PREFIX)
}

fn text(status: u16, msg: &str) -> Response {
    let r = Response::new(status);
    if msg.is_empty() {
        return r;
    }
    r.header("Content-Type", TEXT).body(msg.as_bytes().to_vec())
}

fn json(status: u16, v: &J) -> Response {
    Response::new(status)
        .header("Content-Type", JSON)
        .body(v.to_go_pretty())
}

fn with_meta(r: Response, index: u64) -> Response {
    with_query_meta(r, index, true)
}

fn with_query_meta(mut r: Response, index: u64, known_leader: bool) -> Response {
    let meta = [
        ("X-Consul-Index", index.to_string()),
        ("X-Consul-Knownleader", known_leader.to_string()),
        ("X-Consul-Lastcontact", "0".to_string()),
    ];
    for (i, (k, v)) in meta.into_iter().enumerate() {
        r.headers.insert(i, (k.to_string(), v));
    }
    r
}

/// The dev server's datacenter (`/v1/agent/self` reports it).
const DATACENTER: &str = "dc1";

/// `?dc=` naming another datacenter (names are case-sensitive): the agent has no
/// server to forward to. Checked where Consul's agent makes the RPC, so the checks
/// it makes before (query options, key name, body) answer first.
fn foreign_dc(q: &Query) -> Option<Response> {
    let dc = q.get("dc");
    (!dc.is_empty() && dc != DATACENTER).then(|| text(500, "No path to datacenter"))
}

/// The same for the session and health reads, whose failed call still sets the
/// (empty) query meta headers.
fn foreign_dc_read(q: &Query) -> Option<Outcome> {
    foreign_dc(q).map(|r| respond(with_query_meta(r, 0, false)))
}

fn respond(r: Response) -> Outcome {
    Outcome::Respond(r)
}

/// Entry point for every parsed request.
pub fn handle(shared: &Arc<Shared>, h: &ConnHandle, req: &Request) -> Outcome {
    if is_control(req) {
        return respond(control(shared, h, req));
    }
    // A frozen agent does not even read the request.
    if shared.hold_while_frozen(h) {
        return Outcome::Drop;
    }
    shared.requests.fetch_add(1, Ordering::SeqCst);
    loop {
        match shared.current_fault(Instant::now()) {
            FaultMode::Drop => return Outcome::Drop,
            FaultMode::Error => return respond(text(500, "No cluster leader")),
            FaultMode::Hang => {
                if shared.hold_while_hanging(h) {
                    return Outcome::Drop;
                }
            }
            FaultMode::None => break,
        }
    }
    if let Some(want) = &shared.acl_token {
        let (q, _) = Query::parse(&req.raw_query);
        let given = match q.get("token") {
            "" => req.header("X-Consul-Token").unwrap_or(""),
            t => t,
        };
        if given != want {
            return respond(text(403, "Permission denied"));
        }
    }
    route(shared, h, req)
}

type Endpoint = fn(&Shared, &ConnHandle, &Request, &Query, &str) -> Outcome;

const EXACT: &[(&str, &[&str], Endpoint)] = &[
    ("/v1/session/create", &["PUT"], session_create),
    ("/v1/session/list", &["GET"], session_list),
    ("/v1/agent/self", &["GET"], agent_self),
    ("/v1/status/leader", &["GET"], status_leader),
    ("/v1/status/peers", &["GET"], status_peers),
    ("/v1/txn", &["PUT"], txn),
];

const SUBTREE: &[(&str, &[&str], Endpoint)] = &[
    ("/v1/kv/", &["GET", "PUT", "DELETE"], kvs),
    ("/v1/session/destroy/", &["PUT"], session_destroy),
    ("/v1/session/renew/", &["PUT"], session_renew),
    ("/v1/session/info/", &["GET"], session_info),
    ("/v1/session/node/", &["GET"], session_node),
    ("/v1/health/node/", &["GET"], health_node),
];

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&#34;")
        .replace('\'', "&#39;")
}

fn redirect(req: &Request, to_path: &str) -> Response {
    let mut loc = path_escape(to_path);
    if !req.raw_query.is_empty() {
        loc.push('?');
        loc.push_str(&req.raw_query);
    }
    let mut r = Response::new(301).header("Location", loc.clone());
    if req.method == "GET" || req.method == "HEAD" {
        r = r.header("Content-Type", "text/html; charset=utf-8");
    }
    if req.method == "GET" {
        r = r.body(
            format!(
                "<a href=\"{}\">Moved Permanently</a>.\n\n",
                html_escape(&loc)
            )
            .into_bytes(),
        );
    }
    r
}

fn route(shared: &Shared, h: &ConnHandle, req: &Request) -> Outcome {
    // hashicorp/go-cleanhttp's PrintablePathCheckHandler.
    if !req.path.chars().all(is_print) {
        return respond(Response::new(400));
    }
    if req.method != "CONNECT" {
        let clean = clean_request_path(&req.path);
        if clean != req.path {
            return respond(redirect(req, &clean));
        }
    }
    let path = req.path.as_str();
    let found = EXACT
        .iter()
        .find(|(p, _, _)| *p == path)
        .or_else(|| SUBTREE.iter().find(|(p, _, _)| path.starts_with(p)));
    let (pattern, methods, endpoint) = match found {
        Some(f) => *f,
        None => {
            let with_slash = format!("{path}/");
            if SUBTREE.iter().any(|(p, _, _)| *p == with_slash) {
                return respond(redirect(req, &with_slash));
            }
            if path == "/" {
                return respond(text(200, "Consul Agent"));
            }
            return respond(Response::new(404));
        }
    };
    let (q, bad_query) = Query::parse(&req.raw_query);
    if bad_query {
        return respond(Response::new(500));
    }
    let allow = || {
        let mut m = vec!["OPTIONS"];
        m.extend_from_slice(methods);
        m.join(",")
    };
    if req.method == "OPTIONS" {
        return respond(Response::new(200).header("Allow", allow()));
    }
    if !methods.contains(&req.method.as_str()) {
        return respond(
            text(405, &format!("method {} not allowed", req.method)).header("Allow", allow()),
        );
    }
    let rest = if pattern.ends_with('/') {
        &path[pattern.len()..]
    } else {
        ""
    };
    endpoint(shared, h, req, &q, rest)
}

// ----- query options and blocking ----------------------------------------

struct QueryOpts {
    min_index: u64,
    wait: Option<i64>,
}

/// Consul's `parseConsistency` + `parseWait`.
fn parse_opts(q: &Query) -> Result<QueryOpts, Response> {
    let mut stale = q.has("stale");
    let consistent = q.has("consistent");
    let max_stale = q.get("max_stale");
    if !max_stale.is_empty() {
        match parse_duration(max_stale) {
            Ok(d) => stale = stale || d > 0,
            Err(_) => {
                return Err(text(
                    400,
                    &format!("Invalid max_stale value {}", strconv_quote(max_stale)),
                ))
            }
        }
    }
    if stale && consistent {
        return Err(text(
            400,
            "Cannot specify ?stale with ?consistent, conflicting semantics.",
        ));
    }
    let mut opts = QueryOpts {
        min_index: 0,
        wait: None,
    };
    let wait = q.get("wait");
    if !wait.is_empty() {
        match parse_duration(wait) {
            Ok(d) => opts.wait = Some(d),
            Err(_) => return Err(text(400, "Invalid wait time")),
        }
    }
    let index = q.get("index");
    if !index.is_empty() {
        match parse_uint(index) {
            Ok(i) => opts.min_index = i,
            Err(_) => return Err(text(400, "Invalid index")),
        }
    }
    Ok(opts)
}

/// Counts a blocking query while it waits.
struct Waiting<'a>(&'a AtomicU64);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicU64) -> Waiting<'a> {
        count.fetch_add(1, Ordering::SeqCst);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs a blocking query on `watch`. Answers at once when `index` is 0 or the
/// reported index is past it; otherwise waits until what it watches changes
/// (and the index is past `index`) or the wait (plus jitter) runs out.
/// `Err`: a fault ended it (drop or 500).
fn block<T>(
    shared: &Shared,
    h: &ConnHandle,
    opts: &QueryOpts,
    watch: Watch,
    render: impl FnOnce(&Store) -> T,
) -> Result<(u64, T), Outcome> {
    let mut st = shared.lock_store();
    let (idx, mut stamp) = st.probe(&watch);
    if opts.min_index == 0 || idx > opts.min_index {
        return Ok((idx, render(&st)));
    }
    let mut wait = match opts.wait {
        Some(ns) if ns > 0 => Duration::from_nanos(ns as u64).min(MAX_WAIT),
        _ => DEFAULT_WAIT,
    };
    let jitter_range = (wait / 16).as_nanos() as u64;
    if jitter_range > 0 {
        wait += Duration::from_nanos(util::random_u64() % jitter_range);
    }
    let deadline = Instant::now() + wait;
    let _waiting = Waiting::new(&shared.blocking);
    let parked = shared.park(&st, watch, stamp);
    loop {
        if shared.aborted(h) {
            return Err(Outcome::Drop);
        }
        match shared.current_fault(Instant::now()) {
            FaultMode::Drop => {
                drop(st);
                h.kill();
                return Err(Outcome::Drop);
            }
            // Like an agent losing its servers: queries in flight fail too.
            FaultMode::Error => return Err(respond(text(500, "No cluster leader"))),
            FaultMode::Hang | FaultMode::None => {}
        }
        let now = Instant::now();
        if now >= deadline {
            let (idx, _) = st.probe(parked.watch());
            return Ok((idx, render(&st)));
        }
        st = parked.wait(st, deadline - now);
        if shared.aborted(h) {
            return Err(Outcome::Drop);
        }
        let (idx, s) = st.probe(parked.watch());
        if s != stamp {
            if idx > opts.min_index {
                return Ok((idx, render(&st)));
            }
            stamp = s;
            parked.saw(s);
        }
    }
}

// ----- KV ---------------------------------------------------------------

fn kvs(shared: &Shared, h: &ConnHandle, req: &Request, q: &Query, key: &str) -> Outcome {
    let opts = match parse_opts(q) {
        Ok(o) => o,
        Err(r) => return respond(r),
    };
    match req.method.as_str() {
        "GET" if q.has("keys") => kv_keys(shared, h, q, key, &opts),
        "GET" => kv_get(shared, h, q, key, &opts),
        "PUT" => respond(kv_put(shared, req, q, key)),
        _ => respond(kv_delete(shared, q, key)),
    }
}

fn kv_get(shared: &Shared, h: &ConnHandle, q: &Query, key: &str, opts: &QueryOpts) -> Outcome {
    if q.has("recurse") {
        if let Some(r) = foreign_dc(q) {
            return respond(r);
        }
        let got = block(shared, h, opts, Watch::Prefix(key.to_string()), |s| {
            s.kv_list(key)
                .into_iter()
                .map(|(k, e)| kv_json(k, e))
                .collect::<Vec<_>>()
        });
        return match got {
            Err(o) => o,
            Ok((idx, list)) if list.is_empty() => respond(with_meta(Response::new(404), idx)),
            Ok((idx, list)) => respond(with_meta(json(200, &J::A(list)), idx)),
        };
    }
    if key.is_empty() {
        return respond(text(400, "Missing key name"));
    }
    if let Some(r) = foreign_dc(q) {
        return respond(r);
    }
    let got = block(shared, h, opts, Watch::Key(key.to_string()), |s| {
        s.kv_get(key).cloned()
    });
    match got {
        Err(o) => o,
        Ok((idx, None)) => respond(with_meta(Response::new(404), idx)),
        Ok((idx, Some(e))) if q.has("raw") => {
            let mut r = Response::new(200);
            if !e.value.is_empty() {
                r = r.header("Content-Type", detect_content_type(&e.value));
            }
            respond(with_meta(r.body(e.value), idx))
        }
        Ok((idx, Some(e))) => respond(with_meta(json(200, &J::A(vec![kv_json(key, &e)])), idx)),
    }
}

fn kv_keys(shared: &Shared, h: &ConnHandle, q: &Query, prefix: &str, opts: &QueryOpts) -> Outcome {
    let mut sep = "";
    if q.has("seperator") {
        sep = q.get("seperator");
    }
    if q.has("separator") {
        sep = q.get("separator");
    }
    if let Some(r) = foreign_dc(q) {
        return respond(r);
    }
    let got = block(shared, h, opts, Watch::Prefix(prefix.to_string()), |s| {
        s.kv_keys(prefix, sep)
    });
    match got {
        Err(o) => o,
        Ok((idx, keys)) if keys.is_empty() && !prefix.is_empty() => {
            respond(with_meta(Response::new(404), idx))
        }
        Ok((idx, keys)) => respond(with_meta(
            json(200, &J::A(keys.into_iter().map(J::S).collect())),
            idx,
        )),
    }
}

/// Consul's `conflictingFlags`.
fn conflicting(q: &Query, flags: &[&str]) -> Option<Response> {
    if flags.iter().filter(|f| q.has(f)).count() > 1 {
        return Some(text(400, &format!("Conflicting flags: {}", q.encode())));
    }
    None
}

enum PutOp {
    Set,
    Cas(u64),
    Lock(String),
    Unlock(String),
}

fn kv_put(shared: &Shared, req: &Request, q: &Query, key: &str) -> Response {
    if key.is_empty() {
        return text(400, "Missing key name");
    }
    if let Some(r) = conflicting(q, &["cas", "acquire", "release"]) {
        return r;
    }
    let mut flags = 0;
    if q.has("flags") {
        match parse_uint(q.get("flags")) {
            Ok(f) => flags = f,
            Err(e) => return text(500, &e),
        }
    }
    let mut op = PutOp::Set;
    if q.has("cas") {
        match parse_uint(q.get("cas")) {
            Ok(c) => op = PutOp::Cas(c),
            Err(e) => return text(500, &e),
        }
    }
    if q.has("acquire") {
        op = PutOp::Lock(q.get("acquire").to_string());
    }
    if q.has("release") {
        op = PutOp::Unlock(q.get("release").to_string());
    }
    let value = match &req.body {
        Body::TooLarge => return text(413, &format!("Value exceeds {MAX_BODY} byte limit")),
        Body::Bytes(b) => b.clone(),
    };
    if let Some(r) = foreign_dc(q) {
        return r;
    }
    let result = {
        let mut st = shared.lock_store();
        match op {
            PutOp::Set => Ok(st.kv_set(key, flags, value)),
            PutOp::Cas(c) => Ok(st.kv_cas(key, flags, value, c)),
            PutOp::Lock(s) => st.kv_lock(key, flags, value, &s, Instant::now()),
            PutOp::Unlock(s) => st.kv_unlock(key, flags, value, &s),
        }
    };
    shared.notify_changed();
    match result {
        Ok(b) => json(200, &J::Bool(b)),
        Err(e) => text(500, &e),
    }
}

fn kv_delete(shared: &Shared, q: &Query, key: &str) -> Response {
    if let Some(r) = conflicting(q, &["recurse", "cas"]) {
        return r;
    }
    let recurse = q.has("recurse");
    if !recurse && key.is_empty() {
        return text(400, "Missing key name");
    }
    let mut cas = None;
    if q.has("cas") {
        match parse_uint(q.get("cas")) {
            Ok(c) => cas = Some(c),
            Err(e) => return text(500, &e),
        }
    }
    if let Some(r) = foreign_dc(q) {
        return r;
    }
    let result = {
        let mut st = shared.lock_store();
        match (recurse, cas) {
            (_, Some(c)) => st.kv_delete_cas(key, c),
            (true, None) => st.kv_delete_tree(key),
            (false, None) => st.kv_delete(key),
        }
    };
    shared.notify_changed();
    json(200, &J::Bool(result))
}

// ----- transactions ---------------------------------------------------------

/// Consul's `maxTxnOps`.
const MAX_TXN_OPS: usize = 64;
const TXN_WRITE_VERBS: &[&str] = &[
    "set",
    "delete",
    "delete-cas",
    "delete-tree",
    "cas",
    "lock",
    "unlock",
];

/// `PUT /v1/txn`: KV operations applied atomically (Consul's agent `Txn`): reads only
/// are answered without a raft index (with the query meta in the body), anything else
/// goes through one.
fn txn(shared: &Shared, _h: &ConnHandle, req: &Request, q: &Query, _r: &str) -> Outcome {
    let body = match &req.body {
        Body::TooLarge => return respond(text(413, "http: request body too large")),
        Body::Bytes(b) => b,
    };
    let TxnBody { listed, ops } = match parse_txn_ops(body) {
        Ok(b) => b,
        Err(e) => return respond(text(400, &format!("Failed to parse body: {e}"))),
    };
    if listed > MAX_TXN_OPS {
        return respond(text(
            413,
            &format!("Transaction contains too many operations ({listed} > {MAX_TXN_OPS})"),
        ));
    }
    let mut total = 0;
    for op in &ops {
        if op.value.len() > MAX_BODY {
            return respond(text(
                413,
                &format!(
                    "Value for key {} is too large ({} > {MAX_BODY} bytes)",
                    strconv_quote(&op.key),
                    op.value.len()
                ),
            ));
        }
        total += op.value.len();
    }
    if total > MAX_BODY {
        return respond(text(
            413,
            &format!("Cumulative size of key data is too large ({total} > {MAX_BODY} bytes)"),
        ));
    }
    let writes = ops
        .iter()
        .any(|op| TXN_WRITE_VERBS.contains(&op.verb.as_str()));
    if writes {
        if let Some(r) = foreign_dc(q) {
            return respond(r);
        }
        let out = shared.lock_store().txn_apply(&ops, Instant::now());
        shared.notify_changed();
        return respond(txn_response(out, false));
    }
    // The read-only path parses the query options of a read.
    if let Err(r) = parse_opts(q) {
        return respond(r);
    }
    if let Some(r) = foreign_dc(q) {
        return respond(r);
    }
    let out = shared.lock_store().txn_read(&ops, Instant::now());
    respond(
        txn_response(out, true)
            .header("X-Consul-Knownleader", "true")
            .header("X-Consul-Lastcontact", "0"),
    )
}

/// `TxnResponse`, or for reads `TxnReadResponse`, which adds the (empty) query meta.
fn txn_response(outcome: TxnOutcome, read: bool) -> Response {
    let (status, mut fields) = match outcome {
        Ok(results) => {
            let list = results
                .iter()
                .map(|r| J::obj([("KV", kv_json(&r.key, &r.entry))]))
                .collect();
            (200, vec![("Results", J::A(list)), ("Errors", J::Null)])
        }
        Err(errors) => {
            let list = errors
                .into_iter()
                .map(|(i, what)| J::obj([("OpIndex", J::U(i as u64)), ("What", J::S(what))]))
                .collect();
            (409, vec![("Results", J::Null), ("Errors", J::A(list))])
        }
    };
    if read {
        fields.extend([
            ("Index", J::U(0)),
            ("LastContact", J::U(0)),
            ("KnownLeader", J::Bool(true)),
            ("ConsistencyLevel", J::s("")),
        ]);
    }
    let fields = fields
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    json(status, &J::O(fields))
}

/// A decoded txn body.
struct TxnBody {
    /// Ops listed, with or without `KV`: the limit of 64 counts them all.
    listed: usize,
    /// The KV ops; an op without `KV` is dropped, as Consul's agent does.
    ops: Vec<TxnKvOp>,
}

/// A field of a decoded map as mapstructure finds it: the exact name, else any
/// spelling in another case.
fn map_field<'a>(m: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a Value> {
    m.get(name).or_else(|| {
        let lower = name.to_lowercase();
        m.iter()
            .find(|(k, _)| k.to_lowercase() == lower)
            .map(|(_, v)| v)
    })
}

/// The API form `[{"KV": {"Verb", "Key", "Value" (base64), "Flags", "Index",
/// "Session"}}]`, decoded as Consul before 1.7 does: Go's `interface{}` decoding
/// (every number a float64, so integers above 2^53 are rounded), `fixupKVOps` (base64
/// values), then mapstructure into `api.TxnOps` (uint64 from the float64, names in any
/// case, unknown fields such as `Namespace` ignored), with their error texts.
fn parse_txn_ops(body: &[u8]) -> Result<TxnBody, String> {
    let raw = go_decode_first(body)?;
    // fixupKVOps: the first "kv" of each op (any case), and in it the first "value";
    // it stops at the first problem.
    let Value::Array(items) = &raw else {
        return Err(format!("unexpected raw type: {}", go_fmt_t(&raw)));
    };
    let first = |m: &serde_json::Map<String, Value>, lower: &str| {
        m.iter()
            .find(|(k, _)| k.to_lowercase() == lower)
            .map(|(_, v)| v.clone())
    };
    for item in items {
        let Value::Object(op) = item else {
            return Err(format!("unexpected raw op type: {}", go_type(item)));
        };
        let kv = match first(op, "kv") {
            None | Some(Value::Null) => continue,
            Some(Value::Object(kv)) => kv,
            Some(other) => return Err(format!("unexpected raw KV type: {}", go_type(&other))),
        };
        match first(&kv, "value") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                base64_std_decode(&s).map_err(|e| format!("failed to decode value: {e}"))?;
            }
            Some(other) => return Err(format!("unexpected value type: {}", go_type(&other))),
        }
    }
    // mapstructure: every error is collected, and they are listed sorted.
    let mut errors = Vec::new();
    let mut ops = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Value::Object(op) = item else { continue };
        let Some(Value::Object(kv)) = map_field(op, "KV") else {
            continue;
        };
        let mut string = |name: &str, go_type_name: &str| match map_field(kv, name) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => {
                errors.push(unconvertible(&format!("[{i}].KV.{name}"), go_type_name, v));
                String::new()
            }
        };
        let verb = string("Verb", "api.KVOp");
        let key = string("Key", "string");
        let session = string("Session", "string");
        let mut uint = |name: &str| match map_field(kv, name) {
            None | Some(Value::Null) => 0,
            Some(Value::Number(n)) => {
                let f = n.as_f64().unwrap_or(0.0);
                if f < 0.0 {
                    errors.push(format!(
                        "cannot parse '[{i}].KV.{name}', {f:.6} overflows uint"
                    ));
                    0
                } else {
                    float64_to_uint64(f)
                }
            }
            Some(v) => {
                errors.push(unconvertible(&format!("[{i}].KV.{name}"), "uint64", v));
                0
            }
        };
        let flags = uint("Flags");
        let index = uint("Index");
        // Checked by the fixup above.
        let value = match map_field(kv, "Value") {
            Some(Value::String(s)) => base64_std_decode(s).unwrap_or_default(),
            _ => Vec::new(),
        };
        ops.push(TxnKvOp {
            verb,
            key,
            value,
            flags,
            index,
            session,
        });
    }
    if !errors.is_empty() {
        let mut points: Vec<String> = errors.iter().map(|e| format!("* {e}")).collect();
        points.sort();
        return Err(format!(
            "{} error(s) decoding:\n\n{}",
            points.len(),
            points.join("\n")
        ));
    }
    Ok(TxnBody {
        listed: items.len(),
        ops,
    })
}

// ----- sessions -----------------------------------------------------------

fn session_create(shared: &Shared, h: &ConnHandle, req: &Request, q: &Query, _r: &str) -> Outcome {
    let mut s = SessionArgs {
        id: String::new(),
        name: String::new(),
        node: h.agent.node.clone(),
        checks: Some(vec!["serfHealth".to_string()]),
        lock_delay_ns: 15_000_000_000,
        behavior: "release".to_string(),
        ttl: String::new(),
    };
    match &req.body {
        Body::TooLarge => return respond(text(413, "http: request body too large")),
        Body::Bytes(b) if !b.is_empty() => {
            if let Err(e) = decode_session(b, &mut s) {
                return respond(text(400, &format!("Request decode failed: {e}")));
            }
        }
        Body::Bytes(_) => {}
    }
    // Node, behavior and TTL are checked by the servers, after forwarding.
    if let Some(r) = foreign_dc(q) {
        return respond(r);
    }
    if s.node.is_empty() {
        return respond(text(500, "Must provide Node"));
    }
    let behavior = match s.behavior.as_str() {
        "" | "release" => Behavior::Release,
        "delete" => Behavior::Delete,
        other => return respond(text(500, &format!("Invalid Behavior setting '{other}'"))),
    };
    let mut ttl_dur = None;
    if !s.ttl.is_empty() {
        let ttl = match parse_duration(&s.ttl) {
            Ok(t) => t,
            Err(e) => return respond(text(500, &format!("Session TTL '{}' invalid: {e}", s.ttl))),
        };
        let min = shared.session_ttl_min.as_nanos().min(i64::MAX as u128) as i64;
        let max = SESSION_TTL_MAX.as_nanos() as i64;
        if ttl != 0 && (ttl < min || ttl > max) {
            return respond(text(
                500,
                &format!(
                    "Invalid Session TTL '{ttl}', must be between [{}={}]",
                    format_duration(min),
                    format_duration(max)
                ),
            ));
        }
        if ttl > 0 {
            ttl_dur = Some(Duration::from_nanos(ttl as u64));
        }
    }
    let result = {
        let mut st = shared.lock_store();
        let id = loop {
            let id = util::uuid_v4();
            if !st.session_exists(&id) {
                break id;
            }
        };
        st.session_create(
            NewSession {
                id,
                name: s.name,
                node: s.node,
                checks: s.checks,
                lock_delay_ns: s.lock_delay_ns,
                behavior,
                ttl: s.ttl,
                ttl_dur,
            },
            Instant::now(),
        )
    };
    shared.notify_changed();
    match result {
        Ok(id) => respond(json(200, &J::obj([("ID", J::S(id))]))),
        Err(e) => respond(text(500, &e)),
    }
}

struct SessionArgs {
    id: String,
    name: String,
    node: String,
    checks: Option<Vec<String>>,
    lock_delay_ns: i64,
    behavior: String,
    ttl: String,
}

fn go_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "invalid",
        Value::Bool(_) => "bool",
        Value::Number(_) => "float64",
        Value::String(_) => "string",
        Value::Array(_) => "slice",
        Value::Object(_) => "map",
    }
}

fn unconvertible(name: &str, want: &str, v: &Value) -> String {
    format!(
        "'{name}' expected type '{want}', got unconvertible type '{}'",
        go_type(v)
    )
}

/// Go's `time.Duration(f)` conversion (amd64 semantics for out-of-range).
fn f64_to_duration(f: f64) -> i64 {
    // 2^63 is exactly representable; i64 covers [-2^63, 2^63).
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if f.is_nan() || !(-LIMIT..LIMIT).contains(&f) {
        i64::MIN
    } else {
        f as i64
    }
}

/// Consul's session body decoding: `json.Decoder` into `interface{}`, the
/// LockDelay/Checks fixups, then mapstructure into `structs.Session`.
fn decode_session(body: &[u8], s: &mut SessionArgs) -> Result<(), String> {
    let raw = go_decode_first(body)?;
    let map = match &raw {
        Value::Null => return Ok(()),
        Value::Object(m) => m,
        other => return Err(format!("'' expected a map, got '{}'", go_kind(other))),
    };
    // FixupLockDelay
    let mut lock_delay: Option<Result<i64, &Value>> = None;
    if let Some((_, v)) = map.iter().find(|(k, _)| k.to_lowercase() == "lockdelay") {
        lock_delay = match v {
            Value::String(st) => {
                let mut d = parse_duration(st)?;
                if d < 1000 {
                    d = d.wrapping_mul(1_000_000_000);
                }
                Some(Ok(d))
            }
            Value::Number(n) => {
                let mut d = f64_to_duration(n.as_f64().unwrap_or(0.0));
                if d < 1000 {
                    d = d.wrapping_mul(1_000_000_000);
                }
                Some(Ok(d))
            }
            Value::Null => None,
            other => Some(Err(other)),
        };
    }
    // FixupChecks
    if map.keys().any(|k| k.to_lowercase() == "checks") {
        s.checks = None;
    }
    let field = |name: &str| -> Option<&Value> {
        map.get(name).or_else(|| {
            map.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v)
        })
    };
    let mut errors: Vec<String> = Vec::new();
    let mut string_field = |name: &str, want: &str, out: &mut String| match field(name) {
        None | Some(Value::Null) => {}
        Some(Value::String(v)) => *out = v.clone(),
        Some(other) => errors.push(unconvertible(name, want, other)),
    };
    string_field("ID", "string", &mut s.id);
    string_field("Name", "string", &mut s.name);
    string_field("Node", "string", &mut s.node);
    let mut checks_errors = Vec::new();
    match field("Checks") {
        None | Some(Value::Null) => {}
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::Null => out.push(String::new()),
                    Value::String(c) => out.push(c.clone()),
                    other => checks_errors.push(unconvertible(
                        &format!("Checks[{i}]"),
                        "types.CheckID",
                        other,
                    )),
                }
            }
            s.checks = Some(out);
        }
        Some(other) => checks_errors.push(format!(
            "'Checks': source data must be an array or slice, got {}",
            go_kind(other)
        )),
    }
    match lock_delay {
        Some(Ok(d)) => s.lock_delay_ns = d,
        Some(Err(v)) => checks_errors.push(unconvertible("LockDelay", "time.Duration", v)),
        None => {}
    }
    let mut tail_errors = Vec::new();
    let mut string_field2 = |name: &str, want: &str, out: &mut String| match field(name) {
        None | Some(Value::Null) => {}
        Some(Value::String(v)) => *out = v.clone(),
        Some(other) => tail_errors.push(unconvertible(name, want, other)),
    };
    string_field2("Behavior", "structs.SessionBehavior", &mut s.behavior);
    string_field2("TTL", "string", &mut s.ttl);
    match field("RaftIndex") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for name in ["CreateIndex", "ModifyIndex"] {
                let v = m.get(name).or_else(|| {
                    m.iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case(name))
                        .map(|(_, v)| v)
                });
                match v {
                    None | Some(Value::Null) | Some(Value::Number(_)) => {}
                    Some(other) => tail_errors.push(unconvertible(
                        &format!("RaftIndex.{name}"),
                        "uint64",
                        other,
                    )),
                }
            }
        }
        Some(other) => tail_errors.push(format!(
            "'RaftIndex' expected a map, got '{}'",
            go_kind(other)
        )),
    }
    errors.extend(checks_errors);
    errors.extend(tail_errors);
    if errors.is_empty() {
        return Ok(());
    }
    let points: Vec<String> = errors.iter().map(|e| format!("* {e}")).collect();
    Err(format!(
        "{} error(s) decoding:\n\n{}",
        errors.len(),
        points.join("\n")
    ))
}

fn session_destroy(
    shared: &Shared,
    _h: &ConnHandle,
    _req: &Request,
    q: &Query,
    id: &str,
) -> Outcome {
    if id.is_empty() {
        return respond(text(400, "Missing session"));
    }
    if let Some(r) = foreign_dc(q) {
        return respond(r);
    }
    let result = shared.lock_store().session_destroy(id, Instant::now());
    shared.notify_changed();
    match result {
        Ok(()) => respond(json(200, &J::Bool(true))),
        Err(e) => respond(text(500, &e)),
    }
}

fn session_renew(shared: &Shared, _h: &ConnHandle, _req: &Request, q: &Query, id: &str) -> Outcome {
    if let Err(r) = parse_opts(q) {
        return respond(r);
    }
    if id.is_empty() {
        return respond(text(400, "Missing session"));
    }
    if let Some(r) = foreign_dc(q) {
        return respond(r);
    }
    let mut st = shared.lock_store();
    let out = match st.session_renew(id, Instant::now()) {
        Err(e) => text(500, &e),
        Ok(None) => text(404, &format!("Session id '{id}' not found")),
        Ok(Some(s)) => json(200, &J::A(vec![session_json(s)])),
    };
    respond(out)
}

fn sessions_answer(got: Result<(u64, Vec<J>), Outcome>) -> Outcome {
    match got {
        Err(o) => o,
        Ok((idx, list)) => respond(with_meta(json(200, &J::A(list)), idx)),
    }
}

fn session_info(shared: &Shared, h: &ConnHandle, _req: &Request, q: &Query, id: &str) -> Outcome {
    let opts = match parse_opts(q) {
        Ok(o) => o,
        Err(r) => return respond(r),
    };
    if id.is_empty() {
        return respond(text(400, "Missing session"));
    }
    if let Some(o) = foreign_dc_read(q) {
        return o;
    }
    if let Err(e) = shared.lock_store().session_get(id) {
        return respond(text(500, &e));
    }
    sessions_answer(block(shared, h, &opts, Watch::Sessions, |s| {
        match s.session_get(id) {
            Ok(Some(sess)) => vec![session_json(sess)],
            _ => Vec::new(),
        }
    }))
}

fn session_list(shared: &Shared, h: &ConnHandle, _req: &Request, q: &Query, _r: &str) -> Outcome {
    let opts = match parse_opts(q) {
        Ok(o) => o,
        Err(r) => return respond(r),
    };
    if let Some(o) = foreign_dc_read(q) {
        return o;
    }
    sessions_answer(block(shared, h, &opts, Watch::Sessions, |s| {
        s.session_list().into_iter().map(session_json).collect()
    }))
}

fn session_node(shared: &Shared, h: &ConnHandle, _req: &Request, q: &Query, node: &str) -> Outcome {
    let opts = match parse_opts(q) {
        Ok(o) => o,
        Err(r) => return respond(r),
    };
    if node.is_empty() {
        return respond(text(400, "Missing node name"));
    }
    if let Some(o) = foreign_dc_read(q) {
        return o;
    }
    sessions_answer(block(shared, h, &opts, Watch::Sessions, |s| {
        s.node_sessions(node)
            .into_iter()
            .map(session_json)
            .collect()
    }))
}

// ----- health ----------------------------------------------------------------

fn health_node(shared: &Shared, h: &ConnHandle, _req: &Request, q: &Query, node: &str) -> Outcome {
    let opts = match parse_opts(q) {
        Ok(o) => o,
        Err(r) => return respond(r),
    };
    if node.is_empty() {
        return respond(text(400, "Missing node name"));
    }
    if let Some(o) = foreign_dc_read(q) {
        return o;
    }
    sessions_answer(block(shared, h, &opts, Watch::Checks, |s| {
        s.node(node).map(serf_health_json).into_iter().collect()
    }))
}

// ----- agent / status ------------------------------------------------------

fn agent_self(_s: &Shared, h: &ConnHandle, _req: &Request, _q: &Query, _r: &str) -> Outcome {
    let node = h.agent.node.as_str();
    let (server, role) = if h.agent.server {
        (true, "consul")
    } else {
        (false, "node")
    };
    respond(json(
        200,
        &J::obj([
            (
                "Config",
                J::obj([
                    ("Datacenter", J::s(DATACENTER)),
                    ("NodeName", J::s(node)),
                    ("Revision", J::s("conlock-dev")),
                    ("Server", J::Bool(server)),
                    ("Version", J::s("1.0.8")),
                ]),
            ),
            (
                "Member",
                J::obj([
                    ("Name", J::s(node)),
                    ("Addr", J::s("127.0.0.1")),
                    ("Port", J::U(8301)),
                    (
                        "Tags",
                        J::obj([("dc", J::s(DATACENTER)), ("role", J::s(role))]),
                    ),
                    ("Status", J::U(1)),
                ]),
            ),
        ]),
    ))
}

fn status_leader(_s: &Shared, _h: &ConnHandle, _req: &Request, _q: &Query, _r: &str) -> Outcome {
    respond(json(200, &J::s("127.0.0.1:8300")))
}

fn status_peers(_s: &Shared, _h: &ConnHandle, _req: &Request, _q: &Query, _r: &str) -> Outcome {
    respond(json(200, &J::A(vec![J::s("127.0.0.1:8300")])))
}

// ----- control endpoint --------------------------------------------------------

fn control(shared: &Arc<Shared>, h: &ConnHandle, req: &Request) -> Response {
    let (q, _) = Query::parse(&req.raw_query);
    let rest = &req.path[CONTROL_PREFIX.len()..];
    let method_ok = |m: &str| req.method == m;
    if matches!(rest, "agent" | "agent/freeze" | "agent/thaw" | "restart") && !method_ok("PUT") {
        return text(405, &format!("method {} not allowed", req.method)).header("Allow", "PUT");
    }
    if rest == "agent" {
        let node = q.get("node");
        return match listen::add_agent(shared, node) {
            Ok(addr) => json(200, &J::obj([("Addr", J::S(addr.to_string()))])),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => text(409, &e.to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => text(400, &e.to_string()),
            Err(e) => text(500, &format!("cannot start the agent's listener: {e}")),
        };
    }
    if rest == "agent/freeze" || rest == "agent/thaw" {
        let node = q.get("node");
        let freeze = rest == "agent/freeze";
        let detect = match q.get("detect") {
            "" => DEFAULT_DETECT,
            d => match parse_duration(d) {
                Ok(ns) if ns >= 0 && freeze => Duration::from_nanos(ns as u64),
                _ => return text(400, &format!("Invalid detect duration '{d}'")),
            },
        };
        if !shared.set_frozen(node, freeze, detect) {
            return text(404, &format!("No agent on node '{node}'"));
        }
        return json(200, &J::Bool(true));
    }
    if rest == "restart" {
        if q.get("state") != "lose" {
            return text(
                400,
                &format!("Invalid restart state '{}' (want lose)", q.get("state")),
            );
        }
        shared.restart_losing_state(Some(h));
        return json(200, &J::Bool(true));
    }
    if rest == "fault" {
        if !method_ok("PUT") {
            return text(405, &format!("method {} not allowed", req.method)).header("Allow", "PUT");
        }
        let mode = match FaultMode::parse(q.get("mode")) {
            Some(m) => m,
            None => {
                return text(
                    400,
                    &format!(
                        "Invalid fault mode '{}' (want error, hang, drop or none)",
                        q.get("mode")
                    ),
                )
            }
        };
        let dur = match q.get("for") {
            "" => None,
            f => match parse_duration(f) {
                Ok(d) if d > 0 => Some(Duration::from_nanos(d as u64)),
                _ => return text(400, &format!("Invalid fault duration '{f}'")),
            },
        };
        shared.set_fault(mode, dur);
        return json(200, &J::Bool(true));
    }
    if let Some(id) = rest.strip_prefix("session/expire/") {
        if !method_ok("PUT") {
            return text(405, &format!("method {} not allowed", req.method)).header("Allow", "PUT");
        }
        let ok = shared.lock_store().session_expire(id, Instant::now());
        shared.notify_changed();
        return json(200, &J::Bool(ok));
    }
    if rest == "stats" {
        if !method_ok("GET") {
            return text(405, &format!("method {} not allowed", req.method)).header("Allow", "GET");
        }
        let (sessions, keys) = {
            let st = shared.lock_store();
            (st.session_count(), st.kv_count())
        };
        return json(
            200,
            &J::obj([
                ("requests", J::U(shared.requests.load(Ordering::SeqCst))),
                ("sessions", J::U(sessions as u64)),
                ("keys", J::U(keys as u64)),
            ]),
        );
    }
    Response::new(404)
}
