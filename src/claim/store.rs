//! The store seam: the one handle the hold life cycle (`crate::hold`) and the operator
//! commands (`crate::ops`) get, whatever the store. They see sessions (etcd: leases) by
//! ID, deadlines and neutral errors (`StoreError`); the wire types stay below, in
//! `crate::consul` and `crate::etcd`.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::consul::{self, SessionRequest};
pub use crate::error::StoreError;
use crate::etcd::{EtcdClient, EtcdConfig, EtcdError};

/// A connection to the store.
#[derive(Debug, Clone)]
pub enum Store {
    Consul(consul::Client),
    /// etcd v3 through its JSON gateway: sessions are leases, shown as lower-case hex
    /// (etcdctl's key suffix).
    Etcd(EtcdClient),
}

/// The connection settings as data: what the guardian rebuilds its store from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum StoreConfig {
    Consul(consul::ConnConfig),
    Etcd(EtcdConfig),
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

/// The steps of one release on etcd, each run again, like Consul's (`claim::Releasing`),
/// while etcd answers that it cannot serve it now (HTTP 503 / gRPC Unavailable: no
/// leader, an election), every 250 ms for up to `RELEASE_ELECTION_BUDGET` in all from the
/// first such answer, the client's deadline moved out that far: a release that is lost
/// costs the next holder the TTL and the cushion. An endpoint that does not answer at
/// all is tried again only within the client's deadline (the cleanup budget).
pub struct EtcdReleasing {
    client: EtcdClient,
    until: Option<Instant>,
}

/// How long a release etcd could not serve is tried, from the first such answer: as
/// on Consul (`claim::RELEASE_ELECTION_BUDGET`), longer than an election.
const ETCD_RELEASE_BUDGET: Duration = Duration::from_secs(10);
/// Pause between tries of a release etcd could not serve.
const ETCD_RELEASE_RETRY: Duration = Duration::from_millis(250);

impl EtcdReleasing {
    pub fn new(client: &EtcdClient) -> EtcdReleasing {
        EtcdReleasing {
            client: client.clone(),
            until: None,
        }
    }

    pub fn retry<T>(
        &mut self,
        mut f: impl FnMut(&EtcdClient) -> Result<T, EtcdError>,
    ) -> Result<T, EtcdError> {
        loop {
            let e = match f(&self.client) {
                Err(e) if e.is_retryable() => e,
                other => return other,
            };
            if e.is_unavailable_answer() && !self.client.deadline_is_hard() {
                let until = *self
                    .until
                    .get_or_insert_with(|| Instant::now() + ETCD_RELEASE_BUDGET);
                if Instant::now() + ETCD_RELEASE_RETRY >= until {
                    return Err(e);
                }
                if self.client.deadline().is_some_and(|d| d < until) {
                    self.client = self.client.with_deadline(
                        until,
                        "a release etcd could not serve (no leader) is retried for up to 10s in all",
                    );
                }
            } else if self
                .client
                .deadline()
                .map_or(true, |d| Instant::now() + ETCD_RELEASE_RETRY >= d)
            {
                // No answer at all: only within the client's deadline.
                return Err(e);
            }
            crate::ui::verbose(format_args!("releasing: {e}; retrying"));
            std::thread::sleep(ETCD_RELEASE_RETRY);
        }
    }
}

/// Tries of a lease grant that failed in a way that may pass.
const ETCD_GRANT_TRIES: u32 = 3;
const ETCD_GRANT_PAUSE: Duration = Duration::from_millis(500);

/// A lease ID as conlock shows and stores it: lower-case hex, as etcdctl's key suffix.
pub fn lease_hex(id: i64) -> String {
    format!("{id:x}")
}

/// A lease ID from its hex form (`None`: not one of ours).
pub fn lease_id(hex: &str) -> Option<i64> {
    i64::from_str_radix(hex, 16).ok().filter(|id| *id > 0)
}

/// etcd's TTLs are whole seconds: the TTL asked for, rounded up (a longer lease only
/// expires later; conlock's deadline keeps counting with the shorter one).
pub fn etcd_ttl_secs(ttl: Duration) -> i64 {
    let s = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    s.max(1) as i64
}

impl Store {
    /// Connects again from settings passed as data (the guardian).
    pub fn from_config(cfg: StoreConfig) -> Result<Store, StoreError> {
        match cfg {
            StoreConfig::Consul(c) => Ok(Store::Consul(consul::Client::new(c)?)),
            StoreConfig::Etcd(c) => Ok(Store::Etcd(EtcdClient::new(c)?)),
        }
    }

    pub fn config(&self) -> StoreConfig {
        match self {
            Store::Consul(c) => StoreConfig::Consul(c.config().clone()),
            Store::Etcd(c) => StoreConfig::Etcd(c.config().clone()),
        }
    }

    /// The backend's name, for messages: `consul` or `etcd`.
    pub fn backend(&self) -> &'static str {
        match self {
            Store::Consul(_) => "consul",
            Store::Etcd(_) => "etcd",
        }
    }

    /// The Consul client, for the claims' Consul code (which is only built on Consul).
    pub(super) fn consul(&self) -> &consul::Client {
        match self {
            Store::Consul(c) => c,
            Store::Etcd(_) => panic!("a Consul claim on an etcd store"),
        }
    }

    /// The etcd client, for the claims' etcd code (which is only built on etcd).
    pub(super) fn etcd(&self) -> &EtcdClient {
        match self {
            Store::Etcd(c) => c,
            Store::Consul(_) => panic!("an etcd claim on a Consul store"),
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
            Store::Etcd(c) => {
                let mut tries = 1;
                loop {
                    on_try();
                    match c.lease_grant(etcd_ttl_secs(opts.ttl)) {
                        Ok(r) => return Ok(lease_hex(r.id)),
                        Err(e)
                            if e.is_retryable()
                                && tries < ETCD_GRANT_TRIES
                                && !c
                                    .deadline()
                                    .is_some_and(|d| Instant::now() + ETCD_GRANT_PAUSE >= d) =>
                        {
                            crate::ui::notice(format_args!("granting a lease: {e}; retrying"));
                            tries += 1;
                            std::thread::sleep(ETCD_GRANT_PAUSE);
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
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
            Store::Etcd(c) => {
                let Some(lease) = lease_id(id) else {
                    return Ok(None);
                };
                // Bounded in all by `timeout`, with room for a second endpoint when the
                // first hangs (a follower forwarding to a frozen leader).
                let mut c = c.with_deadline(
                    Instant::now() + timeout,
                    "a keepalive is bounded by the renewal's timeout",
                );
                c.request_timeout = c
                    .request_timeout
                    .min((timeout / 2).max(Duration::from_millis(500)));
                // One keepalive: a positive TTL means renewed; 0 (absent) means gone.
                match c.lease_keepalive_once(lease) {
                    Ok(ttl) if ttl > 0 => Ok(Some(Renewed {
                        ttl: Some(Duration::from_secs(ttl as u64)),
                    })),
                    Ok(_) => Ok(None),
                    Err(e) if e.is_lease_not_found() => Ok(None),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Ends a session: what it held is freed (Consul: after its lock-delay; etcd: at
    /// once, its keys deleted).
    pub fn destroy_session(&self, id: &str) -> Result<(), StoreError> {
        match self {
            Store::Consul(c) => c.session_destroy(id).map(|_| ()).map_err(Into::into),
            Store::Etcd(c) => {
                let Some(lease) = lease_id(id) else {
                    return Ok(());
                };
                // Retried through an election: a lost revoke keeps a semaphore slot (or a
                // key the release could not delete) until the TTL ends.
                match EtcdReleasing::new(c).retry(|c| c.lease_revoke(lease)) {
                    Ok(_) => Ok(()),
                    Err(EtcdError::LeaseNotFound { .. }) => Ok(()),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// The same store whose calls all end by `deadline`; `limit` says what set it, in
    /// error messages.
    pub fn with_deadline(&self, deadline: Instant, limit: &str) -> Store {
        match self {
            Store::Consul(c) => Store::Consul(c.with_deadline(deadline, limit)),
            Store::Etcd(c) => Store::Etcd(c.with_deadline(deadline, limit)),
        }
    }

    /// `with_deadline`, which even a release through an election does not move out (for
    /// clean-ups that must stay within `--timeout`).
    pub fn with_hard_deadline(&self, deadline: Instant, limit: &str) -> Store {
        match self {
            Store::Consul(c) => Store::Consul(c.with_deadline(deadline, limit)),
            Store::Etcd(c) => Store::Etcd(c.with_hard_deadline(deadline, limit)),
        }
    }

    /// When calls must end (see `with_deadline`).
    pub fn deadline(&self) -> Option<Instant> {
        match self {
            Store::Consul(c) => c.deadline(),
            Store::Etcd(c) => c.deadline(),
        }
    }

    /// The same store on connections of its own (for a monitor's long reads).
    pub fn with_own_connections(&self) -> Store {
        match self {
            Store::Consul(c) => Store::Consul(c.with_own_connections()),
            Store::Etcd(c) => Store::Etcd(c.with_own_connections()),
        }
    }

    /// The timeout of a request that does not block.
    pub fn request_timeout(&self) -> Duration {
        match self {
            Store::Consul(c) => c.request_timeout,
            Store::Etcd(c) => c.request_timeout,
        }
    }

    /// The most lock-delay the store applies, whatever a session asked for. etcd applies
    /// none; conlock's own cushion (kept by conlock waiters) has no cap.
    pub fn max_lock_delay(&self) -> Duration {
        match self {
            Store::Consul(_) => consul::CONSUL_MAX_LOCK_DELAY,
            Store::Etcd(_) => Duration::MAX,
        }
    }

    /// How often a session is renewed: Consul's api renews every TTL/2, clientv3 keeps a
    /// lease alive every TTL/3.
    pub fn renew_every(&self, ttl: Duration) -> Duration {
        match self {
            Store::Consul(_) => ttl / 2,
            Store::Etcd(_) => ttl / 3,
        }
    }

    /// How long after a session expires by its TTL the store still keeps others out:
    /// Consul applies the session's lock-delay; etcd frees the keys at once.
    pub fn expiry_delay(&self, lock_delay: Duration) -> Duration {
        match self {
            Store::Consul(_) => lock_delay,
            Store::Etcd(_) => Duration::ZERO,
        }
    }

    /// Why a renewal's answer means the session is gone, for messages.
    pub fn session_gone(&self, id: &str) -> String {
        match self {
            Store::Consul(_) => format!("session {id} was invalidated (Consul no longer knows it)"),
            Store::Etcd(_) => {
                format!("lease {id} is gone (etcd no longer knows it: it expired or was revoked)")
            }
        }
    }

    /// Says once, on stderr, what the server is known to get wrong (etcd older than the
    /// releases that fixed its lease bugs). Not fatal; a failed look says nothing. The
    /// look runs on a thread of its own, off the run's critical path: `ServerCheck::finish`
    /// gives it a moment to say its line before conlock exits.
    pub fn warn_known_server_bugs(&self) -> ServerCheck {
        let Store::Etcd(c) = self else {
            return ServerCheck(None);
        };
        let c = c.clone();
        let look = move || {
            if let Ok(v) = c.version() {
                if let Some(w) = crate::etcd::version::old_server_warning(&v.etcdserver) {
                    crate::ui::warn(format_args!("{w}"));
                }
            }
        };
        // Started before the hold blocks its signals: it must take none (and neither must
        // the stderr writer it may start by warning).
        ServerCheck(crate::ui::spawn_quiet("version", look).ok())
    }
}

/// The look at the server's version, started by `Store::warn_known_server_bugs`.
pub struct ServerCheck(Option<std::thread::JoinHandle<()>>);

impl ServerCheck {
    /// Waits up to `within` for the look to end (it has said its line then); a server
    /// that does not answer by then gets no warning.
    pub fn finish(self, within: Duration) {
        let Some(t) = self.0 else { return };
        let until = Instant::now() + within;
        while !t.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }
}
