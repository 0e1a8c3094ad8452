//! Wire types of etcd's v3 JSON gateway (grpc-gateway, etcd 3.4+), by proto field name.
//!
//! The gateway's encoding (recorded in tests/fixtures/etcd-3.4.23): int64/uint64 are
//! JSON strings (numbers are accepted on input too), bytes are standard base64, enums
//! are upper-case names, and every zero, false or empty field is omitted, so every
//! answer type defaults each field (a failed txn has no `succeeded`, a PUT event no
//! `type`, a keepalive of a lost lease no `TTL`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// int64/uint64 fields: written as strings, read from strings or numbers.
pub mod int {
    use super::*;
    use std::fmt::Display;
    use std::str::FromStr;

    pub fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Str(String),
        U(u64),
        I(i64),
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr + TryFrom<u64> + TryFrom<i64>,
        D: Deserializer<'de>,
    {
        use serde::de::Error;
        let out = match Raw::deserialize(d)? {
            Raw::Str(s) => s.trim().parse::<T>().ok(),
            Raw::U(u) => T::try_from(u).ok(),
            Raw::I(i) => T::try_from(i).ok(),
        };
        out.ok_or_else(|| D::Error::custom("integer out of range or not a number"))
    }
}

/// bytes fields: standard base64 with padding.
pub mod b64 {
    use super::*;
    use base64::Engine;

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        use serde::de::Error;
        let text = Option::<String>::deserialize(d)?.unwrap_or_default();
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(|e| D::Error::custom(format!("invalid base64: {e}")))
    }
}

/// Lists of bytes (`keys` of a timetolive answer).
mod b64_list {
    use super::*;
    use base64::Engine;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
        use serde::de::Error;
        Option::<Vec<String>>::deserialize(d)?
            .unwrap_or_default()
            .iter()
            .map(|t| {
                base64::engine::general_purpose::STANDARD
                    .decode(t.as_bytes())
                    .map_err(|e| D::Error::custom(format!("invalid base64: {e}")))
            })
            .collect()
    }
}

fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}
fn is_false(v: &bool) -> bool {
    !*v
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ResponseHeader {
    #[serde(with = "int")]
    pub cluster_id: u64,
    #[serde(with = "int")]
    pub member_id: u64,
    #[serde(with = "int")]
    pub revision: i64,
    #[serde(with = "int")]
    pub raft_term: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KeyValue {
    #[serde(with = "b64")]
    pub key: Vec<u8>,
    #[serde(with = "int")]
    pub create_revision: i64,
    #[serde(with = "int")]
    pub mod_revision: i64,
    #[serde(with = "int")]
    pub version: i64,
    #[serde(with = "b64")]
    pub value: Vec<u8>,
    #[serde(with = "int")]
    pub lease: i64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum SortOrder {
    #[default]
    #[serde(rename = "NONE")]
    None,
    #[serde(rename = "ASCEND")]
    Ascend,
    #[serde(rename = "DESCEND")]
    Descend,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum SortTarget {
    #[default]
    #[serde(rename = "KEY")]
    Key,
    #[serde(rename = "VERSION")]
    Version,
    #[serde(rename = "CREATE")]
    Create,
    #[serde(rename = "MOD")]
    Mod,
    #[serde(rename = "VALUE")]
    Value,
}

/// `/v3/kv/range`. An empty `range_end` means the one key; see [`prefix_range_end`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RangeRequest {
    #[serde(with = "b64")]
    pub key: Vec<u8>,
    #[serde(with = "b64", skip_serializing_if = "Vec::is_empty")]
    pub range_end: Vec<u8>,
    #[serde(with = "int", skip_serializing_if = "is_zero_i64")]
    pub limit: i64,
    #[serde(with = "int", skip_serializing_if = "is_zero_i64")]
    pub revision: i64,
    #[serde(skip_serializing_if = "is_default")]
    pub sort_order: SortOrder,
    #[serde(skip_serializing_if = "is_default")]
    pub sort_target: SortTarget,
    #[serde(skip_serializing_if = "is_false")]
    pub serializable: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub keys_only: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub count_only: bool,
    #[serde(with = "int", skip_serializing_if = "is_zero_i64")]
    pub min_mod_revision: i64,
    #[serde(with = "int", skip_serializing_if = "is_zero_i64")]
    pub max_mod_revision: i64,
    #[serde(with = "int", skip_serializing_if = "is_zero_i64")]
    pub min_create_revision: i64,
    #[serde(with = "int", skip_serializing_if = "is_zero_i64")]
    pub max_create_revision: i64,
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

impl RangeRequest {
    /// The one key.
    pub fn key(key: impl Into<Vec<u8>>) -> Self {
        RangeRequest {
            key: key.into(),
            ..Default::default()
        }
    }

    /// Every key that starts with `prefix`.
    pub fn prefix(prefix: impl Into<Vec<u8>>) -> Self {
        let key = prefix.into();
        RangeRequest {
            range_end: prefix_range_end(&key),
            key,
            ..Default::default()
        }
    }
}

/// Note: `count` is the number of keys in the range *before* the min/max revision
/// filters; count the `kvs` to count filtered keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RangeResponse {
    pub header: ResponseHeader,
    pub kvs: Vec<KeyValue>,
    pub more: bool,
    #[serde(with = "int")]
    pub count: i64,
}

/// `/v3/kv/put`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PutRequest {
    #[serde(with = "b64")]
    pub key: Vec<u8>,
    #[serde(with = "b64")]
    pub value: Vec<u8>,
    #[serde(with = "int", skip_serializing_if = "is_zero_i64")]
    pub lease: i64,
    #[serde(skip_serializing_if = "is_false")]
    pub prev_kv: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub ignore_value: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub ignore_lease: bool,
}

impl PutRequest {
    pub fn new(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        PutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct PutResponse {
    pub header: ResponseHeader,
    pub prev_kv: Option<KeyValue>,
}

/// `/v3/kv/deleterange`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeleteRangeRequest {
    #[serde(with = "b64")]
    pub key: Vec<u8>,
    #[serde(with = "b64", skip_serializing_if = "Vec::is_empty")]
    pub range_end: Vec<u8>,
    #[serde(skip_serializing_if = "is_false")]
    pub prev_kv: bool,
}

impl DeleteRangeRequest {
    pub fn key(key: impl Into<Vec<u8>>) -> Self {
        DeleteRangeRequest {
            key: key.into(),
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct DeleteRangeResponse {
    pub header: ResponseHeader,
    #[serde(with = "int")]
    pub deleted: i64,
    pub prev_kvs: Vec<KeyValue>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum CompareResult {
    #[serde(rename = "EQUAL")]
    Equal,
    #[serde(rename = "GREATER")]
    Greater,
    #[serde(rename = "LESS")]
    Less,
    #[serde(rename = "NOT_EQUAL")]
    NotEqual,
}

/// What a [`Compare`] looks at, with the value to compare it to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CompareTarget {
    Version(i64),
    Create(i64),
    Mod(i64),
    Value(Vec<u8>),
    Lease(i64),
}

/// One condition of a txn. Serialized with the target's name (`"CREATE"`) and its
/// value field (`"create_revision":"0"`), which the gateway requires even when zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
    pub result: CompareResult,
    pub target: CompareTarget,
}

impl Compare {
    pub fn new(key: impl Into<Vec<u8>>, target: CompareTarget, result: CompareResult) -> Self {
        Compare {
            key: key.into(),
            range_end: Vec::new(),
            result,
            target,
        }
    }

    /// `create_revision(key) == rev`; 0 means "the key does not exist".
    pub fn create_revision(key: impl Into<Vec<u8>>, result: CompareResult, rev: i64) -> Self {
        Self::new(key, CompareTarget::Create(rev), result)
    }
}

impl Serialize for Compare {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::Engine;
        use serde::ser::SerializeMap;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("key", &b64(&self.key))?;
        if !self.range_end.is_empty() {
            m.serialize_entry("range_end", &b64(&self.range_end))?;
        }
        m.serialize_entry("result", &self.result)?;
        match &self.target {
            CompareTarget::Version(v) => {
                m.serialize_entry("target", "VERSION")?;
                m.serialize_entry("version", &v.to_string())?;
            }
            CompareTarget::Create(v) => {
                m.serialize_entry("target", "CREATE")?;
                m.serialize_entry("create_revision", &v.to_string())?;
            }
            CompareTarget::Mod(v) => {
                m.serialize_entry("target", "MOD")?;
                m.serialize_entry("mod_revision", &v.to_string())?;
            }
            CompareTarget::Value(v) => {
                m.serialize_entry("target", "VALUE")?;
                m.serialize_entry("value", &b64(v))?;
            }
            CompareTarget::Lease(v) => {
                m.serialize_entry("target", "LEASE")?;
                m.serialize_entry("lease", &v.to_string())?;
            }
        }
        m.end()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum RequestOp {
    #[serde(rename = "request_range")]
    Range(RangeRequest),
    #[serde(rename = "request_put")]
    Put(PutRequest),
    #[serde(rename = "request_delete_range")]
    DeleteRange(DeleteRangeRequest),
    /// A nested txn (etcd 3.3+): its compares see the store as before the outer txn.
    #[serde(rename = "request_txn")]
    Txn(Box<TxnRequest>),
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum ResponseOp {
    #[serde(rename = "response_range")]
    Range(RangeResponse),
    #[serde(rename = "response_put")]
    Put(PutResponse),
    #[serde(rename = "response_delete_range")]
    DeleteRange(DeleteRangeResponse),
    /// A nested txn's answer (the uncontended acquisition sends one).
    #[serde(rename = "response_txn")]
    Txn(Box<TxnResponse>),
}

/// `/v3/kv/txn`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct TxnResponse {
    pub header: ResponseHeader,
    /// Omitted by the gateway when false.
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
}

/// `/v3/lease/grant`. `id` 0 lets etcd choose.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LeaseGrantRequest {
    #[serde(rename = "TTL", with = "int")]
    pub ttl: i64,
    #[serde(rename = "ID", with = "int", skip_serializing_if = "is_zero_i64")]
    pub id: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct LeaseGrantResponse {
    pub header: ResponseHeader,
    #[serde(rename = "ID", with = "int")]
    pub id: i64,
    /// The granted TTL, which may be more than asked (etcd's minimum).
    #[serde(rename = "TTL", with = "int")]
    pub ttl: i64,
    pub error: String,
}

/// `/v3/lease/keepalive`, `/v3/lease/revoke` (same shape: the lease ID).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LeaseIdRequest {
    #[serde(rename = "ID", with = "int")]
    pub id: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct LeaseKeepAliveResponse {
    pub header: ResponseHeader,
    #[serde(rename = "ID", with = "int")]
    pub id: i64,
    /// The granted TTL again; 0 (omitted) means the lease is gone.
    #[serde(rename = "TTL", with = "int")]
    pub ttl: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct LeaseRevokeResponse {
    pub header: ResponseHeader,
}

/// `/v3/lease/timetolive`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LeaseTimeToLiveRequest {
    #[serde(rename = "ID", with = "int")]
    pub id: i64,
    #[serde(skip_serializing_if = "is_false")]
    pub keys: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct LeaseTimeToLiveResponse {
    pub header: ResponseHeader,
    #[serde(rename = "ID", with = "int")]
    pub id: i64,
    /// Seconds left; -1 when the lease is gone, 0 when expired but not yet revoked.
    #[serde(rename = "TTL", with = "int")]
    pub ttl: i64,
    #[serde(rename = "grantedTTL", with = "int")]
    pub granted_ttl: i64,
    #[serde(deserialize_with = "b64_list::deserialize")]
    pub keys: Vec<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum WatchFilter {
    #[serde(rename = "NOPUT")]
    NoPut,
    #[serde(rename = "NODELETE")]
    NoDelete,
}

/// The `create_request` of `/v3/watch`. `start_revision` 0 means "from now".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WatchCreateRequest {
    #[serde(with = "b64")]
    pub key: Vec<u8>,
    #[serde(with = "b64", skip_serializing_if = "Vec::is_empty")]
    pub range_end: Vec<u8>,
    #[serde(with = "int", skip_serializing_if = "is_zero_i64")]
    pub start_revision: i64,
    #[serde(skip_serializing_if = "is_false")]
    pub progress_notify: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<WatchFilter>,
    #[serde(skip_serializing_if = "is_false")]
    pub prev_kv: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WatchRequest {
    pub create_request: WatchCreateRequest,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EventType {
    /// Enum 0: the gateway omits the field.
    #[default]
    Put,
    Delete,
}

impl<'de> Deserialize<'de> for EventType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            N(i64),
        }
        match Raw::deserialize(d)? {
            Raw::S(s) if s == "PUT" => Ok(EventType::Put),
            Raw::S(s) if s == "DELETE" => Ok(EventType::Delete),
            Raw::N(0) => Ok(EventType::Put),
            Raw::N(1) => Ok(EventType::Delete),
            Raw::S(s) => Err(D::Error::custom(format!("unknown event type {s:?}"))),
            Raw::N(n) => Err(D::Error::custom(format!("unknown event type {n}"))),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: EventType,
    /// For a DELETE only `key` and `mod_revision` (the delete's revision) are set.
    pub kv: KeyValue,
    pub prev_kv: Option<KeyValue>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct WatchResponse {
    pub header: ResponseHeader,
    #[serde(with = "int")]
    pub watch_id: i64,
    pub created: bool,
    pub canceled: bool,
    #[serde(with = "int")]
    pub compact_revision: i64,
    pub cancel_reason: String,
    pub fragment: bool,
    pub events: Vec<Event>,
}

/// `/v3/maintenance/status`: the member answering is the leader when
/// `leader == header.member_id`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct StatusResponse {
    pub header: ResponseHeader,
    pub version: String,
    #[serde(with = "int")]
    pub leader: u64,
    #[serde(rename = "raftTerm", with = "int")]
    pub raft_term: u64,
    #[serde(rename = "raftIndex", with = "int")]
    pub raft_index: u64,
    pub errors: Vec<String>,
    #[serde(rename = "isLearner")]
    pub is_learner: bool,
}

/// `GET /version` (a plain handler, not the gateway).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct VersionResponse {
    pub etcdserver: String,
    pub etcdcluster: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuthenticateRequest {
    pub name: String,
    pub password: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct AuthenticateResponse {
    pub header: ResponseHeader,
    pub token: String,
}

/// The body of a unary error answer: `{"error":..,"message":..,"code":N}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct GatewayError {
    pub error: String,
    pub message: String,
    pub code: i32,
}

/// The last object of a failed stream: `{"error":{"grpc_code":..,"http_code":..,..}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct StreamError {
    pub grpc_code: i32,
    pub http_code: u16,
    pub message: String,
    pub http_status: String,
}

/// One object of a streamed answer (watch, keepalive): a result or the final error.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub enum StreamFrame<T> {
    #[serde(rename = "result")]
    Result(T),
    #[serde(rename = "error")]
    Error(StreamError),
}

/// The end of the range of every key that starts with `prefix` (clientv3's
/// GetPrefixRangeEnd): the prefix with its last byte below 0xff incremented and what
/// follows dropped; `[0]` (every key from `prefix` on) when all bytes are 0xff.
pub fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.last_mut() {
        if *last < 0xff {
            *last += 1;
            return end;
        }
        end.pop();
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_range_end(b"mylock/"), b"mylock0");
        assert_eq!(prefix_range_end(b"a\xff"), b"b");
        assert_eq!(prefix_range_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_range_end(b""), vec![0]);
    }

    #[test]
    fn integers_as_strings_or_numbers() {
        let h: ResponseHeader =
            serde_json::from_value(json!({"revision": "13", "member_id": 7, "raft_term": "2"}))
                .unwrap();
        assert_eq!((h.revision, h.member_id, h.raft_term), (13, 7, 2));
        let h: ResponseHeader =
            serde_json::from_value(json!({"cluster_id": "15118495548433857066"})).unwrap();
        assert_eq!(h.cluster_id, 15118495548433857066);
        assert!(serde_json::from_value::<ResponseHeader>(json!({"revision": "x"})).is_err());
        assert!(
            serde_json::from_value::<ResponseHeader>(json!({"revision": -1}))
                .is_ok_and(|h| h.revision == -1)
        );
        assert!(serde_json::from_value::<ResponseHeader>(json!({"member_id": -1})).is_err());
    }

    #[test]
    fn requests_use_the_gateway_names() {
        let mut r = RangeRequest::prefix(b"ilock/".to_vec());
        r.sort_order = SortOrder::Descend;
        r.sort_target = SortTarget::Create;
        r.limit = 1;
        r.max_create_revision = 44;
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"key":"aWxvY2sv","range_end":"aWxvY2sw","sort_order":"DESCEND",
                   "sort_target":"CREATE","limit":"1","max_create_revision":"44"})
        );
        let txn = TxnRequest {
            compare: vec![Compare::create_revision(
                b"k".to_vec(),
                CompareResult::Equal,
                0,
            )],
            success: vec![RequestOp::Put(PutRequest {
                lease: 5,
                ..PutRequest::new(b"k".to_vec(), Vec::new())
            })],
            failure: vec![RequestOp::Range(RangeRequest::key(b"k".to_vec()))],
        };
        assert_eq!(
            serde_json::to_value(&txn).unwrap(),
            json!({"compare":[{"key":"aw==","result":"EQUAL","target":"CREATE","create_revision":"0"}],
                   "success":[{"request_put":{"key":"aw==","value":"","lease":"5"}}],
                   "failure":[{"request_range":{"key":"aw=="}}]})
        );
        let c = Compare::new(
            b"k".to_vec(),
            CompareTarget::Value(b"v".to_vec()),
            CompareResult::NotEqual,
        );
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            json!({"key":"aw==","result":"NOT_EQUAL","target":"VALUE","value":"dg=="})
        );
        let w = WatchRequest {
            create_request: WatchCreateRequest {
                key: b"lk/".to_vec(),
                range_end: b"lk0".to_vec(),
                start_revision: 4,
                filters: vec![WatchFilter::NoPut],
                prev_kv: true,
                ..Default::default()
            },
        };
        assert_eq!(
            serde_json::to_value(&w).unwrap(),
            json!({"create_request":{"key":"bGsv","range_end":"bGsw","start_revision":"4",
                   "filters":["NOPUT"],"prev_kv":true}})
        );
        assert_eq!(
            serde_json::to_value(LeaseGrantRequest { ttl: 5, id: 0 }).unwrap(),
            json!({"TTL":"5"})
        );
    }

    #[test]
    fn event_types() {
        let e: Event = serde_json::from_value(json!({"kv":{"key":"aw=="}})).unwrap();
        assert_eq!(e.kind, EventType::Put);
        let e: Event =
            serde_json::from_value(json!({"type":"DELETE","kv":{"key":"aw==","mod_revision":"6"}}))
                .unwrap();
        assert_eq!((e.kind, e.kv.mod_revision), (EventType::Delete, 6));
        assert!(serde_json::from_value::<Event>(json!({"type":"BOGUS"})).is_err());
    }
}
