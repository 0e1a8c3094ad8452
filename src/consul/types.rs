//! Wire types of the Consul HTTP API, as Consul names its fields.

use base64::Engine;
use serde::{Deserialize, Serialize};

/// `X-Consul-Index` and friends, from a read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueryMeta {
    pub index: u64,
}

/// One KV entry as Consul returns it (`Value` is base64 on the wire).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct KvPair {
    #[serde(rename = "Key")]
    pub key: String,
    #[serde(rename = "Flags", default)]
    pub flags: u64,
    #[serde(rename = "Value", default, with = "base64_opt")]
    pub value: Option<Vec<u8>>,
    #[serde(rename = "Session", default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(rename = "LockIndex", default)]
    pub lock_index: u64,
    #[serde(rename = "CreateIndex", default)]
    pub create_index: u64,
    #[serde(rename = "ModifyIndex", default)]
    pub modify_index: u64,
}

impl KvPair {
    pub fn value_bytes(&self) -> &[u8] {
        self.value.as_deref().unwrap_or(&[])
    }

    /// The holding session, treating `""` like no session.
    pub fn holder(&self) -> Option<&str> {
        self.session.as_deref().filter(|s| !s.is_empty())
    }
}

mod base64_opt {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(bytes) if !bytes.is_empty() => {
                s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
            }
            _ => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        match text {
            None => Ok(None),
            Some(t) => base64::engine::general_purpose::STANDARD
                .decode(t.as_bytes())
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// What a session is tied to when it is created.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionRequest {
    #[serde(rename = "Name", skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Go duration string, e.g. `15s`.
    #[serde(rename = "TTL", skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Go duration string, e.g. `15s`.
    #[serde(rename = "LockDelay", skip_serializing_if = "Option::is_none")]
    pub lock_delay: Option<String>,
    #[serde(rename = "Behavior", skip_serializing_if = "Option::is_none")]
    pub behavior: Option<String>,
    /// `None` keeps Consul's default (serfHealth); `Some(vec![])` ties the session to nothing.
    #[serde(rename = "Checks", skip_serializing_if = "Option::is_none")]
    pub checks: Option<Vec<String>>,
    #[serde(rename = "Node", skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// A session as Consul reports it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct SessionEntry {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "Name", default)]
    pub name: String,
    #[serde(rename = "Node", default)]
    pub node: String,
    #[serde(rename = "Checks", default)]
    pub checks: Option<Vec<String>>,
    /// Nanoseconds.
    #[serde(rename = "LockDelay", default)]
    pub lock_delay: u64,
    #[serde(rename = "Behavior", default)]
    pub behavior: String,
    #[serde(rename = "TTL", default)]
    pub ttl: String,
    #[serde(rename = "CreateIndex", default)]
    pub create_index: u64,
    #[serde(rename = "ModifyIndex", default)]
    pub modify_index: u64,
}

#[derive(Debug, Deserialize)]
pub(crate) struct SessionCreated {
    #[serde(rename = "ID")]
    pub id: String,
}

/// The parts of `/v1/agent/self` conlock reads.
#[derive(Debug, Clone, Deserialize)]
pub struct AgentSelf {
    #[serde(rename = "Config", default)]
    pub config: AgentConfig,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct AgentConfig {
    #[serde(rename = "NodeName", default)]
    pub node_name: String,
    #[serde(rename = "Datacenter", default)]
    pub datacenter: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_pair_decodes_recorded_shape() {
        let body = r#"[{"LockIndex":1,"Key":"k","Flags":3304740253564472344,"Value":"eyJub2RlIjoiYSJ9","Session":"A","CreateIndex":41,"ModifyIndex":42}]"#;
        let pairs: Vec<KvPair> = serde_json::from_str(body).unwrap();
        assert_eq!(pairs[0].value_bytes(), br#"{"node":"a"}"#);
        assert_eq!(pairs[0].holder(), Some("A"));
        assert_eq!(pairs[0].flags, 0x2ddc_cbc0_58a5_0c18);
        let empty: Vec<KvPair> = serde_json::from_str(
            r#"[{"Key":"k","Flags":0,"Value":null,"LockIndex":0,"CreateIndex":1,"ModifyIndex":1}]"#,
        )
        .unwrap();
        assert_eq!(empty[0].value, None);
        assert_eq!(empty[0].holder(), None);
    }
}

/// One KV operation of a transaction (`PUT /v1/txn`, Consul 0.7 and later).
#[derive(Debug, Clone, Serialize)]
pub struct TxnKvOp {
    #[serde(rename = "Verb")]
    pub verb: &'static str,
    #[serde(rename = "Key")]
    pub key: String,
    #[serde(
        rename = "Value",
        with = "base64_opt",
        skip_serializing_if = "Option::is_none"
    )]
    pub value: Option<Vec<u8>>,
    #[serde(rename = "Flags", skip_serializing_if = "is_zero")]
    pub flags: u64,
    #[serde(rename = "Index", skip_serializing_if = "is_zero")]
    pub index: u64,
    #[serde(rename = "Session", skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TxnKvOp {
    fn new(verb: &'static str, key: &str) -> TxnKvOp {
        TxnKvOp {
            verb,
            key: key.to_string(),
            value: None,
            flags: 0,
            index: 0,
            session: None,
        }
    }

    /// Writes the key only if its ModifyIndex is `index` (0: only if it does not exist).
    pub fn cas(key: &str, value: &[u8], flags: u64, index: u64) -> TxnKvOp {
        TxnKvOp {
            value: Some(value.to_vec()),
            flags,
            index,
            ..TxnKvOp::new("cas", key)
        }
    }

    /// `?acquire=` inside a transaction; Consul applies the lock-delay to it too.
    pub fn lock(key: &str, value: &[u8], flags: u64, session: &str) -> TxnKvOp {
        TxnKvOp {
            value: Some(value.to_vec()),
            flags,
            session: Some(session.to_string()),
            ..TxnKvOp::new("lock", key)
        }
    }

    /// Fails the transaction unless the key exists with ModifyIndex `index`.
    pub fn check_index(key: &str, index: u64) -> TxnKvOp {
        TxnKvOp {
            index,
            ..TxnKvOp::new("check-index", key)
        }
    }

    pub fn delete_cas(key: &str, index: u64) -> TxnKvOp {
        TxnKvOp {
            index,
            ..TxnKvOp::new("delete-cas", key)
        }
    }

    pub fn delete(key: &str) -> TxnKvOp {
        TxnKvOp::new("delete", key)
    }

    pub fn get_tree(prefix: &str) -> TxnKvOp {
        TxnKvOp::new("get-tree", prefix)
    }
}

/// What a transaction did: every op's results, or why it was rolled back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnAnswer {
    /// The entries the ops returned, in op order (writes without their values).
    Done(Vec<KvPair>),
    /// Nothing was applied; Consul's reason for each failed op.
    Refused(Vec<TxnError>),
}

impl TxnAnswer {
    /// True if any op was refused for a lock-delay.
    pub fn refused_for_lock_delay(&self) -> bool {
        self.refused_with("due to lock delay")
    }

    /// True if any op was refused because our session does not exist (any more).
    pub fn refused_for_invalid_session(&self) -> bool {
        self.refused_with("invalid session")
    }

    /// Consul's reason for a refusal that is not a conflict with other writers (a stale
    /// index, a key held or missing), a lock-delay or an invalid session: an ACL denial,
    /// say. Retrying cannot help; `None` when there is no such reason.
    pub fn unexpected_refusal(&self) -> Option<String> {
        const EXPECTED: &[&str] = &[
            "index is stale",
            "lock is already held",
            "doesn't exist",
            "failed index check",
            "due to lock delay",
            "invalid session",
        ];
        match self {
            TxnAnswer::Refused(errors) => errors
                .iter()
                .find(|e| !EXPECTED.iter().any(|x| e.what.contains(x)))
                .map(|e| e.what.clone()),
            TxnAnswer::Done(_) => None,
        }
    }

    fn refused_with(&self, text: &str) -> bool {
        matches!(self, TxnAnswer::Refused(errors) if errors.iter().any(|e| e.what.contains(text)))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TxnError {
    #[serde(rename = "OpIndex", default)]
    pub op_index: usize,
    #[serde(rename = "What", default)]
    pub what: String,
}

#[derive(Deserialize)]
pub(crate) struct TxnResponse {
    #[serde(rename = "Results", default)]
    pub results: Option<Vec<TxnResultKv>>,
    #[serde(rename = "Errors", default)]
    pub errors: Option<Vec<TxnError>>,
}

#[derive(Deserialize)]
pub(crate) struct TxnResultKv {
    #[serde(rename = "KV")]
    pub kv: Option<KvPair>,
}
