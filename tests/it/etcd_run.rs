//! `conlock run --backend etcd` against a real etcd on loopback (etcd_harness): the
//! lock interoperates with `etcdctl lock` both ways, never lets two holders overlap
//! (judged from timestamps the children write), keeps its cushion after an involuntary
//! end, and is stopped by the guardian when conlock dies or stalls.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use conlock::etcd::types::*;
use conlock::etcd::EtcdClient;

use crate::etcd_harness::{
    assert_not_adopted, assert_runs_without_a_cushion, conlock_etcd, conlock_etcd_at, etcdctl_bin,
    etcdctl_lock, heartbeat_job, keys_under, now_ns, proxy_answering_503, proxy_muting_puts,
    proxy_with_hook, put_foreign_keys, spans, with_timings, Etcd, EtcdCluster, EtcdOptions, FAST,
};
use crate::harness::{bytes_contain, fault_proxy, Fault};
use crate::harness::{
    intervals, logged_job, max_overlap, read, scratch, signal, until_exists, wait_exit, wait_for,
    KillOnDrop, BIN,
};

const LONG: Duration = Duration::from_secs(60);
const T: Duration = Duration::from_secs(5);

fn unique_name(what: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "etcdrun/{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// `conlock run --key NAME FAST... -- sh -c CMD`, started.
fn run_lock(etcd: &Etcd, name: &str, extra: &[&str], cmd: &str) -> Child {
    run_lock_at(&etcd.endpoint(), name, extra, cmd)
}

/// [`run_lock`] against a list of endpoints.
fn run_lock_at(endpoints: &str, name: &str, extra: &[&str], cmd: &str) -> Child {
    conlock_etcd_at(endpoints)
        .args(["run", "--key", name])
        .args(with_timings(extra))
        .args(["--", "sh", "-c", cmd])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until `n` contender keys are under `NAME/`.
fn wait_keys(c: &EtcdClient, name: &str, n: usize) {
    assert!(
        wait_for(LONG, || keys_under(c, &format!("{name}/")).len() == n),
        "never {n} keys under {name}/: {:?}",
        keys_under(c, &format!("{name}/"))
    );
}

/// The next `run` of lock `name` after one that never started its command.
fn next_run(etcd: &Etcd, name: &str) -> Command {
    let mut next = conlock_etcd(etcd);
    next.args(["run", "--key", name, "--timeout", "20s"])
        .args(FAST)
        .args(["--", "true"]);
    next
}

/// Whether `key` exists now.
fn exists(c: &EtcdClient, key: &str) -> bool {
    !c.range(&RangeRequest::key(key.to_string()))
        .unwrap()
        .kvs
        .is_empty()
}

/// The kinds of `key`'s events from revision `from` on, from etcd's history (read until
/// the watch is silent for 2 s).
fn history_of(c: &EtcdClient, key: &str, from: i64) -> Vec<EventType> {
    let req = WatchCreateRequest {
        key: key.as_bytes().to_vec(),
        start_revision: from,
        ..Default::default()
    };
    let mut stream = c.watch(&req, Duration::from_secs(2)).unwrap();
    let mut history = Vec::new();
    while let Ok(Some(r)) = stream.next_response() {
        history.extend(r.events.iter().map(|e| e.kind));
    }
    history
}

fn stderr_of(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn uncontended_run_gives_the_child_etcdctls_variables_and_the_create_revision() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("env");
    let dir = scratch("etcd-env");
    let (envf, go) = (dir.join("env"), dir.join("go"));
    let cmd = format!(
        "env > {}.tmp; mv {0}.tmp {0}; {}",
        envf.display(),
        until_exists(&go)
    );
    let h = run_lock(etcd, &name, &[], &cmd);
    assert!(wait_for(LONG, || envf.exists()), "the command never ran");
    let env = read(&envf);
    let var = |k: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .map(str::to_string)
    };
    let kvs = keys_under(&c, &format!("{name}/"));
    assert_eq!(kvs.len(), 1, "{kvs:?}");
    let key = String::from_utf8(kvs[0].key.clone()).unwrap();
    // etcdctl's layout: NAME/<lease in lower-case hex>, on that lease.
    assert_eq!(key, format!("{name}/{:x}", kvs[0].lease));
    assert_eq!(var("ETCD_LOCK_KEY").as_deref(), Some(key.as_str()));
    assert_eq!(
        var("CONLOCK_SESSION").as_deref(),
        Some(format!("{:x}", kvs[0].lease).as_str())
    );
    assert_eq!(var("CONLOCK_KEY").as_deref(), Some(name.as_str()));
    let rev = kvs[0].create_revision;
    // Uncontended, the txn that created the key also wrote the holder record (its mod
    // revision is the key's create revision), which names the key by create revision 0
    // ("this txn's"); `status` resolves it: a holder, no cushion.
    let record_key = conlock::claim::etcd_lock::record_key(&name);
    let rec = c.range(&RangeRequest::key(record_key.clone())).unwrap();
    assert_eq!(rec.kvs[0].mod_revision, rev, "{:?}", rec.kvs);
    let json: serde_json::Value = serde_json::from_slice(&rec.kvs[0].value).unwrap();
    assert_eq!(json["key"], key.as_str(), "{json}");
    assert_eq!(json["create_revision"], 0, "{json}");
    assert_eq!(json["released"], false, "{json}");
    let status = conlock_etcd(etcd)
        .args(["status", "--json", "--key", &name])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["state"], "held", "{status}");
    assert!(status["holder"].is_object(), "{status}");
    assert!(status["lock_delay"].is_null(), "{status}");
    assert_eq!(
        var("CONLOCK_FENCING_TOKEN").as_deref(),
        Some(rev.to_string().as_str())
    );
    // Uncontended, etcdctl's ETCD_LOCK_REV is the txn's revision: the create revision.
    assert_eq!(
        var("ETCD_LOCK_REV").as_deref(),
        Some(rev.to_string().as_str())
    );
    for consul_only in [
        "CONLOCK_MODIFY_INDEX",
        "CONSUL_LOCK_HELD",
        "CONLOCK_LOCK_INDEX",
    ] {
        assert_eq!(var(consul_only), None, "{consul_only} set on etcd");
    }
    std::fs::write(&go, "").unwrap();
    let out = h.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // The server is 3.4.23: one line names the fixed release.
    assert_eq!(
        err.lines()
            .filter(|l| l.contains("known lease bugs") && l.contains("3.4.38"))
            .count(),
        1,
        "{err}"
    );
    // Released: no contender key left, and the record deleted with it.
    assert!(keys_under(&c, &format!("{name}/")).is_empty());
    let rec = c.range(&RangeRequest::key(record_key)).unwrap();
    assert!(rec.kvs.is_empty(), "{:?}", rec.kvs);
}

/// An uncontended run sends one write to acquire (key, record and checks in one txn) and
/// one to release: a lease grant, two txns and the revoke (and the server's version).
#[test]
fn an_uncontended_run_acquires_in_one_txn() {
    let Some(etcd) = Etcd::shared() else { return };
    let name = unique_name("one-txn");
    let upstream = etcd.endpoint().trim_start_matches("http://").to_string();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    let proxy = fault_proxy(upstream, move |req| {
        // Request heads only (bodies come as chunks of their own).
        let line = String::from_utf8_lossy(req);
        if let Some(("POST" | "GET", rest)) = line.split_once(' ') {
            log.lock()
                .unwrap()
                .push(rest.split(' ').next().unwrap_or("").to_string());
        }
        Fault::Forward
    });
    let out = conlock_etcd_at(&proxy)
        .args(["run", "--key", &name])
        .args(with_timings(&[]))
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The server version is read beside, and not waited for: it may not be sent.
    let mut paths = seen.lock().unwrap().clone();
    paths.retain(|p| p != "/version");
    assert_eq!(
        paths,
        [
            "/v3/lease/grant",
            "/v3/kv/txn",
            "/v3/kv/txn",
            "/v3/lease/revoke"
        ],
        "{paths:?}"
    );
}

/// Someone rewrites the holder record while conlock holds: the release, which knows the
/// record it wrote without reading it, finds it changed, reads it, deletes only its own
/// key (the other record stays as it is) and still reports `released`.
#[test]
fn a_record_rewritten_while_held_the_release_deletes_the_key_and_says_released() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("record");
    let dir = scratch("etcd-record");
    let (ev, go) = (dir.join("events"), dir.join("go"));
    let ev_arg = ev.display().to_string();
    let h = run_lock(etcd, &name, &["--events", &ev_arg], &until_exists(&go));
    assert!(wait_for(LONG, || read(&ev).contains("\"acquired\"")));
    let foreign = r#"{"key":"elsewhere/1","create_revision":1,"lock_delay_ms":0,"released":true}"#;
    // The record's real key (`/` escaped): `{name}.conlock` is not it.
    let record_key = conlock::claim::etcd_lock::record_key(&name);
    c.put(&PutRequest::new(record_key.clone(), foreign))
        .unwrap();
    std::fs::write(&go, "").unwrap();
    let out = h.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = read(&ev);
    assert!(events.contains("\"event\":\"released\""), "{events}");
    let rec = c.range(&RangeRequest::key(record_key)).unwrap();
    assert_eq!(
        rec.kvs.first().map(|kv| kv.value.as_slice()),
        Some(foreign.as_bytes())
    );
    assert!(keys_under(&c, &format!("{name}/")).is_empty());
}

#[test]
fn ten_contenders_never_overlap() {
    let Some(etcd) = Etcd::shared() else { return };
    let name = unique_name("ten");
    let dir = scratch("etcd-ten");
    let log = dir.join("log");
    let job = logged_job(&log, "sleep 0.1");
    let kids: Vec<KillOnDrop> = (0..10)
        .map(|_| KillOnDrop(run_lock(etcd, &name, &["-q"], &job)))
        .collect();
    for mut k in kids {
        let st = wait_exit(&mut k.0, Duration::from_secs(120));
        assert!(st.success(), "a contender failed: {st}");
    }
    let iv = intervals(&read(&log));
    assert_eq!(iv.len(), 10, "{}", read(&log));
    assert_eq!(max_overlap(&iv), 1, "{}", read(&log));
}

#[test]
fn conlock_and_etcdctl_lock_exclude_each_other_both_ways() {
    let Some(etcd) = Etcd::shared() else { return };
    if etcdctl_bin(Path::new("etcd")).is_none() {
        return;
    }
    let c = etcd.client(T);
    // A leading slash is part of an etcd name (etcdctl keeps it): kept, not stripped.
    let name = format!("/{}", unique_name("interop"));
    let dir = scratch("etcd-interop");
    let log = dir.join("log");
    // etcdctl first, then conlock, then etcdctl again, each queued behind the last.
    let e1 = KillOnDrop(etcdctl_lock(etcd, &name, &logged_job(&log, "sleep 1")).expect("etcdctl"));
    wait_keys(&c, &name, 1);
    let k = KillOnDrop(run_lock(etcd, &name, &["-q"], &logged_job(&log, "sleep 1")));
    wait_keys(&c, &name, 2);
    let e2 =
        KillOnDrop(etcdctl_lock(etcd, &name, &logged_job(&log, "sleep 0.5")).expect("etcdctl"));
    wait_keys(&c, &name, 3);
    for mut p in [e1, k, e2] {
        let st = wait_exit(&mut p.0, LONG);
        assert!(st.success(), "{st}");
    }
    let iv = intervals(&read(&log));
    assert_eq!(iv.len(), 3, "{}", read(&log));
    assert_eq!(max_overlap(&iv), 1, "{}", read(&log));
}

#[test]
fn sigkill_of_conlock_the_guardian_stops_the_command_and_releases_at_once() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("kill");
    let dir = scratch("etcd-kill");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let h = KillOnDrop(run_lock(
        etcd,
        &name,
        &["--lock-delay", "20s"],
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let w = KillOnDrop(run_lock(
        etcd,
        &name,
        &["--lock-delay", "20s", "-q"],
        &logged_job(&log, "true"),
    ));
    wait_keys(&c, &name, 2);
    let killed = Instant::now();
    signal(h.0.id(), libc::SIGKILL);
    let mut w = w;
    let st = wait_exit(&mut w.0, LONG);
    assert!(st.success(), "{st}");
    // Released by the guardian (marked released): no 20 s cushion, no TTL wait.
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "the waiter took {:?}",
        killed.elapsed()
    );
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{}", read(&log));
    assert!(
        sp[0].2 < sp[1].1,
        "the next holder started before the killed command's last sign of life: {sp:?}"
    );
    let mut h = h;
    let mut err = String::new();
    std::io::Read::read_to_string(h.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(
        err.lines()
            .any(|l| l.starts_with("conlock guardian: released the lock")
                && l.contains("; lease ")
                && l.contains(" revoked")),
        "{err}"
    );
}

/// conlock dies after its lease was revoked: the guardian says that it did not release
/// the lock (it was no longer ours), not that it did.
#[test]
fn the_guardian_does_not_claim_a_release_that_did_not_happen() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("guardian-say");
    let dir = scratch("etcd-guardian-say");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let mut h = KillOnDrop(run_lock(
        etcd,
        &name,
        &["--ttl", "30s", "--lock-delay", "15s"],
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let lease = keys_under(&c, &format!("{name}/"))[0].lease;
    signal(h.0.id(), libc::SIGSTOP);
    c.lease_revoke(lease).unwrap();
    signal(h.0.id(), libc::SIGKILL);
    wait_exit(&mut h.0, LONG);
    let mut err = String::new();
    std::io::Read::read_to_string(h.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("conlock guardian:") && l.contains("release"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(said[0].contains("did not release the lock"), "{err}");
    assert!(!said[0].contains("released"), "{err}");
}

#[test]
fn sigstop_of_conlock_the_guardian_kills_the_command_before_the_lease_expires() {
    let Some(etcd) = Etcd::shared() else { return };
    if etcdctl_bin(Path::new("etcd")).is_none() {
        return;
    }
    let c = etcd.client(T);
    let name = unique_name("stop");
    let dir = scratch("etcd-stop");
    let (log, go) = (dir.join("log"), dir.join("go"));
    // A cushion longer than the TTL: the TTL must bound the deadline by itself (an
    // expiry lets etcdctl in at once), not the TTL plus the cushion.
    let h = KillOnDrop(run_lock(
        etcd,
        &name,
        &["--ttl", "3s", "--lock-delay", "6s"],
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    // etcdctl gets no cushion: it takes the lock as soon as the lease expires.
    // Its job lasts long enough for a command that still ran to show a heartbeat.
    let mut e =
        KillOnDrop(etcdctl_lock(etcd, &name, &logged_job(&log, "sleep 0.5")).expect("etcdctl"));
    wait_keys(&c, &name, 2);
    signal(h.0.id(), libc::SIGSTOP);
    let st = wait_exit(&mut e.0, LONG);
    signal(h.0.id(), libc::SIGCONT);
    assert!(st.success(), "{st}");
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{}", read(&log));
    assert!(
        sp[0].2 < sp[1].1,
        "etcdctl started while the stopped holder's command still ran: {sp:?}"
    );
    let mut h = h;
    let st = wait_exit(&mut h.0, LONG);
    assert_eq!(st.code(), Some(124), "{st}");
}

/// The holder's lease is revoked by an operator: the holder stops at once (exit 124),
/// and a conlock waiter keeps the holder's cushion before it starts.
#[test]
fn lease_revoked_while_connected_holder_exits_124_and_the_waiter_keeps_the_cushion() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("revoke");
    let dir = scratch("etcd-revoke");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let h = run_lock(
        etcd,
        &name,
        &["--lock-delay", "3s"],
        &heartbeat_job(&log, &go),
    );
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let mut w = KillOnDrop(run_lock(etcd, &name, &["-q"], &logged_job(&log, "true")));
    wait_keys(&c, &name, 2);
    let lease = keys_under(&c, &format!("{name}/"))
        .into_iter()
        .min_by_key(|kv| kv.create_revision)
        .unwrap()
        .lease;
    let revoked_at = now_ns();
    let revoked = Instant::now();
    c.lease_revoke(lease).unwrap();
    let err = stderr_of(h);
    assert!(err.contains("deleted"), "{err}");
    assert!(
        revoked.elapsed() < Duration::from_secs(5),
        "the holder took {:?} to stop",
        revoked.elapsed()
    );
    assert_eq!(wait_exit(&mut w.0, LONG).code(), Some(0));
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{}", read(&log));
    assert!(sp[0].2 < sp[1].1, "{sp:?}");
    assert!(
        sp[1].1 >= revoked_at + 3_000_000_000,
        "the waiter started {} ms after the revoke, inside the 3 s cushion",
        (sp[1].1 - revoked_at) / 1_000_000
    );
}

/// The holder is cut off (SIGSTOP) and its lease revoked: it cannot hear of it, its
/// command runs on until the guardian's deadline; a conlock waiter keeps the cushion,
/// so the two never overlap.
#[test]
fn lease_revoked_while_cut_off_the_waiter_waits_out_the_cushion() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("cutoff");
    let dir = scratch("etcd-cutoff");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let h = KillOnDrop(run_lock(
        etcd,
        &name,
        &["--ttl", "10s", "--lock-delay", "3s"],
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let mut w = KillOnDrop(run_lock(etcd, &name, &["-q"], &logged_job(&log, "true")));
    wait_keys(&c, &name, 2);
    let lease = keys_under(&c, &format!("{name}/"))
        .into_iter()
        .min_by_key(|kv| kv.create_revision)
        .unwrap()
        .lease;
    signal(h.0.id(), libc::SIGSTOP);
    let revoked_at = now_ns();
    c.lease_revoke(lease).unwrap();
    assert_eq!(wait_exit(&mut w.0, LONG).code(), Some(0));
    signal(h.0.id(), libc::SIGCONT);
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{}", read(&log));
    assert!(
        sp[0].2 < sp[1].1,
        "the waiter started while the cut-off holder's command ran: {sp:?}"
    );
    assert!(sp[1].1 >= revoked_at + 3_000_000_000, "{sp:?}");
}

#[test]
fn key_deleted_by_someone_else_holder_exits_124_and_the_waiter_keeps_the_cushion() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("del");
    let dir = scratch("etcd-del");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let h = run_lock(
        etcd,
        &name,
        &["--lock-delay", "3s"],
        &heartbeat_job(&log, &go),
    );
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let mut w = KillOnDrop(run_lock(etcd, &name, &["-q"], &logged_job(&log, "true")));
    wait_keys(&c, &name, 2);
    let first = keys_under(&c, &format!("{name}/"))
        .into_iter()
        .min_by_key(|kv| kv.create_revision)
        .unwrap();
    let deleted_at = now_ns();
    c.delete_range(&DeleteRangeRequest::key(first.key)).unwrap();
    let out = h.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(124));
    assert_eq!(wait_exit(&mut w.0, LONG).code(), Some(0));
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{}", read(&log));
    assert!(sp[0].2 < sp[1].1, "{sp:?}");
    assert!(sp[1].1 >= deleted_at + 3_000_000_000, "{sp:?}");
}

/// A waiter that starts after a holder's involuntary end (it never saw the deletion)
/// still keeps the cushion: it reads it from the holder record.
#[test]
fn a_waiter_arriving_after_a_revoke_still_keeps_the_cushion() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("late");
    let dir = scratch("etcd-late");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let h = KillOnDrop(run_lock(
        etcd,
        &name,
        &["--ttl", "10s", "--lock-delay", "3s"],
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let lease = keys_under(&c, &format!("{name}/"))[0].lease;
    signal(h.0.id(), libc::SIGSTOP);
    let revoked_at = now_ns();
    c.lease_revoke(lease).unwrap();
    let mut w = KillOnDrop(run_lock(etcd, &name, &["-q"], &logged_job(&log, "true")));
    assert_eq!(wait_exit(&mut w.0, LONG).code(), Some(0));
    signal(h.0.id(), libc::SIGCONT);
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{}", read(&log));
    assert!(sp[0].2 < sp[1].1, "{sp:?}");
    assert!(sp[1].1 >= revoked_at + 3_000_000_000, "{sp:?}");
}

#[test]
fn timeout_on_a_busy_lock_is_exit_75_and_removes_the_waiters_key() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("busy");
    let dir = scratch("etcd-busy");
    let go = dir.join("go");
    let marker = dir.join("ran");
    let h = KillOnDrop(run_lock(etcd, &name, &[], &until_exists(&go)));
    wait_keys(&c, &name, 1);
    let started = Instant::now();
    let out = conlock_etcd(etcd)
        .args(["run", "--key", &name, "--timeout", "1s"])
        .args(FAST)
        .args(["--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!marker.exists());
    // Only the holder's key is left.
    assert_eq!(keys_under(&c, &format!("{name}/")).len(), 1);
    std::fs::write(&go, "").unwrap();
    let mut h = h;
    assert!(wait_exit(&mut h.0, LONG).success());
}

/// Usage errors come before any request: conlock exits 125 with one line naming the
/// flag, and the endpoint (a listener of the test) never sees a connection.
#[test]
fn bad_flag_combinations_are_refused_before_any_request() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let ep = format!("http://{}", listener.local_addr().unwrap());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "run",
                "--backend",
                "etcd",
                "--http-addr",
                "x:1",
                "--key",
                "k",
            ],
            "--http-addr is a Consul option",
        ),
        (
            vec!["run", "--backend", "etcd", "--check", "c", "--key", "k"],
            "--check is a Consul option",
        ),
        (
            vec![
                "run",
                "--backend",
                "etcd",
                "--behavior",
                "delete",
                "--key",
                "k",
            ],
            "--behavior is a Consul option",
        ),
        (
            vec!["run", "--backend", "etcd", "--prefix", "p"],
            "--key NAME",
        ),
        (
            vec![
                "run",
                "--backend",
                "consul",
                "--endpoints",
                "http://x:1",
                "--key",
                "k",
            ],
            "--endpoints is an etcd option",
        ),
        (
            vec!["run", "--etcd-user", "u", "--key", "k"],
            "--etcd-user is an etcd option",
        ),
        (
            vec!["run", "--backend", "etcd", "--ttl", "10s", "--key", "k"],
            "renews every 3.333s, and one and a half renewal intervals (5s) must fit",
        ),
        (
            vec!["run", "--backend", "etcd", "--ttl", "1s", "--key", "k"],
            "2s to 24h",
        ),
        (
            vec![
                "run",
                "--backend",
                "etcd",
                "--lock-delay",
                "5s",
                "--key",
                "k",
            ],
            "does not fit inside the lock-delay",
        ),
        (
            vec![
                "status",
                "--backend",
                "etcd",
                "--key",
                "k",
                "--kind",
                "semaphore",
            ],
            "--kind semaphore needs --prefix",
        ),
        (
            vec!["break", "--backend", "etcd", "--prefix", "/", "--yes"],
            "names no lock or semaphore",
        ),
        (
            vec!["sem", "--backend", "etcd", "-n", "2", "--prefix", "/"],
            "names no semaphore",
        ),
    ];
    for (args, want) in cases {
        let mut cmd = Command::new(BIN.path());
        for (k, _) in std::env::vars() {
            if k.starts_with("CONSUL_") || k.starts_with("CONLOCK_") || k.starts_with("ETCDCTL_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("ETCDCTL_ENDPOINTS", &ep);
        cmd.args(&args);
        if args[0] != "status" && args[0] != "break" {
            cmd.args(["--", "true"]);
        }
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    let bad = Command::new(BIN.path())
        .env("CONLOCK_BACKEND", "zookeeper")
        .args(["run", "--key", "k", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("CONLOCK_BACKEND=\"zookeeper\""));
    assert!(
        listener.accept().is_err(),
        "a usage error made a request to the endpoint"
    );
}

/// etcd #11456 (etcdctl 3.4 runs its command when its lease expired while it waited):
/// a conlock waiter whose lease expired while it was stopped must not hold when it
/// wakes, beside the contender that queued after it.
#[test]
fn a_waiter_whose_lease_expired_while_waiting_does_not_run_beside_the_next() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("jepsen");
    let dir = scratch("etcd-jepsen");
    let (log, go_a) = (dir.join("log"), dir.join("go-a"));
    let go_c = dir.join("go-c");
    let a = KillOnDrop(run_lock(
        etcd,
        &name,
        &["-q"],
        &logged_job(&log, &until_exists(&go_a)),
    ));
    wait_keys(&c, &name, 1);
    let b = KillOnDrop(run_lock(
        etcd,
        &name,
        &["-v"],
        &logged_job(&log, "sleep 0.3"),
    ));
    wait_keys(&c, &name, 2);
    let b_key = keys_under(&c, &format!("{name}/"))
        .into_iter()
        .max_by_key(|kv| kv.create_revision)
        .unwrap()
        .key;
    // B stops past its 3 s TTL: its key goes with its lease.
    signal(b.0.id(), libc::SIGSTOP);
    assert!(
        wait_for(LONG, || c
            .range(&RangeRequest::key(b_key.clone()))
            .unwrap()
            .kvs
            .is_empty()),
        "B's key never expired"
    );
    let cc = KillOnDrop(run_lock(
        etcd,
        &name,
        &["-q"],
        &logged_job(&log, &until_exists(&go_c)),
    ));
    wait_keys(&c, &name, 2);
    // A goes; C holds; B wakes while C runs.
    std::fs::write(&go_a, "").unwrap();
    assert!(wait_for(LONG, || read(&log).matches("S ").count() == 2));
    signal(b.0.id(), libc::SIGCONT);
    // Give B every chance to (wrongly) start beside C.
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(&go_c, "").unwrap();
    let mut b = b;
    let st = wait_exit(&mut b.0, LONG);
    let mut berr = String::new();
    std::io::Read::read_to_string(b.0.stderr.as_mut().unwrap(), &mut berr).unwrap();
    assert!(st.success(), "B: {st}: {berr}");
    for mut p in [a, cc] {
        let st = wait_exit(&mut p.0, LONG);
        assert!(st.success(), "{st}");
    }
    let iv = intervals(&read(&log));
    assert_eq!(iv.len(), 3, "{}", read(&log));
    assert_eq!(max_overlap(&iv), 1, "{}", read(&log));
}

/// The leader freezes (SIGSTOP) while conlock holds through all three members: leases
/// are only extended by the new leader, so the waiter never starts beside the holder's
/// command, whatever the holder decides (keep it, or stop it with exit 124).
#[test]
fn a_frozen_leader_never_lets_two_holders_overlap() {
    let Some(cluster) = EtcdCluster::start("frz", &EtcdOptions::fast()) else {
        return;
    };
    let eps = cluster.endpoints();
    let c = crate::etcd_harness::client_for(&eps, Duration::from_secs(2));
    let name = unique_name("frozen-leader");
    let dir = scratch("etcd-frozen");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let timings = ["--ttl", "6s", "--lock-delay", "3s"];
    let mut a = KillOnDrop(run_lock_at(
        &eps,
        &name,
        &timings,
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let mut b = KillOnDrop(run_lock_at(&eps, &name, &["-q"], &logged_job(&log, "true")));
    wait_keys(&c, &name, 2);
    let leader = cluster.wait_leader(LONG);
    cluster.members[leader].stop();
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    cluster.wait_leader_among(&others, LONG);
    std::thread::sleep(Duration::from_secs(3));
    cluster.members[leader].cont();
    std::fs::write(&go, "").unwrap();
    let code = wait_exit(&mut a.0, LONG).code();
    assert!(matches!(code, Some(0) | Some(124)), "holder: {code:?}");
    assert_eq!(wait_exit(&mut b.0, LONG).code(), Some(0));
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{}", read(&log));
    assert!(sp[0].2 < sp[1].1, "overlap across a leader change: {sp:?}");
}

/// Two members freeze: no quorum, no keepalive, no confirmation. The holder's deadline
/// passes and its command is stopped (exit 124); once the quorum is back the waiter
/// starts after it, never beside it.
#[test]
fn quorum_loss_stops_the_holder_by_its_deadline_and_nobody_overlaps() {
    let Some(cluster) = EtcdCluster::start("quo", &EtcdOptions::fast()) else {
        return;
    };
    let eps = cluster.endpoints();
    let c = crate::etcd_harness::client_for(&eps, Duration::from_secs(2));
    let name = unique_name("quorum");
    let dir = scratch("etcd-quorum");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let timings = ["--ttl", "4s", "--lock-delay", "2s"];
    let mut a = KillOnDrop(run_lock_at(
        &eps,
        &name,
        &timings,
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let mut b = KillOnDrop(run_lock_at(&eps, &name, &["-q"], &logged_job(&log, "true")));
    wait_keys(&c, &name, 2);
    cluster.members[1].stop();
    cluster.members[2].stop();
    let st = wait_exit(&mut a.0, LONG);
    assert_eq!(st.code(), Some(124), "{st}");
    let stopped_at = now_ns();
    cluster.members[1].cont();
    cluster.members[2].cont();
    assert_eq!(wait_exit(&mut b.0, LONG).code(), Some(0));
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{}", read(&log));
    assert!(sp[0].2 < stopped_at, "{sp:?}");
    assert!(sp[0].2 < sp[1].1, "{sp:?}");
}

/// REVIEW (fails on 0034124): the holder record `NAME.conlock` is a plain key with no
/// lease, and for a lock `P/x` it lies under `P/`, the prefix of lock `P`: after one
/// conlock run on `P/x` it counts as the oldest contender of lock `P` forever, so no
/// conlock (and no `etcdctl lock P`) ever holds `P` again.
#[test]
fn a_nested_locks_holder_record_does_not_block_the_parent_lock_forever() {
    let Some(etcd) = Etcd::shared() else { return };
    let parent = unique_name("parent");
    let child = format!("{parent}/x");
    let dir = scratch("etcd-nested");
    let marker = dir.join("ran");
    let st = wait_exit(&mut run_lock(etcd, &child, &["-q"], "true"), LONG);
    assert!(st.success(), "the run on {child}: {st}");
    // Nothing holds or waits for the parent lock now.
    let out = conlock_etcd(etcd)
        .args(["run", "--key", &parent, "--timeout", "5s"])
        .args(FAST)
        .args(["--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "lock {parent} is free, yet: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(marker.exists());
}

/// A waiter that gives up (`--timeout`) during the cushion leaves the holder record as
/// it was: the next waiter keeps the whole cushion again, from its own read.
#[test]
fn a_waiter_that_gives_up_in_the_cushion_leaves_it_to_the_next() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("cushion-giveup");
    let dir = scratch("etcd-cushion-giveup");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let h = KillOnDrop(run_lock(
        etcd,
        &name,
        &["--ttl", "10s", "--lock-delay", "3s"],
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let lease = keys_under(&c, &format!("{name}/"))[0].lease;
    signal(h.0.id(), libc::SIGSTOP);
    c.lease_revoke(lease).unwrap();
    let marker = dir.join("gave-up-ran");
    let out = conlock_etcd(etcd)
        .args(["run", "--key", &name, "--timeout", "1s"])
        .args(FAST)
        .args(["--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!marker.exists());
    assert!(keys_under(&c, &format!("{name}/")).is_empty());
    let launched = now_ns();
    let mut w = KillOnDrop(run_lock(etcd, &name, &["-q"], &logged_job(&log, "true")));
    assert_eq!(wait_exit(&mut w.0, LONG).code(), Some(0));
    signal(h.0.id(), libc::SIGCONT);
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{}", read(&log));
    assert!(sp[0].2 < sp[1].1, "{sp:?}");
    assert!(sp[1].1 >= launched + 3_000_000_000, "{sp:?}");
}

/// The member conlock talks to (the leader, first in its endpoints) is SIGKILLed while
/// conlock holds, and restarted on its data dir. conlock fails over to another endpoint
/// and keeps holding (leases survive a leader change): its command runs on through the
/// restart and it exits 0; the waiter (on the other members) starts only after the
/// holder's command ended.
#[test]
fn a_member_restart_under_the_holder_it_keeps_holding_and_nobody_overlaps() {
    let Some(mut cluster) = EtcdCluster::start("rst", &EtcdOptions::fast()) else {
        return;
    };
    let leader = cluster.wait_leader(LONG);
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let ep = |order: &[usize]| {
        let v: Vec<String> = order
            .iter()
            .map(|&i| cluster.members[i].endpoint())
            .collect();
        v.join(",")
    };
    let eps_a = ep(&[leader, others[0], others[1]]);
    let eps_b = ep(&[others[0], others[1], leader]);
    let c = crate::etcd_harness::client_for(&eps_b, Duration::from_secs(2));
    let name = unique_name("restart");
    let dir = scratch("etcd-restart");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let timings = ["--ttl", "6s", "--lock-delay", "3s"];
    let mut a = KillOnDrop(run_lock_at(
        &eps_a,
        &name,
        &timings,
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let mut b = KillOnDrop(run_lock_at(
        &eps_b,
        &name,
        &["-q"],
        &logged_job(&log, "true"),
    ));
    wait_keys(&c, &name, 2);
    cluster.members[leader].kill();
    cluster.wait_leader_among(&others, LONG);
    cluster.members[leader].restart();
    cluster.members[leader]
        .wait_healthy(crate::etcd_harness::READY_WITHIN)
        .unwrap_or_else(|log| panic!("the restarted member did not become healthy: {log}"));
    let restarted = now_ns();
    // Past a whole TTL after the restart: a holder that lost its lease would know by now.
    assert!(
        wait_for(LONG, || now_ns() > restarted + 7_000_000_000),
        "the clock stood still"
    );
    assert!(
        a.0.try_wait().unwrap().is_none(),
        "the holder ended during the restart"
    );
    std::fs::write(&go, "").unwrap();
    let st = wait_exit(&mut a.0, LONG);
    let mut aerr = String::new();
    std::io::Read::read_to_string(a.0.stderr.as_mut().unwrap(), &mut aerr).unwrap();
    assert_eq!(st.code(), Some(0), "holder: {st}: {aerr}");
    assert_eq!(wait_exit(&mut b.0, LONG).code(), Some(0));
    let text = read(&log);
    let sp = spans(&text);
    assert_eq!(sp.len(), 2, "{text}");
    // The command ran on through the restart (it still beat after it), and the waiter
    // started after its last sign of life.
    assert!(sp[0].2 > restarted, "{sp:?}");
    assert!(sp[0].2 < sp[1].1, "overlap across a member restart: {sp:?}");
}

/// The leader freezes while a waiter waits on it (the leader is the waiter's only
/// reachable first endpoint) and the holder, on the other members, finishes meanwhile:
/// the waiter gets the lock through another member before the leader comes back, and
/// never starts beside the holder's command.
#[test]
fn a_frozen_leader_under_a_waiter_the_waiter_fails_over_and_nobody_overlaps() {
    let Some(cluster) = EtcdCluster::start("frw", &EtcdOptions::fast()) else {
        return;
    };
    let leader = cluster.wait_leader(LONG);
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let ep = |order: &[usize]| {
        let v: Vec<String> = order
            .iter()
            .map(|&i| cluster.members[i].endpoint())
            .collect();
        v.join(",")
    };
    let eps_a = ep(&[others[0], others[1], leader]);
    let eps_b = ep(&[leader, others[0], others[1]]);
    let c = crate::etcd_harness::client_for(&eps_a, Duration::from_secs(2));
    let name = unique_name("frozen-waiter");
    let dir = scratch("etcd-frozen-waiter");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let mut a = KillOnDrop(run_lock_at(
        &eps_a,
        &name,
        &["--ttl", "6s", "--lock-delay", "3s"],
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let mut b = KillOnDrop(run_lock_at(
        &eps_b,
        &name,
        &["-v"],
        &logged_job(&log, "true"),
    ));
    wait_keys(&c, &name, 2);
    cluster.members[leader].stop();
    cluster.wait_leader_among(&others, LONG);
    std::fs::write(&go, "").unwrap();
    let st = wait_exit(&mut a.0, LONG);
    assert_eq!(st.code(), Some(0), "holder: {st}");
    let released = Instant::now();
    // A waiter whose watch hangs on the frozen member notices after a silent watch read
    // of 3 s, looks again (one request timeout of 3 s on the frozen member, then the
    // next endpoint) and holds: 5.5 s measured; it was 32-34 s with the 30 s read.
    let st = wait_exit(&mut b.0, Duration::from_secs(120));
    let took = released.elapsed();
    cluster.members[leader].cont();
    let mut berr = String::new();
    std::io::Read::read_to_string(b.0.stderr.as_mut().unwrap(), &mut berr).unwrap();
    assert_eq!(st.code(), Some(0), "waiter: {st}: {berr}");
    let text = read(&log);
    let sp = spans(&text);
    assert_eq!(sp.len(), 2, "{text}");
    assert!(sp[0].2 < sp[1].1, "overlap across a frozen leader: {sp:?}");
    assert!(
        took < Duration::from_secs(15),
        "the waiter took {took:?} to hold after the holder's release: {berr}"
    );
    eprintln!("the waiter held {took:?} after the holder's release, its leader frozen");
}

/// A key named after conlock's lease but written by someone else (here with no lease)
/// is not adopted: conlock takes a new lease (and so a new key) instead. etcd 3.4 hands
/// out lease IDs from the member's request counter, so on a private member the next
/// grant's ID is a few above the test's own; the foreign keys cover that range, and
/// have no lease, so a conlock that does not adopt one waits behind them until its
/// --timeout.
#[test]
fn a_key_named_after_our_lease_on_another_lease_is_not_adopted() {
    let Some(etcd) = Etcd::start("foreign", &EtcdOptions::fast()) else {
        return;
    };
    let c = etcd.client(T);
    let name = unique_name("foreign");
    put_foreign_keys(&c, &name);
    let dir = scratch("etcd-foreign");
    let ran = dir.join("ran");
    let h = run_lock(
        &etcd,
        &name,
        &["--timeout", "2s"],
        &format!("touch {}", ran.display()),
    );
    assert_not_adopted(&h.wait_with_output().unwrap(), &ran);
}

/// conlock is SIGKILLed while the answer to its uncontended take is missing, after the
/// take landed: its guardian knows the claim from the start, so it releases (deletes the
/// key and the record) instead of only revoking the lease, which would leave the record
/// behind and cost the next conlock run a 30 s cushion for a command that never ran.
#[test]
fn sigkill_while_the_take_is_unanswered_the_guardian_releases_it() {
    let Some(etcd) = Etcd::shared() else { return };
    let (name, _) = signal_while_the_take_is_unanswered(etcd, "killed-take", libc::SIGKILL);
    assert_runs_without_a_cushion(&mut next_run(etcd, &name));
}

/// An uncontended run (`--lock-delay 30s`) whose take lands but is never answered gets
/// `sig` once the take is in etcd. Returns the lock's name and how the run ended.
fn signal_while_the_take_is_unanswered(
    etcd: &Etcd,
    what: &str,
    sig: i32,
) -> (String, std::process::ExitStatus) {
    let c = etcd.client(T);
    let name = unique_name(what);
    let record_key = conlock::claim::etcd_lock::record_key(&name);
    let (proxy, _) = proxy_muting_puts(etcd, &record_key, 0);
    let mut w = KillOnDrop(run_lock_at(
        &proxy,
        &name,
        &["--lock-delay", "30s", "-q"],
        "true",
    ));
    assert!(
        wait_for(LONG, || exists(&c, &record_key)),
        "the take never landed, the test shows nothing"
    );
    signal(w.0.id(), sig);
    let st = wait_exit(&mut w.0, LONG);
    (name, st)
}

/// A record take-over (here the uncontended one, in the txn that creates the key)
/// reaches etcd but its answer does not come by `--timeout` (2.5 s, under the 3 s request
/// timeout): the run gives up (exit 75) and takes it back, so the next conlock run starts
/// at once. Left alone, the record would name the run as a holder that never let go, and
/// every conlock waiter would keep its 30 s cushion for a command that never ran.
#[test]
fn a_take_over_unanswered_by_the_timeout_is_taken_back() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("unanswered");
    let record_key = conlock::claim::etcd_lock::record_key(&name);
    let (proxy, _) = proxy_muting_puts(etcd, &record_key, 0);
    let from = c
        .range(&RangeRequest::key(record_key.clone()))
        .unwrap()
        .header
        .revision
        + 1;
    let mut w = KillOnDrop(run_lock_at(
        &proxy,
        &name,
        &["--lock-delay", "30s", "--timeout", "2500ms", "-q"],
        "true",
    ));
    let st = wait_exit(&mut w.0, LONG);
    assert_eq!(st.code(), Some(75));
    // The record's history: the take-over did land (a put naming the run's key), and was
    // taken back (deleted).
    let history = history_of(&c, &record_key, from);
    assert_eq!(
        history.first(),
        Some(&EventType::Put),
        "the take-over did not land, the test shows nothing: {history:?}"
    );
    assert_eq!(
        history,
        [EventType::Put, EventType::Delete],
        "not taken back"
    );
    assert_runs_without_a_cushion(&mut next_run(etcd, &name));
}

/// The same for a waiter's take-over (the take on its predecessor's release, or the
/// record write after a look, if that take's answer timed out first): it reaches etcd
/// but its answer does not come by `--timeout`, so the run gives up (exit 75) and takes
/// it back. The test above covers only the uncontended take (in the txn that creates the
/// key); this one fails if the take-back after a wait (`Turn::Busy`) goes.
#[test]
fn a_waiters_take_over_unanswered_by_the_timeout_is_taken_back() {
    use std::sync::atomic::Ordering;
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("unanswered-wait");
    let record_key = conlock::claim::etcd_lock::record_key(&name);
    let dir = scratch("etcd-unanswered-wait");
    let go = dir.join("go");
    let mut h = KillOnDrop(run_lock(etcd, &name, &["-q"], &until_exists(&go)));
    wait_keys(&c, &name, 1);
    // The waiter's first txn that writes the record is its enqueue (its nested take,
    // which fails here): forwarded. Every later one is a take-over: muted.
    let (proxy, seen) = proxy_muting_puts(etcd, &record_key, 1);
    let mut w = KillOnDrop(run_lock_at(
        &proxy,
        &name,
        &["--lock-delay", "30s", "--timeout", "6s", "-q"],
        "true",
    ));
    wait_keys(&c, &name, 2);
    let from = c
        .range(&RangeRequest::key(record_key.clone()))
        .unwrap()
        .header
        .revision
        + 1;
    std::fs::write(&go, "").unwrap();
    assert!(wait_exit(&mut h.0, LONG).success());
    let st = wait_exit(&mut w.0, LONG);
    assert_eq!(st.code(), Some(75));
    assert!(
        seen.load(Ordering::SeqCst) >= 2,
        "no take-over was sent, the test shows nothing"
    );
    // The record's history: the holder's release (a delete), the waiter's take-over(s)
    // (puts naming its key), and the take-back (a delete).
    let history = history_of(&c, &record_key, from);
    assert!(
        history.len() >= 2 && history[0] == EventType::Delete && history[1] == EventType::Put,
        "the take-over did not land, the test shows nothing: {history:?}"
    );
    assert_eq!(history.last(), Some(&EventType::Delete), "not taken back");
    assert_runs_without_a_cushion(&mut next_run(etcd, &name));
}

/// A stop request (SIGTERM) while the uncontended take's answer is pending, after the
/// take landed: conlock gives up at once (exit 143, the lease revoked). It must take back
/// the record too, as on `--timeout`: the revoke leaves it, and every conlock waiter
/// would keep a 30 s cushion for a command that never ran.
#[test]
fn a_stop_request_while_the_take_is_unanswered_takes_it_back() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let (name, st) = signal_while_the_take_is_unanswered(etcd, "unanswered-stop", libc::SIGTERM);
    assert_eq!(st.code(), Some(143));
    let record_key = conlock::claim::etcd_lock::record_key(&name);
    let record = c.range(&RangeRequest::key(record_key)).unwrap().kvs;
    assert!(record.is_empty(), "not taken back: {record:?}");
    assert_runs_without_a_cushion(&mut next_run(etcd, &name));
}

/// etcd compacts its history past the revision a waiter's look read, before the
/// waiter's watch of its predecessor opens: the waiter looks again (it does not end
/// with an error), and holds after the holder lets go.
#[test]
fn a_compaction_before_the_waiters_watch_makes_it_look_again() {
    let Some(etcd) = Etcd::start("compact-wait", &EtcdOptions::fast()) else {
        return;
    };
    let name = unique_name("compact-wait");
    let dir = scratch("etcd-compact-wait");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let mut a = KillOnDrop(run_lock(&etcd, &name, &[], &heartbeat_job(&log, &go)));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let compacted = dir.join("compacted");
    let (ep, direct, marker) = (etcd.endpoint(), etcd.client(T), compacted.clone());
    let upstream = ep.trim_start_matches("http://").to_string();
    let proxy = proxy_with_hook(upstream, b"/v3/watch", move || {
        let k = "compact-wait/filler";
        direct.put(&PutRequest::new(k, "1")).unwrap();
        let last = direct
            .put(&PutRequest::new(k, "2"))
            .unwrap()
            .header
            .revision;
        let (status, body) = crate::etcd_harness::post(
            &ep,
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{last}","physical":true}}"#),
            T,
        )
        .expect("compaction answered");
        assert_eq!(status, 200, "{body}");
        std::fs::write(&marker, "").unwrap();
    });
    let mut b = KillOnDrop(run_lock_at(
        &proxy,
        &name,
        &["-v"],
        &logged_job(&log, "true"),
    ));
    assert!(
        wait_for(LONG, || compacted.exists()),
        "the waiter never opened a watch"
    );
    std::fs::write(&go, "").unwrap();
    assert_eq!(wait_exit(&mut a.0, LONG).code(), Some(0));
    let st = wait_exit(&mut b.0, LONG);
    let mut berr = String::new();
    std::io::Read::read_to_string(b.0.stderr.as_mut().unwrap(), &mut berr).unwrap();
    assert_eq!(st.code(), Some(0), "waiter: {st}: {berr}");
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{sp:?}");
    assert!(sp[0].2 < sp[1].1, "overlap: {sp:?}");
}

/// The look at the server's version is off the critical path: with `/version` answered
/// 2.5 s late (within the 3 s request timeout), the command still starts at once, and
/// the one warning line still comes.
#[test]
fn a_slow_version_answer_does_not_delay_the_command() {
    let Some(etcd) = Etcd::shared() else { return };
    let upstream = etcd.endpoint().trim_start_matches("http://").to_string();
    let proxy = proxy_with_hook(upstream, b"GET /version", || {
        std::thread::sleep(Duration::from_millis(2500))
    });
    let name = unique_name("slow-version");
    let dir = scratch("etcd-slow-version");
    let started = dir.join("started");
    let t0 = Instant::now();
    let mut h = KillOnDrop(run_lock_at(
        &proxy,
        &name,
        &[],
        &format!("touch {}; sleep 4", started.display()),
    ));
    assert!(wait_for(LONG, || started.exists()), "the command never ran");
    let took = t0.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the command started {took:?} after conlock (the version look is on the critical path)"
    );
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(0));
    let mut err = String::new();
    std::io::Read::read_to_string(h.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(
        err.lines()
            .filter(|l| l.contains("known lease bugs"))
            .count(),
        1,
        "{err}"
    );
}

/// A TTL over etcd's 5 min lease checkpoint interval gets one warning line (a leader
/// change may restore a stale remaining TTL when checkpointing is on); 5 min gets none.
#[test]
fn a_ttl_over_five_minutes_warns_about_lease_checkpoints() {
    let Some(etcd) = Etcd::shared() else { return };
    for (ttl, warned) in [("301s", 1), ("5m", 0)] {
        let name = unique_name("ttl-checkpoint");
        let h = run_lock(etcd, &name, &["--ttl", ttl, "--lock-delay", "15s"], "true");
        let out = h.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{ttl}: {err}");
        assert_eq!(
            err.lines()
                .filter(|l| l.contains("--experimental-enable-lease-checkpoint"))
                .count(),
            warned,
            "{ttl}: {err}"
        );
    }
}

/// The holder's release meets 2 s of "no leader" answers (an election): it is tried
/// again until etcd serves it, so the next holder starts at once, not after the TTL
/// and the cushion (10 s + 5 s).
#[test]
fn a_release_during_an_election_is_retried_and_the_next_holder_starts_at_once() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let upstream = etcd.endpoint().trim_start_matches("http://").to_string();
    let electing = Arc::new(AtomicBool::new(false));
    let window: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let failed = Arc::new(AtomicBool::new(false));
    let (e2, w2, f2) = (electing.clone(), window.clone(), failed.clone());
    let proxy = proxy_answering_503(upstream, move |req| {
        let write = [&b"/v3/kv/txn"[..], b"/v3/lease/revoke"]
            .iter()
            .any(|p| req.windows(p.len()).any(|w| w == *p));
        if !write || !e2.load(Ordering::SeqCst) {
            return false;
        }
        let mut w = w2.lock().unwrap();
        let until = *w.get_or_insert_with(|| Instant::now() + Duration::from_secs(2));
        let fail = Instant::now() < until;
        f2.fetch_or(fail, Ordering::SeqCst);
        fail
    });
    let name = unique_name("release-election");
    let dir = scratch("etcd-release-election");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let timings = ["--ttl", "10s", "--lock-delay", "5s"];
    let mut a = KillOnDrop(run_lock_at(
        &proxy,
        &name,
        &[&timings[..], &["-v"]].concat(),
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let mut b = KillOnDrop(run_lock(etcd, &name, &timings, &logged_job(&log, "true")));
    wait_keys(&c, &name, 2);
    electing.store(true, Ordering::SeqCst);
    std::fs::write(&go, "").unwrap();
    let st = wait_exit(&mut a.0, LONG);
    let mut aerr = String::new();
    std::io::Read::read_to_string(a.0.stderr.as_mut().unwrap(), &mut aerr).unwrap();
    assert_eq!(st.code(), Some(0), "holder: {aerr}");
    assert!(
        failed.load(Ordering::SeqCst),
        "no release met the election: {aerr}"
    );
    assert_eq!(wait_exit(&mut b.0, LONG).code(), Some(0));
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{sp:?}");
    assert!(sp[0].2 < sp[1].1, "overlap: {sp:?}");
    let gap = Duration::from_nanos((sp[1].1 - sp[0].2) as u64);
    assert!(
        gap < Duration::from_secs(8),
        "the next holder started {gap:?} after the holder's end (TTL + cushion: 15s): {aerr}"
    );
}

/// A [`fault_proxy`] that, while `budget` is above 0, takes one from it for a
/// connection whose request contains `path` and hangs that connection.
fn proxy_swallowing(
    upstream: String,
    path: &'static [u8],
    budget: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> String {
    use std::sync::atomic::Ordering;
    fault_proxy(upstream, move |req| {
        let take = |b: usize| b.checked_sub(1);
        if bytes_contain(req, path)
            && budget
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, take)
                .is_ok()
        {
            Fault::Hang
        } else {
            Fault::Forward
        }
    })
}

/// REVIEW finding 1. docs/safety.md: with `kill_grace + margin` at most half the TTL,
/// "one keepalive can fail and be retried before the stop signal"; `--ttl 10s
/// --kill-grace 3s` is named as accepted. One keepalive that hangs on both endpoints
/// (two members forwarding it to a frozen leader) takes the whole renewal timeout
/// (min(TTL/3, confirm_every) = 3.33 s), and the retry comes 1 s later: 3.33 + 3.33 + 1
/// = 7.67 s after the last keepalive, past the stop signal at 6.25 s. The lease (10 s)
/// was never at risk, yet the command is stopped and conlock exits 124.
#[test]
fn review_one_keepalive_that_hangs_on_two_endpoints_is_retried_before_the_stop_signal() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let Some(etcd) = Etcd::shared() else { return };
    let upstream = etcd.endpoint().trim_start_matches("http://").to_string();
    let budget = Arc::new(AtomicUsize::new(0));
    let a = proxy_swallowing(upstream.clone(), b"/v3/lease/keepalive", budget.clone());
    let b = proxy_swallowing(upstream, b"/v3/lease/keepalive", budget.clone());
    let name = unique_name("one-keepalive-hangs");
    let dir = scratch("etcd-one-keepalive-hangs");
    let started = dir.join("started");
    let mut h = KillOnDrop(run_lock_at(
        &format!("{a},{b}"),
        &name,
        &[
            "--ttl",
            "10s",
            "--lock-delay",
            "15s",
            "--kill-grace",
            "3s",
            "-v",
        ],
        &format!("touch {}; sleep 11", started.display()),
    ));
    assert!(wait_for(LONG, || started.exists()));
    // The next keepalive hangs on the first endpoint, then on the second; nothing else.
    budget.store(2, Ordering::SeqCst);
    let st = wait_exit(&mut h.0, LONG);
    let mut err = String::new();
    std::io::Read::read_to_string(h.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(
        budget.load(Ordering::SeqCst),
        0,
        "the test did not hang a keepalive on both endpoints: {err}"
    );
    assert_eq!(
        st.code(),
        Some(0),
        "one keepalive that hung was not retried before the stop signal: {err}"
    );
}

/// REVIEW finding 2. A waiter without `--timeout` waits through an etcd it cannot reach
/// (each failed look is retried every second). But when its own key is gone (its lease
/// revoked or expired while it waited) it replaces the lease, and a grant that fails
/// three times in a row (about 1 s of "no leader" in an election, or a member that
/// hangs) ends the wait with exit 125 instead of waiting on (or exit 75 with
/// `--timeout`). Here the waiter's lease is revoked and its next three grants hang.
#[test]
fn review_a_waiter_that_cannot_replace_its_lost_lease_at_once_keeps_waiting() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("regrant");
    let dir = scratch("etcd-regrant");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let mut a = KillOnDrop(run_lock(
        etcd,
        &name,
        &[],
        &logged_job(&log, &until_exists(&go)),
    ));
    wait_keys(&c, &name, 1);
    let upstream = etcd.endpoint().trim_start_matches("http://").to_string();
    let budget = Arc::new(AtomicUsize::new(0));
    let proxy = proxy_swallowing(upstream, b"/v3/lease/grant", budget.clone());
    let mut b = KillOnDrop(run_lock_at(
        &proxy,
        &name,
        &["-v"],
        &logged_job(&log, "true"),
    ));
    wait_keys(&c, &name, 2);
    let b_lease = keys_under(&c, &format!("{name}/"))
        .into_iter()
        .max_by_key(|kv| kv.create_revision)
        .unwrap()
        .lease;
    // B's next three grants hang (3 s each); then etcd answers again.
    budget.store(3, Ordering::SeqCst);
    c.lease_revoke(b_lease).unwrap();
    assert!(
        wait_for(LONG, || budget.load(Ordering::SeqCst) == 0),
        "B never tried to replace its lease"
    );
    std::fs::write(&go, "").unwrap();
    assert!(wait_exit(&mut a.0, LONG).success());
    let st = wait_exit(&mut b.0, LONG);
    let mut berr = String::new();
    std::io::Read::read_to_string(b.0.stderr.as_mut().unwrap(), &mut berr).unwrap();
    assert_eq!(st.code(), Some(0), "B: {berr}");
    assert_eq!(intervals(&read(&log)).len(), 2, "{}", read(&log));
}

/// A waiter woken by its predecessor's deletion takes the lock in one txn, which must
/// also find no older key left. Here the predecessor's end looks like its own release
/// (the record says it released, written in the same txn as the deletion, as its release
/// would) while an older contender still holds: the waiter must wait for that one too.
/// Fails if the take drops its "no older key" (range) compare: the waiter would start
/// beside the older holder.
#[test]
fn a_waiter_woken_by_a_released_predecessor_still_waits_for_an_older_key() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("older");
    let dir = scratch("etcd-older");
    let (ev, started) = (dir.join("events"), dir.join("started"));
    let ev_arg = ev.display().to_string();
    let lease = c.lease_grant(60).unwrap().id;
    let on_lease = |key: &str| {
        c.put(&PutRequest {
            lease,
            ..PutRequest::new(key.to_string(), "")
        })
        .unwrap()
        .header
        .revision
    };
    let older = format!("{name}/aaa-older");
    let pred = format!("{name}/bbb-pred");
    on_lease(&older);
    let pred_rev = on_lease(&pred);
    let w = KillOnDrop(run_lock(
        etcd,
        &name,
        &["--events", &ev_arg],
        &format!("date +%s.%N > {}", started.display()),
    ));
    wait_keys(&c, &name, 3);
    assert!(
        wait_for(LONG, || read(&ev).contains("bbb-pred")),
        "the waiter never waited for its predecessor: {}",
        read(&ev)
    );
    // The predecessor "releases" as a conlock holder does: its record (of `pred_rev`)
    // and its key deleted in one txn, so only the older key stops the waiter.
    let record = format!(
        r#"{{"key":"{pred}","create_revision":{pred_rev},"lock_delay_ms":2000,"released":false}}"#
    );
    let record_key = conlock::claim::etcd_lock::record_key(&name);
    c.put(&PutRequest::new(record_key.clone(), record)).unwrap();
    let r = c
        .txn(&TxnRequest {
            compare: vec![],
            success: vec![
                RequestOp::DeleteRange(DeleteRangeRequest::key(record_key)),
                RequestOp::DeleteRange(DeleteRangeRequest::key(pred.clone())),
            ],
            failure: vec![],
        })
        .unwrap();
    assert!(r.succeeded);
    // The waiter looks again and waits for the older key.
    assert!(
        wait_for(LONG, || read(&ev).contains("aaa-older")),
        "the waiter never waited for the older key: {}\nstarted: {}",
        read(&ev),
        read(&started)
    );
    let freed_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        !started.exists(),
        "the waiter started beside the older key's holder"
    );
    c.delete_range(&DeleteRangeRequest::key(older)).unwrap();
    let mut w = w;
    let st = wait_exit(&mut w.0, Duration::from_secs(60));
    assert!(st.success(), "the waiter failed: {st}");
    let at: f64 = read(&started).trim().parse().unwrap();
    assert!(
        at >= freed_at,
        "the waiter's command started at {at}, before the older key went at {freed_at}"
    );
    let _ = c.lease_revoke(lease);
}

/// The release reaches etcd, but the member answers "no leader" instead of etcd's
/// answer: conlock sends it again and finds the key gone. It did land, so conlock says
/// so: the `released` event is written, for the lock and for the semaphore.
#[test]
fn a_release_whose_answer_was_lost_still_counts_as_released() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    for what in ["run", "sem"] {
        let name = unique_name(&format!("lost-release-{what}"));
        let dir = scratch("etcd-lost-release");
        let events = dir.join("events");
        let budget = Arc::new(AtomicUsize::new(1));
        let b2 = budget.clone();
        let upstream = etcd.endpoint().trim_start_matches("http://").to_string();
        let proxy = fault_proxy(upstream, move |req| {
            let take = |b: usize| b.checked_sub(1);
            if bytes_contain(req, b"request_delete_range")
                && b2
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, take)
                    .is_ok()
            {
                Fault::ForwardThenNoLeader
            } else {
                Fault::Forward
            }
        });
        let mut cmd = conlock_etcd_at(&proxy);
        if what == "run" {
            cmd.args(["run", "--key", &name]);
        } else {
            cmd.args(["sem", "--prefix", &name, "--limit", "1"]);
        }
        let out = cmd
            .args(FAST)
            .arg("--events")
            .arg(&events)
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{what}: {err}");
        assert_eq!(
            budget.load(Ordering::SeqCst),
            0,
            "{what}: the release's answer was not lost, the test shows nothing: {err}"
        );
        assert!(
            keys_under(&c, &format!("{name}/")).is_empty(),
            "{what}: still held"
        );
        assert!(
            read(&events).contains("\"released\""),
            "{what}: no released event: {err}{}",
            read(&events)
        );
    }
}

/// The opposite case: the release does not land (its member answers "no leader"), and
/// meanwhile the holder's lease is revoked and its record goes (as when a successor kept
/// the cushion, held and released). When the release is sent again, the key is gone and
/// no record of ours is left, but conlock did not release the lock: it must not say it
/// did (no `released` event; "could not release").
#[test]
fn a_release_that_never_landed_after_a_revoke_is_not_counted_as_released() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(etcd) = Etcd::shared() else { return };
    let name = unique_name("revoked-release");
    let record_key = conlock::claim::etcd_lock::record_key(&name);
    let dir = scratch("etcd-revoked-release");
    let events = dir.join("events");
    let (direct, prefix) = (etcd.client(T), format!("{name}/"));
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let upstream = etcd.endpoint().trim_start_matches("http://").to_string();
    let proxy = fault_proxy(upstream, move |req| {
        if !bytes_contain(req, b"request_delete_range") || d2.swap(true, Ordering::SeqCst) {
            return Fault::Forward;
        }
        // The release's first try: before it lands, the lease is revoked and the
        // record deleted (the successor's release); this try never reaches etcd.
        let lease = keys_under(&direct, &prefix)[0].lease;
        direct.lease_revoke(lease).unwrap();
        direct
            .delete_range(&DeleteRangeRequest::key(record_key.clone()))
            .unwrap();
        Fault::NoLeader
    });
    let out = conlock_etcd_at(&proxy)
        .args(["run", "--key", &name, "-v"])
        .args(FAST)
        .arg("--events")
        .arg(&events)
        .args(["--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        done.load(Ordering::SeqCst),
        "no release was sent, the test shows nothing: {err}"
    );
    assert!(
        !read(&events).contains("\"released\""),
        "a released event for a lock that was revoked, not released: {}",
        read(&events)
    );
    assert!(err.contains("could not release"), "{err}");
}

/// What became of waiter B in `regrant_hangs`.
struct Regrant {
    status: std::process::ExitStatus,
    err: String,
    /// B's first key (and so its first lease).
    key: KeyValue,
    grants: usize,
    revokes: usize,
    /// From B's spawn to its exit.
    took: Duration,
}

/// A holds `NAME`; B waits behind it with `--timeout` through a proxy which, once `end`
/// has ended B's key (a revoke of its lease, or a delete), hangs every lease grant and
/// the first `hung_revokes` lease revokes, so B cannot replace its lease.
fn regrant_hangs(
    tag: &str,
    timeout: Duration,
    hung_revokes: usize,
    end: impl FnOnce(&EtcdClient, &KeyValue),
) -> Option<Regrant> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let etcd = Etcd::shared()?;
    let c = etcd.client(T);
    let name = unique_name(tag);
    let go = scratch(&format!("etcd-{tag}")).join("go");
    let mut a = KillOnDrop(run_lock(etcd, &name, &[], &until_exists(&go)));
    wait_keys(&c, &name, 1);
    let upstream = etcd.endpoint().trim_start_matches("http://").to_string();
    let hang = Arc::new(AtomicBool::new(false));
    let (grants, revokes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (h2, g2, r2) = (hang.clone(), grants.clone(), revokes.clone());
    let proxy = fault_proxy(upstream, move |req| {
        if !h2.load(Ordering::SeqCst) {
            return Fault::Forward;
        }
        if bytes_contain(req, b"/v3/lease/grant") {
            g2.fetch_add(1, Ordering::SeqCst);
            return Fault::Hang;
        }
        if bytes_contain(req, b"/v3/lease/revoke")
            && r2.fetch_add(1, Ordering::SeqCst) < hung_revokes
        {
            return Fault::Hang;
        }
        Fault::Forward
    });
    let started = Instant::now();
    let timeout = format!("{}s", timeout.as_secs());
    let mut b = KillOnDrop(run_lock_at(&proxy, &name, &["--timeout", &timeout], "true"));
    wait_keys(&c, &name, 2);
    let key = keys_under(&c, &format!("{name}/"))
        .into_iter()
        .max_by_key(|kv| kv.create_revision)
        .unwrap();
    hang.store(true, Ordering::SeqCst);
    end(&c, &key);
    let status = wait_exit(&mut b.0, LONG);
    let took = started.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(b.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    std::fs::write(&go, "").unwrap();
    assert!(wait_exit(&mut a.0, LONG).success());
    let (grants, revokes) = (
        grants.load(Ordering::SeqCst),
        revokes.load(Ordering::SeqCst),
    );
    Some(Regrant {
        status,
        err,
        key,
        grants,
        revokes,
        took,
    })
}

/// A waiter whose lease is revoked while it waits, and whose member then hangs every
/// lease grant and revoke, gives up at its --timeout (exit 75): neither the 1s for the
/// old lease's revoke, nor the grant, nor a revoke of the gone lease at the exit holds
/// it later (before: about --timeout + 5s, the grant's 2s answer grace and the 3s
/// cleanup budget).
#[test]
fn a_waiter_whose_lost_lease_cannot_be_replaced_gives_up_at_its_timeout() {
    const TIMEOUT: Duration = Duration::from_secs(5);
    let Some(b) = regrant_hangs("regrant-hang", TIMEOUT, usize::MAX, |c, key| {
        c.lease_revoke(key.lease).unwrap();
    }) else {
        return;
    };
    let berr = &b.err;
    assert_eq!(b.status.code(), Some(75), "B: {berr}");
    assert!(
        b.grants >= 1,
        "no grant of B met the hang before --timeout, the test shows nothing: {berr}"
    );
    // From the spawn: the start-up before the wait, and the exit, within 3s.
    assert!(
        b.took < TIMEOUT + Duration::from_secs(3),
        "B gave up {:?} after it started, with --timeout {TIMEOUT:?}: {berr}",
        b.took
    );
    assert!(
        berr.contains("to lease grant") && berr.contains("not retrying: --timeout has passed"),
        "B: {berr}"
    );
}

/// A waiter whose key someone deleted (its lease still alive) replaces its lease; the
/// member hangs the old lease's revoke once and every grant, so it gives up at
/// --timeout. The lease it gave up on was never said gone: the exit revokes it (one
/// more short try), instead of leaving it to its TTL with whatever it held.
#[test]
fn a_waiter_that_gives_up_on_a_live_lease_still_revokes_it() {
    let Some(b) = regrant_hangs("regrant-live", Duration::from_secs(6), 1, |c, key| {
        c.delete_range(&DeleteRangeRequest::key(key.key.clone()))
            .unwrap();
    }) else {
        return;
    };
    let berr = &b.err;
    assert_eq!(b.status.code(), Some(75), "B: {berr}");
    assert!(
        b.grants >= 1 && b.revokes >= 1,
        "B's replacement never met the hang, the test shows nothing: {berr}"
    );
    let c = Etcd::shared().unwrap().client(T);
    assert_eq!(
        c.lease_time_to_live(b.key.lease, false).unwrap().ttl,
        -1,
        "B's lease {:x} outlived B: {berr}",
        b.key.lease
    );
}

/// `--timeout` bounds the wait, requests included. A waiter whose key is gone replaces
/// its lease; etcd answers "no leader" (on kept-alive connections, as a member without a
/// leader does) to its revokes until it tries a grant, and to every grant: the waiter
/// gives up (exit 75) soon after its 5 s `--timeout`. It revoked the old lease through
/// the release's retry, which retried "no leader" for 10 s whatever `--timeout` said.
#[test]
fn review2_a_waiter_replacing_its_lease_in_an_election_keeps_its_timeout() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let name = unique_name("regrant-timeout");
    let dir = scratch("etcd-regrant-timeout");
    let go = dir.join("go");
    let mut a = KillOnDrop(run_lock(etcd, &name, &[], &until_exists(&go)));
    wait_keys(&c, &name, 1);
    let upstream = etcd.endpoint().trim_start_matches("http://").to_string();
    // Armed: revokes answer "no leader" until the first grant; grants always do.
    let (armed, granted) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let (armed2, granted2) = (armed.clone(), granted.clone());
    let proxy = fault_proxy(upstream, move |req| {
        if !armed2.load(Ordering::SeqCst) {
            return Fault::Forward;
        }
        if bytes_contain(req, b"/v3/lease/grant") {
            granted2.store(true, Ordering::SeqCst);
            return Fault::NoLeaderKeepOpen;
        }
        if bytes_contain(req, b"/v3/lease/revoke") && !granted2.load(Ordering::SeqCst) {
            return Fault::NoLeaderKeepOpen;
        }
        Fault::Forward
    });
    let started = Instant::now();
    let mut b = KillOnDrop(run_lock_at(
        &proxy,
        &name,
        &["-v", "--timeout", "5s"],
        "true",
    ));
    wait_keys(&c, &name, 2);
    let b_lease = keys_under(&c, &format!("{name}/"))
        .into_iter()
        .max_by_key(|kv| kv.create_revision)
        .unwrap()
        .lease;
    armed.store(true, Ordering::SeqCst);
    c.lease_revoke(b_lease).unwrap();
    let st = wait_exit(&mut b.0, LONG);
    let took = started.elapsed();
    let mut berr = String::new();
    std::io::Read::read_to_string(b.0.stderr.as_mut().unwrap(), &mut berr).unwrap();
    assert!(
        granted.load(Ordering::SeqCst),
        "B never tried to replace its lease: {berr}"
    );
    assert_eq!(st.code(), Some(75), "B: {berr}");
    // 5 s, 2 s of grace for an answer, and slack for a busy machine.
    assert!(
        took < Duration::from_secs(10),
        "B gave up {took:?} after it started, with --timeout 5s: {berr}"
    );
    std::fs::write(&go, "").unwrap();
    assert!(wait_exit(&mut a.0, LONG).success());
}

/// An operator revokes a waiter's lease right before its first txn (the enqueue)
/// reaches etcd. etcd refuses the whole txn ("requested lease not found"): conlock should
/// queue again with a new lease (as after any lease lost while waiting), not exit 125.
#[test]
fn a_lease_revoked_before_the_enqueue_lands_queues_again() {
    let name = unique_name("rev4-enqueue");
    let Some(out) =
        crate::etcd_harness::leases_revoked_before_the_first_txn("rev4", &["run", "--key", &name])
    else {
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("queueing with a new lease"), "{err}");
}
