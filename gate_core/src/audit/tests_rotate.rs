//! Rotation by size: the segments and the live file read as one chain, whoever wrote and
//! whichever writer rotated; a full disk during a rotation writes nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::chain::{genesis, hash, hex};
use super::rotate::{segment_path, segments, staging_path};
use super::tests::Tmpfs;
use super::{AuditError, AuditLog, NoteKey, Rotation};

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gw-rotate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir(&d).expect("mkdir");
    d
}

fn rotating(path: &Path, keydir: &Path, max_size: u64, keep: Option<usize>) -> AuditLog {
    let key = NoteKey::load_or_create(&keydir.join("audit-key")).expect("key");
    AuditLog::open(path)
        .expect("open")
        .with_checkpoints(key, 0, Duration::from_secs(3600))
        .with_rotation(Rotation { max_size, keep })
}

/// The files of the log, oldest first: its segments, then the live file.
fn files(path: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = segments(path).expect("segments").into_iter().map(|(_, p)| p).collect();
    out.push(path.to_path_buf());
    out
}

/// Every line of the log's files, checked as one chain from `seq` 1 and genesis; each
/// segment's first line (but the first's) an opening checkpoint naming the segment before
/// it, and each segment named for its first `seq`.
fn check_chain(path: &Path) -> Vec<Value> {
    let mut prev = genesis();
    let mut out: Vec<Value> = Vec::new();
    let mut before: Option<String> = None;
    for f in files(path) {
        let bytes = std::fs::read(&f).expect("read");
        for (i, line) in bytes.split_inclusive(|&b| b == b'\n').enumerate() {
            assert!(line.ends_with(b"\n"), "{}: line {} whole", f.display(), i + 1);
            let v: Value = serde_json::from_slice(line).expect("json");
            let seq = out.len() as u64 + 1;
            assert_eq!(v["seq"], json!(seq), "{}: line {} seq", f.display(), i + 1);
            assert_eq!(v["prev"], json!(hex(&prev)), "{}: line {} prev", f.display(), i + 1);
            if i == 0 {
                if f != path {
                    assert_eq!(f, segment_path(path, seq), "a segment is named for its first seq");
                }
                match &before {
                    Some(name) => {
                        assert_eq!((v["event"].as_str(), v["rotated_from"].as_str()), (Some("checkpoint"), Some(name.as_str())));
                        assert_eq!(v["size"], json!(seq - 1));
                        let note = v["note"].as_str().expect("a note");
                        let signed = note.split("\n\n").next().expect("a body");
                        assert!(signed.ends_with(&format!("\nrotated_from {name}")), "the link is in the signed text: {note:?}");
                    }
                    None => assert!(v.get("rotated_from").is_none() && !v["note"].as_str().unwrap_or("").contains("rotated_from")),
                }
            }
            prev = hash(line);
            out.push(v);
        }
        if f != path {
            assert_eq!(out.last().expect("a segment is never empty")["event"], json!("checkpoint"), "a segment ends in a checkpoint");
            before = Some(f.file_name().expect("name").to_string_lossy().into_owned());
        }
    }
    out
}

#[test]
fn rotation_keeps_one_chain_across_the_segments() {
    let dir = scratch("chain");
    let path = dir.join("audit.jsonl");
    let log = rotating(&path, &dir.join("key"), 8192, None);
    for i in 0..200 {
        log.write(obj(json!({"run": "gw-1", "event": "request", "i": i, "pad": "p".repeat(i % 300)}))).expect("write");
    }
    let segs = segments(&path).expect("segments");
    assert!(segs.len() >= 3, "rotated: {segs:?}");
    for (_, p) in &segs {
        let len = std::fs::metadata(p).expect("stat").len();
        // A segment ends at the first record that would take it past the limit, plus its closing checkpoint.
        assert!(len <= 8192 + 1024, "{} is {len} bytes", p.display());
    }
    let recs = check_chain(&path);
    let mine: Vec<u64> = recs.iter().filter(|r| r["event"] == json!("request")).map(|r| r["i"].as_u64().unwrap()).collect();
    assert_eq!(mine, (0..200).collect::<Vec<_>>(), "every record once, in order");
    assert!(!staging_path(&path).exists(), "no staged file left");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn concurrent_writers_crossing_rotations_keep_one_chain() {
    let dir = scratch("writers");
    let path = dir.join("audit.jsonl");
    let keydir = dir.join("key");
    NoteKey::load_or_create(&keydir.join("audit-key")).expect("key");
    // Each handle has its own descriptor, as separate processes do: a writer that waited
    // for the lock on a file another one rotated away must follow the path.
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let (path, keydir) = (path.clone(), keydir.clone());
            std::thread::spawn(move || {
                let log = rotating(&path, &keydir, 16384, None);
                for i in 0..150 {
                    log.write(obj(json!({"run": "gw-1", "event": "request", "t": t, "i": i, "pad": "x".repeat((i * 97) % 900)})))
                        .expect("write");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer");
    }
    let recs = check_chain(&path);
    let mut seen: Vec<(u64, u64)> = recs
        .iter()
        .filter(|r| r["event"] == json!("request"))
        .map(|r| (r["t"].as_u64().unwrap(), r["i"].as_u64().unwrap()))
        .collect();
    seen.sort();
    let want: Vec<(u64, u64)> = (0..6).flat_map(|t| (0..150).map(move |i| (t, i))).collect();
    assert_eq!(seen, want, "every record once, none in a file the path no longer names");
    assert!(segments(&path).expect("segments").len() >= 5);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_writer_on_a_rotated_away_descriptor_follows_the_path() {
    let dir = scratch("follow");
    let path = dir.join("audit.jsonl");
    let a = rotating(&path, &dir.join("key"), 4096, None);
    let b = rotating(&path, &dir.join("key"), 4096, None);
    b.write(obj(json!({"run": "gw-b", "event": "request", "i": 0}))).expect("b");
    for i in 0..40 {
        a.write(obj(json!({"run": "gw-a", "event": "request", "i": i, "pad": "a".repeat(200)}))).expect("a");
    }
    assert!(!segments(&path).expect("segments").is_empty(), "a rotated");
    b.write(obj(json!({"run": "gw-b", "event": "request", "i": 1}))).expect("b");
    let recs = check_chain(&path);
    let live = std::fs::read_to_string(&path).expect("read");
    assert!(live.lines().last().unwrap().contains("\"gw-b\""), "b's record is in the live file");
    assert_eq!(recs.iter().filter(|r| r["run"] == json!("gw-b")).count(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn keep_deletes_the_oldest_segments() {
    let dir = scratch("keep");
    let path = dir.join("audit.jsonl");
    let log = rotating(&path, &dir.join("key"), 4096, Some(2));
    for i in 0..200 {
        log.write(obj(json!({"run": "gw-1", "event": "request", "i": i, "pad": "k".repeat(100)}))).expect("write");
    }
    let segs = segments(&path).expect("segments");
    assert_eq!(segs.len(), 2, "{segs:?}");
    // What is left still joins: the newer segment and the live file continue the older one.
    let first = std::fs::read_to_string(&segs[1].1).expect("read");
    let live = std::fs::read_to_string(&path).expect("read");
    let v: Value = serde_json::from_str(live.lines().next().unwrap()).expect("json");
    let last = first.split_inclusive('\n').next_back().unwrap();
    assert_eq!(v["prev"], json!(hex(&hash(last.as_bytes()))));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_disk_during_a_rotation_writes_nothing_and_the_next_write_rotates() {
    let dir = scratch("full");
    let fs = Tmpfs::mount(&dir, 256 * 1024);
    let path = dir.join("audit.jsonl");
    let log = rotating(&path, &dir.join("key"), 8192, None);
    let mut i = 0;
    while std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) < 7000 {
        log.write(obj(json!({"run": "gw-1", "event": "request", "i": i, "pad": "f".repeat(500)}))).expect("write");
        i += 1;
    }
    // Fill the file system: the live file's last page has room left, a new file has none.
    let filler = dir.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).expect("filler");
        let block = vec![b'f'; 4096];
        while f.write_all(&block).is_ok() {}
        while f.write_all(b"f").is_ok() {}
    }
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).expect("stat"));
    let before = ino(&path);
    let big = "b".repeat(2000); // past the limit: this record calls for a rotation
    let err = log.write(obj(json!({"run": "gw-1", "event": "request", "i": "big", "pad": big}))).expect_err("no room");
    assert_eq!(err.io().and_then(|e| e.raw_os_error()), Some(libc::ENOSPC), "{err}");
    assert!(matches!(err, AuditError::Write { .. }), "{err}");
    assert_eq!(ino(&path), before, "the log at the path is the old file");
    assert!(segments(&path).expect("segments").is_empty() && !staging_path(&path).exists(), "no segment, nothing staged");
    let text = std::fs::read_to_string(&path).expect("read");
    assert!(!text.contains("\"big\""), "the record was not written");
    std::fs::remove_file(&filler).expect("free space");
    log.write(obj(json!({"run": "gw-1", "event": "request", "i": "big", "pad": big}))).expect("writes pass again");
    assert_eq!(segments(&path).expect("segments").len(), 1, "and the log rotated");
    let recs = check_chain(&path);
    assert_eq!(recs.iter().filter(|r| r["i"] == json!("big")).count(), 1);
    drop(log);
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn segment_names_are_the_logs_and_sort_as_the_chain() {
    use super::rotate::segment_seq;
    let p = Path::new("/var/log/gatewrap/audit.jsonl");
    assert_eq!(segment_path(p, 5001), PathBuf::from("/var/log/gatewrap/audit.jsonl.000000005001"));
    assert_eq!(segment_seq("audit.jsonl", "audit.jsonl.000000005001"), Some(5001));
    assert_eq!(segment_seq("audit.jsonl", "audit.jsonl.1"), None, "logrotate's numbering is not ours");
    assert_eq!(segment_seq("audit.jsonl", "audit.jsonl.00000000000x"), None);
    assert_eq!(segment_seq("audit.jsonl", "other.jsonl.000000005001"), None);
    assert_eq!(segment_seq("audit.jsonl", "audit.jsonl.1234567890123"), Some(1234567890123), "more digits past 10^12");
}
