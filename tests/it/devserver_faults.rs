//! The dev server's models of what ends a Consul session besides a destroy
//! or a TTL: client agents on other nodes that can be frozen (node failure
//! invalidates their serfHealth-tied sessions), and a restart that loses all
//! state.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::*;

fn info(addr: SocketAddr, id: &str) -> Value {
    get(addr, &format!("/v1/session/info/{id}")).json()
}

fn health(addr: SocketAddr, node: &str) -> Resp {
    let r = get(addr, &format!("/v1/health/node/{node}"));
    assert_eq!(r.status, 200, "health of {node}: {}", r.text());
    r
}

fn acquire(addr: SocketAddr, key: &str, id: &str) -> bool {
    let r = put(addr, &format!("/v1/kv/{key}?acquire={id}"), id.as_bytes());
    assert_eq!(r.status, 200, "acquire {key}: {}", r.text());
    r.json() == json!(true)
}

fn no_answer(addr: SocketAddr, path: &str) {
    let e = try_http_timeout(addr, "GET", path, None, &[], Duration::from_millis(800))
        .expect_err("a frozen agent must not answer");
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
        "the connection must stay open without an answer: {e}"
    );
}

#[test]
fn an_agent_is_a_separate_node_on_the_same_store() {
    let server = start_server();
    let primary = server.addr();
    let agent = server.add_agent("client1").expect("add agent");
    assert_ne!(agent, primary);
    let me = get(agent, "/v1/agent/self").json();
    assert_eq!(me["Config"]["NodeName"], json!("client1"));
    assert_eq!(me["Member"]["Name"], json!("client1"));
    assert_eq!(me["Config"]["Server"], json!(false));
    assert_eq!(
        get(primary, "/v1/agent/self").json()["Config"]["NodeName"],
        json!("conlock-dev")
    );

    let a = create_session(agent, json!({"Name": "a"}));
    let s = &info(primary, &a)[0];
    assert_eq!(s["Node"], json!("client1"));
    assert_eq!(s["Checks"], json!(["serfHealth"]));
    let p = create_session(primary, json!({"Name": "p"}));
    assert_eq!(info(agent, &p)[0]["Node"], json!("conlock-dev"));
    // Either node can be named explicitly; unknown ones are refused.
    let x = create_session(primary, json!({"Node": "CLIENT1"}));
    assert_eq!(info(agent, &x)[0]["Node"], json!("CLIENT1"));
    let r = put(agent, "/v1/session/create", br#"{"Node":"nope"}"#);
    assert_eq!(
        (r.status, r.text()),
        (500, "Missing node registration".into())
    );

    assert!(acquire(agent, "k", &a));
    assert_eq!(get(primary, "/v1/kv/k").json()[0]["Session"], json!(a));
    let node_list = get(primary, "/v1/session/node/client1").json();
    assert_eq!(node_list.as_array().unwrap().len(), 2);

    let h = health(primary, "client1");
    let c = &h.json()[0];
    assert_eq!(c["CheckID"], json!("serfHealth"));
    assert_eq!(c["Status"], json!("passing"));
    assert_eq!(c["Output"], json!("Agent alive and reachable"));
    assert_eq!(health(agent, "nope").json(), json!([]));

    let e = server.add_agent("Client1").expect_err("node name taken");
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
    assert!(server.add_agent("conlock-dev").is_err());

    // The same through the control endpoint.
    let r = put(primary, "/v1/conlock-dev/agent?node=client2", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let addr: SocketAddr = r.json()["Addr"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        get(addr, "/v1/agent/self").json()["Config"]["NodeName"],
        json!("client2")
    );
    assert_eq!(
        put(primary, "/v1/conlock-dev/agent?node=client2", b"").status,
        409
    );
    assert_eq!(put(primary, "/v1/conlock-dev/agent", b"").status, 400);
    assert_eq!(get(primary, "/v1/conlock-dev/agent?node=x").status, 405);
}

#[test]
fn a_frozen_agent_hangs_while_others_answer_and_its_node_fails() {
    let server = start_server();
    let primary = server.addr();
    let agent = server.add_agent("client1").expect("add agent");
    let other = server.add_agent("client2").expect("add agent");
    let a = create_session(agent, json!({"Name": "a", "LockDelay": "2s"}));
    let d = create_session(agent, json!({"Behavior": "delete", "LockDelay": "2s"}));
    let t = create_session(
        agent,
        json!({"Checks": [], "TTL": "30s", "LockDelay": "2s"}),
    );
    let o = create_session(other, json!({"Name": "o"}));
    let w = create_session(primary, json!({"Name": "w"}));
    for (key, id) in [("a", &a), ("d", &d), ("t", &t), ("o", &o)] {
        assert!(acquire(agent, key, id));
    }

    // Long enough for the checks below to run before the node fails.
    let detect = Duration::from_millis(2500);
    assert!(server.freeze_agent("client1", detect));
    let frozen_at = Instant::now();
    assert!(!server.freeze_agent("nope", detect));
    no_answer(agent, "/v1/kv/a");
    // A renewal through the frozen agent hangs too.
    let renew = {
        let path = format!("/v1/session/renew/{a}");
        std::thread::spawn(move || try_http(agent, "PUT", &path, None, &[]))
    };
    // The other listeners answer meanwhile.
    assert_eq!(get(primary, "/v1/kv/a").status, 200);
    assert_eq!(get(other, "/v1/kv/a").status, 200);
    assert!(!acquire(primary, "a", &w), "a is still held");

    assert!(
        wait_until(Duration::from_secs(20), || health(primary, "client1")
            .json()[0]["Status"]
            == json!("critical")),
        "client1 never turned critical"
    );
    let seen = frozen_at.elapsed();
    assert!(seen >= detect, "critical after {seen:?}, detect {detect:?}");
    let h = health(other, "client1");
    let idx = h.json()[0]["ModifyIndex"].as_u64().unwrap();
    assert_eq!(h.index(), idx);
    assert_eq!(
        h.json()[0]["Output"],
        json!("Agent not live or unreachable")
    );
    // One raft index: check critical, session gone, key released or deleted.
    let ra = get(primary, &format!("/v1/session/info/{a}"));
    assert_eq!((ra.json(), ra.index()), (json!([]), idx));
    assert_eq!(info(primary, &d), json!([]));
    let ka = get(primary, "/v1/kv/a");
    let ka0 = &ka.json()[0];
    assert!(ka0.get("Session").is_none(), "{ka0}");
    assert_eq!(ka0["LockIndex"], json!(1));
    assert_eq!(ka0["ModifyIndex"], json!(idx));
    let kd = get(primary, "/v1/kv/d");
    assert_eq!((kd.status, kd.index()), (404, idx));
    // Untouched: the session without checks, and the other node's.
    assert_eq!(info(primary, &t)[0]["Checks"], json!([]));
    assert_eq!(get(primary, "/v1/kv/t").json()[0]["Session"], json!(t));
    assert_eq!(get(primary, "/v1/kv/o").json()[0]["Session"], json!(o));
    assert_eq!(
        health(primary, "client2").json()[0]["Status"],
        json!("passing")
    );
    // No new serfHealth session on the failed node, through any agent.
    let r = put(primary, "/v1/session/create", br#"{"Node":"client1"}"#);
    assert_eq!(
        (r.status, r.text()),
        (500, "Check 'serfHealth' is in critical state".into())
    );

    // The lock-delay was applied to the released key.
    let free_seen = Instant::now();
    assert!(!acquire(primary, "a", &w), "lock-delay must refuse at once");
    assert!(
        !acquire(primary, "d", &w),
        "the deleted key has its lock-delay too"
    );
    assert!(
        wait_until(Duration::from_secs(20), || acquire(primary, "a", &w)),
        "w never got a"
    );
    assert!(frozen_at.elapsed() >= detect + Duration::from_secs(2));
    assert!(free_seen.elapsed() >= Duration::from_secs(1));
    assert!(!renew.is_finished(), "the renewal must still hang");

    let thawed = Instant::now();
    assert!(server.thaw_agent("client1"));
    let r = renew.join().unwrap().expect("an answer after the thaw");
    assert!(thawed.elapsed() < Duration::from_secs(5));
    assert_eq!(
        (r.status, r.text()),
        (404, format!("Session id '{a}' not found"))
    );
    let r = put(agent, &format!("/v1/session/renew/{t}"), b"");
    assert_eq!(r.status, 200, "the TTL-only session lives on");
    let h = health(primary, "client1");
    assert_eq!(h.json()[0]["Status"], json!("passing"));
    assert!(h.index() > idx);
    assert!(create_session(agent, json!({})).len() == 36);
}

#[test]
fn a_frozen_agents_ttl_sessions_end_by_ttl_only() {
    // No checks and a 1 s TTL: the freeze (whose detection never comes in
    // this test) does not end it; 2 × TTL without a renewal does.
    let server = start_server();
    let primary = server.addr();
    let agent = server.add_agent("client1").expect("add agent");
    let t = create_session(agent, json!({"Checks": [], "TTL": "1s", "LockDelay": "0s"}));
    let renewed = Instant::now();
    assert!(server.freeze_agent("client1", Duration::from_secs(600)));
    assert!(
        wait_until(Duration::from_secs(20), || info(primary, &t) == json!([])),
        "the TTL session never expired"
    );
    let took = renewed.elapsed();
    assert!(
        took >= Duration::from_millis(1900),
        "expired after {took:?}"
    );
    assert_eq!(
        health(primary, "client1").json()[0]["Status"],
        json!("passing")
    );
    // Freeze and thaw through the control endpoint.
    let r = put(primary, "/v1/conlock-dev/agent/thaw?node=client1", b"");
    assert_eq!((r.status, r.json()), (200, json!(true)));
    assert_eq!(get(agent, "/v1/session/list").status, 200);
    let r = put(
        primary,
        "/v1/conlock-dev/agent/freeze?node=client1&detect=300ms",
        b"",
    );
    assert_eq!((r.status, r.json()), (200, json!(true)));
    no_answer(agent, "/v1/session/list");
    assert!(wait_until(Duration::from_secs(20), || health(
        primary, "client1"
    )
    .json()[0]["Status"]
        == json!("critical")));
    // The control endpoint itself is exempt from the freeze.
    let r = put(agent, "/v1/conlock-dev/agent/thaw?node=client1", b"");
    assert_eq!(r.status, 200);
    assert!(wait_until(Duration::from_secs(20), || health(
        primary, "client1"
    )
    .json()[0]["Status"]
        == json!("passing")));
    let bad = [
        ("/v1/conlock-dev/agent/freeze?node=nope", 404),
        ("/v1/conlock-dev/agent/freeze?node=client1&detect=soon", 400),
        ("/v1/conlock-dev/agent/freeze?node=client1&detect=-1s", 400),
    ];
    for (path, status) in bad {
        assert_eq!(put(primary, path, b"").status, status, "{path}");
    }
}

#[test]
fn restart_losing_state_drops_everything_and_the_index_goes_back() {
    let server = start_server();
    let primary = server.addr();
    let agent = server.add_agent("client1").expect("add agent");
    let s = create_session(agent, json!({"LockDelay": "10s"}));
    for i in 0..20 {
        put(primary, &format!("/v1/kv/x/{i}"), b"v");
    }
    assert!(acquire(agent, "lock", &s));
    let seen = get(primary, "/v1/kv/lock").index();
    assert!(seen > 20);
    server.restart_losing_state();

    let r = get(primary, "/v1/kv/lock");
    assert_eq!(r.status, 404);
    assert!(r.index() < seen, "index {} not below {seen}", r.index());
    let r = get(agent, "/v1/kv/x/?recurse");
    assert_eq!(r.status, 404);
    assert_eq!(info(primary, &s), json!([]));
    assert_eq!(get(primary, "/v1/session/list").json(), json!([]));
    let r = put(agent, &format!("/v1/session/renew/{s}"), b"");
    assert_eq!(
        (r.status, r.text()),
        (404, format!("Session id '{s}' not found"))
    );
    // The agents' nodes are registered again; no lock-delay survives.
    let n = create_session(agent, json!({}));
    assert!(acquire(primary, "lock", &n));
    let after = get(primary, "/v1/kv/lock").index();
    assert!(after < seen, "new writes start low: {after} vs {seen}");
    assert_eq!(
        health(primary, "client1").json()[0]["Status"],
        json!("passing")
    );
    let stats = get(primary, "/v1/conlock-dev/stats").json();
    assert_eq!(
        (stats["sessions"].clone(), stats["keys"].clone()),
        (json!(1), json!(1))
    );

    // Through the control endpoint.
    let r = put(primary, "/v1/conlock-dev/restart?state=lose", b"");
    assert_eq!((r.status, r.json()), (200, json!(true)));
    assert_eq!(get(primary, "/v1/kv/lock").status, 404);
    assert_eq!(put(primary, "/v1/conlock-dev/restart", b"").status, 400);
    assert_eq!(
        put(primary, "/v1/conlock-dev/restart?state=keep", b"").status,
        400
    );
}

#[test]
fn restart_losing_state_fails_held_blocking_queries() {
    let server = start_server();
    let primary = server.addr();
    let agent = server.add_agent("client1").expect("add agent");
    put(primary, "/v1/kv/k", b"v");
    let idx = get(primary, "/v1/kv/k").index();
    let before = server.request_count();
    let held: Vec<_> = [primary, agent]
        .into_iter()
        .map(|addr| {
            let path = format!("/v1/kv/k?index={idx}&wait=5m");
            std::thread::spawn(move || {
                let t = Instant::now();
                (try_http(addr, "GET", &path, None, &[]), t.elapsed())
            })
        })
        .collect();
    assert!(wait_until(Duration::from_secs(10), || server
        .request_count()
        >= before + 2));
    // Also a query held on a frozen agent.
    let frozen = server.add_agent("client2").expect("add agent");
    assert!(server.freeze_agent("client2", Duration::from_secs(600)));
    let stuck = std::thread::spawn(move || try_http(frozen, "GET", "/v1/kv/k", None, &[]));
    // No answer yet, on any of them.
    assert!(!wait_until(Duration::from_millis(300), || held
        .iter()
        .any(|h| h.is_finished())
        || stuck.is_finished()));
    let restarted = Instant::now();
    server.restart_losing_state();
    for h in held {
        let (r, _) = h.join().unwrap();
        assert!(r.is_err(), "a held query must fail, got {r:?}");
    }
    assert!(stuck.join().unwrap().is_err());
    assert!(restarted.elapsed() < Duration::from_secs(10));
    // Same ports, serving.
    assert_eq!(get(primary, "/v1/kv/k").status, 404);
    assert_eq!(get(agent, "/v1/kv/k").status, 404);
}
