//! The waiting status: one line on a terminal, progress lines with -v, `waiting` events.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ui;

/// The waiting status: one line on a terminal, progress lines with -v, `waiting` events.
pub struct WaitDisplay {
    what: String,
    started: Instant,
    /// What the wait is about now, after "waiting for WHAT, " (`None`: nothing yet).
    state: Arc<Mutex<Option<String>>>,
    done: Arc<AtomicBool>,
}

impl WaitDisplay {
    pub fn start(what: String) -> WaitDisplay {
        let d = WaitDisplay {
            what,
            started: Instant::now(),
            state: Arc::new(Mutex::new(None)),
            done: Arc::new(AtomicBool::new(false)),
        };
        if ui::stderr_is_terminal() && ui::level() == ui::Level::Normal {
            let (what, state, done, started) =
                (d.what.clone(), d.state.clone(), d.done.clone(), d.started);
            let _ = std::thread::Builder::new()
                .name("status".into())
                .spawn(move || {
                    // Only draw once the wait is noticeable.
                    std::thread::sleep(Duration::from_millis(300));
                    while !done.load(Ordering::SeqCst) {
                        let st = state.lock().unwrap_or_else(|p| p.into_inner()).clone();
                        let by = st.map(|h| format!(", {h}")).unwrap_or_default();
                        ui::status_line(&format!(
                            "conlock: waiting for {what}{by} ({}s)",
                            started.elapsed().as_secs()
                        ));
                        std::thread::sleep(Duration::from_millis(500));
                    }
                });
        }
        d
    }

    /// What the wait was about last ("held by …", "free, in lock-delay until about …").
    pub fn last(&self) -> Option<String> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How long the wait has lasted.
    pub fn waited(&self) -> Duration {
        self.started.elapsed()
    }

    /// Reports who holds the claim now (`None`: nobody, or a lock-delay).
    pub fn holder(&self, who: Option<String>) {
        let text = who.as_ref().map(|w| format!("held by {w}"));
        self.set(
            text,
            serde_json::json!({ "holder": who, "holder_session": null, "lock_delay_until": null }),
        );
    }

    /// A lock's holder, described, and its session.
    pub fn held_by(&self, who: String, session: &str) {
        let text = format!("held by {who}");
        self.set(
            Some(text),
            serde_json::json!({ "holder": who, "holder_session": session, "lock_delay_until": null }),
        );
    }

    /// Free, but refused: a lock-delay runs, until about `until` if known.
    pub fn lock_delay(&self, until: Option<std::time::SystemTime>) {
        let text = match until {
            Some(t) => format!("free, in lock-delay until about {}", ui::clock_time(t)),
            None => "free, in a lock-delay (end unknown: its holder was not seen)".to_string(),
        };
        self.set(
            Some(text),
            serde_json::json!({
                "holder": null,
                "holder_session": null,
                "lock_delay_until": until.map(ui::timestamp),
            }),
        );
    }

    /// Says what changed (-v, events); the terminal line picks it up.
    fn set(&self, text: Option<String>, fields: serde_json::Value) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if *st == text {
            return;
        }
        match &text {
            Some(t) => ui::verbose(format_args!("waiting for {}: {t}", self.what)),
            None => ui::verbose(format_args!("{} has no holder; trying", self.what)),
        }
        if text.is_some() {
            crate::events::emit("waiting", fields);
        }
        *st = text;
    }

    pub fn finish(&self) {
        self.done.store(true, Ordering::SeqCst);
        ui::clear_status();
    }
}
