//! JSON text a terminal never interprets: every control character of every string, C0
//! (U+0000–U+001F), DEL (U+007F) and C1 (U+0080–U+009F, e.g. CSI U+009B, which some
//! terminals act on like `ESC [`), is written as a `\uXXXX` escape.
//!
//! serde_json escapes C0 (and `"` and `\`) itself, through
//! [`serde_json::ser::Formatter::write_char_escape`]; the rest of a string reaches
//! [`serde_json::ser::Formatter::write_string_fragment`], where DEL and C1 are escaped here.
//! Source: ECMA-48 §5 (C0 and C1 sets), RFC 8259 §7 (any character may be escaped).

use std::io::{self, Write};

use serde::Serialize;
use serde_json::ser::{Formatter, Serializer};

/// Compact JSON, with DEL and C1 escaped as well as C0.
pub struct ControlEscaping;

/// True for the characters serde_json leaves raw that a terminal may act on.
fn is_del_or_c1(c: char) -> bool {
    ('\u{7f}'..='\u{9f}').contains(&c)
}

impl Formatter for ControlEscaping {
    fn write_string_fragment<W: ?Sized + Write>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            if is_del_or_c1(c) {
                writer.write_all(&fragment.as_bytes()[start..i])?;
                write!(writer, "\\u{:04x}", c as u32)?;
                start = i + c.len_utf8();
            }
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

/// `value` as compact JSON with every control character escaped.
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> String {
    let mut out = Vec::with_capacity(256);
    let mut ser = Serializer::with_formatter(&mut out, ControlEscaping);
    // Serializing plain JSON values (Map, Value, str) into a Vec cannot fail.
    if value.serialize(&mut ser).is_err() {
        return "{}".into();
    }
    // The formatter writes only valid UTF-8 (serde_json's output plus ASCII escapes).
    String::from_utf8(out).unwrap_or_else(|_| "{}".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_control_character_is_escaped() {
        for cp in (0u32..0x20).chain(0x7f..0xa0) {
            let c = char::from_u32(cp).unwrap();
            let s = to_string(&format!("a{c}b"));
            assert!(s.is_ascii(), "U+{cp:04X} written raw: {s:?}");
            assert!(!s.bytes().any(|b| b < 0x20 || b == 0x7f), "U+{cp:04X}: {s:?}");
            let back: String = serde_json::from_str(&s).unwrap();
            assert_eq!(back, format!("a{c}b"), "U+{cp:04X} does not round-trip");
        }
    }

    #[test]
    fn printable_text_is_kept() {
        assert_eq!(to_string("é \u{a0}☃\u{1f600}"), "\"é \u{a0}☃\u{1f600}\"");
        assert_eq!(to_string("\u{9b}31m"), "\"\\u009b31m\"");
        assert_eq!(to_string("\u{1b}[2J\u{7f}"), "\"\\u001b[2J\\u007f\"");
    }
}
