//! `conlock sem --backend etcd` against a real etcd on loopback (etcd_harness): never
//! more than the limit at once (judged from timestamps the children write), prompt
//! hand-over, the limit compared, and the slot records' cushion after an involuntary end.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use conlock::claim::etcd_semaphore::{limit_key_of, records_of};
use conlock::etcd::types::*;
use conlock::etcd::EtcdClient;

use crate::etcd_harness::{
    assert_not_adopted, assert_runs_without_a_cushion, conlock_etcd, heartbeat_job, keys_under,
    now_ns, proxy_answering_503, proxy_muting_puts, put_foreign_keys, spans, with_timings, Etcd,
    EtcdOptions, FAST,
};
use crate::harness::{bytes_contain, fault_proxy, Fault};
use crate::harness::{
    intervals, logged_job, max_overlap, read, scratch, signal, until_exists, wait_exit, wait_for,
    KillOnDrop,
};

const LONG: Duration = Duration::from_secs(60);
const T: Duration = Duration::from_secs(5);

pub fn unique_name(what: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "etcdsem/{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// `conlock sem --prefix P --limit N FAST... -- sh -c CMD`, started.
pub fn run_sem(etcd: &Etcd, prefix: &str, limit: u32, extra: &[&str], cmd: &str) -> Child {
    run_sem_at(&etcd.endpoint(), prefix, limit, extra, cmd)
}

/// [`run_sem`] through `endpoints` (a proxy).
pub fn run_sem_at(endpoints: &str, prefix: &str, limit: u32, extra: &[&str], cmd: &str) -> Child {
    crate::etcd_harness::conlock_etcd_at(endpoints)
        .args(["sem", "--prefix", prefix, "--limit", &limit.to_string()])
        .args(with_timings(extra))
        .args(["--", "sh", "-c", cmd])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until `n` contender keys are under `P/`.
pub fn wait_keys(c: &EtcdClient, prefix: &str, n: usize) {
    assert!(
        wait_for(LONG, || keys_under(c, &format!("{prefix}/")).len() == n),
        "never {n} keys under {prefix}/: {:?}",
        keys_under(c, &format!("{prefix}/"))
    );
}

/// The contender keys under `P/`, oldest first.
fn contenders(c: &EtcdClient, prefix: &str) -> Vec<KeyValue> {
    let mut kvs = keys_under(c, &format!("{prefix}/"));
    kvs.sort_by_key(|kv| kv.create_revision);
    kvs
}

/// The most jobs that ran at once, as far as they said (a killed job ends at its last
/// heartbeat).
fn overlap_of_spans(log: &str) -> usize {
    let iv: Vec<(u128, u128)> = spans(log).iter().map(|s| (s.1, s.2)).collect();
    max_overlap(&iv)
}

#[test]
fn twelve_contenders_with_limit_three_never_exceed_three_and_all_run() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let prefix = unique_name("twelve");
    let dir = scratch("etcd-sem12");
    let log = dir.join("log");
    let env = dir.join("env");
    let job = logged_job(
        &log,
        &format!(
            "echo \"$CONLOCK_KEY $CONLOCK_PREFIX $CONLOCK_LIMIT $CONLOCK_FENCING_TOKEN\" >> {}; sleep 0.3",
            env.display()
        ),
    );
    let kids: Vec<KillOnDrop> = (0..12)
        .map(|_| KillOnDrop(run_sem(etcd, &prefix, 3, &["-q"], &job)))
        .collect();
    for mut k in kids {
        let st = wait_exit(&mut k.0, Duration::from_secs(180));
        assert!(st.success(), "a contender failed: {st}");
    }
    let iv = intervals(&read(&log));
    assert_eq!(iv.len(), 12, "{}", read(&log));
    let most = max_overlap(&iv);
    assert!(most <= 3, "{most} at once: {}", read(&log));
    // Twelve 0.3 s jobs through three slots: they did share the slots.
    assert!(most >= 2, "never two at once: {}", read(&log));
    // The child's variables: its own key, the prefix, the limit, a unique token.
    let lines = read(&env);
    let mut tokens: Vec<u64> = Vec::new();
    for l in lines.lines() {
        let p: Vec<&str> = l.split(' ').collect();
        assert!(p[0].starts_with(&format!("{prefix}/")), "{l}");
        assert_eq!(p[1], prefix, "{l}");
        assert_eq!(p[2], "3", "{l}");
        tokens.push(p[3].parse().unwrap());
    }
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 12, "{lines}");
    // All released: no contender key, no slot record, no limit left.
    for p in [
        format!("{prefix}/"),
        records_of(&prefix),
        limit_key_of(&prefix),
    ] {
        assert!(
            keys_under(&c, &p).is_empty(),
            "{p}: {:?}",
            keys_under(&c, &p)
        );
    }
}

/// Two holders of semaphore `prefix` with limit 2, each logging to `log` and running
/// until its `go` file exists; returns once both commands started.
fn hold_both_slots(
    etcd: &Etcd,
    prefix: &str,
    log: &Path,
    go: [&Path; 2],
) -> (KillOnDrop, KillOnDrop) {
    let start = |go: &Path| {
        KillOnDrop(run_sem(
            etcd,
            prefix,
            2,
            &["-q"],
            &logged_job(log, &until_exists(go)),
        ))
    };
    let both = (start(go[0]), start(go[1]));
    assert!(wait_for(LONG, || read(log).matches("S ").count() == 2));
    both
}

/// A freed slot starts the next waiter at once: from the end the leaving job wrote to
/// the start the next one wrote, well under the watch's 30 s silence.
#[test]
fn a_freed_slot_starts_the_next_waiter_promptly() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let prefix = unique_name("handover");
    let dir = scratch("etcd-sem-handover");
    let log = dir.join("log");
    let (go1, go2) = (dir.join("go1"), dir.join("go2"));
    let (a, b) = hold_both_slots(etcd, &prefix, &log, [&go1, &go2]);
    let w = KillOnDrop(run_sem(
        etcd,
        &prefix,
        2,
        &["-q"],
        &logged_job(&log, "true"),
    ));
    wait_keys(&c, &prefix, 3);
    // The waiter is settled in its watch before the slot frees.
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&go1, "").unwrap();
    for mut k in [a, w] {
        assert!(wait_exit(&mut k.0, LONG).success());
    }
    std::fs::write(&go2, "").unwrap();
    let mut b = b;
    assert!(wait_exit(&mut b.0, LONG).success());
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 3, "{}", read(&log));
    let first_end = sp[0].2.min(sp[1].2);
    let gap_ms = (sp[2].1 - first_end) / 1_000_000;
    assert!(
        gap_ms < 2000,
        "the waiter started {gap_ms} ms after the slot freed"
    );
}

/// A different --limit than the holders use is exit 125, naming both limits; once the
/// holders are gone the limit goes with them and another may be chosen.
#[test]
fn a_different_limit_than_the_holders_is_exit_125_naming_both() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let prefix = unique_name("limit");
    let dir = scratch("etcd-sem-limit");
    let (go, marker) = (dir.join("go"), dir.join("ran"));
    let h = KillOnDrop(run_sem(etcd, &prefix, 2, &[], &until_exists(&go)));
    wait_keys(&c, &prefix, 1);
    let out = conlock_etcd(etcd)
        .args(["sem", "--prefix", &prefix, "--limit", "3"])
        .args(FAST)
        .args(["--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("limit of 2") && err.contains("--limit 3"),
        "{err}"
    );
    assert!(!marker.exists());
    // The holder is untouched, and its limit stays.
    assert_eq!(keys_under(&c, &format!("{prefix}/")).len(), 1);
    std::fs::write(&go, "").unwrap();
    let mut h = h;
    assert!(wait_exit(&mut h.0, LONG).success());
    let out = conlock_etcd(etcd)
        .args(["sem", "--prefix", &prefix, "--limit", "3", "-q"])
        .args(FAST)
        .args(["--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(marker.exists());
}

/// conlock is SIGKILLed while its command runs: the guardian kills the command, then
/// releases (no cushion): the slot is reused soon, and only after the command is dead.
#[test]
fn sigkill_of_a_holder_the_guardian_frees_the_slot_after_the_command_is_dead() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let prefix = unique_name("kill");
    let dir = scratch("etcd-sem-kill");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let h = KillOnDrop(run_sem(
        etcd,
        &prefix,
        1,
        &["--lock-delay", "20s"],
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let mut w = KillOnDrop(run_sem(
        etcd,
        &prefix,
        1,
        &["--lock-delay", "20s", "-q"],
        &logged_job(&log, "true"),
    ));
    wait_keys(&c, &prefix, 2);
    let killed = Instant::now();
    signal(h.0.id(), libc::SIGKILL);
    let st = wait_exit(&mut w.0, LONG);
    assert!(st.success(), "{st}");
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "the waiter took {:?} (a cushion or the TTL instead of the guardian's release)",
        killed.elapsed()
    );
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{}", read(&log));
    assert!(
        sp[0].2 < sp[1].1,
        "the next holder started before the killed command's last sign of life: {sp:?}"
    );
}

/// SIGSTOP of a holder: the guardian kills its command by the deadline, before the
/// lease expires; the waiter (which keeps the cushion after the expiry) never overlaps.
#[test]
fn sigstop_of_a_holder_its_command_is_dead_before_the_waiter_starts() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let prefix = unique_name("stop");
    let dir = scratch("etcd-sem-stop");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let h = KillOnDrop(run_sem(etcd, &prefix, 1, &[], &heartbeat_job(&log, &go)));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let mut w = KillOnDrop(run_sem(
        etcd,
        &prefix,
        1,
        &["-q"],
        &logged_job(&log, "true"),
    ));
    wait_keys(&c, &prefix, 2);
    signal(h.0.id(), libc::SIGSTOP);
    let st = wait_exit(&mut w.0, LONG);
    signal(h.0.id(), libc::SIGCONT);
    assert!(st.success(), "{st}");
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{}", read(&log));
    assert!(sp[0].2 < sp[1].1, "overlap: {sp:?}");
    let mut h = h;
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(124));
}

/// One of two holders is cut off (SIGSTOP) and its lease revoked: its command runs on
/// until the guardian's deadline. The waiter keeps the vanished holder's cushion (its
/// slot record): it starts no earlier than the revoke + the lock-delay, and never more
/// than two ran at once.
#[test]
fn a_holder_revoked_while_cut_off_keeps_its_slot_for_the_cushion() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let prefix = unique_name("cutoff");
    let dir = scratch("etcd-sem-cutoff");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let slow = ["--ttl", "10s", "--lock-delay", "3s"];
    let a = KillOnDrop(run_sem(etcd, &prefix, 2, &slow, &heartbeat_job(&log, &go)));
    assert!(wait_for(LONG, || read(&log).matches("S ").count() == 1));
    let b = KillOnDrop(run_sem(etcd, &prefix, 2, &slow, &heartbeat_job(&log, &go)));
    assert!(wait_for(LONG, || read(&log).matches("S ").count() == 2));
    let mut w = KillOnDrop(run_sem(
        etcd,
        &prefix,
        2,
        &["-q"],
        &logged_job(&log, "true"),
    ));
    wait_keys(&c, &prefix, 3);
    let lease = contenders(&c, &prefix)[0].lease;
    signal(a.0.id(), libc::SIGSTOP);
    let revoked_at = now_ns();
    c.lease_revoke(lease).unwrap();
    assert_eq!(wait_exit(&mut w.0, LONG).code(), Some(0));
    signal(a.0.id(), libc::SIGCONT);
    std::fs::write(&go, "").unwrap();
    let mut b = b;
    assert!(wait_exit(&mut b.0, LONG).success());
    let log = read(&log);
    let sp = spans(&log);
    assert_eq!(sp.len(), 3, "{log}");
    assert!(overlap_of_spans(&log) <= 2, "three at once: {sp:?}");
    assert!(
        sp[2].1 >= revoked_at + 3_000_000_000,
        "the waiter started {} ms after the revoke, inside the 3 s cushion",
        (sp[2].1 - revoked_at) / 1_000_000
    );
}

/// A waiter that comes after a holder was revoked (it never saw the key go) still keeps
/// the cushion: the slot record is there.
#[test]
fn a_waiter_arriving_after_a_revoke_still_keeps_the_cushion() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let prefix = unique_name("late");
    let dir = scratch("etcd-sem-late");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let h = KillOnDrop(run_sem(
        etcd,
        &prefix,
        1,
        &["--ttl", "10s", "--lock-delay", "3s"],
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let lease = contenders(&c, &prefix)[0].lease;
    signal(h.0.id(), libc::SIGSTOP);
    let revoked_at = now_ns();
    c.lease_revoke(lease).unwrap();
    let mut w = KillOnDrop(run_sem(
        etcd,
        &prefix,
        1,
        &["-q"],
        &logged_job(&log, "true"),
    ));
    assert_eq!(wait_exit(&mut w.0, LONG).code(), Some(0));
    signal(h.0.id(), libc::SIGCONT);
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{}", read(&log));
    assert!(sp[0].2 < sp[1].1, "{sp:?}");
    assert!(sp[1].1 >= revoked_at + 3_000_000_000, "{sp:?}");
    // The waiter freed the vanished slot and released its own: nothing left.
    assert!(keys_under(&c, &records_of(&prefix)).is_empty());
}

/// The holder's key is deleted by someone else (or its lease revoked) while conlock is
/// connected: it stops at once (exit 124) and the waiter keeps the cushion.
#[test]
fn key_deleted_or_lease_revoked_while_connected_holder_exits_124_and_the_waiter_keeps_the_cushion()
{
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    for how in ["delete", "revoke"] {
        let prefix = unique_name(how);
        let dir = scratch("etcd-sem-del");
        let (log, go) = (dir.join("log"), dir.join("go"));
        let h = run_sem(
            etcd,
            &prefix,
            1,
            &["--lock-delay", "3s"],
            &heartbeat_job(&log, &go),
        );
        assert!(wait_for(LONG, || read(&log).contains("A ")));
        let mut w = KillOnDrop(run_sem(
            etcd,
            &prefix,
            1,
            &["-q"],
            &logged_job(&log, "true"),
        ));
        wait_keys(&c, &prefix, 2);
        let first = contenders(&c, &prefix)[0].clone();
        let ended_at = now_ns();
        if how == "delete" {
            c.delete_range(&DeleteRangeRequest::key(first.key)).unwrap();
        } else {
            c.lease_revoke(first.lease).unwrap();
        }
        let out = h.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(124), "{how}: {err}");
        assert!(err.contains("deleted"), "{how}: {err}");
        assert_eq!(wait_exit(&mut w.0, LONG).code(), Some(0), "{how}");
        let sp = spans(&read(&log));
        assert_eq!(sp.len(), 2, "{how}: {}", read(&log));
        assert!(sp[0].2 < sp[1].1, "{how}: {sp:?}");
        assert!(sp[1].1 >= ended_at + 3_000_000_000, "{how}: {sp:?}");
    }
}

#[test]
fn timeout_on_a_full_semaphore_is_exit_75_and_removes_the_waiters_key() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let prefix = unique_name("busy");
    let dir = scratch("etcd-sem-busy");
    let (go, marker) = (dir.join("go"), dir.join("ran"));
    let h = KillOnDrop(run_sem(etcd, &prefix, 1, &[], &until_exists(&go)));
    wait_keys(&c, &prefix, 1);
    let started = Instant::now();
    let out = conlock_etcd(etcd)
        .args([
            "sem",
            "--prefix",
            &prefix,
            "--limit",
            "1",
            "--timeout",
            "1s",
        ])
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
    assert_eq!(keys_under(&c, &format!("{prefix}/")).len(), 1);
    std::fs::write(&go, "").unwrap();
    let mut h = h;
    assert!(wait_exit(&mut h.0, LONG).success());
}

/// A waiter whose lease expires while it waits (stopped past its TTL) never takes a slot
/// with its gone key (etcd #11456): it queues again and still never runs beside the
/// holder.
#[test]
fn a_waiter_whose_lease_expired_while_waiting_does_not_run_beside_the_holder() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let prefix = unique_name("expired");
    let dir = scratch("etcd-sem-expired");
    let (log, go_a, go_c) = (dir.join("log"), dir.join("go-a"), dir.join("go-c"));
    let a = KillOnDrop(run_sem(
        etcd,
        &prefix,
        1,
        &["-q"],
        &logged_job(&log, &until_exists(&go_a)),
    ));
    wait_keys(&c, &prefix, 1);
    let b = KillOnDrop(run_sem(
        etcd,
        &prefix,
        1,
        &[],
        &logged_job(&log, "sleep 0.3"),
    ));
    wait_keys(&c, &prefix, 2);
    let b_key = contenders(&c, &prefix)[1].key.clone();
    signal(b.0.id(), libc::SIGSTOP);
    assert!(
        wait_for(LONG, || c
            .range(&RangeRequest::key(b_key.clone()))
            .unwrap()
            .kvs
            .is_empty()),
        "B's key never expired"
    );
    let cc = KillOnDrop(run_sem(
        etcd,
        &prefix,
        1,
        &["-q"],
        &logged_job(&log, &until_exists(&go_c)),
    ));
    wait_keys(&c, &prefix, 2);
    std::fs::write(&go_a, "").unwrap();
    assert!(wait_for(LONG, || read(&log).matches("S ").count() == 2));
    signal(b.0.id(), libc::SIGCONT);
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(&go_c, "").unwrap();
    for mut p in [b, a, cc] {
        let st = wait_exit(&mut p.0, LONG);
        assert!(st.success(), "{st}");
    }
    let iv = intervals(&read(&log));
    assert_eq!(iv.len(), 3, "{}", read(&log));
    assert_eq!(max_overlap(&iv), 1, "{}", read(&log));
}

/// REVIEW: a semaphore `A/b` whose holder vanished leaves its slot record and its limit
/// behind; neither may lie under `A/` (lock `A`'s contender prefix, for conlock and for
/// `etcdctl lock A`), or lock `A` waits for them forever.
#[test]
fn review_a_semaphore_under_a_lock_name_leaves_nothing_under_the_locks_prefix() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let outer = unique_name("outer");
    let prefix = format!("{outer}/b");
    let dir = scratch("etcd-sem-nested");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let h = run_sem(etcd, &prefix, 1, &[], &heartbeat_job(&log, &go));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    // The holder vanishes without releasing: its record and the limit stay.
    let lease = contenders(&c, &prefix)[0].lease;
    c.lease_revoke(lease).unwrap();
    let out = h.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(124));
    let left = keys_under(&c, &format!("{outer}/"));
    let names: Vec<String> = left
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect();
    assert!(names.is_empty(), "left under {outer}/: {names:?}");
    let mut l = KillOnDrop(
        conlock_etcd(etcd)
            .args(["run", "--key", &outer, "--timeout", "10s", "-q"])
            .args(["--", "true"])
            .spawn()
            .unwrap(),
    );
    assert_eq!(wait_exit(&mut l.0, LONG).code(), Some(0));
}

/// The holder's release meets 2 s of "no leader" answers (an election): it is tried
/// again until etcd serves it, so the waiter starts at once. A release that is lost
/// leaves the slot record, and the waiter keeps the 10 s cushion after the revoke.
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
    let prefix = unique_name("release-election");
    let dir = scratch("etcd-sem-release-election");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let timings = ["--ttl", "10s", "--lock-delay", "10s"];
    let mut a = KillOnDrop(run_sem_at(
        &proxy,
        &prefix,
        1,
        &[&timings[..], &["-v"]].concat(),
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let mut b = KillOnDrop(run_sem(
        etcd,
        &prefix,
        1,
        &timings,
        &logged_job(&log, "true"),
    ));
    wait_keys(&c, &prefix, 2);
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
        gap < Duration::from_secs(7),
        "the next holder started {gap:?} after the holder's end (revoke + cushion: 12s): {aerr}"
    );
}

/// A key named after conlock's lease but written by someone else (here with no lease)
/// is not adopted: conlock takes a new lease (and so a new key) instead. The foreign
/// keys cover the next lease IDs of a private member (etcd 3.4 hands them out from its
/// request counter, as `etcd_run::a_key_named_after_our_lease_on_another_lease_is_not_adopted`
/// explains); created in one txn, they are all older than conlock's own key, so with
/// limit 1 a conlock that does not adopt one waits behind them until its --timeout.
#[test]
fn a_key_named_after_our_lease_on_another_lease_is_not_adopted() {
    let Some(etcd) = Etcd::start("sem-foreign", &EtcdOptions::fast()) else {
        return;
    };
    let c = etcd.client(T);
    let prefix = unique_name("foreign");
    put_foreign_keys(&c, &prefix);
    let dir = scratch("etcd-sem-foreign");
    let ran = dir.join("ran");
    let h = run_sem(
        &etcd,
        &prefix,
        1,
        &["--timeout", "2s"],
        &format!("touch {}", ran.display()),
    );
    assert_not_adopted(&h.wait_with_output().unwrap(), &ran);
}

/// A waiter whose watch stays silent (a frozen member) looks again after 3 s of
/// silence, so it holds within seconds of the holder's release, not after 30 s.
#[test]
fn a_waiter_whose_watch_is_silent_looks_again_within_seconds() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let upstream = etcd.endpoint().trim_start_matches("http://").to_string();
    let proxy = fault_proxy(upstream, |req| {
        if bytes_contain(req, b"/v3/watch") {
            Fault::MuteAfterCreated
        } else {
            Fault::Forward
        }
    });
    let prefix = unique_name("silent-watch");
    let dir = scratch("etcd-sem-silent-watch");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let mut a = KillOnDrop(run_sem(etcd, &prefix, 1, &[], &heartbeat_job(&log, &go)));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let mut b = KillOnDrop(run_sem_at(
        &proxy,
        &prefix,
        1,
        &["-v"],
        &logged_job(&log, "true"),
    ));
    wait_keys(&c, &prefix, 2);
    std::fs::write(&go, "").unwrap();
    assert_eq!(wait_exit(&mut a.0, LONG).code(), Some(0));
    let st = wait_exit(&mut b.0, LONG);
    let mut berr = String::new();
    std::io::Read::read_to_string(b.0.stderr.as_mut().unwrap(), &mut berr).unwrap();
    assert_eq!(st.code(), Some(0), "waiter: {berr}");
    let sp = spans(&read(&log));
    assert_eq!(sp.len(), 2, "{sp:?}");
    assert!(sp[0].2 < sp[1].1, "overlap: {sp:?}");
    let gap = Duration::from_nanos((sp[1].1 - sp[0].2) as u64);
    assert!(
        gap < Duration::from_secs(15),
        "the waiter started {gap:?} after the holder's end (a silent watch read: 30 s): {berr}"
    );
    eprintln!("the waiter started {gap:?} after the holder's end, its watch silent");
}

/// A slot write reaches etcd but its answer does not come by `--timeout` (2.5 s, under
/// the 3 s request timeout): the run gives up (exit 75) and gives the slot back, so the
/// next run starts at once. Left alone, the record would be a vanished holder's, and
/// every waiter would keep its 30 s cushion for a command that never ran.
#[test]
fn a_slot_write_unanswered_by_the_timeout_is_given_back() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    // A prefix whose records' prefix is a multiple of 3 bytes: its base64 starts the
    // slot record's.
    let mut prefix = unique_name("unanswered");
    while records_of(&prefix).len() % 3 != 0 {
        prefix.push('x');
    }
    let (proxy, _) = proxy_muting_puts(etcd, &records_of(&prefix), 0);
    let from = c.range(&RangeRequest::key("x")).unwrap().header.revision;
    let mut w = KillOnDrop(
        conlock_etcd(etcd)
            .env("ETCDCTL_ENDPOINTS", &proxy)
            .args(["sem", "--prefix", &prefix, "--limit", "1", "-q"])
            .args(with_timings(&[
                "--lock-delay",
                "30s",
                "--timeout",
                "2500ms",
            ]))
            .args(["--", "true"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_eq!(wait_exit(&mut w.0, LONG).code(), Some(75));
    // The slot write did land: at some revision since, a slot record existed.
    let to = c.range(&RangeRequest::key("x")).unwrap().header.revision;
    let landed = (from..=to).any(|rev| {
        let mut r = RangeRequest::prefix(records_of(&prefix));
        r.revision = rev;
        !c.range(&r).unwrap().kvs.is_empty()
    });
    assert!(
        landed,
        "the slot write did not land, the test shows nothing"
    );
    assert_runs_without_a_cushion(
        conlock_etcd(etcd)
            .args([
                "sem",
                "--prefix",
                &prefix,
                "--limit",
                "1",
                "--timeout",
                "20s",
            ])
            .args(with_timings(&[]))
            .args(["--", "true"]),
    );
}

/// A holder cut off (SIGSTOP) and revoked leaves its slot record: its command may run
/// for its cushion. When it comes back and ends, it must not take the limit with it
/// (it was the last contender): a newcomer with another `--limit` would start beside
/// that command under a limit its holder never agreed to. The limit stays, and the
/// newcomer is refused, naming both (exit 125).
#[test]
fn the_limit_stays_while_a_vanished_holders_slot_is_kept() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let prefix = unique_name("limit-kept");
    let dir = scratch("etcd-sem-limit-kept");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let mut h = KillOnDrop(run_sem(
        etcd,
        &prefix,
        1,
        &["--lock-delay", "30s"],
        &heartbeat_job(&log, &go),
    ));
    assert!(wait_for(LONG, || read(&log).contains("A ")));
    let lease = contenders(&c, &prefix)[0].lease;
    signal(h.0.id(), libc::SIGSTOP);
    c.lease_revoke(lease).unwrap();
    signal(h.0.id(), libc::SIGCONT);
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(124));
    assert!(
        !keys_under(&c, &records_of(&prefix)).is_empty(),
        "the vanished holder's slot record is gone, the test shows nothing"
    );
    let limit = c
        .range(&RangeRequest::key(limit_key_of(&prefix)))
        .unwrap()
        .kvs;
    assert_eq!(
        limit.first().map(|kv| kv.value.clone()),
        Some(b"1".to_vec()),
        "the limit went while a vanished holder's slot was kept"
    );
    let out = conlock_etcd(etcd)
        .args([
            "sem",
            "--prefix",
            &prefix,
            "--limit",
            "2",
            "--timeout",
            "2s",
        ])
        .args(with_timings(&[]))
        .args(["--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("theirs 1, ours 2"), "{err}");
    assert!(
        err.contains("slot record(s) of holders that did not release"),
        "{err}"
    );
}

/// A waiter far back in line (`2 * limit` or more keys ahead) whose key `limit` places
/// ahead is a nested semaphore's contender (`P/n/<lease>`: in P's line, as etcdctl
/// nests names, but it never writes one of P's slot records) starts at once when a slot
/// frees for it, not at its next 3 s re-look. The proxy shows when the waiter made its
/// watch; the slots free right after, so a waiter asleep on that key wakes ~3 s late.
#[test]
fn a_far_back_waiter_behind_a_nested_semaphores_key_starts_promptly() {
    use std::sync::{Arc, Mutex};
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let watches = Arc::new(Mutex::new(0usize));
    let seen = watches.clone();
    let upstream = etcd.endpoint().trim_start_matches("http://").to_string();
    let proxy = fault_proxy(upstream, move |req| {
        if bytes_contain(req, b"/v3/watch") {
            *seen.lock().unwrap() += 1;
        }
        Fault::Forward
    });
    let prefix = unique_name("far-back-nested");
    let dir = scratch("etcd-sem-far-back-nested");
    let log = dir.join("log");
    let (go1, go2, gon) = (dir.join("go1"), dir.join("go2"), dir.join("gon"));
    let (a1, a2) = hold_both_slots(etcd, &prefix, &log, [&go1, &go2]);
    // Third in P's line: the holder of semaphore P/n.
    let nested = KillOnDrop(run_sem(
        etcd,
        &format!("{prefix}/n"),
        1,
        &["-q"],
        &until_exists(&gon),
    ));
    wait_keys(&c, &prefix, 3);
    let a3 = KillOnDrop(run_sem(
        etcd,
        &prefix,
        2,
        &["-q"],
        &logged_job(&log, "true"),
    ));
    wait_keys(&c, &prefix, 4);
    // Fifth: 4 keys ahead (2 * limit); the key 2 places ahead is the nested holder's.
    let w = KillOnDrop(run_sem_at(
        &proxy,
        &prefix,
        2,
        &["-v"],
        &logged_job(&log, "true"),
    ));
    wait_keys(&c, &prefix, 5);
    assert!(
        wait_for(LONG, || *watches.lock().unwrap() >= 1),
        "the waiter never made a watch"
    );
    std::fs::write(&go1, "").unwrap();
    std::fs::write(&go2, "").unwrap();
    for mut k in [a1, a2, a3] {
        assert!(wait_exit(&mut k.0, LONG).success());
    }
    let mut w = w;
    let st = wait_exit(&mut w.0, LONG);
    let mut werr = String::new();
    std::io::Read::read_to_string(w.0.stderr.as_mut().unwrap(), &mut werr).unwrap();
    assert!(st.success(), "waiter: {werr}");
    std::fs::write(&gon, "").unwrap();
    let mut nested = nested;
    assert!(wait_exit(&mut nested.0, LONG).success());
    let text = read(&log);
    assert!(max_overlap(&intervals(&text)) <= 2, "{text}");
    let sp = spans(&text);
    assert_eq!(sp.len(), 4, "{text}");
    // sp[2]: the third of P (a slot free for it at once), sp[3]: the waiter, whose slot
    // freed when the third ended.
    let gap_ms = (sp[3].1 - sp[2].2) / 1_000_000;
    assert!(
        gap_ms < 1500,
        "the waiter started {gap_ms} ms after a slot freed for it (behind a nested semaphore's key): {werr}"
    );
    eprintln!("the far-back waiter started {gap_ms} ms after its slot freed");
}

/// As `etcd_run::a_lease_revoked_before_the_enqueue_lands_queues_again`,
/// for the semaphore.
#[test]
fn a_lease_revoked_before_the_enqueue_lands_queues_again() {
    let Some(out) = crate::etcd_harness::leases_revoked_before_the_first_txn(
        "rev4s",
        &["sem", "--prefix", "rev4sem", "--limit", "2"],
    ) else {
        return;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("queueing with a new lease"), "{err}");
}
