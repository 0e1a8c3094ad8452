//! HTTPS to an agent whose certificate names only a DNS name: --tls-server-name and
//! CONSUL_TLS_SERVER_NAME (issue 14). A rustls front relays to the dev server; its
//! certificate (tests/fixtures/tls, CA-signed, SAN DNS:consul.test only) was made with
//! openssl and is valid until 2126.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::common::start_server;
use crate::harness::*;

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/tls/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A TLS front for `backend`; returns its address and the SNI names clients sent.
fn tls_front(backend: SocketAddr) -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(fixture("server.pem"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(fixture("server.key")).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let names = Arc::new(Mutex::new(Vec::new()));
    let seen = names.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (cfg, seen) = (config.clone(), seen.clone());
            std::thread::spawn(move || relay(stream, cfg, backend, seen));
        }
    });
    (addr, names)
}

fn relay(
    client: TcpStream,
    cfg: Arc<rustls::ServerConfig>,
    backend: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
) {
    let conn = Arc::new(Mutex::new(rustls::ServerConnection::new(cfg).unwrap()));
    let Ok(back) = TcpStream::connect(backend) else {
        return;
    };
    let (mut client_r, client_w) = (client.try_clone().unwrap(), client);
    let (mut back_r, mut back_w) = (back.try_clone().unwrap(), back);
    let client_w = Arc::new(Mutex::new(client_w));
    let flush = |c: &mut rustls::ServerConnection, w: &Mutex<TcpStream>| {
        let mut w = w.lock().unwrap();
        while c.wants_write() {
            if c.write_tls(&mut *w).is_err() {
                break;
            }
        }
    };
    // Backend to client.
    let (conn2, cw2) = (conn.clone(), client_w.clone());
    let down = std::thread::spawn(move || {
        let mut buf = [0u8; 16384];
        while let Ok(n) = back_r.read(&mut buf) {
            if n == 0 {
                break;
            }
            let mut c = conn2.lock().unwrap();
            if c.writer().write_all(&buf[..n]).is_err() {
                break;
            }
            flush(&mut c, &cw2);
        }
        let mut c = conn2.lock().unwrap();
        c.send_close_notify();
        flush(&mut c, &cw2);
        let _ = cw2.lock().unwrap().shutdown(Shutdown::Write);
    });
    // Client to backend.
    let mut buf = [0u8; 16384];
    'outer: while let Ok(n) = client_r.read(&mut buf) {
        if n == 0 {
            break;
        }
        let mut plain = Vec::new();
        {
            let mut c = conn.lock().unwrap();
            let mut rd = &buf[..n];
            while !rd.is_empty() {
                if c.read_tls(&mut rd).is_err() || c.process_new_packets().is_err() {
                    flush(&mut c, &client_w);
                    break 'outer;
                }
            }
            if let Some(name) = c.server_name() {
                let mut s = seen.lock().unwrap();
                if s.last().map(String::as_str) != Some(name) {
                    s.push(name.to_string());
                }
            }
            let mut tmp = [0u8; 16384];
            loop {
                match c.reader().read(&mut tmp) {
                    Ok(0) => break,
                    Ok(k) => plain.extend_from_slice(&tmp[..k]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => break,
                }
            }
            flush(&mut c, &client_w);
        }
        if !plain.is_empty() && back_w.write_all(&plain).is_err() {
            break;
        }
    }
    let _ = back_w.shutdown(Shutdown::Both);
    let _ = down.join();
}

#[test]
fn tls_server_name_checks_the_certificate_name_and_sends_sni() {
    let server = start_server();
    let (front, names) = tls_front(server.addr());
    let https = format!("https://{front}");
    let with = |env: &[(&str, &str)], args: &[&str]| {
        conlock(&server)
            .env("CONSUL_HTTP_ADDR", &https)
            .env("CONSUL_CACERT", fixture("ca.pem"))
            .envs(env.iter().copied())
            .args(args)
            .output()
            .unwrap()
    };
    // The certificate names consul.test, not 127.0.0.1.
    let o = with(&[], &["status", "--key", "k"]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("not valid for name"), "{err}");
    assert!(
        err.contains("--tls-server-name or CONSUL_TLS_SERVER_NAME"),
        "{err}"
    );

    let o = with(
        &[],
        &["status", "--key", "k", "--tls-server-name", "consul.test"],
    );
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = with(
        &[("CONSUL_TLS_SERVER_NAME", "consul.test")],
        &["run", "--key", "tls/k", "--", "true"],
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // A job that lasts until the monitor's blocking query is in: the monitor's own
    // connections reach the agent by the same name.
    let go = scratch("tls-monitor").join("go");
    let mut kid = conlock(&server)
        .env("CONSUL_HTTP_ADDR", &https)
        .env("CONSUL_CACERT", fixture("ca.pem"))
        .env("CONSUL_TLS_SERVER_NAME", "consul.test")
        .args(["run", "--key", "tls/monitored", "--", "sh", "-c"])
        .arg(until_exists(&go))
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(60), || server.blocking_count() >= 1),
        "the monitor's query never reached the agent"
    );
    std::fs::write(&go, "").unwrap();
    assert!(wait_exit(&mut kid, Duration::from_secs(60)).success());
    assert!(
        names.lock().unwrap().iter().all(|n| n == "consul.test")
            && !names.lock().unwrap().is_empty(),
        "SNI sent: {:?}",
        names.lock().unwrap()
    );
    // The name is checked, not just sent.
    let o = with(
        &[("CONSUL_TLS_SERVER_NAME", "other.test")],
        &["status", "--key", "k"],
    );
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not valid for name"));
}

/// conlock SIGKILLed while it holds over TLS with a server name: its guardian releases the
/// lock at once. The guardian builds its client from the settings conlock was given; it
/// was handed the URL already rewritten to the server name, whose resolver then looked up
/// that name (consul.test does not resolve) and the lock waited for the TTL and lock-delay.
#[test]
fn guardian_releases_over_tls_with_a_server_name() {
    let server = start_server();
    let (front, _) = tls_front(server.addr());
    let dir = scratch("tls-guardian");
    let pidfile = dir.join("pid");
    let mut h = conlock(&server)
        .env("CONSUL_HTTP_ADDR", format!("https://{front}"))
        .env("CONSUL_CACERT", fixture("ca.pem"))
        .env("CONSUL_TLS_SERVER_NAME", "consul.test")
        .args([
            "run",
            "--key",
            "tls/guarded",
            "--ttl",
            "3600s",
            "--lock-delay",
            "60s",
        ])
        .args(["--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 600", pidfile.display()))
        .spawn()
        .unwrap();
    let c = client(&server);
    assert!(
        wait_for(Duration::from_secs(60), || read(&pidfile)
            .trim()
            .parse::<i32>()
            .is_ok()),
        "the command never started"
    );
    let child: i32 = read(&pidfile).trim().parse().unwrap();
    assert!(holder(&c, "tls/guarded").is_some());
    signal(h.id(), libc::SIGKILL);
    wait_exit(&mut h, Duration::from_secs(60));
    assert!(
        wait_for(Duration::from_secs(60), || !process_alive(child)),
        "the command survived conlock's SIGKILL"
    );
    assert!(
        wait_for(Duration::from_secs(30), || holder(&c, "tls/guarded")
            .is_none()
            && c.session_list(conlock::consul::QueryOptions::default())
                .unwrap()
                .0
                .is_empty()),
        "the guardian did not release the lock and destroy the session"
    );
}
