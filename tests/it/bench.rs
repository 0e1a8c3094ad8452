//! bench/bench.py's comparison mode, run against the dev server with the stand-in for
//! `consul lock` in tests/fixtures (real Consul is not installable here).

use std::path::Path;
use std::process::Command;

use crate::harness::*;

#[test]
fn bench_compares_with_a_consul_lock_stand_in() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = scratch("bench").join("results.json");
    let run = Command::new("python3")
        .arg(root.join("bench/bench.py"))
        .args(["--bin", BIN.path(), "--quick", "--only", "1,2,4"])
        .arg("--compare-consul-lock")
        .arg(root.join("tests/fixtures/fake-consul-lock"))
        .arg("--out")
        .arg(&out)
        .env("CONLOCK_BIN", BIN)
        .env("FAKE_CONSUL_LOCK_DELAY", "1s")
        .output()
        .expect("python3 runs bench/bench.py");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "bench failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("results written to {}", out.display())),
        "{stdout}"
    );
    assert!(!stderr.contains("kill-grace"), "{stderr}");
    let r: serde_json::Value = serde_json::from_str(&read(&out)).unwrap();
    assert_eq!(r["interleaved"], true);
    for tool in ["conlock", "consul-lock"] {
        let t = &r["tools"][tool];
        // The stand-in runs conlock, so both send what conlock sends (see run.rs).
        let reqs = t["1_uncontended"]["requests_per_run"].as_f64().unwrap();
        assert!((6.0..=7.0).contains(&reqs), "{tool}: {reqs} requests");
        assert_eq!(t["1_uncontended"]["runs"], 5, "{tool}");
        assert_eq!(t["2_handoff"]["handoffs"], 30, "{tool}");
        assert_eq!(t["2_handoff_5"]["waiters"], 5, "{tool}");
        assert_eq!(t["2_handoff_5"]["handoffs"], 10, "{tool}");
        assert_eq!(t["2_handoff_1"]["waiters"], 1, "{tool}");
        assert_eq!(t["2_handoff_1"]["handoffs"], 10, "{tool}");
        let f = &t["4_failover"];
        assert_eq!(f["runs"], 2, "{tool}");
        // conlock was given the lock-delay and TTL seen in the stand-in's session.
        assert_eq!(f["lock_delay_s"], 1.0, "{tool}");
        assert_eq!(f["ttl_s"], 15.0, "{tool}");
        let p50 = f["p50_ms"].as_f64().unwrap();
        assert!(p50 > 0.0 && p50 < 30_000.0, "{tool}: failover {p50} ms");
    }
    // The protocol floor (bench/floor.c) is measured wherever a C compiler is.
    let cc = Command::new("cc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let floor = &r["tools"]["conlock"]["1_uncontended"]["protocol_floor_ms_p50"];
    if cc {
        assert!(floor.as_f64().is_some_and(|ms| ms > 0.0), "{floor}");
    }
    // The table has a ratio column.
    assert!(stdout.contains("ratio"), "{stdout}");
}
