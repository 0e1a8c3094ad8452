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
