//! The hash chain and its checkpoints, checked by recomputing them from the file's bytes.

use std::sync::Arc;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use serde_json::{json, Map, Value};

use super::chain::{genesis, hash, hex};
use super::{AuditLog, NoteKey};

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

pub(super) fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("gw-chain-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).expect("mkdir");
    d
}

/// The lines of `path` with their newlines, checked as one chain from genesis: each
/// `seq` one more than the last, each `prev` the hash of the line before.
pub(super) fn check_chain(path: &std::path::Path) -> Vec<Value> {
    let bytes = std::fs::read(path).expect("read");
    let mut prev = genesis();
    let mut out = Vec::new();
    for (i, line) in bytes.split_inclusive(|&b| b == b'\n').enumerate() {
        assert!(line.ends_with(b"\n"), "line {} whole", i + 1);
        let v: Value = serde_json::from_slice(line).expect("json");
        assert_eq!(v["seq"], json!(i as u64 + 1), "line {} seq", i + 1);
        assert_eq!(v["prev"], json!(hex(&prev)), "line {} prev", i + 1);
        prev = hash(line);
        out.push(v);
    }
    out
}

#[test]
fn writers_on_separate_handles_keep_one_chain() {
    let dir = scratch("writers");
    let path = dir.join("audit.jsonl");
    // Each handle has its own descriptor and state, as separate processes do: only the
    // flock and the file's last line tie them together.
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                let log = AuditLog::open(&path).expect("open");
                for i in 0..150 {
                    let pad = "x".repeat((i * 97) % 9000);
                    log.write(obj(json!({"t": t, "i": i, "pad": pad}))).expect("write");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer");
    }
    assert_eq!(check_chain(&path).len(), 900);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A writer remembers the head it wrote last and reads the file back only when the file's
/// length changed: with two handles taking turns (each finds the other's record), one
/// writing several in a row (it finds its own), checkpoints in between, and a record
/// appended behind both handles' backs by a plain write, the file stays one chain.
#[test]
fn a_writer_that_remembers_its_head_still_follows_every_other_writer() {
    let dir = scratch("remembered");
    let path = dir.join("audit.jsonl");
    let key = NoteKey::load_or_create(&dir.join("key").join("audit-key")).expect("key");
    let a = AuditLog::open(&path).expect("open").with_checkpoints(key, 4, Duration::from_secs(3600));
    let b = AuditLog::open(&path).expect("open");
    for i in 0..10 {
        a.write(obj(json!({"w": "a", "i": i}))).expect("write");
        if i % 3 == 0 {
            b.write(obj(json!({"w": "b", "i": i}))).expect("write");
        }
    }
    // Another writer of the same format (e.g. after a crash of this one), not through a handle.
    let lines = check_chain(&path);
    let bytes = std::fs::read(&path).expect("read");
    let last = bytes[..bytes.len() - 1].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let rec = format!("{{\"v\":1,\"time\":\"t\",\"seq\":{},\"prev\":\"{}\",\"w\":\"raw\"}}\n", lines.len() + 1, hex(&hash(&bytes[last..])));
    std::io::Write::write_all(&mut std::fs::OpenOptions::new().append(true).open(&path).expect("open"), rec.as_bytes()).expect("append");
    a.write(obj(json!({"w": "a", "i": "after"}))).expect("write");
    let lines = check_chain(&path);
    assert_eq!(lines.iter().filter(|v| v["w"] == json!("raw")).count(), 1);
    assert_eq!(lines.last().map(|v| v["i"].clone()), Some(json!("after")));
    assert!(lines.iter().any(|v| v["event"] == json!("checkpoint")), "checkpoints were written");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_log_begun_before_the_chain_is_continued_from_its_last_line() {
    let dir = scratch("legacy");
    let path = dir.join("audit.jsonl");
    let old = "{\"v\":1,\"time\":\"T\",\"event\":\"run_end\"}\n";
    std::fs::write(&path, old).expect("write");
    AuditLog::open(&path).expect("open").write(obj(json!({"event": "x"}))).expect("write");
    let text = std::fs::read_to_string(&path).expect("read");
    let v: Value = serde_json::from_str(text.lines().nth(1).expect("2 lines")).expect("json");
    assert_eq!(v["seq"], 1, "a new chain starts");
    assert_eq!(v["prev"], json!(hex(&hash(old.as_bytes()))), "linked to the last unchained line");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Verify a checkpoint record's note with `vk` and return (origin, size, root).
fn open_note(rec: &Value, vk: &VerifyingKey, name: &str) -> (String, u64, [u8; 32]) {
    let note = rec["note"].as_str().expect("note");
    let (body, sigs) = note.split_once("\n\n").expect("blank line");
    let body = format!("{body}\n");
    let sig_line = sigs.strip_suffix('\n').expect("ends in newline");
    let rest = sig_line.strip_prefix("\u{2014} ").expect("em dash");
    let (who, b64) = rest.split_once(' ').expect("name and signature");
    assert_eq!(who, name);
    let raw = B64.decode(b64).expect("base64");
    let sig = Signature::from_slice(&raw[4..]).expect("64 bytes");
    vk.verify(body.as_bytes(), &sig).expect("signature verifies");
    let mut lines = body.lines();
    let origin = lines.next().expect("origin").to_string();
    let size = lines.next().expect("size").parse().expect("number");
    let root = B64.decode(lines.next().expect("root")).expect("base64").try_into().expect("32 bytes");
    (origin, size, root)
}

#[test]
fn checkpoints_every_n_records_and_on_demand_sign_the_chain_head() {
    let dir = scratch("checkpoints");
    let keydir = dir.join("key");
    let key = NoteKey::load_or_create(&keydir.join("audit-key")).expect("key");
    let name = key.name().to_string();
    let verifier = key.verifier();
    let again = NoteKey::load_or_create(&keydir.join("audit-key")).expect("key");
    assert_eq!(again.verifier(), verifier, "the key is made once and reused");
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!((mode(&keydir), mode(&keydir.join("audit-key"))), (0o700, 0o600));
    let parts: Vec<&str> = verifier.splitn(3, '+').collect();
    assert_eq!(parts.len(), 3, "name+id+key: {verifier}");
    let raw = B64.decode(parts[2]).expect("base64");
    assert_eq!(raw[0], 1, "Ed25519");
    let vk = VerifyingKey::from_bytes(&raw[1..].try_into().expect("32 bytes")).expect("key");

    let path = dir.join("audit.jsonl");
    let log = Arc::new(AuditLog::open(&path).expect("open").with_checkpoints(key, 10, Duration::from_secs(3600)));
    for i in 0..25 {
        log.write(obj(json!({"event": "x", "i": i}))).expect("write");
    }
    log.checkpoint().expect("checkpoint");
    log.checkpoint().expect("a second one right after is skipped");
    let recs = check_chain(&path);
    let cps: Vec<(usize, &Value)> = recs.iter().enumerate().filter(|(_, r)| r["event"] == "checkpoint").collect();
    // After the records of seq 10 and 20 (checkpoints count in seq), and the final one.
    assert_eq!(cps.iter().map(|(i, _)| i + 1).collect::<Vec<_>>(), vec![11, 21, 28], "{recs:#?}");
    let bytes = std::fs::read(&path).expect("read");
    let lines: Vec<&[u8]> = bytes.split_inclusive(|&b| b == b'\n').collect();
    for (i, rec) in cps {
        let (origin, size, root) = open_note(rec, &vk, &name);
        assert_eq!(origin, name);
        assert_eq!(size, i as u64, "size: the records before it");
        assert_eq!(rec["size"], json!(size));
        assert_eq!(root, hash(lines[i - 1]), "root: the chain head");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hostile_strings_give_one_escaped_line_each() {
    let dir = scratch("hostile");
    let path = dir.join("audit.jsonl");
    let log = AuditLog::open(&path).expect("open");
    let c0: String = (0u8..0x20).map(char::from).collect();
    let c1: String = (0x7fu32..0xa0).filter_map(char::from_u32).collect();
    let table = [
        c0.clone(),
        c1.clone(),
        format!("\u{9b}2J\u{1b}]0;title\u{7}{c0}{c1}"),
        "n".repeat(64 * 1024),
        format!("{}\u{9b}", "é".repeat(40 * 1024)),
        "\u{fffd}\u{2028}\u{2029}".into(),
    ];
    for (i, s) in table.iter().enumerate() {
        log.write(obj(json!({"event": "x", "i": i, "comm": s, s.clone(): 1}))).expect("write");
    }
    let bytes = std::fs::read(&path).expect("read");
    assert!(!bytes.iter().any(|&b| b < 0x20 && b != b'\n' || b == 0x7f), "no raw C0 or DEL");
    let text = String::from_utf8(bytes).expect("utf-8");
    assert!(!text.chars().any(|c| ('\u{80}'..='\u{9f}').contains(&c)), "no raw C1");
    let recs = check_chain(&path);
    assert_eq!(recs.len(), table.len(), "one line per record");
    for (i, s) in table.iter().enumerate().take(3) {
        assert_eq!(recs[i]["comm"], json!(s), "record {i} round-trips");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hex_is_lowercase_two_digits_a_byte() {
    let h: [u8; 32] = std::array::from_fn(|i| (i * 37 + 5) as u8);
    let want: String = h.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex(&h), want);
    assert_eq!(hex(&[0u8; 32]), "0".repeat(64));
}
