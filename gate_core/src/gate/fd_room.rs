//! The gate's share of its process's file descriptors when they run short.
//!
//! A run's bounds ([`super::MAX_CONNECTIONS`], [`super::MAX_HALF_CLOSED`], a tunnel's two
//! sockets and two pipes) are per run, but the shared daemon's open-file limit is one for
//! all its runs: a run that held a thousand connections took the daemon's last descriptors,
//! and every other run's gate then failed accept(2) with EMFILE (its requests waited
//! unanswered and unrecorded). When the process has no more than a reserve of descriptors
//! left, a run holding [`FAIR_SHARE`] connections or more gets no more (the connection just
//! accepted is closed at once and the refusal audited), so the rest stays for the runs that
//! hold few; what its connections would open next is refused it the same way: a lookup's
//! or an upstream socket before the lookup and again before the dial (`guard::vetted`:
//! 503), a tunnel's two pipes when it opens (`connect::tunnel`: its bytes are copied
//! instead of spliced).
//!
//! Every check weighs the descriptors open in the whole process, the gate's and everything
//! else's (Python's, the audit logs, the ring buffers): the kernel's count ([`open_now`]),
//! taken again each millisecond and at every check near the limit, plus what checks let
//! open since (see [`short_now`]); on a kernel before 6.2, which gives no count, the lowest
//! free descriptor stands for it ([`lowest_free`]). They used the lowest free descriptor, which a hole low in
//! the table (a connection just closed) showed as room while the table was nearly full: a
//! run over its share took the hole and, with a tunnel's pipes, the reserve
//! (tests/escape/test_bounds.py).
//!
//! What a check does not see: what the rest of the process opened since a count less than a
//! millisecond old, and descriptors a check let through that were not open yet at a count.
//! The gate's worker threads each may pass one check before the socket it lets through is
//! opened (the dial follows without a wait), and an approved request's lookup starts before
//! its claim (`guard::Early`): a few descriptors of the reserve, not one per connection.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Connections a run may always open, however short of descriptors the process is.
pub const FAIR_SHARE: usize = 64;

/// Descriptors kept free for the runs within their [`FAIR_SHARE`]: an eighth of the
/// process's soft RLIMIT_NOFILE, at least 64 and at most 1,024.
fn reserve(limit: u64) -> u64 {
    (limit / 8).clamp(64, 1024)
}

/// The process's soft RLIMIT_NOFILE (getrlimit(2)), read at each call: another process may
/// change it (prlimit(1)). `None` if it cannot be read or is unlimited.
fn soft_limit() -> Option<u64> {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 || rl.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(rl.rlim_cur as u64)
}

/// How many descriptors this process has open now, whatever their numbers: the size
/// fstat(2) reports for /proc/<pid>/fd, which since Linux 6.2 is the process's count of open
/// files (the kernel's Documentation/filesystems/proc.rst, "/proc/<pid>/fd"; it counts the
/// bits of the descriptor table's open bitmap, so it costs the same at 100 descriptors as at
/// 10,000: ~1.2 µs here, where reading the directory cost ~0.65 µs a descriptor). The
/// directory is opened once (`O_PATH`, one descriptor for the process's life) and again in
/// a child of fork(2), whose table is its own. `None` if /proc cannot be read, or reports 0
/// (a kernel before 6.2: the gate's process always has its listeners open).
pub fn open_now() -> Option<u64> {
    static DIR: OnceLock<Option<(u32, File)>> = OnceLock::new();
    let pid = std::process::id();
    let opened = || {
        use std::os::unix::fs::OpenOptionsExt;
        let mut dir = std::fs::OpenOptions::new();
        dir.read(true).custom_flags(libc::O_PATH | libc::O_DIRECTORY);
        dir.open(format!("/proc/{pid}/fd")).ok().map(|f| (pid, f))
    };
    let fresh;
    let dir = match DIR.get_or_init(opened) {
        Some((owner, f)) if *owner == pid => f,
        _ => {
            fresh = opened()?;
            &fresh.1
        }
    };
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes the struct it is given; the descriptor is open while `dir` lives.
    if unsafe { libc::fstat(dir.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: fstat succeeded, so it filled the struct.
    let open = unsafe { st.assume_init() }.st_size as u64;
    (open > 0).then_some(open)
}

/// The lowest descriptor number not open now, every one below it open (POSIX, open(2): "the
/// lowest-numbered file descriptor not currently open"; /dev/null opened and closed at once):
/// the count on a kernel before 6.2, whose /proc/<pid>/fd reports no size ([`open_now`]).
/// It reads low where a hole is low in the table (a connection just closed), as every check
/// did before the count. `None` if no descriptor could be opened (the process is out).
fn lowest_free() -> Option<u64> {
    // SAFETY: open and close of a descriptor this function owns alone.
    let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened here and is closed once.
    unsafe { libc::close(fd) };
    Some(fd as u64)
}

/// Whether a run holding `held` connections is refused a descriptor when the process has
/// `open` of its soft `limit` open: it holds its [`FAIR_SHARE`] or more, and no more than
/// the [`reserve`] is left (`limit - open`; a connection just accepted is counted in `open`).
fn short_at(open: u64, limit: u64, held: usize) -> bool {
    held >= FAIR_SHARE && open + reserve(limit) >= limit
}

/// The kernel's last count of the process's open descriptors and its soft limit, and the
/// descriptors checks let open since: their sum is an estimate that only errs high for the
/// gate's own (what closed since is not taken off) and does not see the rest of the process
/// (Python's, the audit logs) until the next count.
struct Tally {
    at: Instant,
    open: u64,
    /// `None`: unlimited or unreadable (never short).
    limit: Option<u64>,
    since: u64,
}

impl Tally {
    /// A count now ([`open_now`], or [`lowest_free`] on a kernel before 6.2; [`soft_limit`]);
    /// `None` if neither can be read.
    fn now() -> Option<Tally> {
        let limit = soft_limit();
        let open = if limit.is_some() { open_now().or_else(lowest_free)? } else { 0 };
        Some(Tally { at: Instant::now(), open, limit, since: 0 })
    }

    fn short(&self, held: usize) -> bool {
        self.limit.is_some_and(|limit| short_at(self.open + self.since, limit, held))
    }
}

/// How long a count stands while its estimate stays clear of the reserve. A count costs
/// ~1.1 µs here (getrlimit(2) and fstat(2)), so at most ~0.1 % of a core; what the rest of
/// the process opens in that time is not seen (it would have to open a reserve, 64 or more).
const RECOUNT_AFTER: Duration = Duration::from_millis(1);

/// Whether a run holding `held` connections should open no new descriptor now (keep the
/// connection just accepted, open an upstream socket, a lookup's, a tunnel's pipes):
/// `opening` is how many the caller opens (or just opened) if not. See [`short_at`], with
/// the process's open descriptors estimated from the kernel's count ([`open_now`]) plus what
/// checks let open since ([`Tally`]): counted again after [`RECOUNT_AFTER`], and at each check
/// while the estimate is within the reserve, so near the limit every answer is the kernel's
/// count. Only when the run holds its share or more: below it, no system call. A count that
/// cannot be read makes such a run short (fail closed: its descriptors are not weighed
/// blind); an unlimited or unreadable limit never does.
pub fn short_now(held: usize, opening: u64) -> bool {
    static TALLY: Mutex<Option<Tally>> = Mutex::new(None);
    if held < FAIR_SHARE {
        return false;
    }
    let mut tally = TALLY.lock().unwrap_or_else(|p| p.into_inner());
    check(&mut tally, held, opening, Tally::now)
}

/// [`short_now`]'s decision on `tally`, with `count` for a fresh count.
fn check(tally: &mut Option<Tally>, held: usize, opening: u64, count: impl FnOnce() -> Option<Tally>) -> bool {
    if !tally.as_ref().is_some_and(|t| t.at.elapsed() < RECOUNT_AFTER && !t.short(held)) {
        *tally = count();
    }
    let Some(t) = tally.as_mut() else { return true };
    let short = t.short(held);
    if !short {
        t.since += opening;
    }
    short
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_an_eighth_of_the_limit_within_64_and_1024() {
        assert_eq!([reserve(256), reserve(1024), reserve(4096), reserve(1 << 20)], [64, 128, 512, 1024]);
    }

    #[test]
    fn a_run_within_its_share_is_never_short() {
        assert!(!short_at(u64::MAX / 2, 1024, FAIR_SHARE - 1));
        assert!(!short_now(FAIR_SHARE - 1, u64::MAX / 2));
    }

    #[test]
    fn a_run_over_its_share_is_short_only_when_the_reserve_is_all_that_is_left() {
        let cases = [
            // (open, limit, held, short): the reserve of 1,024 is 128
            (10, 1024, FAIR_SHARE * 10, false),
            (1024 - 129, 1024, FAIR_SHARE, false),
            (1024 - 128, 1024, FAIR_SHARE, true),
            (1024, 1024, FAIR_SHARE, true),
            (2048, 1024, FAIR_SHARE, true),
        ];
        for (open, limit, held, short) in cases {
            assert_eq!(short_at(open, limit, held), short, "{open} open of {limit}, {held} held");
        }
    }

    #[test]
    fn the_count_is_of_open_descriptors_not_the_lowest_free_one() {
        let before = open_now().expect("/proc/<pid>/fd reports its count (Linux 6.2 and later)");
        let mut files: Vec<File> = (0..200).map(|_| File::open("/dev/null").expect("a descriptor")).collect();
        let held = open_now().unwrap();
        // a hole low in the table: the lowest free descriptor moves down, the count by one
        drop(files.remove(0));
        let after_hole = open_now().unwrap();
        // other tests' threads open and close descriptors beside this one
        assert!((held as i64 - before as i64 - 200).abs() < 20, "{before} then {held}");
        assert!((held as i64 - after_hole as i64 - 1).abs() < 20, "{held} then {after_hole}");
        assert!(!short_now(FAIR_SHARE * 2, 1), "this test process is far from its limit");
    }

    #[test]
    fn the_lowest_free_descriptor_is_a_lower_bound_of_the_count() {
        let lowest = lowest_free().expect("a free descriptor");
        assert!(lowest <= open_now().expect("a count") + 16, "{lowest} free, other tests' threads beside");
    }

    #[test]
    fn what_checks_let_open_counts_until_the_estimate_reaches_the_reserve_then_the_kernel_counts() {
        // a limit of 1,024: the reserve is 128, short from 896 open
        let counted = |open| move || Some(Tally { at: Instant::now(), open, limit: Some(1024), since: 0 });
        let mut tally = None;
        assert!(!check(&mut tally, FAIR_SHARE, 3, counted(800)), "the first check counts");
        let not_again = || -> Option<Tally> { panic!("counted again while the estimate was clear") };
        for _ in 0..31 {
            assert!(!check(&mut tally, FAIR_SHARE, 3, not_again));
        }
        // 800 + 32 x 3 = 896: the estimate is within the reserve, so the kernel counts; it
        // says what the checks let through was closed again
        assert!(!check(&mut tally, FAIR_SHARE, 3, counted(700)));
        assert_eq!(tally.as_ref().map(|t| (t.open, t.since)), Some((700, 3)));
        // the kernel's count within the reserve: short, and nothing is let through
        let mut near = Some(Tally { at: Instant::now(), open: 890, limit: Some(1024), since: 6 });
        assert!(check(&mut near, FAIR_SHARE, 3, counted(896)));
        assert_eq!(near.as_ref().map(|t| (t.open, t.since)), Some((896, 0)));
    }

    #[test]
    fn an_old_count_is_taken_again_and_an_unreadable_one_makes_the_run_short() {
        let old = Instant::now() - RECOUNT_AFTER;
        let mut tally = Some(Tally { at: old, open: 10, limit: Some(1024), since: 0 });
        assert!(check(&mut tally, FAIR_SHARE, 1, || Some(Tally { at: Instant::now(), open: 1000, limit: Some(1024), since: 0 })));
        assert!(check(&mut Some(Tally { at: old, open: 10, limit: Some(1024), since: 0 }), FAIR_SHARE, 1, || None));
        assert!(!check(&mut None, FAIR_SHARE, 1, || Some(Tally { at: Instant::now(), open: 5000, limit: None, since: 0 })), "unlimited");
    }
}
