use std::io::Read;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::{format_time, line, AuditError, AuditLog, GateRecord};

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

#[test]
fn time_has_microseconds_and_z() {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(1_795_943_802_123_456_789).expect("valid");
    assert_eq!(format_time(t), "2026-11-29T09:16:42.123456Z");
    let zero = time::OffsetDateTime::from_unix_timestamp(0).expect("valid");
    assert_eq!(format_time(zero), "1970-01-01T00:00:00.000000Z");
}

#[test]
fn line_puts_v_and_time_first_and_keeps_order() {
    let rec = obj(json!({"zeta": 1, "alpha": "x", "mid": [1, 2.5, null, true], "nested": {"b": 1, "a": 2}}));
    let l = line("T", rec).expect("line");
    assert_eq!(l, "{\"v\":1,\"time\":\"T\",\"zeta\":1,\"alpha\":\"x\",\"mid\":[1,2.5,null,true],\"nested\":{\"b\":1,\"a\":2}}\n");
}

#[test]
fn control_characters_are_escaped() {
    let l = line("T", obj(json!({"cmdline": "a\nb\r\u{1b}[31m\u{0}\"\\"}))).expect("line");
    assert_eq!(l, "{\"v\":1,\"time\":\"T\",\"cmdline\":\"a\\nb\\r\\u001b[31m\\u0000\\\"\\\\\"}\n");
    assert_eq!(l.matches('\n').count(), 1, "exactly one newline, at the end");
}

#[test]
fn reserved_keys_are_refused() {
    for key in ["v", "time"] {
        let mut m = Map::new();
        m.insert(key.into(), json!(2));
        assert!(matches!(line("T", m), Err(AuditError::Reserved(k)) if k == key));
    }
}

#[test]
fn gate_record_omits_unknown_fields() {
    let rec = GateRecord {
        run: "gw-1".into(),
        event: "connect",
        decision: "denied",
        reason: Some("policy: default deny".into()),
        dst_host: Some("x.test".into()),
        dst_port: Some(443),
        proto: "connect",
        status: Some(403),
        ..GateRecord::default()
    };
    let l = line("T", rec.into_map()).expect("line");
    assert_eq!(
        l,
        "{\"v\":1,\"time\":\"T\",\"run\":\"gw-1\",\"event\":\"connect\",\"decision\":\"denied\",\"reason\":\"policy: default deny\",\"dst_host\":\"x.test\",\"dst_port\":443,\"proto\":\"connect\",\"status\":403}\n"
    );
}

#[test]
fn concurrent_writers_never_interleave() {
    let dir = std::env::temp_dir().join(format!("gw-audit-test-{}", std::process::id()));
    let path = dir.join("sub/audit.jsonl");
    let _ = std::fs::remove_dir_all(&dir);
    let log = Arc::new(AuditLog::open(&path).expect("open"));
    let big = "x".repeat(8000);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let log = log.clone();
            let big = big.clone();
            std::thread::spawn(move || {
                for i in 0..200 {
                    log.write(obj(json!({"t": t, "i": i, "pad": big}))).expect("write");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer thread");
    }
    // A second handle on the same file appends too (the Python side and the gate share one).
    let other = AuditLog::open(&path).expect("reopen");
    other.write(obj(json!({"last": true}))).expect("write");
    other.sync().expect("sync");
    let mut text = String::new();
    std::fs::File::open(&path).and_then(|mut f| f.read_to_string(&mut text)).expect("read");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 801);
    for l in &lines {
        let v: Value = serde_json::from_str(l).expect("each line is one JSON object");
        assert_eq!(v["v"], 1);
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777).unwrap_or(0);
    assert_eq!(mode(&path), 0o640 & !umask());
    assert_eq!(mode(&dir.join("sub")), 0o750 & !umask());
    let _ = std::fs::remove_dir_all(&dir);
}

fn umask() -> u32 {
    // SAFETY: umask is set and immediately restored.
    unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old as u32
    }
}
