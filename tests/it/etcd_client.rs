//! The etcd v3 client against a real etcd on loopback (etcd_harness): KV, txn, leases,
//! watches, failover between endpoints, and authentication.

use std::time::{Duration, Instant};

use conlock::etcd::types::*;
use conlock::etcd::{EtcdClient, EtcdConfig, EtcdError, EtcdFlags};

use crate::etcd_harness::{
    client_for, etcdctl, etcdctl_with_input, post, Etcd, EtcdCluster, EtcdOptions,
};

const T: Duration = Duration::from_secs(5);

fn put(c: &EtcdClient, key: &str, value: &str) -> i64 {
    c.put(&PutRequest::new(key, value)).unwrap().header.revision
}

/// A TCP port nothing listens on (bound, then released).
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn put_range_delete() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let v = c.version().unwrap();
    assert!(v.etcdserver.starts_with("3."), "{v:?}");
    let st = c.status().unwrap();
    assert_eq!(st.leader, st.header.member_id, "a single member leads");

    let rev = put(&c, "prd/a", "1");
    put(&c, "prd/b", "2");
    let r = c.range(&RangeRequest::key("prd/a")).unwrap();
    assert_eq!(r.kvs.len(), 1);
    assert_eq!(
        (r.kvs[0].value.as_slice(), r.kvs[0].create_revision),
        (&b"1"[..], rev)
    );
    let r = c.range(&RangeRequest::prefix("prd/")).unwrap();
    let keys: Vec<_> = r.kvs.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(keys, vec![b"prd/a".to_vec(), b"prd/b".to_vec()]);
    assert_eq!(r.count, 2);
    let none = c.range(&RangeRequest::key("prd/none")).unwrap();
    assert!(none.kvs.is_empty() && none.count == 0);
    let d = c
        .delete_range(&DeleteRangeRequest {
            prev_kv: true,
            ..DeleteRangeRequest::key("prd/a")
        })
        .unwrap();
    assert_eq!((d.deleted, d.prev_kvs[0].value.as_slice()), (1, &b"1"[..]));
    assert!(c.range(&RangeRequest::key("prd/a")).unwrap().kvs.is_empty());
    let d = c.delete_range(&DeleteRangeRequest::key("prd/a")).unwrap();
    assert_eq!(d.deleted, 0);
}

#[test]
fn txn_compare_on_create_revision() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let key = "txn/lock/1";
    let claim = |rev: i64| TxnRequest {
        compare: vec![Compare::create_revision(key, CompareResult::Equal, rev)],
        success: vec![
            RequestOp::Put(PutRequest::new(key, "")),
            RequestOp::Range(RangeRequest::prefix("txn/lock/")),
        ],
        failure: vec![RequestOp::Range(RangeRequest::key(key))],
    };
    let t = c.txn(&claim(0)).unwrap();
    assert!(t.succeeded);
    let created = t.header.revision;
    match &t.responses[..] {
        [ResponseOp::Put(_), ResponseOp::Range(r)] => {
            assert_eq!(r.kvs[0].create_revision, created)
        }
        other => panic!("{other:?}"),
    }
    // The key exists now: the same txn fails (the gateway omits `succeeded`).
    let t = c.txn(&claim(0)).unwrap();
    assert!(!t.succeeded);
    match &t.responses[..] {
        [ResponseOp::Range(r)] => assert_eq!(r.kvs[0].create_revision, created),
        other => panic!("{other:?}"),
    }
    // Ownership check as Mutex.IsOwner: create_revision == the one we got.
    assert!(c.txn(&claim(created)).unwrap().succeeded);
    assert!(!c.txn(&claim(created + 1000)).unwrap().succeeded);
}

#[test]
fn lease_grant_keepalive_revoke() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let g = c.lease_grant(30).unwrap();
    assert_eq!(g.ttl, 30);
    let key = format!("lease/{:x}", g.id);
    c.put(&PutRequest {
        lease: g.id,
        ..PutRequest::new(key.as_str(), "")
    })
    .unwrap();
    assert_eq!(c.lease_keepalive_once(g.id).unwrap(), 30);
    let ttl = c.lease_time_to_live(g.id, true).unwrap();
    assert!(
        ttl.ttl > 0 && ttl.ttl <= 30 && ttl.granted_ttl == 30,
        "{ttl:?}"
    );
    assert_eq!(ttl.keys, vec![key.clone().into_bytes()]);

    c.lease_revoke(g.id).unwrap();
    assert!(c
        .range(&RangeRequest::key(key.as_str()))
        .unwrap()
        .kvs
        .is_empty());
    // A keepalive of a revoked lease answers without a TTL: 0, the lease is lost.
    assert_eq!(c.lease_keepalive_once(g.id).unwrap(), 0);
    assert_eq!(c.lease_time_to_live(g.id, false).unwrap().ttl, -1);
    match c.lease_revoke(g.id) {
        Err(EtcdError::LeaseNotFound { lease, .. }) => assert_eq!(lease, g.id),
        other => panic!("{other:?}"),
    }
}

#[test]
fn watch_sees_put_then_delete_in_order() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let r1 = put(&c, "wat/a", "v1");
    let r2 = put(&c, "wat/a", "v2");
    let r3 = c
        .delete_range(&DeleteRangeRequest::key("wat/a"))
        .unwrap()
        .header
        .revision;
    let watcher = c.with_own_connections();
    let mut w = watcher
        .watch(
            &WatchCreateRequest {
                key: b"wat/".to_vec(),
                range_end: prefix_range_end(b"wat/"),
                start_revision: r1,
                prev_kv: true,
                ..Default::default()
            },
            Duration::from_secs(30),
        )
        .unwrap();
    assert!(w.created().header.revision >= r3);
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let r = w.next_response().unwrap().expect("the watch stays open");
        seen.extend(r.events.iter().map(|e| (e.kind, e.kv.mod_revision)));
    }
    assert_eq!(
        seen,
        vec![
            (EventType::Put, r1),
            (EventType::Put, r2),
            (EventType::Delete, r3)
        ]
    );
    // A live event, while the main client's connections stay free.
    let r4 = put(&c, "wat/b", "live");
    let r = w.next_response().unwrap().unwrap();
    assert_eq!(r.events.len(), 1);
    assert_eq!(
        (r.events[0].kind, r.events[0].kv.mod_revision),
        (EventType::Put, r4)
    );
    assert_eq!(r.events[0].kv.value, b"live");
}

#[test]
fn silent_watch_times_out_after_its_read_timeout() {
    let Some(etcd) = Etcd::shared() else { return };
    let c = etcd.client(T);
    let mut w = c
        .watch(
            &WatchCreateRequest {
                key: b"silent/".to_vec(),
                range_end: prefix_range_end(b"silent/"),
                ..Default::default()
            },
            Duration::from_millis(500),
        )
        .unwrap();
    let t0 = Instant::now();
    match w.next_response() {
        Err(EtcdError::Timeout { secs, .. }) => assert_eq!(secs, 0.5),
        other => panic!("{other:?}"),
    }
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(450) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    // Over after an error; dropping it closes the connection.
    assert!(w.next_response().unwrap().is_none());
}

#[test]
fn watch_from_a_compacted_revision_reports_compacted() {
    let Some(etcd) = Etcd::start("compact", &EtcdOptions::default()) else {
        return;
    };
    let c = etcd.client(T);
    let first = put(&c, "cmp/a", "1");
    put(&c, "cmp/a", "2");
    let last = put(&c, "cmp/a", "3");
    let (status, body) = post(
        &etcd.endpoint(),
        "/v3/kv/compaction",
        &format!(r#"{{"revision":"{last}","physical":true}}"#),
        T,
    )
    .expect("compaction answered");
    assert_eq!(status, 200, "{body}");
    let mut w = c
        .watch(
            &WatchCreateRequest {
                key: b"cmp/".to_vec(),
                range_end: prefix_range_end(b"cmp/"),
                start_revision: first,
                ..Default::default()
            },
            Duration::from_secs(30),
        )
        .unwrap();
    match w.next_response() {
        Err(e @ EtcdError::Compacted { .. }) => {
            assert!(
                matches!(e, EtcdError::Compacted { compact_revision, .. } if compact_revision == last)
            );
            assert!(e.to_string().contains(&format!("revision {last}")), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn failover_past_a_dead_endpoint_and_all_dead_names_both() {
    let Some(etcd) = Etcd::shared() else { return };
    let dead = format!("http://127.0.0.1:{}", dead_port());
    let c = client_for(&format!("{dead},{}", etcd.endpoint()), T);
    put(&c, "fo/a", "1");
    assert_eq!(
        c.current_endpoint(),
        etcd.endpoint(),
        "remembers the one that answered"
    );
    assert_eq!(c.range(&RangeRequest::key("fo/a")).unwrap().kvs.len(), 1);

    let dead2 = format!("http://127.0.0.1:{}", dead_port());
    let c = client_for(&format!("{dead},{dead2}"), T);
    let t0 = Instant::now();
    match c.range(&RangeRequest::key("fo/a")) {
        Err(e @ EtcdError::Unreachable { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&dead) && text.contains(&dead2), "{text}");
            assert!(text.contains("--endpoints"), "{text}");
            assert!(e.is_retryable());
        }
        other => panic!("{other:?}"),
    }
    assert!(
        t0.elapsed() < T,
        "refused connections fail fast: {:?}",
        t0.elapsed()
    );
}

#[test]
fn cluster_forms_elects_and_restarts_a_member() {
    let Some(mut cluster) = EtcdCluster::start("form", &EtcdOptions::fast()) else {
        return;
    };
    let leader = cluster.wait_leader(Duration::from_secs(30));
    let c = client_for(&cluster.endpoints(), T);
    let rev = put(&c, "cl/a", "1");
    for m in &cluster.members {
        let r = m.client(T).range(&RangeRequest::key("cl/a")).unwrap();
        assert_eq!(r.kvs[0].mod_revision, rev, "{}", m.name);
        let st = m.client(T).status().unwrap();
        assert_eq!(
            st.leader,
            st_member(&cluster, leader),
            "{} agrees on the leader",
            m.name
        );
    }
    // A killed follower: the other two still serve; restarted, it catches up.
    let f = (leader + 1) % 3;
    cluster.members[f].kill();
    let rev2 = put(&c, "cl/a", "2");
    cluster.members[f].restart();
    cluster.members[f]
        .wait_healthy(Duration::from_secs(60))
        .unwrap_or_else(|log| panic!("member {f} after restart: {log}"));
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let r = cluster.members[f]
            .client(T)
            .range(&RangeRequest::key("cl/a"))
            .unwrap();
        if r.kvs[0].mod_revision == rev2 {
            break;
        }
        assert!(Instant::now() < until, "member {f} did not catch up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn st_member(cluster: &EtcdCluster, i: usize) -> u64 {
    cluster.members[i]
        .client(T)
        .status()
        .unwrap()
        .header
        .member_id
}

#[test]
fn a_frozen_endpoint_times_out_then_the_next_answers() {
    let Some(cluster) = EtcdCluster::start("frozen", &EtcdOptions::fast()) else {
        return;
    };
    let leader = cluster.wait_leader(Duration::from_secs(30));
    let frozen = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let eps = format!(
        "{},{},{}",
        cluster.members[frozen].endpoint(),
        cluster.members[other].endpoint(),
        cluster.members[leader].endpoint()
    );
    let timeout = Duration::from_secs(1);
    let c = client_for(&eps, timeout);
    put(&c, "fz/a", "1");
    assert_eq!(c.current_endpoint(), cluster.members[frozen].endpoint());
    cluster.members[frozen].stop();
    let t0 = Instant::now();
    let r = c.range(&RangeRequest::key("fz/a"));
    let took = t0.elapsed();
    cluster.members[frozen].cont();
    assert_eq!(r.unwrap().kvs.len(), 1);
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(10),
        "the frozen member's timeout, then the next one: {took:?}"
    );
    assert_eq!(c.current_endpoint(), cluster.members[other].endpoint());
}

#[test]
fn auth_token_and_wrong_password() {
    let Some(mut etcd) = Etcd::start("auth", &EtcdOptions::default()) else {
        return;
    };
    let bin = crate::etcd_harness::etcd_bin().expect("found above");
    if crate::etcd_harness::etcdctl_bin(&bin).is_none() {
        return;
    }
    let ep = etcd.endpoint();
    etcdctl(&bin, &ep, &["user", "add", "root:rootpw"]);
    etcdctl(&bin, &ep, &["user", "grant-role", "root", "root"]);
    etcdctl(&bin, &ep, &["auth", "enable"]);

    let with = |vars: &[(&str, &str)], flags: EtcdFlags| {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let flags = EtcdFlags {
            endpoints: Some(ep.clone()),
            ..flags
        };
        let cfg = EtcdConfig::resolve(&flags, &move |k| {
            vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
        .unwrap();
        let mut c = EtcdClient::new(cfg).unwrap();
        c.request_timeout = T;
        c
    };
    let c = with(&[("ETCDCTL_USER", "root:rootpw")], EtcdFlags::default());
    put(&c, "auth/a", "1");
    assert_eq!(c.range(&RangeRequest::key("auth/a")).unwrap().kvs.len(), 1);
    let g = c.lease_grant(30).unwrap();
    assert_eq!(c.lease_keepalive_once(g.id).unwrap(), 30);
    let mut w = c
        .watch(
            &WatchCreateRequest {
                key: b"auth/".to_vec(),
                range_end: prefix_range_end(b"auth/"),
                ..Default::default()
            },
            Duration::from_secs(30),
        )
        .unwrap();
    let rev = put(&c, "auth/b", "2");
    assert_eq!(
        w.next_response().unwrap().unwrap().events[0]
            .kv
            .mod_revision,
        rev
    );
    drop(w);

    // A password change (here to the same one) invalidates the user's tokens: the
    // client's next request is refused, and it authenticates once more.
    let old = c.auth_token().expect("a token");
    let refused = |tok: &str| {
        ureq::Agent::config_builder()
            .proxy(None)
            .http_status_as_error(false)
            .build()
            .new_agent()
            .post(format!("{ep}/v3/kv/range"))
            .header("Authorization", tok)
            .send(r#"{"key":"YQ=="}"#)
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(refused(&old), 200);
    etcdctl_with_input(
        &bin,
        &ep,
        &[
            "--user",
            "root:rootpw",
            "user",
            "passwd",
            "root",
            "--interactive=false",
        ],
        "rootpw\n",
    );
    assert_eq!(refused(&old), 401, "the old token is no longer valid");
    assert_eq!(c.range(&RangeRequest::key("auth/a")).unwrap().kvs.len(), 1);
    assert_ne!(c.auth_token().unwrap(), old);
    // Simple tokens survive a restart of the member (observed on 3.4.23).
    etcd.restart();
    etcd.wait_healthy(Duration::from_secs(60)).unwrap();
    assert_eq!(c.range(&RangeRequest::key("auth/a")).unwrap().kvs.len(), 1);

    let wrong = with(
        &[],
        EtcdFlags {
            user: Some("root:nope".into()),
            ..Default::default()
        },
    );
    match wrong.range(&RangeRequest::key("auth/a")) {
        Err(e @ EtcdError::Auth { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("ETCDCTL_USER/--etcd-user") && text.contains("authentication failed"),
                "{text}"
            );
            assert!(text.contains("(from --etcd-user)"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    let none = with(&[], EtcdFlags::default());
    match none.range(&RangeRequest::key("auth/a")) {
        Err(e @ EtcdError::Auth { .. }) => {
            assert!(
                e.to_string().contains("set ETCDCTL_USER or --etcd-user"),
                "{e}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn tls_endpoint_with_and_without_verification() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
    let opts = EtcdOptions {
        tls: Some((dir.join("server.pem"), dir.join("server.key"))),
        ..Default::default()
    };
    let Some(etcd) = Etcd::start("tls", &opts) else {
        return;
    };
    let ep = etcd.endpoint();
    assert!(ep.starts_with("https://"), "{ep}");
    let client = |vars: Vec<(&'static str, String)>| {
        let flags = EtcdFlags {
            endpoints: Some(ep.clone()),
            ..Default::default()
        };
        let cfg = EtcdConfig::resolve(&flags, &move |k| {
            vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        })
        .unwrap();
        let mut c = EtcdClient::new(cfg).unwrap();
        c.request_timeout = T;
        c
    };
    let ca = dir.join("ca.pem").display().to_string();
    // The test certificate names consul.test, not 127.0.0.1: verification fails and
    // the message names where the CA came from.
    let strict = client(vec![("ETCDCTL_CACERT", ca.clone())]);
    match strict.range(&RangeRequest::key("tls/a")) {
        Err(e @ EtcdError::Unreachable { .. }) => {
            assert!(e.to_string().contains("ETCDCTL_CACERT"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    let lax = client(vec![
        ("ETCDCTL_CACERT", ca),
        ("ETCDCTL_INSECURE_SKIP_TLS_VERIFY", "true".into()),
    ]);
    put(&lax, "tls/a", "1");
    assert_eq!(lax.range(&RangeRequest::key("tls/a")).unwrap().kvs.len(), 1);
    // Plain HTTP to the TLS port: etcd resets the connection.
    let plain = client_for(&ep.replace("https://", "http://"), T);
    let e = plain.range(&RangeRequest::key("tls/a")).unwrap_err();
    assert!(matches!(e, EtcdError::Unreachable { .. }), "{e:?}");
}
