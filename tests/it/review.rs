//! Regression tests from a review of the supervision and claim code.

use std::time::{Duration, Instant};

use crate::common::start_server;
use crate::harness::*;

const LONG: Duration = Duration::from_secs(60);

/// A direct child that takes `cleanup` to exit after SIGTERM, and a leftover in its
/// group that ignores SIGTERM and writes its pid to `dir/leftover`.
fn slow_child_with_stubborn_leftover(dir: &std::path::Path, cleanup: &str) -> String {
    let d = dir.display();
    format!(
        "trap 'sleep {cleanup}; exit 0' TERM; \
         sh -c 'trap \"\" TERM; echo $$ > {d}/leftover; while :; do sleep 0.05; done' & \
         while :; do sleep 0.05; done"
    )
}

/// The grace timer starts when the lock is lost: a child that exits during the grace
/// period must not restart it for the processes it leaves behind. Otherwise a leftover
/// ignoring the kill signal survives up to twice --kill-grace after the loss.
#[test]
fn loss_grace_is_not_restarted_for_leftovers() {
    let server = start_server();
    let dir = scratch("review-grace-loss");
    let mut h = KillOnDrop(start_holder(
        &server,
        "review-grace-loss",
        &["--kill-grace", "3s"],
        &slow_child_with_stubborn_leftover(&dir, "2.5"),
    ));
    let leftover = read_pid_file(&dir.join("leftover"));
    let c = client(&server);
    let session = holder(&c, "review-grace-loss").unwrap();
    let t = Instant::now();
    c.session_destroy(&session).unwrap();
    assert!(
        wait_for(LONG, || !process_alive(leftover)),
        "leftover never died"
    );
    let gone = t.elapsed();
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(124));
    assert!(
        gone < Duration::from_millis(4500),
        "leftover SIGKILLed {gone:?} after the loss; --kill-grace is 3s"
    );
}

/// Same for a forwarded SIGTERM: it starts the grace timer once.
#[test]
fn sigterm_grace_is_not_restarted_for_leftovers() {
    let server = start_server();
    let dir = scratch("review-grace-term");
    let mut h = KillOnDrop(start_holder(
        &server,
        "review-grace-term",
        &["--kill-grace", "3s"],
        &slow_child_with_stubborn_leftover(&dir, "2.5"),
    ));
    let leftover = read_pid_file(&dir.join("leftover"));
    let t = Instant::now();
    signal(h.0.id(), libc::SIGTERM);
    assert!(
        wait_for(LONG, || !process_alive(leftover)),
        "leftover never died"
    );
    let gone = t.elapsed();
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(0));
    assert!(
        gone < Duration::from_millis(4500),
        "leftover SIGKILLed {gone:?} after SIGTERM; --kill-grace is 3s"
    );
}

fn read_pid_file(path: &std::path::Path) -> i32 {
    assert!(
        wait_for(LONG, || read(path).trim().parse::<i32>().is_ok()),
        "no pid in {path:?}"
    );
    read(path).trim().parse().unwrap()
}

/// A parent that ignores SIGCHLD passes that on through exec. conlock must still see its
/// child exit (with SIGCHLD ignored, the kernel reaps children itself and `waitpid`
/// never reports them), or it holds the lock forever after the command has ended.
#[test]
fn inherited_ignored_sigchld_does_not_hide_the_child_exit() {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let server = start_server();
    let mut cmd = conlock(&server);
    // The child still gets the disposition conlock was started with (no shell: dash
    // resets SIGCHLD itself).
    cmd.args(["run", "--key", "review-sigchld", "--"])
        .args(["grep", "SigIgn", "/proc/self/status"])
        .stdout(std::process::Stdio::piped());
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGCHLD, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut h = KillOnDrop(cmd.spawn().unwrap());
    assert_eq!(wait_exit(&mut h.0, Duration::from_secs(20)).code(), Some(0));
    let mut out = String::new();
    h.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    let ign = u64::from_str_radix(out.split_whitespace().nth(1).unwrap(), 16).unwrap();
    assert_ne!(
        ign & (1 << (libc::SIGCHLD - 1)),
        0,
        "SIGCHLD no longer ignored in the child"
    );
    let c = client(&server);
    assert_eq!(holder(&c, "review-sigchld"), None);
}
