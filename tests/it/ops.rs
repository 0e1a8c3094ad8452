//! Operator commands: status, watch, break (issue 5).

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use assert_cmd::prelude::*;
use conlock::consul::QueryOptions;
use predicates::str::contains;

use crate::common::start_server;
use crate::harness::*;

const LONG: Duration = Duration::from_secs(60);

fn status(server: &conlock::devserver::DevServer, args: &[&str]) -> (Option<i32>, String) {
    let out = conlock(server).arg("status").args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn status_free_held_and_semaphore() {
    let server = start_server();
    conlock(&server)
        .args(["status", "--prefix", "st"])
        .assert()
        .code(1)
        .stdout(contains("state: free"));
    let out = conlock(&server)
        .args(["status", "--prefix", "st", "--json"])
        .assert()
        .code(1);
    let j: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(
        (j["kind"].as_str(), j["held"].as_bool()),
        (Some("lock"), Some(false))
    );

    let mut h = conlock(&server)
        .args([
            "run",
            "--prefix",
            "st",
            "--session-name",
            "status-test",
            "--",
            "sleep",
            "60",
        ])
        .spawn()
        .unwrap();
    let c = client(&server);
    assert!(wait_for(LONG, || holder(&c, "st/.lock").is_some()));
    let mut held = conlock(&server)
        .args(["status", "--prefix", "st"])
        .assert()
        .code(0);
    for want in [
        "state:",
        "held",
        "status-test",
        "fencing token:",
        "lock-delay 15s",
        "\"command\": \"sleep 60\"",
    ] {
        held = held.stdout(contains(want));
    }
    let (_, json) = status(&server, &["--key", "st/.lock", "--json"]);
    let j: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(j["held"], true);
    assert_eq!(j["holder"]["name"], "status-test");
    assert_eq!(j["holder"]["value"]["command"], "sleep 60");
    assert!(j["modify_index"].as_u64().unwrap() > 0);
    assert_eq!(j["lock_index"], 1);
    signal(h.id(), libc::SIGTERM);
    wait_exit(&mut h, LONG);

    // A semaphore with two holders and one waiter.
    let kids: Vec<_> = (0..3)
        .map(|_| {
            conlock(&server)
                .args([
                    "sem", "--limit", "2", "--prefix", "stsem", "--", "sleep", "60",
                ])
                .spawn()
                .unwrap()
        })
        .collect();
    assert!(wait_for(LONG, || {
        let (_, json) = status(&server, &["--prefix", "stsem", "--json"]);
        serde_json::from_str::<serde_json::Value>(&json)
            .map(|j| j["holders"].as_array().map_or(0, |a| a.len()) == 2 && j["waiting"] == 1)
            .unwrap_or(false)
    }));
    let out = conlock(&server)
        .args(["status", "--prefix", "stsem", "--json"])
        .assert()
        .code(0);
    let j: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    assert_eq!(
        (j["kind"].as_str(), j["limit"].as_u64()),
        (Some("semaphore"), Some(2))
    );
    conlock(&server)
        .args(["status", "--prefix", "stsem"])
        .assert()
        .stdout(contains("2 of 2 held"))
        .stdout(contains("waiting:"))
        .stdout(contains("holder 2"));
    for mut k in kids {
        signal(k.id(), libc::SIGTERM);
        wait_exit(&mut k, LONG);
    }
}

#[test]
fn watch_reports_acquire_release_and_loss_and_runs_the_handler() {
    let server = start_server();
    let dir = scratch("watch");
    let events = dir.join("events");
    let handler = format!(
        "echo \"$CONLOCK_EVENT $CONLOCK_HOLDER_SESSION $CONLOCK_TARGET\" >> {}",
        events.display()
    );
    let mut w = conlock(&server)
        .args(["watch", "--key", "wk", "--json", "--", "sh", "-c", &handler])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut next = crate::harness::json_lines(w.stdout.take().unwrap(), LONG);
    let _w = KillOnDrop(w);
    assert_eq!(next()["event"], "free");

    // A holder comes and goes normally: acquired, released.
    let started = dir.join("a-started");
    let mut a = conlock(&server)
        .args(["run", "--key", "wk", "--", "sh", "-c"])
        .arg(format!("touch {}; exec sleep 60", started.display()))
        .spawn()
        .unwrap();
    let e = next();
    assert_eq!(e["event"], "acquired");
    let a_session = e["holder"]["session"].as_str().unwrap().to_string();
    // Until the command runs, a SIGTERM means "give up waiting": the session is
    // destroyed and the watch would report a loss instead of a release.
    assert!(
        wait_for(LONG, || started.exists()),
        "A's command never started"
    );
    signal(a.id(), libc::SIGTERM);
    wait_exit(&mut a, LONG);
    let e = next();
    assert_eq!(
        (e["event"].as_str(), e["holder"]["session"].as_str()),
        (Some("released"), Some(a_session.as_str()))
    );

    // A holder whose session is destroyed: acquired, lost.
    let b_started = dir.join("b-started");
    let mut b = conlock(&server)
        .args([
            "run",
            "--key",
            "wk",
            "--lock-delay",
            "2s",
            "--kill-grace",
            "200ms",
            "--",
        ])
        .args(marked(&b_started, "exec sleep 60"))
        .spawn()
        .unwrap();
    let e = next();
    assert_eq!(e["event"], "acquired");
    let b_session = e["holder"]["session"].as_str().unwrap().to_string();
    assert!(
        wait_for(LONG, || b_started.exists()),
        "B's command never started"
    );
    client(&server).session_destroy(&b_session).unwrap();
    let e = next();
    assert_eq!(
        (e["event"].as_str(), e["holder"]["session"].as_str()),
        (Some("lost"), Some(b_session.as_str()))
    );
    assert_eq!(wait_exit(&mut b, LONG).code(), Some(124));

    // The handler saw the same sequence with the right environment (runs never overlap).
    let want = [
        "free  wk".to_string(),
        format!("acquired {a_session} wk"),
        format!("released {a_session} wk"),
        format!("acquired {b_session} wk"),
        format!("lost {b_session} wk"),
    ];
    assert!(
        wait_for(LONG, || read(&events).lines().count() >= want.len()),
        "handler runs:\n{}",
        read(&events)
    );
    let got: Vec<String> = read(&events).lines().map(str::to_string).collect();
    assert_eq!(got, want);
}

#[test]
fn break_frees_a_lock_held_by_another_conlock() {
    let server = start_server();
    let running = scratch("brk").join("running");
    let mut h = conlock(&server)
        .args([
            "run",
            "--prefix",
            "brk",
            "--lock-delay",
            "2s",
            "--kill-grace",
            "200ms",
        ])
        .arg("--")
        .args(marked(&running, "exec sleep 60"))
        .spawn()
        .unwrap();
    let c = client(&server);
    assert!(wait_for(LONG, || running.exists()));

    // Without --yes on a non-terminal: refused, nothing changes.
    conlock(&server)
        .args(["break", "--prefix", "brk"])
        .assert()
        .code(125)
        .stderr(contains("--yes"));
    assert!(holder(&c, "brk/.lock").is_some());

    conlock(&server)
        .args(["break", "--prefix", "brk", "--yes"])
        .assert()
        .success()
        .stdout(contains("destroyed session"));
    assert_eq!(wait_exit(&mut h, LONG).code(), Some(124));
    assert!(c
        .session_list(QueryOptions::default())
        .unwrap()
        .0
        .is_empty());
    // Nothing held any more: break says so and succeeds.
    conlock(&server)
        .args(["break", "--prefix", "brk", "--yes"])
        .assert()
        .success()
        .stdout(contains("nothing to break"));
}

#[test]
fn break_removes_one_semaphore_holder() {
    let server = start_server();
    let dir = scratch("bsem");
    let mut kids: Vec<_> = (0..2)
        .map(|i| {
            conlock(&server)
                .args(["sem", "--limit", "2", "--prefix", "bsem", "--"])
                .args(marked(&dir.join(format!("running{i}")), "exec sleep 60"))
                .spawn()
                .unwrap()
        })
        .collect();
    assert!(wait_for(LONG, || (0..2)
        .all(|i| dir.join(format!("running{i}")).exists())));
    let holders = || -> Vec<String> {
        let out = conlock(&server)
            .args(["status", "--prefix", "bsem", "--json"])
            .output()
            .unwrap();
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        j["holders"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|h| h["session"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(wait_for(LONG, || holders().len() == 2));
    let victim = holders()[0].clone();
    conlock(&server)
        .args(["break", "--prefix", "bsem", "--session", &victim, "--yes"])
        .assert()
        .success();
    assert!(wait_for(LONG, || holders().len() == 1));
    assert!(!holders().contains(&victim));
    // Exactly one conlock lost its slot (124); stop the other.
    assert!(wait_for(LONG, || kids
        .iter_mut()
        .filter_map(|k| k.try_wait().unwrap())
        .count()
        == 1));
    for k in &mut kids {
        match k.try_wait().unwrap() {
            Some(st) => assert_eq!(st.code(), Some(124)),
            None => {
                signal(k.id(), libc::SIGTERM);
                wait_exit(k, LONG);
            }
        }
    }
}

#[test]
fn held_since_is_when_holding_began_not_when_waiting_began() {
    let server = start_server();
    let mut a = start_holder(&server, "since", &[], "exec sleep 60");
    let running = scratch("since").join("b");
    let mut b = conlock(&server)
        .args(["run", "--key", "since", "--"])
        .args(marked(&running, "exec sleep 60"))
        .spawn()
        .unwrap();
    assert!(wait_sessions(&server, 2));
    let before_handoff = conlock::ui::timestamp(std::time::SystemTime::now());
    signal(a.id(), libc::SIGTERM);
    wait_exit(&mut a, LONG);
    assert!(wait_for(LONG, || running.exists()));
    let out = conlock(&server)
        .args(["status", "--key", "since", "--json"])
        .assert()
        .code(0);
    let j: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();

    let since = j["holder"]["held_since"].as_str().unwrap().to_string();
    // Same RFC 3339 UTC format: the strings order like the times.
    assert!(
        since >= before_handoff,
        "held since {since}, but the handoff began at {before_handoff}"
    );
    signal(b.id(), libc::SIGTERM);
    wait_exit(&mut b, LONG);
}

/// status --json: every duration in nanoseconds; with --value nothing records when
/// holding began (Consul keeps no times), so held_since is null and the text says unknown.
#[test]
fn status_durations_in_ns_and_held_since_with_a_value_of_ones_own() {
    let server = start_server();
    let mut a = start_holder(
        &server,
        "own",
        &["--value", "mine", "--ttl", "20s", "--lock-delay", "7s"],
        "exec sleep 60",
    );
    let out = conlock(&server)
        .args(["status", "--key", "own", "--json"])
        .assert()
        .code(0);
    let j: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    crate::schema::assert_status_valid(&j);
    let h = &j["holder"];
    assert_eq!(h["value"], "mine", "{j}");
    assert_eq!(h["held_since"], serde_json::Value::Null, "{j}");
    assert_eq!(h["ttl_ns"], 20_000_000_000u64, "{j}");
    assert_eq!(h["lock_delay_ns"], 7_000_000_000u64, "{j}");
    conlock(&server)
        .args(["status", "--key", "own"])
        .assert()
        .code(0)
        .stdout(contains(
            "held since:    unknown (the holder stores its own value)",
        ));
    signal(a.id(), libc::SIGTERM);
    wait_exit(&mut a, LONG);
}

/// A stdout whose reader is gone before conlock writes (as `| head -1` or `| true` may be).
fn closed_pipe() -> Stdio {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    unsafe { libc::close(fds[0]) };
    Stdio::from(unsafe { OwnedFd::from_raw_fd(fds[1]) })
}

fn dev_full() -> Stdio {
    Stdio::from(
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap(),
    )
}

/// Every command that writes to stdout (`pipe/held` is held, `pipe/free` is not).
fn stdout_writers() -> Vec<Vec<&'static str>> {
    vec![
        vec!["status", "--key", "pipe/held"],
        vec!["status", "--key", "pipe/held", "--json"],
        vec!["watch", "--key", "pipe/held"],
        vec!["watch", "--key", "pipe/held", "--json"],
        vec!["completions", "bash"],
        vec!["man"],
        vec!["man", "run"],
        vec!["--help"],
        vec!["run", "--help"],
        vec!["--version"],
        vec!["dev-server", "--addr", "127.0.0.1:0"],
        vec!["break", "--key", "pipe/free", "--yes"],
    ]
}

/// Runs conlock with `stdout`; returns the exit status and stderr.
fn with_stdout(
    server: &conlock::devserver::DevServer,
    args: &[&str],
    stdout: Stdio,
) -> (std::process::ExitStatus, String) {
    let mut child = conlock(server)
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (wait_exit(&mut child, LONG), err)
}

#[test]
fn a_closed_stdout_ends_quietly_with_141() {
    let server = start_server();
    let mut h = start_holder(&server, "pipe/held", &[], "exec sleep 60");
    let c = client(&server);
    assert!(wait_for(LONG, || holder(&c, "pipe/held").is_some()));
    for args in stdout_writers() {
        let (st, err) = with_stdout(&server, &args, closed_pipe());
        assert_eq!(
            (st.code(), err.as_str()),
            (Some(141), ""),
            "conlock {args:?} to a closed pipe: {st}"
        );
    }
    // break still breaks: the output comes after the session is destroyed.
    let (st, err) = with_stdout(
        &server,
        &["break", "--key", "pipe/held", "--yes"],
        closed_pipe(),
    );
    assert_eq!((st.code(), err.as_str()), (Some(141), ""), "break: {st}");
    assert_eq!(wait_exit(&mut h, LONG).code(), Some(124));
}

#[test]
fn a_full_stdout_is_one_error_line_and_125() {
    let server = start_server();
    let mut h = start_holder(&server, "pipe/held", &[], "exec sleep 60");
    let c = client(&server);
    assert!(wait_for(LONG, || holder(&c, "pipe/held").is_some()));
    for args in stdout_writers() {
        let (st, err) = with_stdout(&server, &args, dev_full());
        assert_eq!(st.code(), Some(125), "conlock {args:?} > /dev/full: {st}");
        assert_eq!(
            err, "conlock: error: cannot write to stdout: No space left on device (os error 28)\n",
            "conlock {args:?} > /dev/full"
        );
    }
    let (st, err) = with_stdout(
        &server,
        &["break", "--key", "pipe/held", "--yes"],
        dev_full(),
    );
    assert_eq!(st.code(), Some(125), "break: {st}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(wait_exit(&mut h, LONG).code(), Some(124));
}

/// Messages that read cleanly (issue 32, item 11).
#[test]
fn operator_messages_read_cleanly() {
    let server = start_server();
    // A semaphore nobody holds: no "0 of unknown".
    let (code, text) = status(&server, &["--prefix", "idle", "--kind", "semaphore"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("slots:     0 held; the limit is not known yet (no .lock)\n"),
        "{text}"
    );

    // A holder with no value and no session name: no "session X of session X".
    let c = client(&server);
    let sid = c
        .session_create(&conlock::consul::SessionRequest::default())
        .unwrap();
    let put = conlock::consul::PutOptions {
        flags: conlock::consul::LOCK_FLAGS,
        acquire: Some(&sid),
        ..Default::default()
    };
    assert!(c.kv_put("plain", b"", put).unwrap());
    conlock(&server)
        .args(["break", "--key", "plain", "--yes"])
        .assert()
        .success()
        .stdout(format!(
            "destroyed session {sid}; plain can be acquired again after 15s (lock-delay)\n"
        ));

    // A failing handler: its command line, then how it ended, once.
    let mut w = KillOnDrop(
        conlock(&server)
            .args(["watch", "--key", "w", "--", "sh", "-c", "exit 9"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(w.0.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line,
        "conlock: warning: the handler (sh -c 'exit 9') exited with 9\n"
    );
}
