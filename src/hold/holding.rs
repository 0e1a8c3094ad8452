//! The holding guard: owns the session (and with it the claim once acquired) from its
//! creation to the exit. Its `give_up`, `abandon` and `finish` are the only ways out of a
//! hold, and each one spells out, once, the order of the guardian notification, the
//! release, the session destroy and the events (docs/architecture.md, *The holding
//! guard*). Losses are announced by the caller, before it calls them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::event;
use super::guardian::Guardian;
use super::session::Session;
use super::signals;
use super::supervise::{Outcome, Prior};
use crate::claim::{Claim, Store};
use crate::error::{exit, Result};
use crate::events;
use crate::ui;

/// Total time for releasing and destroying the session once the command is gone (a
/// release that Consul answers with 500, as during a leader election, may take longer:
/// see `claim::retry_release`).
pub const CLEANUP_BUDGET: Duration = Duration::from_secs(3);

/// `client` for the cleanup: its calls end within `CLEANUP_BUDGET` from now.
/// The second try to end a session whose replacement failed at --timeout.
const ABANDONED_DESTROY: Duration = Duration::from_secs(1);

fn cleanup_client(client: &Store) -> Store {
    client.with_deadline(
        Instant::now() + CLEANUP_BUDGET,
        &format!(
            "cleanup is bounded to {}",
            crate::duration::format(CLEANUP_BUDGET)
        ),
    )
}

/// How a hold ends once its command ran.
pub(super) enum Ending {
    /// The whole command is gone: release, then destroy the session.
    Release(Outcome),
    /// Lost while processes of the command survive: nothing is released (another holder
    /// would start beside them); the session stops renewing and expires by its TTL.
    KeepForSurvivors,
}

/// A hold from the session's creation on. Moved into the exit it ends with.
#[must_use = "a hold ends only through give_up, abandon or finish"]
pub(super) struct Holding<'a> {
    client: &'a Store,
    claim: Arc<dyn Claim>,
    session: Session,
    guardian: Option<&'a Arc<Guardian>>,
    /// conlock's children from before the command, for the guardian; the spawn takes it.
    prior: Option<Prior>,
    /// The session the claim is held with (`held`); empty while waiting.
    session_id: String,
    /// The guardian knows the claim (`tell_claim`).
    claim_told: bool,
    /// Ends the monitor thread (it may not have started).
    stop_monitor: Arc<AtomicBool>,
}

impl<'a> Holding<'a> {
    pub(super) fn new(
        client: &'a Store,
        claim: Arc<dyn Claim>,
        session: Session,
        guardian: Option<&'a Arc<Guardian>>,
        prior: Prior,
    ) -> Holding<'a> {
        Holding {
            client,
            claim,
            session,
            guardian,
            prior: Some(prior),
            session_id: String::new(),
            claim_told: false,
            stop_monitor: Arc::new(AtomicBool::new(false)),
        }
    }

    pub(super) fn session(&self) -> &Session {
        &self.session
    }

    pub(super) fn client(&self) -> &'a Store {
        self.client
    }

    pub(super) fn guardian(&self) -> Option<&'a Arc<Guardian>> {
        self.guardian
    }

    /// The session the claim is held with (`held`).
    pub(super) fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The claim is acquired: returns the session ID it is held with.
    pub(super) fn held(&mut self) -> String {
        self.session_id = self.session.id();
        self.session_id.clone()
    }

    /// Set to end the monitor thread; `finish` sets it.
    pub(super) fn stop_monitor(&self) -> Arc<AtomicBool> {
        self.stop_monitor.clone()
    }

    /// For the spawn: conlock's children from before the command. Once, after
    /// `tell_claim` (which lists them to the guardian).
    pub(super) fn take_prior(&mut self) -> Prior {
        debug_assert!(
            self.claim_told,
            "the guardian learns the claim before the spawn"
        );
        self.prior
            .take()
            .expect("the spawn takes the prior children once")
    }

    /// The guardian learns the claim (once): from then on a conlock that dies has it
    /// released by the guardian.
    pub(super) fn tell_claim(&mut self) {
        if let (Some(g), false) = (self.guardian, self.claim_told) {
            let prior = self.prior.as_ref().map_or(&[][..], Prior::list);
            g.claim(self.claim.spec(), prior);
        }
        self.claim_told = true;
    }

    /// Never acquired (busy, or the wait failed): the session goes, within the cleanup
    /// budget (it may hold what the wait acquired as it failed), then the `exit` event.
    pub(super) fn give_up(self, end: Result<(i32, &'static str)>) -> Result<i32> {
        // A session the store said is gone (one not replaced by --timeout) needs no
        // destroy: a hung store would hold the exit for the cleanup budget. One given up
        // on by a replacement whose destroy failed may still hold what the wait wrote
        // (a semaphore's contender key): one more try, short, as the store just hung.
        match self.session.lost() {
            Some(why) => ui::verbose(format_args!("{why}: not destroying it")),
            None if self.session.abandoned() => {
                self.session.destroy_with(&self.client.with_hard_deadline(
                    Instant::now() + ABANDONED_DESTROY,
                    "ending a session given up on is bounded to 1s",
                ))
            }
            None => self.session.destroy_with(&cleanup_client(self.client)),
        }
        end.map(|(code, how)| exit_event(code, how))
    }

    /// Acquired but the command did not start (a loss, a stop request, a passed deadline,
    /// a failed spawn): the guardian learns the claim first (a conlock killed during the
    /// release still has it released), then the release, the session destroy, and the
    /// `exit` event. No `released` event: nothing ran under the claim.
    pub(super) fn abandon(mut self, end: Result<(i32, &'static str)>) -> Result<i32> {
        self.tell_claim();
        self.claim.release(self.client, &self.session_id);
        self.session.destroy();
        end.map(|(code, how)| exit_event(code, how))
    }

    /// The command ran: see `Ending`. For a release: the monitor, renewal and signal
    /// threads end, the guardian learns that the command is gone, the release and the
    /// session destroy share the cleanup budget, `released` is written only for a release
    /// that happened and not after a loss, then the `exit` event.
    pub(super) fn finish(self, ending: Ending) -> i32 {
        let Holding {
            client,
            claim,
            mut session,
            guardian,
            session_id,
            stop_monitor,
            ..
        } = self;
        stop_monitor.store(true, Ordering::SeqCst);
        let outcome = match ending {
            Ending::KeepForSurvivors => {
                drop(session);
                return exit_event(exit::LOST, "lost");
            }
            Ending::Release(outcome) => outcome,
        };
        // Nothing is left to supervise or renew for (the session outlives the bounded
        // cleanup by its TTL): the signal and renew threads end now, while the release
        // waits on the network. An exit waits for every thread, and each idle one costs a
        // wake-up then.
        session.stop_renewing();
        signals::end_thread();
        // The whole process group is gone: now the claim may go. Bounded in total, so an
        // agent that stopped answering does not keep us (and whoever waits for our exit).
        // The guardian learns that the command is gone before the claim goes (when its
        // pipe was full, this waits a little for room).
        if let Some(g) = guardian {
            g.settle(Duration::from_millis(500));
        }
        let cleanup = cleanup_client(client);
        let cleanup_end = cleanup.deadline().unwrap_or_else(Instant::now);
        let released = claim.release(&cleanup, &session_id);
        if released && !matches!(outcome, Outcome::Lost(_)) {
            events::emit("released", serde_json::json!({ "session": session_id }));
        }
        if Instant::now() < cleanup_end {
            session.destroy_with(&cleanup);
        } else {
            ui::warn(format_args!(
                "no time left to destroy session {session_id} (cleanup is bounded to {}); it expires by its TTL",
                crate::duration::format(CLEANUP_BUDGET)
            ));
            drop(session);
        }
        let (code, how) = exit_of(&outcome);
        match &outcome {
            Outcome::Lost(reason) => ui::verbose(format_args!(
                "exiting {} after losing {}: {reason}",
                exit::LOST,
                claim.describe()
            )),
            _ => ui::verbose(format_args!(
                "command {}; {} {}",
                event::describe_end(code),
                if released {
                    "released"
                } else {
                    "could not release"
                },
                claim.describe()
            )),
        }
        exit_event(code, how)
    }
}

/// The exit code and the `how` of the `exit` event for an outcome.
fn exit_of(outcome: &Outcome) -> (i32, &'static str) {
    match outcome {
        Outcome::Exited(code) => match event::child_signal() {
            Some(sig) if *code == 128 + sig => (*code, "signal"),
            _ => (*code, "exited"),
        },
        Outcome::Lost(_) => (exit::LOST, "lost"),
        Outcome::MaxTime => (exit::MAX_TIME, "max-time"),
    }
}

/// Emits the `exit` event and returns `code`.
fn exit_event(code: i32, how: &str) -> i32 {
    let extra = match (how, event::child_signal()) {
        ("signal", Some(sig)) => serde_json::json!({ "signal": sig }),
        _ => serde_json::json!({}),
    };
    events::exit(code, how, extra);
    code
}
