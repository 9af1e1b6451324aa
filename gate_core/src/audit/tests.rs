use std::io::Read;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::{format_time, line, AuditError, AuditLog, GateRecord};

/// What [`line`] puts after `v` and `time`, for `chain::place` to fill in.
const PH: &str = ",\"seq\":18446744073709551615,\"prev\":\"0000000000000000000000000000000000000000000000000000000000000000\"";

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
    assert_eq!(l, format!("{{\"v\":1,\"time\":\"T\"{PH},\"zeta\":1,\"alpha\":\"x\",\"mid\":[1,2.5,null,true],\"nested\":{{\"b\":1,\"a\":2}}}}\n"));
}

#[test]
fn control_characters_are_escaped() {
    let l = line("T", obj(json!({"cmdline": "a\nb\r\u{1b}[31m\u{0}\"\\"}))).expect("line");
    assert_eq!(l, format!("{{\"v\":1,\"time\":\"T\"{PH},\"cmdline\":\"a\\nb\\r\\u001b[31m\\u0000\\\"\\\\\"}}\n"));
    assert_eq!(l.matches('\n').count(), 1, "exactly one newline, at the end");
}

#[test]
fn reserved_keys_are_refused() {
    for key in ["v", "time", "seq", "prev"] {
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
        format!("{{\"v\":1,\"time\":\"T\"{PH},\"run\":\"gw-1\",\"event\":\"connect\",\"decision\":\"denied\",\"reason\":\"policy: default deny\",\"dst_host\":\"x.test\",\"dst_port\":443,\"proto\":\"connect\",\"status\":403}}\n")
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

/// A fresh directory under /tmp (sticky, root's), removed by the caller.
fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("gw-audit-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).expect("mkdir");
    d
}

#[test]
fn a_long_record_is_cut_to_the_cap_and_names_what_was_cut() {
    use super::MAX_RECORD;
    let table: &[(&str, Value, &[&str])] = &[
        ("one long string is cut", json!({"run": "gw-1", "event": "request", "target": "x".repeat(40_000), "method": "GET"}), &["target"]),
        ("long strings in a list are cut", json!({"run": "gw-1", "event": "run_start", "argv": vec!["y".repeat(9000); 4]}), &["argv"]),
        ("a list of many short strings is dropped", json!({"run": "gw-1", "event": "run_start", "argv": vec!["z"; 8000], "uid": 0}), &["argv"]),
    ];
    for (case, rec, want) in table {
        let l = line("T", obj(rec.clone())).expect("line");
        assert!(l.len() <= MAX_RECORD, "{case}: {} bytes", l.len());
        assert!(l.ends_with('\n') && l.matches('\n').count() == 1, "{case}");
        let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(v["truncated"], json!(want), "{case}");
        assert_eq!((&v["run"], &v["event"]), (&rec["run"], &rec["event"]), "{case}: the identity fields stay");
    }
    let l = line("T", obj(json!({"run": "gw-1", "method": "GET", "target": "é".repeat(10_000)}))).expect("line");
    let v: Value = serde_json::from_str(&l).expect("json");
    let target = v["target"].as_str().expect("a string still");
    assert!(target.ends_with('…') && target.len() < 10_000, "cut on a character boundary, marked");
    assert_eq!(v["method"], "GET");
    let short = line("T", obj(json!({"run": "gw-1", "target": "a".repeat(1000)}))).expect("line");
    assert!(!short.contains("truncated"), "a record under the cap is left whole");
    let keys: Map<String, Value> = (0..2000).map(|i| (format!("key-{i:04}-{}", "k".repeat(20)), Value::from(1))).collect();
    let mut many = obj(json!({"run": "gw-1", "event": "x"}));
    many.extend(keys);
    let l = line("T", many).expect("line");
    let v: Value = serde_json::from_str(&l).expect("json");
    assert!(l.len() <= MAX_RECORD);
    assert_eq!((v["truncated"].clone(), v["run"].clone()), (json!(["*"]), json!("gw-1")), "keys alone too long: the identity is kept");
}

/// Mounts a tmpfs of `size` bytes at `dir` (mode 0755) for the test; unmounted on drop.
pub(super) struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    pub(super) fn mount(dir: &std::path::Path, size: usize) -> Tmpfs {
        use std::ffi::CString;
        let target = CString::new(dir.as_os_str().as_encoded_bytes()).expect("path");
        let opts = CString::new(format!("size={size},mode=0755")).expect("opts");
        // SAFETY: plain mount(2) with NUL-terminated strings that outlive the call.
        let rc = unsafe { libc::mount(c"tmpfs".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), 0, opts.as_ptr().cast()) };
        assert_eq!(rc, 0, "mount tmpfs (the writer tests run as root): {}", std::io::Error::last_os_error());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        use std::ffi::CString;
        if let Ok(t) = CString::new(self.0.as_os_str().as_encoded_bytes()) {
            // SAFETY: umount2 of the mount this value made.
            unsafe { libc::umount2(t.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

#[test]
fn a_write_the_disk_cannot_take_leaves_no_cut_record_and_the_log_recovers() {
    let dir = scratch("full");
    let fs = Tmpfs::mount(&dir, 64 * 1024);
    let path = dir.join("audit.jsonl");
    let log = AuditLog::open(&path).expect("open");
    // Fill the file system, then free two pages (8192 bytes) for the log: two records of
    // ~3 KB fit, the third is cut by the kernel (a short write, then ENOSPC).
    let filler = dir.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).expect("filler");
        let block = vec![b'f'; 4096];
        while f.write_all(&block).is_ok() {}
        let len = f.metadata().expect("stat").len();
        f.set_len(len - 8192).expect("free two pages");
    }
    let pad = "p".repeat(3000);
    let mut written = 0;
    let err = loop {
        match log.write(obj(json!({"run": "gw-1", "i": written, "pad": pad}))) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 100, "the disk never filled");
    };
    assert_eq!(err.io().and_then(|e| e.raw_os_error()), Some(libc::ENOSPC), "{err}");
    assert!(matches!(err, AuditError::Write { .. }), "undone, not left cut: {err}");
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(text.is_empty() || text.ends_with('\n'), "no cut record at the end");
    assert_eq!(written, 2, "two records fit in two pages");
    assert_eq!(text.lines().count(), written, "every record written whole, no part of the failed one");
    for l in text.lines() {
        serde_json::from_str::<Value>(l).expect("each line is a whole record");
    }
    std::fs::remove_file(&filler).expect("free space");
    log.write(obj(json!({"run": "gw-1", "after": true}))).expect("writes pass again once there is space");
    let text = std::fs::read_to_string(&path).expect("read");
    assert_eq!(text.lines().count(), written + 1);
    drop(log);
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn what_is_not_a_regular_file_in_a_root_directory_is_refused_at_once() {
    let dir = scratch("kinds");
    let fifo = dir.join("fifo.jsonl");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let link = dir.join("link.jsonl");
    std::os::unix::fs::symlink(dir.join("real.jsonl"), &link).expect("symlink");
    let sub = dir.join("subdir.jsonl");
    std::fs::create_dir(&sub).expect("mkdir");
    for (path, what) in [(&fifo, "a FIFO"), (&link, "a symbolic link"), (&sub, "a directory")] {
        let e = AuditLog::open(path).expect_err("refused");
        assert!(matches!(e, AuditError::NotAFile { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains(&path.display().to_string()) && msg.contains(what) && msg.contains("--audit-log"), "{msg}");
    }
    assert!(!dir.join("real.jsonl").exists(), "the link was not followed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_directory_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("open");
    let shared = dir.join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let e = AuditLog::open(shared.join("audit.jsonl")).expect_err("refused");
    assert!(matches!(e, AuditError::Dir(_)), "{e}");
    assert!(e.to_string().contains("writable by others") && e.to_string().contains("--audit-log"), "{e}");
    let below = shared.join("below");
    std::fs::create_dir(&below).expect("mkdir");
    let e = AuditLog::open(below.join("audit.jsonl")).expect_err("refused");
    assert!(e.to_string().contains("(above it)"), "a directory above that others can write: {e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A record with every field the gate sets.
fn full_record() -> GateRecord {
    GateRecord {
        run: "gw-1".into(),
        event: "request",
        decision: "allowed",
        reason: Some("policy: rule r\u{9b}".into()),
        rule: Some("r".into()),
        would: Some("deny"),
        client: Some("127.0.0.1:5".into()),
        client_pid: Some(None),
        client_comm: Some("curl\u{1b}".into()),
        method: Some("GET".into()),
        target: Some("http://x.test/\"q\"".into()),
        dst_host: Some("x.test".into()),
        dst_ip: Some("192.0.2.1".into()),
        dst_port: Some(80),
        proto: "http",
        status: Some(200),
        error: Some("downstream: x".into()),
        bytes_up: Some(3),
        bytes_down: Some(5000),
        duration_ms: Some(1.234),
        inspected: true,
        count: Some(2),
        approval: Some("ap-1".into()),
        grant: Some("gr-1".into()),
        secret: Some("github".into()),
        redacted: Some(1),
    }
}

#[test]
fn a_gate_record_is_written_as_the_line_of_its_map() {
    let rec = full_record();
    let direct = super::gate_line("T", super::record::Fields { rec: &rec, admit: false });
    assert_eq!(direct, line("T", rec.clone().into_map()).expect("line"));
    let mut admit = rec.clone().into_map();
    admit.insert("event".into(), json!("admit"));
    // The keys in the record's order (the gate's admit line had them shuffled: the map's
    // `remove` is a swap_remove).
    for outcome in ["status", "dst_ip", "error", "bytes_up", "bytes_down", "duration_ms", "redacted"] {
        admit.shift_remove(outcome);
    }
    assert_eq!(super::gate_line("T", super::record::Fields { rec: &rec, admit: true }), line("T", admit).expect("line"));
}

#[test]
fn a_gate_record_over_the_cap_is_cut_as_any_record() {
    let rec = GateRecord { target: Some("x".repeat(40_000)), ..full_record() };
    let direct = super::gate_line("T", super::record::Fields { rec: &rec, admit: false });
    assert!(direct.len() <= super::MAX_RECORD);
    assert_eq!(direct, line("T", rec.into_map()).expect("line"));
}

/// CPU time of this process (user + system: the caller's and the audit writer thread's),
/// from getrusage(2) RUSAGE_SELF.
fn thread_cpu() -> std::time::Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| std::time::Duration::from_micros(t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The CPU one allowed request's two records (`admit`, then `request`) cost, written as the
/// gate did before (each a JSON map: `write(rec.into_map())`) and as it does now
/// (`write_gate`), in turn, to a log in DIR
/// (default /tmp/gw-record-cost, made root-only) `GW_AUDIT_DIR=DIR cargo test --release -p gate_core --lib record_cost -- --ignored --nocapture`.
#[test]
#[ignore]
fn record_cost() {
    let dir = std::env::var("GW_AUDIT_DIR").unwrap_or_else(|_| "/tmp/gw-record-cost".into());
    let path = std::path::PathBuf::from(dir).join(format!("gw-record-cost-{}.jsonl", std::process::id()));
    let log = AuditLog::open(&path).expect("open");
    let rec = GateRecord {
        reason: Some("policy: rule bench-policy.toml:rule[1]".into()),
        rule: Some("bench-policy.toml:rule[1]".into()),
        would: None,
        client_pid: Some(None),
        client_comm: None,
        error: None,
        inspected: false,
        count: None,
        approval: None,
        grant: None,
        ..full_record()
    };
    let n = 20_000u32;
    for round in 0..3 {
        let t = thread_cpu();
        for _ in 0..n {
            let mut admit = rec.clone().into_map();
            admit.insert("event".into(), json!("admit"));
            for outcome in ["status", "dst_ip", "error", "bytes_up", "bytes_down", "duration_ms", "redacted"] {
                admit.remove(outcome);
            }
            log.write(admit).expect("write");
            log.write(rec.clone().into_map()).expect("write");
        }
        let maps = (thread_cpu() - t) / n;
        let t = thread_cpu();
        for _ in 0..n {
            log.write_gate(&rec, true).expect("write");
            log.write_gate(&rec, false).expect("write");
        }
        let direct = (thread_cpu() - t) / n;
        println!("round {round}: a request's two records: as maps {maps:?} CPU, straight from the record {direct:?}");
    }
    let _ = std::fs::remove_file(&path);
}
