//! The rules by host, kept up to date as rules are added ([`Policy::push_rule`]): a decision
//! looks only at the rules whose host pattern can match its host, in evaluation order, instead
//! of at every rule (issue 13, target 5: decisions flat in the number of rules).
//!
//! The index only narrows: each candidate still goes through the one matcher
//! ([`Rule::matches`], [`HostPattern::matches`]), and the candidates come in evaluation order,
//! so a decision is the linear scan's (tests_index.rs checks it against the scan). It keys the
//! canonical forms the matcher compares: an [`HostPattern::Exact`] rule by its [`Host`] (name,
//! IPv4 or IPv6, as [`Host`]'s `==`), a `*.s` rule by `s`; a query name is looked up whole and
//! at each of its label boundaries from the left (`a.b.c` -> `b.c`, `c`), one hash lookup each
//! (at most 127 for a 253-byte name). Every pattern the matcher has is keyed, so there is no
//! list of rules to scan besides; a new kind of pattern has to be given its key here (the
//! `match` in [`HostIndex::insert`] is exhaustive).
//!
//! Rules of one host (or one suffix) are all candidates for it: 100,000 rules for one host
//! that differ by port or path are still scanned one by one.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::fmt;

use super::canon::{Host, HostPattern};
use super::rules::{Policy, Rule};

/// A rule's place in evaluation order: the command-line rules first, in the order added,
/// then the file's in file order (the derived order is that order). A place does not move
/// when a command-line rule is added after the file was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Slot {
    Cli(usize),
    File(usize),
}

/// The places of one key, ascending. Most keys have one rule: it is kept inline (a `Vec`
/// would allocate room for four; at 100,000 rules that was 6 MiB).
#[derive(Clone)]
enum Slots {
    One(Slot),
    Many(Vec<Slot>),
}

impl Slots {
    fn as_slice(&self) -> &[Slot] {
        match self {
            Slots::One(s) => std::slice::from_ref(s),
            Slots::Many(list) => list,
        }
    }

    /// Put `slot` where ascending order has it (usually at the end).
    fn insert(&mut self, slot: Slot) {
        let mut list = match std::mem::replace(self, Slots::Many(Vec::new())) {
            Slots::One(s) => vec![s],
            Slots::Many(list) => list,
        };
        list.insert(list.partition_point(|s| *s < slot), slot);
        *self = Slots::Many(list);
    }
}

/// Places by host key.
#[derive(Clone, Default)]
pub(super) struct HostIndex {
    /// [`HostPattern::Exact`] rules by host.
    exact: HashMap<Host, Slots>,
    /// `*.s` ([`HostPattern::Subdomains`]) rules by `s`.
    subdomains: HashMap<String, Slots>,
}

/// Counts, not the (possibly 100,000) entries.
impl fmt::Debug for HostIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostIndex")
            .field("exact_hosts", &self.exact.len())
            .field("suffixes", &self.subdomains.len())
            .finish()
    }
}

impl HostIndex {
    /// Key `pattern` at `slot`.
    pub(super) fn insert(&mut self, slot: Slot, pattern: &HostPattern) {
        fn add<K>(entry: Entry<'_, K, Slots>, slot: Slot) {
            entry.and_modify(|slots| slots.insert(slot)).or_insert(Slots::One(slot));
        }
        match pattern {
            HostPattern::Exact(host) => add(self.exact.entry(host.clone()), slot),
            HostPattern::Subdomains(suffix) => add(self.subdomains.entry(suffix.clone()), slot),
        }
    }

    /// The places of every rule whose host pattern may match `host`, ascending; a superset
    /// of those that do (the matcher decides), without repeats.
    pub(super) fn candidates<'a>(&'a self, host: &Host) -> Candidates<'a> {
        let mut lists: Vec<&'a [Slot]> = Vec::new();
        if let Some(l) = self.exact.get(host) {
            lists.push(l.as_slice());
        }
        if let Host::Name(name) = host {
            // `*.s` matches `head.s` (head not empty): s follows one of name's dots.
            for (dot, _) in name.match_indices('.') {
                if let Some(l) = self.subdomains.get(&name[dot + 1..]) {
                    lists.push(l.as_slice());
                }
            }
        }
        Candidates { lists }
    }
}

/// Slots of several ascending lists, merged in ascending order (the lists are disjoint: each
/// rule has one key). Usually one or two lists; each step looks at every list's head.
pub(super) struct Candidates<'a> {
    lists: Vec<&'a [Slot]>,
}

impl Iterator for Candidates<'_> {
    type Item = Slot;

    fn next(&mut self) -> Option<Slot> {
        let (k, slot) = self.lists.iter().enumerate().filter_map(|(k, l)| l.first().map(|s| (k, *s))).min_by_key(|(_, s)| *s)?;
        self.lists[k] = &self.lists[k][1..];
        Some(slot)
    }
}

impl Policy {
    /// The rules that may match `host`, in evaluation order (see the module comment).
    pub(super) fn candidates<'a>(&'a self, host: &Host) -> impl Iterator<Item = &'a Rule> + 'a {
        self.index().candidates(host).map(|slot| self.at(slot))
    }
}
