//! The size cap of one record: a line over [`MAX_RECORD`] bytes has its long strings cut,
//! then its largest values dropped, and names what was cut in [`f::TRUNCATED`].

use serde_json::{Map, Value};

use super::fields as f;

/// Largest line (its newline included) the audit log holds, in bytes.
pub const MAX_RECORD: usize = 16 * 1024;
/// What a cut string ends with.
const CUT: &str = "…";
/// The longest a string is cut to first, in bytes (halved until the record fits).
const FIRST_STRING_LIMIT: usize = 4096;
/// Below this, cutting strings further is not worth it: values are dropped instead.
const LAST_STRING_LIMIT: usize = 64;

/// `out` serialized, with its newline.
fn to_line(out: &Map<String, Value>) -> String {
    let mut s = super::escape::to_string(out);
    s.push('\n');
    s
}

/// Cut `s` to at most `limit` bytes (on a character boundary) plus [`CUT`]; true if cut.
fn cut_string(s: &mut String, limit: usize) -> bool {
    if s.len() <= limit {
        return false;
    }
    let mut end = limit;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str(CUT);
    true
}

/// Cut every string in `v` (nested ones too) to `limit` bytes; true if any was cut.
fn cut_strings(v: &mut Value, limit: usize) -> bool {
    match v {
        Value::String(s) => cut_string(s, limit),
        Value::Array(a) => a.iter_mut().fold(false, |cut, x| cut_strings(x, limit) | cut),
        Value::Object(m) => m.values_mut().fold(false, |cut, x| cut_strings(x, limit) | cut),
        _ => false,
    }
}

/// The line of `out` (whose first keys are `v`, `time`, `seq` and `prev`), at most [`MAX_RECORD`] bytes:
/// 1. as it is, if it fits;
/// 2. else its strings cut to 4096, 2048, ... 64 bytes, until it fits;
/// 3. else its largest values (never `v`, `time`, `seq`, `prev`, `run`, `event`, `decision`) replaced
///    by `null`, largest first, until it fits;
/// 4. else (the keys alone are too long) only `v`, `time`, `seq`, `prev`, `run`, `event`, `decision` are
///    kept, cut to 64 bytes each.
///
/// In 2-3 the record gets [`f::TRUNCATED`]: the list of the keys whose values were cut; in
/// 4, `["*"]`.
pub fn capped_line(mut out: Map<String, Value>) -> String {
    let line = to_line(&out);
    if line.len() <= MAX_RECORD {
        return line;
    }
    let mut cut: Vec<String> = Vec::new();
    let note = |cut: &mut Vec<String>, k: &str| {
        if !cut.iter().any(|c| c == k) {
            cut.push(k.to_string());
        }
    };
    let kept = |k: &str| [f::V, f::TIME, f::SEQ, f::PREV, f::RUN, f::EVENT, f::DECISION].contains(&k);
    let with_flag = |out: &Map<String, Value>, cut: &[String]| {
        let mut o = out.clone();
        o.insert(f::TRUNCATED.into(), Value::from(cut.to_vec()));
        to_line(&o)
    };
    let mut limit = FIRST_STRING_LIMIT;
    while limit >= LAST_STRING_LIMIT {
        for (k, v) in out.iter_mut() {
            if !kept(k) && cut_strings(v, limit) {
                note(&mut cut, k);
            }
        }
        let line = with_flag(&out, &cut);
        if line.len() <= MAX_RECORD {
            return line;
        }
        limit /= 2;
    }
    let mut sizes: Vec<(usize, String)> = out
        .iter()
        .filter(|(k, _)| !kept(k))
        .map(|(k, v)| (super::escape::to_string(v).len(), k.clone()))
        .collect();
    sizes.sort_by_key(|s| std::cmp::Reverse(s.0));
    for (_, k) in sizes {
        out.insert(k.clone(), Value::Null);
        note(&mut cut, &k);
        let line = with_flag(&out, &cut);
        if line.len() <= MAX_RECORD {
            return line;
        }
    }
    out.retain(|k, _| kept(k));
    for v in out.values_mut() {
        cut_strings(v, LAST_STRING_LIMIT);
    }
    out.insert(f::TRUNCATED.into(), Value::from(vec!["*"]));
    to_line(&out)
}
