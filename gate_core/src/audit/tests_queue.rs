//! The writer thread ([`super::queue`]): records queued from many threads land whole, in
//! one exact chain, each caller's in its order; a batch the disk cannot take fails every
//! record in it and leaves no part of it; what is queued is written when the log is dropped;
//! the thread ends when idle and the next record starts another.

use std::sync::Arc;

use serde_json::json;

use super::tests::Tmpfs;
use super::tests_chain::{check_chain as chained, scratch};
use super::{AuditError, AuditLog, GateRecord};

fn rec(run: &str, target: String) -> GateRecord {
    GateRecord { run: run.into(), event: "request", decision: "allowed", proto: "http", target: Some(target), ..GateRecord::default() }
}

#[test]
fn records_queued_from_many_threads_keep_one_exact_chain_and_each_callers_order() {
    let dir = scratch("order");
    let path = dir.join("audit.jsonl");
    let log = Arc::new(AuditLog::open(&path).expect("open"));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || {
                for i in 0..500 {
                    let r = rec(&format!("t{t}"), format!("{i}"));
                    // Waited for (an admit) and not (an outcome), in turn: one order for both.
                    if i % 2 == 0 {
                        log.write_gate(&r, true).expect("write");
                    } else {
                        let _ = log.send_gate(&r, false, false);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    log.sync().expect("sync waits for what is queued");
    let lines = chained(&path);
    assert_eq!(lines.len(), 8 * 500);
    for t in 0..8 {
        let mine: Vec<String> = lines.iter().filter(|v| v["run"] == json!(format!("t{t}"))).map(|v| v["target"].as_str().unwrap().to_string()).collect();
        assert_eq!(mine, (0..500).map(|i| i.to_string()).collect::<Vec<_>>(), "thread {t}'s records in its order");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn what_is_queued_is_written_when_the_log_is_dropped() {
    let dir = scratch("drop");
    let path = dir.join("audit.jsonl");
    let log = AuditLog::open(&path).expect("open");
    for i in 0..3000 {
        let _ = log.send_gate(&rec("gw-1", format!("{i}")), false, false);
    }
    drop(log);
    let lines = chained(&path);
    assert_eq!(lines.len(), 3000, "nobody waited, and none was dropped");
    assert_eq!(lines[2999]["target"], json!("2999"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_batch_the_disk_cannot_take_fails_every_waiting_record_and_leaves_none_of_it() {
    let dir = scratch("full");
    let fs = Tmpfs::mount(&dir, 64 * 1024);
    let path = dir.join("audit.jsonl");
    let log = Arc::new(AuditLog::open(&path).expect("open"));
    log.write_gate(&rec("gw-1", "before".into()), true).expect("a first record");
    let before = std::fs::read(&path).expect("read");
    // Fill the file system: no record fits now.
    let filler = dir.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).expect("filler");
        let block = vec![b'f'; 4096];
        while f.write_all(&block).is_ok() {}
        // The log's page has room left: take it with short records of a handle of its own
        // (what remains is shorter than one of them, and so than any record below).
        let other = AuditLog::open(&path).expect("open");
        while other.write(serde_json::from_value(json!({"run": "filler"})).unwrap()).is_ok() {}
    }
    let filled = std::fs::read(&path).expect("read");
    assert!(filled.starts_with(&before));
    // Many callers at once: their records are queued together and written as batches.
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let log = log.clone();
            std::thread::spawn(move || (0..50).map(|i| log.write_gate(&rec("gw-1", format!("{t}-{i}-{}", "x".repeat(300))), true)).collect::<Vec<_>>())
        })
        .collect();
    let results: Vec<Result<(), AuditError>> = threads.into_iter().flat_map(|t| t.join().expect("thread")).collect();
    for r in &results {
        let e = r.as_ref().expect_err("no record fits: each waiting caller is told");
        assert_eq!(e.io().and_then(|e| e.raw_os_error()), Some(libc::ENOSPC), "{e}");
    }
    assert_eq!(std::fs::read(&path).expect("read"), filled, "nothing of the failed batches remains");
    std::fs::remove_file(&filler).expect("free space");
    log.write_gate(&rec("gw-1", "after".into()), true).expect("writes pass again once there is space");
    let lines = chained(&path);
    assert_eq!(lines.last().unwrap()["target"], json!("after"));
    assert_eq!(lines.iter().filter(|v| v["run"] == json!("gw-1")).count(), 2, "the first and the last record only");
    drop(log);
    drop(fs);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_record_nobody_waits_for_is_written_without_another_one_after_it() {
    let dir = scratch("lazy");
    let path = dir.join("audit.jsonl");
    let log = AuditLog::open(&path).expect("open");
    let _ = log.send_gate(&rec("gw-1", "alone".into()), false, false);
    // Nothing else is queued or waited for, and the log stays open: the writer writes it on
    // its own (the bound below is only how long this test is willing to wait).
    let mut tries = 0;
    while std::fs::read(&path).map(|b| b.is_empty()).unwrap_or(true) {
        assert!(tries < 30_000, "the record was never written");
        std::thread::sleep(std::time::Duration::from_millis(1));
        tries += 1;
    }
    let lines = chained(&path);
    assert_eq!((lines.len(), lines[0]["target"].clone()), (1, json!("alone")));
    drop(log);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_writer_thread_ends_when_idle_and_the_next_record_starts_another_in_the_same_chain() {
    // A daemon with thousands of idle sandboxes, each with a log of its own, holds no writer
    // thread for them (issue 23, target 4); a record after the pause is still chained.
    let dir = scratch("idle");
    let path = dir.join("audit.jsonl");
    let log = AuditLog::open(&path).expect("open");
    log.write_gate(&rec("gw-1", "before".into()), true).expect("first record");
    let finished = |log: &AuditLog| log.writer.lock().unwrap().as_ref().map(|h| h.is_finished());
    assert_eq!(finished(&log), Some(false), "a writer runs while records come");
    std::thread::sleep(super::queue::WRITER_IDLE + std::time::Duration::from_millis(500));
    assert_eq!(finished(&log), Some(true), "the writer ended after WRITER_IDLE without a record");
    log.write_gate(&rec("gw-1", "after".into()), true).expect("a record after the pause");
    assert_eq!(finished(&log), Some(false), "the record started another writer");
    let lines = chained(&path);
    let targets: Vec<_> = lines.iter().map(|v| v["target"].clone()).collect();
    assert_eq!(targets, vec![json!("before"), json!("after")]);
    drop(log);
    let _ = std::fs::remove_dir_all(&dir);
}
