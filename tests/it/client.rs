//! The Consul client against the dev server: credentials, error mapping, blocking reads.

use std::time::{Duration, Instant};

use conlock::consul::{Client, ConnConfig, ConnFlags, ConsulError, PutOptions, QueryOptions};
use conlock::devserver::{DevServer, Options};

use crate::common::start_server;
use crate::harness::*;

fn client_with(server: &DevServer, flags: ConnFlags, env: &[(&str, &str)]) -> Client {
    let flags = ConnFlags {
        http_addr: flags.http_addr.or(Some(server.addr().to_string())),
        ..flags
    };
    let vars: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let cfg = ConnConfig::resolve(&flags, &move |k| {
        vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    })
    .unwrap();
    Client::new(cfg).unwrap()
}

#[test]
fn token_is_sent_from_flag_env_and_file_and_403_names_its_source() {
    let server = DevServer::start(Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        session_ttl_min: Duration::from_secs(1),
        acl_token: Some("tok".into()),
        node_name: "n".into(),
    })
    .unwrap();
    let file = scratch("client-token").join("t");
    std::fs::write(&file, "tok\n").unwrap();
    let file = file.to_str().unwrap().to_string();
    let put = |c: &Client| c.kv_put("k", b"v", PutOptions::default());
    let flag = ConnFlags {
        token: Some("tok".into()),
        ..Default::default()
    };
    assert!(put(&client_with(&server, flag, &[])).unwrap());
    assert!(put(&client_with(
        &server,
        ConnFlags::default(),
        &[("CONSUL_HTTP_TOKEN", "tok")]
    ))
    .unwrap());
    assert!(put(&client_with(
        &server,
        ConnFlags::default(),
        &[("CONSUL_HTTP_TOKEN_FILE", &file)]
    ))
    .unwrap());
    let err = put(&client_with(
        &server,
        ConnFlags::default(),
        &[("CONSUL_HTTP_TOKEN", "bad")],
    ))
    .unwrap_err();
    assert!(matches!(err, ConsulError::AclDenied { .. }), "{err:?}");
    assert!(!err.is_retryable());
    let msg = err.to_string();
    assert!(
        msg.contains("403")
            && msg.contains("Permission denied")
            && msg.contains("CONSUL_HTTP_TOKEN"),
        "{msg}"
    );
}

#[test]
fn server_errors_are_retryable_and_show_consuls_text() {
    let server = start_server();
    let c = client(&server);
    fault(&server, "error", "");
    let err = c.kv_get("k", QueryOptions::default()).unwrap_err();
    fault(&server, "none", "");
    assert!(
        matches!(err, ConsulError::Server { status: 500, .. }),
        "{err:?}"
    );
    assert!(err.is_retryable());
    assert!(err.to_string().contains("No cluster leader"), "{err}");
    // 4xx: Consul's text is shown, and it is not retryable.
    let err = c.kv_put("", b"x", PutOptions::default()).unwrap_err();
    assert!(
        matches!(err, ConsulError::Rejected { status: 400, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("Missing key name"), "{err}");
    assert!(!err.is_retryable());
}

#[test]
fn agent_self_reports_the_node_name() {
    let server = DevServer::start(Options {
        addr: "127.0.0.1:0".parse().unwrap(),
        session_ttl_min: Duration::from_secs(1),
        acl_token: None,
        node_name: "node-under-test".into(),
    })
    .unwrap();
    let me = client(&server).agent_self().unwrap();
    assert_eq!(me.config.node_name, "node-under-test");
}

#[test]
fn connection_refused_names_address_and_origin() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let flags = ConnFlags {
        http_addr: Some(format!("127.0.0.1:{port}")),
        ..Default::default()
    };
    let c = Client::new(ConnConfig::resolve(&flags, &|_| None).unwrap()).unwrap();
    let err = c.kv_get("k", QueryOptions::default()).unwrap_err();
    assert!(matches!(err, ConsulError::Unreachable { .. }), "{err:?}");
    assert!(err.is_retryable());
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("127.0.0.1:{port}")) && msg.contains("--http-addr"),
        "{msg}"
    );
}

#[test]
fn blocking_read_returns_on_change_and_on_timeout() {
    let server = start_server();
    let c = client(&server);
    c.kv_put("b", b"1", PutOptions::default()).unwrap();
    let (_, meta) = c.kv_get("b", QueryOptions::default()).unwrap();
    // Timeout: no change within the wait; the same index comes back.
    let t = Instant::now();
    let (pair, same) = c
        .kv_get(
            "b",
            QueryOptions::blocking(meta.index, Duration::from_millis(500)),
        )
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(450),
        "returned after {:?}",
        t.elapsed()
    );
    assert_eq!(same.index, meta.index);
    assert_eq!(pair.unwrap().value_bytes(), b"1");
    // Change: a write wakes the query long before its wait ends.
    let writer = {
        let c = c.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            c.kv_put("b", b"2", PutOptions::default()).unwrap();
        })
    };
    let t = Instant::now();
    let (pair, changed) = c
        .kv_get(
            "b",
            QueryOptions::blocking(meta.index, Duration::from_secs(60)),
        )
        .unwrap();
    writer.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(30));
    assert!(changed.index > meta.index);
    assert_eq!(pair.unwrap().value_bytes(), b"2");
}
