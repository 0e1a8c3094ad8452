//! Session keeping: create a Consul session, renew it every TTL/2, and know until when
//! it is guaranteed to be alive on the server.
//!
//! Consul never invalidates a session before its TTL has passed since the last renewal
//! reached it. We count from the moment a renewal was *sent*, so `deadline()` is always
//! earlier than the earliest moment the server could drop the session.

use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::consul::{Client, ConsulError, SessionRequest};
use crate::guardian::Guardian;
use crate::supervise::Event;
use crate::ui;

#[derive(Debug, Clone)]
pub struct SessionSpec {
    pub name: String,
    pub ttl: Duration,
    pub lock_delay: Duration,
    /// `release` or `delete`.
    pub behavior: &'static str,
    /// `None`: Consul's default (serfHealth). `Some(vec![])`: TTL only.
    pub checks: Option<Vec<String>>,
}

impl SessionSpec {
    /// Safety margin kept between our local deadline and the server-side TTL.
    pub fn margin(&self) -> Duration {
        (self.ttl / 10).clamp(Duration::from_millis(500), Duration::from_secs(5))
    }
}

/// See `Session::handle`.
#[derive(Clone)]
pub struct SessionRef(Arc<Shared>);

impl SessionRef {
    pub fn id(&self) -> String {
        self.0
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .id
            .clone()
    }
}

pub struct Session {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    client: Client,
    guardian: Option<Arc<Guardian>>,
    spec: SessionSpec,
    state: Mutex<State>,
    wake: Condvar,
}

struct State {
    id: String,
    /// When the last successful create or renew was sent.
    confirmed_at: Instant,
    lost: Option<String>,
    stop: bool,
    /// Not renewing: a lock waiter holds nothing, so it spares Consul the renewals.
    paused: bool,
    on_lost: Option<Sender<Event>>,
    /// Told the new deadline after each confirmation (the guardian's watchdog).
    on_confirmed: Option<DeadlineHook>,
}

/// Receives `Session::deadline()` after each confirmation. Must not block.
pub type DeadlineHook = Box<dyn Fn(Instant) + Send>;

impl Session {
    /// Creates the session and starts renewing it.
    /// The guardian, if any, is told every session ID so it can destroy it if we die.
    /// With `renew` false, renewals wait for `resume_renewing`.
    pub fn create(
        client: &Client,
        spec: SessionSpec,
        guardian: Option<Arc<Guardian>>,
        renew: bool,
    ) -> Result<Session, ConsulError> {
        let sent = Instant::now();
        let id = client.session_create(&request(&spec))?;
        if let Some(g) = &guardian {
            g.session(&id, spec.ttl);
        }
        ui::verbose(format_args!(
            "created session {id} (TTL {})",
            crate::duration::format(spec.ttl)
        ));
        let shared = Arc::new(Shared {
            client: client.clone(),
            guardian,
            spec,
            state: Mutex::new(State {
                id,
                confirmed_at: sent,
                lost: None,
                stop: false,
                paused: !renew,
                on_lost: None,
                on_confirmed: None,
            }),
            wake: Condvar::new(),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("renew".into())
            .spawn(move || renew_loop(&worker))
            .expect("spawn renew thread");
        Ok(Session {
            shared,
            thread: Some(thread),
        })
    }

    pub fn id(&self) -> String {
        self.state().id.clone()
    }

    /// A cheap handle that always reads the current session ID (it changes on `recreate`).
    pub fn handle(&self) -> SessionRef {
        SessionRef(self.shared.clone())
    }

    pub fn spec(&self) -> &SessionSpec {
        &self.shared.spec
    }

    /// Until this moment the server cannot have invalidated the session by TTL.
    pub fn deadline(&self) -> Instant {
        deadline(&self.state(), &self.shared.spec)
    }

    /// Calls `hook` with the deadline now and after every confirmation that moves it.
    pub fn on_confirmed(&self, hook: DeadlineHook) {
        let mut s = self.state();
        hook(deadline(&s, &self.shared.spec));
        s.on_confirmed = Some(hook);
    }

    /// Why the session is known to be gone, if it is.
    pub fn lost(&self) -> Option<String> {
        self.state().lost.clone()
    }

    /// Sends `Event::Lost` to `tx` once the session is known to be gone (at once if it is).
    pub fn notify_lost(&self, tx: Sender<Event>) {
        let mut s = self.state();
        if let Some(reason) = &s.lost {
            let _ = tx.send(Event::Lost(reason.clone()));
        }
        s.on_lost = Some(tx);
    }

    /// Starts (or keeps) renewing. If the last confirmation is older than TTL/2, renews
    /// at once so that `deadline()` is fresh. `Ok(false)`: Consul no longer knows the session.
    pub fn resume_renewing(&self) -> Result<bool, ConsulError> {
        let (id, stale) = {
            let s = self.state();
            (
                s.id.clone(),
                s.confirmed_at.elapsed() > self.shared.spec.ttl / 2,
            )
        };
        if stale {
            // A passing error must not cost the lock just acquired: retry briefly.
            let mut tries = 0;
            loop {
                let sent = Instant::now();
                let timeout = self.shared.client.request_timeout;
                match self.shared.client.session_renew(&id, timeout) {
                    Ok(Some(_)) => {
                        confirmed(&mut self.state(), &self.shared.spec, sent);
                        break;
                    }
                    Ok(None) => return Ok(false),
                    Err(e) if e.is_retryable() && tries < 3 => {
                        tries += 1;
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        self.state().paused = false;
        self.shared.wake.notify_all();
        Ok(true)
    }

    /// Replaces a lost session by a new one (for example after the server lost its state).
    pub fn recreate(&self) -> Result<(), ConsulError> {
        let old = self.id();
        let _ = self.shared.client.session_destroy(&old);
        let sent = Instant::now();
        let id = self
            .shared
            .client
            .session_create(&request(&self.shared.spec))?;
        ui::verbose(format_args!("replaced session {old} by {id}"));
        if let Some(g) = &self.shared.guardian {
            g.session(&id, self.shared.spec.ttl);
        }
        let mut s = self.state();
        s.id = id;
        confirmed(&mut s, &self.shared.spec, sent);
        s.lost = None;
        drop(s);
        self.shared.wake.notify_all();
        Ok(())
    }

    /// Stops renewing and destroys the session on the server.
    pub fn destroy(mut self) {
        let id = self.stop_renewing();
        match self.shared.client.session_destroy(&id) {
            Ok(_) => ui::verbose(format_args!("destroyed session {id}")),
            Err(e) => ui::warn(format_args!(
                "could not destroy session {id}: {e}; it expires by its TTL"
            )),
        }
    }

    /// Like `destroy`, through `client` (a deadline-bounded one once the command is gone).
    pub fn destroy_with(mut self, client: &Client) {
        let id = self.stop_renewing();
        match client.session_destroy(&id) {
            Ok(_) => ui::verbose(format_args!("destroyed session {id}")),
            Err(e) => ui::warn(format_args!(
                "could not destroy session {id}: {e}; it expires by its TTL"
            )),
        }
    }

    fn stop_renewing(&mut self) -> String {
        let id = {
            let mut s = self.state();
            s.stop = true;
            s.id.clone()
        };
        self.shared.wake.notify_all();
        // The thread may sit in a renew call; it exits when that returns.
        drop(self.thread.take());
        id
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop_renewing();
    }
}

fn deadline(s: &State, spec: &SessionSpec) -> Instant {
    s.confirmed_at + spec.ttl - spec.margin()
}

/// A request sent at `sent` proved the session valid.
fn confirmed(s: &mut State, spec: &SessionSpec, sent: Instant) {
    s.confirmed_at = sent;
    if let Some(hook) = &s.on_confirmed {
        hook(deadline(s, spec));
    }
}

fn request(spec: &SessionSpec) -> SessionRequest {
    SessionRequest {
        name: spec.name.clone(),
        ttl: Some(crate::duration::format(spec.ttl)),
        lock_delay: Some(crate::duration::format(spec.lock_delay)),
        behavior: Some(spec.behavior.to_string()),
        checks: spec.checks.clone(),
        node: None,
    }
}

fn renew_loop(shared: &Shared) {
    let ttl = shared.spec.ttl;
    let retry_every = (ttl / 10).clamp(Duration::from_millis(200), Duration::from_secs(1));
    let timeout = (ttl / 3).min(Duration::from_secs(5));
    let mut next = Instant::now() + ttl / 2;
    loop {
        let id = {
            let mut s = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if s.stop {
                    return;
                }
                let now = Instant::now();
                if s.paused {
                    next = s.confirmed_at + ttl / 2;
                }
                if now >= next && s.lost.is_none() && !s.paused {
                    break;
                }
                let wait = if s.lost.is_some() || s.paused {
                    Duration::from_secs(3600)
                } else {
                    next - now
                };
                let before = s.id.clone();
                s = shared
                    .wake
                    .wait_timeout(s, wait)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                if s.id != before {
                    next = Instant::now() + ttl / 2;
                }
            }
            s.id.clone()
        };
        let sent = Instant::now();
        let result = shared.client.session_renew(&id, timeout);
        let mut s = shared.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.id != id || s.stop {
            continue;
        }
        match result {
            Ok(Some(_)) => {
                confirmed(&mut s, &shared.spec, sent);
                next = sent + ttl / 2;
            }
            Ok(None) => {
                let reason = format!("session {id} was invalidated (Consul no longer knows it)");
                ui::verbose(&reason);
                s.lost = Some(reason.clone());
                if let Some(tx) = &s.on_lost {
                    let _ = tx.send(Event::Lost(reason));
                }
            }
            Err(e) => {
                ui::verbose(format_args!("renewing session {id} failed: {e}; retrying"));
                next = Instant::now() + retry_every;
            }
        }
    }
}
