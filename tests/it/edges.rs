//! Operators' rough edges (issue 14) and bad input refused before any request
//! (issue 11, cases 11 and 12).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use assert_cmd::assert::Assert;
use assert_cmd::prelude::*;
use conlock::consul::{PutOptions, QueryOptions, SessionRequest, LOCK_FLAGS};
use conlock::devserver::DevServer;
use predicates::prelude::*;
use predicates::str::contains;

use crate::common::{start_server, start_server_with};
use crate::harness::*;
use crate::schema::assert_status_valid;

const LONG: Duration = Duration::from_secs(60);

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn status_json(server: &DevServer, args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let o = conlock(server)
        .arg("status")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {:?} {}", o.stdout, stderr(&o)));
    assert_status_valid(&j);
    (o.status.code(), j)
}

/// Runs `cmd` and asserts exit 125, a message containing `want`, and that no request
/// reached `server`.
fn refused_before_any_request(server: &DevServer, cmd: &mut Command, want: &str) -> Assert {
    let a = cmd.assert().code(125).stderr(contains(want));
    let err = stderr(a.get_output());
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert_eq!(
        server.request_count(),
        0,
        "a request reached the server: {err}"
    );
    a
}

#[test]
fn keys_with_empty_dot_or_dotdot_segments_are_refused_first() {
    let server = start_server();
    for key in ["a/../b", "a/./b", "a//b", "..", "a/."] {
        for args in [
            vec!["run", "--key", key, "--", "true"],
            vec!["status", "--key", key],
            vec!["watch", "--key", key],
            vec!["break", "--key", key, "--yes"],
        ] {
            refused_before_any_request(
                &server,
                conlock(&server).args(&args),
                "Consul cannot store such a key",
            );
        }
        for args in [
            vec!["run", "--prefix", key, "--", "true"],
            vec!["sem", "--limit", "2", "--prefix", key, "--", "true"],
            vec!["status", "--prefix", key],
        ] {
            refused_before_any_request(
                &server,
                conlock(&server).args(&args),
                "Consul cannot store such a key",
            );
        }
    }
    // What Consul accepts stays accepted: a trailing slash on a key, slashes around a prefix.
    conlock(&server)
        .args(["run", "--key", "dir/", "--", "true"])
        .assert()
        .success();
    conlock(&server)
        .args(["status", "--prefix", "/p/"])
        .assert()
        .code(1);
}

#[test]
fn files_are_read_up_to_their_limit() {
    let server = start_server();
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 7] = [
        (
            &["--token-file", "/dev/zero"],
            &[],
            "larger than 65536 bytes",
        ),
        (
            &[],
            &[("CONSUL_HTTP_TOKEN_FILE", "/dev/zero")],
            "larger than 65536 bytes",
        ),
        (
            &["--value-file", "/dev/zero"],
            &[],
            "larger than 524288 bytes (512 KiB",
        ),
        (
            &["--ca-file", "/dev/zero"],
            &[],
            "larger than 1048576 bytes",
        ),
        (
            &[],
            &[("CONSUL_CACERT", "/dev/zero")],
            "larger than 1048576 bytes",
        ),
        (
            &["--client-cert", "/dev/zero", "--client-key", "/dev/zero"],
            &[],
            "larger than 1048576 bytes",
        ),
        (
            &[],
            &[
                ("CONSUL_CLIENT_CERT", "/dev/zero"),
                ("CONSUL_CLIENT_KEY", "/dev/zero"),
            ],
            "larger than 1048576 bytes",
        ),
    ];
    for (flags, env, want) in cases {
        let started = Instant::now();
        refused_before_any_request(
            &server,
            conlock(&server)
                .args(["run", "--key", "k"])
                .args(flags)
                .envs(env.iter().copied())
                .args(["--", "true"]),
            want,
        )
        .stderr(contains("/dev/zero"));
        // Unbounded, /dev/zero is read until memory runs out.
        assert!(started.elapsed() < Duration::from_secs(30));
    }
}

#[test]
fn a_token_with_a_control_character_is_refused_first() {
    let server = start_server();
    refused_before_any_request(
        &server,
        conlock(&server).args(["status", "--key", "k", "--token", "abc\u{1}def"]),
        "the ACL token from --token contains a control character",
    );
    refused_before_any_request(
        &server,
        conlock(&server)
            .env("CONSUL_HTTP_TOKEN", "abc\tdef")
            .args(["status", "--key", "k"]),
        "ACL token from CONSUL_HTTP_TOKEN contains",
    );
}

#[test]
fn a_denial_without_a_token_says_to_set_one() {
    let server = start_server_with(|o| o.acl_token = Some("secret".into()));
    conlock(&server)
        .args(["status", "--key", "k"])
        .assert()
        .code(125)
        .stderr(contains("no ACL token was sent: set CONSUL_HTTP_TOKEN"))
        .stderr(contains("from no token").not());
    conlock(&server)
        .args(["status", "--key", "k", "--token", "wrong"])
        .assert()
        .stderr(contains("check the ACL token from --token"));
}

#[test]
fn address_schemes_are_case_insensitive_and_https_to_http_is_explained() {
    let server = start_server();
    conlock(&server)
        .env("CONSUL_HTTP_ADDR", format!("HTTP://{}", server.addr()))
        .args(["status", "--key", "k"])
        .assert()
        .code(1);
    conlock(&server)
        .env("CONSUL_HTTP_ADDR", format!("https://{}", server.addr()))
        .args(["status", "--key", "k"])
        .assert()
        .code(125)
        .stderr(contains(format!(
            "the agent at {} answered plain HTTP; use http:// or check CONSUL_HTTP_SSL",
            server.addr()
        )))
        .stderr(contains("InvalidContentType").not());
}

#[test]
fn a_huge_command_line_is_cut_in_the_default_value() {
    let server = start_server();
    // Six 100 KB arguments (one argument may not exceed 128 KiB on Linux).
    let big = "x".repeat(100_000);
    let marker = scratch("huge").join("ran");
    let mut cmd = conlock(&server);
    cmd.args(["run", "--key", "huge", "--", "sh", "-c"])
        .arg(format!("touch {}; sleep 60", marker.display()))
        .arg("sh");
    for _ in 0..6 {
        cmd.arg(&big);
    }
    let mut child = KillOnDrop(cmd.stderr(Stdio::piped()).spawn().unwrap());
    assert!(wait_for(LONG, || marker.exists()), "the command never ran");
    let c = client(&server);
    let (pair, _) = c.kv_get("huge", QueryOptions::default()).unwrap();
    let pair = pair.unwrap();
    assert!(pair.value_bytes().len() <= 512 * 1024);
    let v: serde_json::Value = serde_json::from_slice(pair.value_bytes()).unwrap();
    let command = v["command"].as_str().unwrap();
    assert!(
        command.starts_with("sh -c touch") && command.ends_with('…'),
        "{}",
        &command[..80]
    );
    assert_eq!(v["lock_delay"], "15s");
    let s = c.session_list(QueryOptions::default()).unwrap().0;
    assert!(s[0].name.chars().count() < 300, "{}", s[0].name);
    signal(child.0.id(), libc::SIGTERM);
    let st = wait_exit(&mut child.0, LONG);
    assert_eq!(st.code(), Some(143));
}

#[test]
fn migration_hints_for_shell_lines_and_missing_interpreters() {
    let server = start_server();
    conlock(&server)
        .args(["run", "--key", "k", "--", "echo a && echo b"])
        .assert()
        .code(127)
        .stderr(contains(
            "command not found: 'echo a && echo b' (searched PATH) (a whole shell line? use --shell)",
        ));
    // With a slash too (no PATH search), quoted so that it does not read as a shell line.
    for (cmd, want) in [
        (
            "pg_dump db | gzip > /b/db.gz",
            "command not found: 'pg_dump db | gzip > /b/db.gz' (a whole shell line? use --shell)\n",
        ),
        (
            "./job 1",
            "command not found: './job 1' (a whole shell line? use --shell)\n",
        ),
    ] {
        conlock(&server)
            .args(["run", "--key", "k", "--", cmd])
            .assert()
            .code(127)
            .stderr(predicates::str::ends_with(want));
    }
    conlock(&server)
        .args(["run", "--key", "k", "--", "no-such-command-xyz"])
        .assert()
        .code(127)
        .stderr(contains("--shell").not());

    let script = scratch("interp").join("job.sh");
    std::fs::write(&script, "#!/nonexistent/bin/bash\necho hi\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    conlock(&server)
        .args(["run", "--key", "k", "--", script.to_str().unwrap()])
        .assert()
        .code(127)
        .stderr(contains(format!(
            "interpreter /nonexistent/bin/bash of script {} not found",
            script.display()
        )));
    assert_eq!(server.request_count(), 0);
}

#[test]
fn negative_durations_get_a_correct_hint() {
    let server = start_server();
    for args in [
        ["run", "--key", "k", "--timeout", "-5s", "--", "true"],
        ["run", "--key", "k", "--timeout=-5s", "--", "true", "x"],
    ] {
        conlock(&server)
            .args(args)
            .assert()
            .code(125)
            .stderr(contains("durations cannot be negative"))
            .stderr(contains("'-- -5").not());
    }
    conlock(&server)
        .args(["run", "--key", "k", "--busy-exit-code", "-5", "--", "true"])
        .assert()
        .stderr(contains("'-- -5'").not());
    assert_eq!(server.request_count(), 0);
}

#[test]
fn signal_deaths_are_named_and_every_verbose_line_is_stamped() {
    let server = start_server();
    // A lock-delay over Consul's cap gives a warning; -v stamps it like the rest.
    let o = conlock(&server)
        .args([
            "-v",
            "run",
            "--key",
            "sig",
            "--lock-delay",
            "2m",
            "--",
            "sh",
            "-c",
            "kill -9 $$",
        ])
        .assert()
        .code(137)
        .stderr(contains(
            "command was killed by signal 9 (SIGKILL; exit code 137)",
        ));
    let err = stderr(o.get_output());
    for line in err.lines() {
        let stamp = line.split(' ').next().unwrap();
        assert!(
            stamp.len() == 27 && stamp.ends_with('Z') && stamp.as_bytes()[10] == b'T',
            "line without a timestamp: {line}"
        );
    }
    o.stderr(contains(
        "conlock: warning: --lock-delay 2m0s is more than Consul applies",
    ));
}

#[test]
fn watch_and_status_name_the_target_alike() {
    let server = start_server();
    let mut w = KillOnDrop(
        conlock(&server)
            .args(["watch", "--prefix", "w1"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(w.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.trim_end().ends_with("free     lock w1/.lock"),
        "{line}"
    );
    conlock(&server)
        .args(["status", "--prefix", "w1"])
        .assert()
        .stdout(contains("lock:  w1/.lock"));
}

#[test]
fn status_json_keeps_one_shape_per_kind() {
    let server = start_server();
    // Nothing under the prefix: a lock unless told otherwise; .holders is a list either way.
    let (code, j) = status_json(&server, &["--prefix", "db"]);
    assert_eq!(
        (code, j["kind"].as_str(), j["state"].as_str()),
        (Some(1), Some("lock"), Some("free"))
    );
    assert_eq!(j["holders"], serde_json::json!([]));
    let (code, j) = status_json(&server, &["--prefix", "db", "--kind", "semaphore"]);
    assert_eq!((code, j["kind"].as_str()), (Some(1), Some("semaphore")));
    assert_eq!(j["holders"], serde_json::json!([]));

    // Two holders and a waiter on a 2-slot semaphore.
    let dir = scratch("semjson");
    let mut kids = Vec::new();
    for i in 0..3 {
        let m = dir.join(format!("m{i}"));
        kids.push(KillOnDrop(
            conlock(&server)
                .args(["sem", "--limit", "2", "--prefix", "db", "--"])
                .args(marked(&m, "sleep 60"))
                .spawn()
                .unwrap(),
        ));
    }
    assert!(wait_for(LONG, || {
        let (_, j) = status_json(&server, &["--prefix", "db"]);
        j["holders"].as_array().map(Vec::len) == Some(2) && j["waiting"] == 1
    }));
    let (code, j) = status_json(&server, &["--prefix", "db"]);
    assert_eq!(
        (code, j["kind"].as_str(), j["state"].as_str()),
        (Some(0), Some("semaphore"), Some("held"))
    );
    // The wrong kind for what Consul holds is an error, not a guess.
    conlock(&server)
        .args(["status", "--prefix", "db", "--kind", "lock"])
        .assert()
        .code(125);
    for k in &mut kids {
        signal(k.0.id(), libc::SIGTERM);
    }
    for k in &mut kids {
        wait_exit(&mut k.0, LONG);
    }
    // Emptied again: still a semaphore when asked as one.
    let (code, j) = status_json(&server, &["--prefix", "db", "--kind", "semaphore"]);
    assert_eq!(
        (code, j["state"].as_str(), &j["holders"]),
        (Some(1), Some("free"), &serde_json::json!([]))
    );

    // A held lock.
    let mut h = KillOnDrop(start_holder(&server, "lk", &[], "sleep 60"));
    let (code, j) = status_json(&server, &["--key", "lk"]);
    assert_eq!((code, j["state"].as_str()), (Some(0), Some("held")));
    assert_eq!(j["holders"][0]["session"], j["holder"]["session"]);
    assert_eq!(j["holder"]["value"]["lock_delay"], "15s");
    signal(h.0.id(), libc::SIGTERM);
    wait_exit(&mut h.0, LONG);
    let (code, j) = status_json(&server, &["--key", "lk"]);
    assert_eq!((code, j["state"].as_str()), (Some(1), Some("free")));
}

/// Right after a `break` (or a loss) of a conlock holder, status knows the lock-delay
/// that run meets: the losing conlock and break record its end in the key.
#[test]
fn status_after_break_shows_the_lock_delay_run_meets() {
    let server = start_server();
    let mut holder = start_holder(&server, "bd/k", &[], "exec sleep 60");
    conlock(&server)
        .args(["break", "--key", "bd/k", "--yes"])
        .assert()
        .code(0);
    // The holder stops its command and cleans up on its way out.
    assert_eq!(wait_exit(&mut holder, LONG).code(), Some(124));
    conlock(&server)
        .args(["run", "--key", "bd/k", "--timeout", "0s", "--", "true"])
        .assert()
        .code(75)
        .stderr(contains("free, in a lock-delay"));
    conlock(&server)
        .args(["status", "--key", "bd/k"])
        .assert()
        .code(2)
        .stdout(contains("free, but in a lock-delay until about"));
    let (code, j) = status_json(&server, &["--key", "bd/k"]);
    assert_eq!(
        (code, j["state"].as_str()),
        (Some(2), Some("lock-delay")),
        "{j}"
    );
    let until = j["lock_delay"]["until"].as_str().unwrap().to_string();
    let now = conlock::ui::timestamp(std::time::SystemTime::now());
    assert!(until > now, "until {until}, now {now}");

    // A holder that died: break alone records it, from the session's LockDelay.
    let c = client(&server);
    let sid = c
        .session_create(&SessionRequest {
            name: "dead".into(),
            lock_delay: Some("20s".into()),
            ..Default::default()
        })
        .unwrap();
    let value = br#"{"host":"h","pid":1,"command":"job","started":"2026-11-21T13:45:26.123Z","lock_delay":"20s"}"#;
    let put = PutOptions {
        flags: LOCK_FLAGS,
        acquire: Some(&sid),
        ..Default::default()
    };
    assert!(c.kv_put("bd/dead", value, put).unwrap());
    conlock(&server)
        .args(["break", "--key", "bd/dead", "--yes"])
        .assert()
        .code(0);
    let (code, j) = status_json(&server, &["--key", "bd/dead"]);
    assert_eq!(code, Some(2), "{j}");
    assert!(j["lock_delay"]["until"].as_str().is_some(), "{j}");

    // A recorded end that has passed: free, although the key is still there.
    let old = br#"{"host":"h","pid":1,"command":"job","lock_delay":"15s","lock_delay_until":"2020-01-01T00:00:00.000Z"}"#;
    let put = PutOptions {
        flags: LOCK_FLAGS,
        ..Default::default()
    };
    assert!(c.kv_put("bd/old", old, put).unwrap());
    let (code, j) = status_json(&server, &["--key", "bd/old"]);
    assert_eq!((code, j["state"].as_str()), (Some(1), Some("free")), "{j}");
    assert_eq!(j["lock_delay"], serde_json::Value::Null, "{j}");
}

#[test]
fn status_agrees_with_run_during_a_lock_delay() {
    let server = start_server();
    let c = client(&server);
    // A holder whose session is invalidated leaves the key without a session.
    let sid = c
        .session_create(&SessionRequest {
            name: "doomed".into(),
            lock_delay: Some("30s".into()),
            ..Default::default()
        })
        .unwrap();
    let value = br#"{"host":"h","pid":1,"command":"job","started":"2026-11-21T13:45:26.123Z","lock_delay":"30s"}"#;
    let put = PutOptions {
        flags: LOCK_FLAGS,
        acquire: Some(&sid),
        ..Default::default()
    };
    assert!(c.kv_put("ld/.lock", value, put).unwrap());
    assert!(c.session_destroy(&sid).unwrap());

    conlock(&server)
        .args(["run", "--prefix", "ld", "--timeout", "0s", "--", "true"])
        .assert()
        .code(75)
        // Without -v too, the busy message says why.
        .stderr(contains("is busy: free, in a lock-delay"));
    conlock(&server)
        .args(["status", "--prefix", "ld"])
        .assert()
        .code(2)
        .stdout(contains(
            "free, but a lock-delay of up to 30s may still block new holders",
        ));
    let (code, j) = status_json(&server, &["--prefix", "ld"]);
    assert_eq!((code, j["state"].as_str()), (Some(2), Some("lock-delay")));
    assert_eq!(j["lock_delay"]["up_to_ns"], 30_000_000_000u64);
    assert_eq!(j["held"], false);
}

#[test]
fn dev_server_takes_no_client_options_and_client_options_go_either_side() {
    let server = start_server();
    let mut help = Command::new(BIN)
        .args(["dev-server", "--help"])
        .assert()
        .stdout(contains("--session-ttl-min"));
    for opt in ["--http-addr", "--token", "--ca-file", "--datacenter"] {
        // dev-server --help must not list `opt`.
        help = help.stdout(contains(opt).not());
    }
    Command::new(BIN)
        .args(["dev-server", "--http-addr", "127.0.0.1:1"])
        .assert()
        .code(125);
    Command::new(BIN)
        .args([
            "--http-addr",
            "127.0.0.1:1",
            "dev-server",
            "--addr",
            "127.0.0.1:0",
        ])
        .assert()
        .code(125)
        .stderr(contains(
            "--http-addr applies to run, sem, status, watch and break",
        ));
    // Before or after the subcommand; after wins.
    let addr = server.addr().to_string();
    conlock(&server)
        .env_remove("CONSUL_HTTP_ADDR")
        .args(["--http-addr", &addr, "status", "--key", "k"])
        .assert()
        .code(1);
    conlock(&server)
        .env_remove("CONSUL_HTTP_ADDR")
        .args([
            "--http-addr",
            "127.0.0.1:1",
            "status",
            "--http-addr",
            &addr,
            "--key",
            "k",
        ])
        .assert()
        .code(1);
}

#[test]
fn man_pages_and_help_name_what_operators_type() {
    Command::new(BIN)
        .args(["man", "run"])
        .assert()
        .stdout(contains(".SH SYNOPSIS\n\\fBconlock run\\fR"));
    for sub in [None, Some("run"), Some("sem"), Some("status")] {
        let mut help = Command::new(BIN).args(sub).arg("--help").assert();
        for var in [
            "CONSUL_HTTP_SSL",
            "CONSUL_HTTP_SSL_VERIFY",
            "CONSUL_TLS_SERVER_NAME",
        ] {
            help = help.stdout(contains(var));
        }
    }
    Command::new(BIN)
        .args(["break", "--help"])
        .assert()
        .stdout(contains("1    declined at the confirmation prompt"));
    // The variables the command receives, and that --timeout defaults to forever.
    for sub in ["run", "sem"] {
        let help = Command::new(BIN).args([sub, "--help"]).output().unwrap();
        let man = Command::new(BIN).args(["man", sub]).output().unwrap();
        for text in [&help.stdout, &man.stdout] {
            let text = String::from_utf8_lossy(text);
            for want in [
                "CONSUL_LOCK_HELD",
                "CONLOCK_KEY",
                "CONLOCK_SESSION",
                "CONLOCK_MODIFY_INDEX",
                "CONLOCK_FENCING_TOKEN",
                "CONLOCK_LOCK_INDEX",
                "CONLOCK_PREFIX, CONLOCK_LIMIT",
                "[default: wait forever]",
            ] {
                assert!(text.contains(want), "{sub}: {want} missing in:\n{text}");
            }
        }
    }
    // What status can and cannot see of a lock-delay (issue 32, item 6).
    Command::new(BIN)
        .args(["status", "--help"])
        .assert()
        .stdout(contains(
            "After a loss or a `break`, a conlock holder's\n       key says until when",
        ))
        .stdout(contains(
            "a `consul lock` holder\n       deletes its key when it loses it",
        ));
}

#[test]
fn ctrl_c_during_the_demo_releases_before_the_server_stops() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/demo.sh");
    let mut demo = KillOnDrop(
        std::process::Command::new("bash")
            .args([script, BIN.path()])
            .env_remove("CONSUL_HTTP_ADDR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    let pgid = demo.0.id() as i32;
    let mut out = std::io::BufReader::new(demo.0.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("got the lock") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the demo ended early"
        );
    }
    // What a terminal's Ctrl-C does: SIGINT to the whole foreground group.
    unsafe { libc::kill(-pgid, libc::SIGINT) };
    let st = wait_exit(&mut demo.0, LONG);
    let mut err = String::new();
    use std::io::Read;
    demo.0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(st.code(), Some(130), "{err}");
    for bad in [
        "could not release",
        "Connection refused",
        "could not destroy",
    ] {
        assert!(!err.contains(bad), "{err}");
    }
}

/// conlock started with stdin, stdout or stderr closed (`>&-` in a script, a daemon that
/// closed them): they are opened on /dev/null first, as the command would expect, so
/// that no socket or pipe of conlock's takes their number. A guardian whose pipe was fd 1
/// read end-of-file at once and took conlock for dead.
#[test]
fn closed_standard_streams_become_dev_null() {
    use std::os::unix::process::CommandExt;
    let server = start_server();
    let dir = scratch("closed-streams");
    for fd in 0..3 {
        let (out, key) = (dir.join(format!("fds-{fd}")), format!("closed-{fd}"));
        let mut cmd = conlock(&server);
        cmd.args(["run", "--key", &key, "--", "sh", "-c"])
            .arg(format!(
                // Through a pipe: dash redirects a simple command in the shell itself.
                "readlink /proc/$$/fd/{fd} | cat > {}; echo out; echo err >&2",
                out.display()
            ));
        // SAFETY: close is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                libc::close(fd);
                Ok(())
            });
        }
        let o = cmd.output().unwrap();
        assert_eq!(o.status.code(), Some(0), "fd {fd} closed: {}", stderr(&o));
        assert_eq!(read(&out).trim(), "/dev/null", "fd {fd} of the command");
        assert!(holder(&client(&server), &key).is_none());
    }
}

/// A value of 460,000 bytes (under Consul's 512 KiB) is stored whole by a lock holder and
/// by a semaphore holder: each write sends it once, as the raw body of a KV `PUT`. (The
/// issue that found a 413 here was about a `/v1/txn` acquire that carried the value
/// twice, base64-encoded; conlock no longer uses `/v1/txn`.)
#[test]
fn a_value_of_460000_bytes_is_stored_whole() {
    let server = start_server();
    let dir = scratch("big-value");
    let file = dir.join("value");
    let value: Vec<u8> = (0..460_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    std::fs::write(&file, &value).unwrap();
    let c = client(&server);
    for (what, args, key) in [
        (
            "lock",
            vec!["run", "--key", "big-lock"],
            "big-lock".to_string(),
        ),
        (
            "semaphore",
            vec!["sem", "--prefix", "big-sem", "--limit", "2"],
            String::new(),
        ),
    ] {
        let (ran, go) = (
            dir.join(format!("{what}-ran")),
            dir.join(format!("{what}-go")),
        );
        let mut holder = KillOnDrop(
            conlock(&server)
                .args(&args)
                .arg("--value-file")
                .arg(&file)
                .arg("--")
                .args(marked(&ran, &until_exists(&go)))
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        assert!(
            wait_for(LONG, || ran.exists()),
            "the {what} holder never ran"
        );
        let key = if key.is_empty() {
            // The semaphore's contender key: the one key under the prefix but .lock.
            let (keys, _) = c
                .kv_keys("big-sem/", None, QueryOptions::default())
                .unwrap();
            keys.into_iter()
                .find(|k| !k.ends_with("/.lock"))
                .expect("a contender key")
        } else {
            key
        };
        let (pair, _) = c.kv_get(&key, QueryOptions::default()).unwrap();
        let stored = pair.expect("the key exists").value_bytes().to_vec();
        std::fs::write(&go, "").unwrap();
        let status = wait_exit(&mut holder.0, LONG);
        let mut err = String::new();
        std::io::Read::read_to_string(&mut holder.0.stderr.take().unwrap(), &mut err).unwrap();
        assert!(status.success(), "{what}: {status}: {err}");
        assert_eq!(stored.len(), value.len(), "{what}");
        assert!(stored == value, "{what}: the stored value differs");
    }
}

/// A value over 512 KiB is refused before any request (exit 125, naming the limit).
#[test]
fn a_value_over_512_kib_is_refused_before_any_request() {
    let server = start_server();
    let file = scratch("huge-value").join("value");
    std::fs::write(&file, vec![b'v'; 512 * 1024 + 1]).unwrap();
    for args in [
        &["run", "--key", "huge-value"][..],
        &["sem", "--prefix", "huge-value", "--limit", "2"],
    ] {
        conlock(&server)
            .args(args)
            .arg("--value-file")
            .arg(&file)
            .args(["--", "true"])
            .assert()
            .code(125)
            .stderr(contains("512 KiB"));
    }
    assert_eq!(server.request_count(), 0, "a request was sent");
}

/// The heading a line of `--help` output sits under.
fn heading_of(help: &str, needle: &str) -> String {
    let mut heading = String::new();
    for line in help.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            heading = line.to_string();
        }
        if line.trim_start().starts_with(needle) {
            return heading;
        }
    }
    panic!("{needle} not in:\n{help}");
}

/// A subcommand's own options are listed with it, not under "Consul connection:" (where
/// they were when they followed the connection options in the definitions).
#[test]
fn subcommand_options_sit_under_the_subcommand_heading() {
    for (sub, needle, want) in [
        ("status", "--json", "Options:"),
        ("watch", "--json", "Options:"),
        ("watch", "[HANDLER]", "Arguments:"),
        ("break", "--session", "Options:"),
        ("break", "-y, --yes", "Options:"),
        ("run", "--key", "Options:"),
        ("run", "--http-addr", "Consul connection:"),
    ] {
        let out = Command::new(BIN).args([sub, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            heading_of(&help, needle),
            want,
            "conlock {sub} --help, {needle}"
        );
    }
    // The man pages follow the same headings (.SH sections).
    for (sub, needle) in [("status", "\\-\\-json"), ("break", "\\-\\-yes")] {
        let out = Command::new(BIN).args(["man", sub]).output().unwrap();
        let page = String::from_utf8_lossy(&out.stdout);
        let section = page
            .lines()
            // After the synopsis, which names every option.
            .skip_while(|l| !l.starts_with(".SH DESCRIPTION"))
            .take_while(|l| !l.contains(needle))
            .filter(|l| l.starts_with(".SH "))
            .last()
            .unwrap_or_default()
            .to_string();
        assert_eq!(section, ".SH OPTIONS", "conlock-{sub}.1, {needle}");
    }
}

/// `dev-server --addr` takes a host name and `:PORT` (loopback), as people type them.
#[test]
fn dev_server_addr_takes_localhost_and_a_bare_port() {
    for addr in ["localhost:0", ":0"] {
        let mut child = Command::new(BIN)
            .args(["dev-server", "--addr", addr])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        signal(child.id(), libc::SIGTERM);
        let status = child.wait().unwrap();
        let url = line
            .strip_prefix("conlock dev-server listening on ")
            .unwrap_or_else(|| panic!("{addr}: {line:?}"));
        let port = url.split(' ').next().unwrap().rsplit(':').next().unwrap();
        assert!(
            (url.starts_with("http://127.0.0.1:") || url.starts_with("http://[::1]:"))
                && port.parse::<u16>().unwrap() != 0,
            "{addr}: {line:?}"
        );
        assert_eq!(status.code(), Some(0), "{addr}");
    }
    Command::new(BIN)
        .args(["dev-server", "--addr", "localhost:x"])
        .assert()
        .code(125)
        .stderr(contains("\"x\" is not a port number"));
}

/// Installed documentation is whole: the man pages put examples, exit codes and the
/// environment under the headings man readers know, name only pages that exist, and
/// neither they nor --help point at paths of the source tree (docs/...).
#[test]
fn man_pages_and_help_point_at_what_is_installed() {
    const SUBS: [&str; 6] = ["run", "sem", "status", "watch", "break", "dev-server"];
    let page = |sub: Option<&str>| -> String {
        let out = Command::new(BIN).arg("man").args(sub).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "man {sub:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    for sub in std::iter::once(None).chain(SUBS.iter().copied().map(Some)) {
        let roff = page(sub);
        let headings: Vec<&str> = roff.lines().filter(|l| l.starts_with(".SH ")).collect();
        assert!(!headings.contains(&".SH EXTRA"), "{sub:?}: {headings:?}");
        assert!(headings.contains(&".SH SEE ALSO"), "{sub:?}: {headings:?}");
        if !matches!(sub, Some("watch" | "dev-server")) {
            for h in [".SH EXAMPLES", ".SH EXIT STATUS"] {
                assert!(headings.contains(&h), "{sub:?}: {h} in {headings:?}");
            }
        }
        if matches!(sub, None | Some("run" | "sem")) {
            assert!(
                headings.contains(&".SH ENVIRONMENT"),
                "{sub:?}: {headings:?}"
            );
        }
        // Every page reference is a page `conlock man` prints.
        let plain = roff
            .replace("\\fB", "")
            .replace("\\fR", "")
            .replace("\\-", "-");
        for (i, _) in plain.match_indices("(1)") {
            let name = plain[..i]
                .rsplit(|c: char| c.is_whitespace() || c == ',')
                .next()
                .unwrap();
            let sub = name
                .strip_prefix("conlock")
                .unwrap_or_else(|| panic!("{name}(1)"));
            if let Some(sub) = sub.strip_prefix('-') {
                assert!(SUBS.contains(&sub), "{name}(1) has no page");
            } else {
                assert_eq!(sub, "", "{name}(1)");
            }
        }
        let help = Command::new(BIN).args(sub).arg("--help").output().unwrap();
        for text in [plain, String::from_utf8_lossy(&help.stdout).into_owned()] {
            for (i, _) in text.match_indices("docs/") {
                assert!(
                    text[..i].ends_with("/usr/share/doc/conlock/"),
                    "{sub:?}: a path of the source tree: {}",
                    &text[i.saturating_sub(40)..(i + 30).min(text.len())]
                );
            }
        }
    }
    // No page for the subcommands that have none (the top page lists them as usage).
    let top = page(None);
    for missing in [
        "conlock\\-completions(1)",
        "conlock\\-man(1)",
        "conlock\\-help(1)",
    ] {
        assert!(!top.contains(missing), "{missing}");
    }
}

/// Usage errors say what was probably meant and point at the subcommand's help; a bare
/// `conlock` prints the help.
#[test]
fn usage_errors_show_the_fix() {
    for (args, want) in [
        (
            &["run", "--key", "k", "true"][..],
            "the command goes after `--`: conlock run --key k -- true (see 'conlock run --help')",
        ),
        (
            &["run", "service/x", "--", "./job"][..],
            "conlock run --prefix service/x -- ./job (see 'conlock run --help')",
        ),
        (
            &["sem", "-n", "2", "db", "./worker"][..],
            "conlock sem -n 2 --prefix db -- ./worker (see 'conlock sem --help')",
        ),
        (
            &["run", "--key", "k"][..],
            "give the command after `--`: conlock run --key k -- CMD… (see 'conlock run --help')",
        ),
        (
            &["watch", "--key", "k", "sh"][..],
            "the handler goes after `--`: conlock watch --key k -- sh (see 'conlock watch --help')",
        ),
        (
            &["run", "--kye", "k", "--", "true"][..],
            "unexpected argument '--kye' found (see 'conlock run --help')",
        ),
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {err}");
        assert!(
            err.starts_with("conlock: error: ") && err.ends_with(&format!("{want}\n")),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
    let out = Command::new(BIN).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.starts_with("Run a command while holding") && err.contains("Usage: conlock"),
        "{err}"
    );
}

/// fish completion (the script `conlock completions fish` prints, run by fish itself):
/// the command after `--`, subcommand names after `man`, no file names for durations.
#[test]
#[ignore = "needs fish (apt-get install fish): cargo test --test it -- --ignored edges::fish_"]
fn fish_completes_the_command_after_dashes() {
    let dir = scratch("fish-completion");
    let script = dir.join("conlock.fish");
    let out = Command::new(BIN)
        .args(["completions", "fish"])
        .output()
        .unwrap();
    std::fs::write(&script, &out.stdout).unwrap();
    std::fs::write(dir.join("5s-file"), "").unwrap();
    // fish runs `conlock` from PATH for nothing here, but resolves the command after `--`.
    let complete = |line: &str| -> String {
        let out = Command::new("fish")
            .current_dir(&dir)
            .env("HOME", &dir)
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .arg("--no-config")
            .arg("-c")
            .arg(format!(
                "source '{}'; complete -C '{line}'",
                script.display()
            ))
            .output()
            .expect("fish runs (apt-get install fish)");
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let first = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| l.split('\t').next().unwrap().to_string())
            .collect()
    };
    for line in ["conlock run --key k -- ech", "conlock watch --key k -- ech"] {
        let got = first(&complete(line));
        assert!(got.iter().any(|w| w == "echo"), "{line}: {got:?}");
        assert!(
            !got.iter().any(|w| w.starts_with("--key")),
            "{line}: {got:?}"
        );
    }
    // Options after `--` are the command's, not conlock's.
    let got = first(&complete("conlock run --key k -- sh --ver"));
    assert!(!got.iter().any(|w| w == "--verbose"), "{got:?}");
    let man = first(&complete("conlock man "));
    for sub in ["run", "sem", "status", "watch", "break", "dev-server"] {
        assert!(man.iter().any(|l| l == sub), "{sub} in {man:?}");
    }
    assert!(!man.iter().any(|l| l == "5s-file"), "{man:?}");
    let duration = complete("conlock run --timeout 5");
    assert!(!duration.contains("5s-file"), "{duration:?}");
}

/// What the fish test checks with fish, in the script itself (for machines without it).
#[test]
fn fish_script_completes_after_dashes_and_man_names() {
    let out = Command::new(BIN)
        .args(["completions", "fish"])
        .output()
        .unwrap();
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(script.contains("function __fish_conlock_command_after_dashes"));
    // Every generated completion is off after `--`.
    for line in script
        .lines()
        .filter(|l| l.starts_with("complete -c conlock -n \""))
    {
        assert!(
            line.starts_with("complete -c conlock -n \"not __fish_conlock_after_dashes; and "),
            "{line}"
        );
    }
    assert!(script.contains(
        "__fish_conlock_using_subcommand man; and not __fish_seen_subcommand_from run sem status watch break dev-server\" -f -a \"run sem status watch break dev-server\""
    ));
}

/// bash completion (the script `conlock completions bash` prints, run by bash itself):
/// the command after `--`, subcommand names after `man`, no file names for durations.
#[test]
fn bash_completes_the_command_after_dashes() {
    let dir = scratch("bash-completion");
    let script = dir.join("conlock.bash");
    let out = Command::new(BIN)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    std::fs::write(&script, &out.stdout).unwrap();
    // A file the default completion would offer for a duration.
    std::fs::write(dir.join("5s-file"), "").unwrap();
    let complete = |words: &str| -> String {
        let out = Command::new("bash")
            .current_dir(&dir)
            .arg("-c")
            .arg(format!(
                "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
                 _conlock_command conlock \"${{COMP_WORDS[COMP_CWORD]}}\" 2>/dev/null; \
                 printf '%s\\n' \"${{COMPREPLY[@]}}\"",
                script.display()
            ))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let after = complete("conlock run --key k -- ech");
    assert!(after.lines().any(|l| l == "echo"), "{after:?}");
    let after = complete("conlock watch --key k -- ech");
    assert!(after.lines().any(|l| l == "echo"), "{after:?}");
    let man = complete("conlock man ''");
    for sub in ["run", "sem", "status", "watch", "break", "dev-server"] {
        assert!(man.lines().any(|l| l == sub), "{sub} in {man:?}");
    }
    let duration = complete("conlock run --timeout 5");
    assert!(!duration.contains("5s-file"), "{duration:?}");
}
