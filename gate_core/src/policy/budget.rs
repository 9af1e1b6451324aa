//! Budgets: how many requests (or tunnels) one rule may allow per window, and the counters
//! of one run.
//!
//! Windows are fixed and start at a rule's first counted request: from then on, for `per`,
//! at most `count` requests are allowed; the first request after the window ends starts a
//! new window. (A sliding window would smooth bursts at window edges; the fixed window is
//! simpler to state and to read back from the audit log: at most `count` allowed requests
//! between a window's first request and `per` later.)

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::duration::{show_duration, show_remaining};

/// The audit reason of a request denied because its rule's budget is spent.
pub const REASON_BUDGET: &str = "budget";

/// `budget = { count = N, per = "10m" }` of an allow rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Requests allowed per window, at least 1.
    pub count: u32,
    /// Window length.
    pub per: Duration,
}

impl Budget {
    /// `6 per 10m`.
    pub fn describe(&self) -> String {
        format!("{} per {}", self.count, show_duration(self.per))
    }
}

/// The once-per-window notice of a spent budget, e.g. `gatewrap: budget spent: rule R
/// allows 2 per 10m; its requests are denied (reason budget) for the next 9m`.
pub fn show_budget_spent(rule: &str, budget: &Budget, resets_in: Duration, report: bool) -> String {
    let rest = show_remaining(resets_in);
    let what = if report { "report mode lets them through (would = deny)" } else { "its requests are denied (reason budget)" };
    format!("gatewrap: budget spent: rule {rule} allows {}; {what} for the next {rest}", budget.describe())
}

/// The outcome of counting one request against a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// Within budget: the `used`-th request of this window.
    Within { used: u32 },
    /// Over budget; `first` is true for the first refusal of this window (tell the human).
    Over { first: bool, resets_in: Duration },
}

#[derive(Debug)]
struct Window {
    start: Instant,
    used: u32,
    told: bool,
}

/// The counters of one run, by rule id. Rules without a budget are never looked up.
#[derive(Debug, Default)]
pub struct Budgets {
    windows: Mutex<HashMap<String, Window>>,
}

impl Budgets {
    /// Count one request allowed by `rule` at `now`.
    pub fn spend(&self, rule: &str, budget: &Budget, now: Instant) -> Spend {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let w = windows.entry(rule.to_string()).or_insert(Window { start: now, used: 0, told: false });
        if now.saturating_duration_since(w.start) >= budget.per {
            *w = Window { start: now, used: 0, told: false };
        }
        if w.used < budget.count {
            w.used += 1;
            return Spend::Within { used: w.used };
        }
        let first = !w.told;
        w.told = true;
        Spend::Over { first, resets_in: budget.per.saturating_sub(now.saturating_duration_since(w.start)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_window_allows_count_then_refuses_until_it_ends() {
        let b = Budget { count: 2, per: Duration::from_secs(60) };
        let budgets = Budgets::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let table: &[(&str, u64, Spend)] = &[
            ("the first request opens the window", 0, Spend::Within { used: 1 }),
            ("the second is still within", 10, Spend::Within { used: 2 }),
            ("the third is over and told", 20, Spend::Over { first: true, resets_in: Duration::from_secs(40) }),
            ("the fourth is over, not told again", 59, Spend::Over { first: false, resets_in: Duration::from_secs(1) }),
            ("the window ends 60s after its first request", 60, Spend::Within { used: 1 }),
            ("the new window counts on", 61, Spend::Within { used: 2 }),
            ("and is told once again", 62, Spend::Over { first: true, resets_in: Duration::from_secs(58) }),
        ];
        for (case, s, want) in table {
            assert_eq!(budgets.spend("r", &b, at(*s)), *want, "{case}");
        }
        assert_eq!(budgets.spend("other", &b, at(62)), Spend::Within { used: 1 }, "rules count apart");
    }
}
