//! The store seam: the one handle the hold life cycle (`crate::hold`) and the operator
//! commands (`crate::ops`) get, whatever the store. They see sessions (etcd: leases) by
//! ID, deadlines and neutral errors (`StoreError`); the wire types stay below, in
//! `crate::consul` (and, once wired in, `crate::etcd`).

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::consul::{self, SessionRequest};
pub use crate::error::StoreError;

/// A connection to the store.
#[derive(Debug, Clone)]
pub enum Store {
    Consul(consul::Client),
}

/// The connection settings as data: what the guardian rebuilds its store from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum StoreConfig {
    Consul(consul::ConnConfig),
}

/// What a session (etcd: a lease) is created with.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    pub name: String,
    pub ttl: Duration,
    pub lock_delay: Duration,
    /// `release` or `delete`.
    pub behavior: &'static str,
    /// `None`: the store's default health checks. `Some(vec![])`: TTL only.
    pub checks: Option<Vec<String>>,
}

/// A renewal the store accepted.
#[derive(Debug, Clone)]
pub struct Renewed {
    /// The TTL the store gave the session, when it said.
    pub ttl: Option<Duration>,
}

impl Store {
    /// Connects again from settings passed as data (the guardian).
    pub fn from_config(cfg: StoreConfig) -> Result<Store, StoreError> {
        match cfg {
            StoreConfig::Consul(c) => Ok(Store::Consul(consul::Client::new(c)?)),
        }
    }

    pub fn config(&self) -> StoreConfig {
        match self {
            Store::Consul(c) => StoreConfig::Consul(c.config().clone()),
        }
    }

    /// The Consul client, for the claims' Consul code.
    pub(super) fn consul(&self) -> &consul::Client {
        match self {
            Store::Consul(c) => c,
        }
    }

    /// Creates a session and returns its ID, tried again after a failure that may pass
    /// (harmless: a session we did not hear about holds nothing and expires by its TTL).
    /// `on_try` runs right before each request is sent.
    pub fn create_session(
        &self,
        opts: &SessionOptions,
        mut on_try: impl FnMut(),
    ) -> Result<String, StoreError> {
        match self {
            Store::Consul(c) => {
                let req = SessionRequest {
                    name: opts.name.clone(),
                    ttl: Some(crate::duration::format(opts.ttl)),
                    lock_delay: Some(crate::duration::format(opts.lock_delay)),
                    behavior: Some(opts.behavior.to_string()),
                    checks: opts.checks.clone(),
                    node: None,
                };
                Ok(consul::retry_transient(
                    "creating a session",
                    c.deadline(),
                    || {
                        on_try();
                        c.session_create(&req)
                    },
                )?)
            }
        }
    }

    /// Renews a session; `Ok(None)`: the store no longer knows it.
    pub fn renew_session(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<Option<Renewed>, StoreError> {
        match self {
            Store::Consul(c) => Ok(c.session_renew(id, timeout)?.map(|e| Renewed {
                ttl: crate::duration::parse(&e.ttl).ok(),
            })),
        }
    }

    /// Ends a session: what it held is freed (Consul: after its lock-delay).
    pub fn destroy_session(&self, id: &str) -> Result<(), StoreError> {
        match self {
            Store::Consul(c) => c.session_destroy(id).map(|_| ()).map_err(Into::into),
        }
    }

    /// The same store whose calls all end by `deadline`; `limit` says what set it, in
    /// error messages.
    pub fn with_deadline(&self, deadline: Instant, limit: &str) -> Store {
        match self {
            Store::Consul(c) => Store::Consul(c.with_deadline(deadline, limit)),
        }
    }

    /// When calls must end (see `with_deadline`).
    pub fn deadline(&self) -> Option<Instant> {
        self.consul().deadline()
    }

    /// The same store on connections of its own (for a monitor's long reads).
    pub fn with_own_connections(&self) -> Store {
        match self {
            Store::Consul(c) => Store::Consul(c.with_own_connections()),
        }
    }

    /// The timeout of a request that does not block.
    pub fn request_timeout(&self) -> Duration {
        self.consul().request_timeout
    }

    /// The most lock-delay the store applies, whatever a session asked for.
    pub fn max_lock_delay(&self) -> Duration {
        match self {
            Store::Consul(_) => consul::CONSUL_MAX_LOCK_DELAY,
        }
    }
}
