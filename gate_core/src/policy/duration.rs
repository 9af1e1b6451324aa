//! Durations in a policy file (`timeout`, a budget's `per`): one positive whole number and a
//! unit, `s` (seconds), `m` (minutes) or `h` (hours), e.g. `"30s"`, `"10m"`, `"2h"`; at most
//! [`MAX_DURATION`]. Anything else (`"10"`, `"1.5m"`, `"1h30m"`, `"10 m"`, `"0s"`, `"1d"`) is
//! refused: a duration read wrongly is a budget or a timeout that silently means something else.

use std::time::Duration;

/// The longest duration accepted: 31 days.
pub const MAX_DURATION: Duration = Duration::from_secs(31 * 24 * 3600);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}: expected a whole number and a unit s, m or h (e.g. \"30s\", \"10m\", \"2h\"), from 1s to 31 days")]
pub struct DurationError(pub String);

/// Parse a duration of the grammar above.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let bad = || DurationError(text.to_string());
    let unit = match text.as_bytes().last() {
        Some(b's') => 1,
        Some(b'm') => 60,
        Some(b'h') => 3600,
        _ => return Err(bad()),
    };
    let digits = &text[..text.len() - 1];
    if digits.is_empty() || digits.len() > 9 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let d = Duration::from_secs(n * unit);
    if n == 0 || d > MAX_DURATION {
        return Err(bad());
    }
    Ok(d)
}

/// The shortest spelling of `d` in the grammar (`600s` -> `10m`), for messages.
pub fn show_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// A time left, rounded up to a whole unit for reading: `40s`, `10m` (for 9m 59s), `3h`.
pub fn show_remaining(d: Duration) -> String {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    match s {
        0..=119 => format!("{}s", s.max(1)),
        120..=7199 => format!("{}m", s.div_ceil(60)),
        _ => format!("{}h", s.div_ceil(3600)),
    }
}
