//! A command's arguments: bytes passed as given, with idem's placeholders replaced.
//!
//! Only `{date}`, `{scope}`, `{run_id}`, `{trigger}`, `{job}` and `{param.NAME}` are
//! placeholders; every other brace is the program's (`awk '{print}'`, `find -exec {} ;`,
//! `'{"a": 1}'`), and so is `${NAME}`, a shell's variable even when NAME is a placeholder's
//! name. `{{date}}` is the literal text `{date}`. Arguments are bytes, not text: a file
//! name that is not UTF-8 reaches the program unchanged.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};

use serde::{Deserialize, Deserializer};

use crate::error::{Error, Result};
use crate::model::RunRequest;

/// One argument of `run` or `content` as written: a string, or an array of byte values
/// for an argument that is not UTF-8 (`idem exec` passes its arguments that way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgText(pub OsString);

impl From<&str> for ArgText {
    fn from(s: &str) -> Self {
        ArgText(OsString::from(s))
    }
}

impl ArgText {
    /// The argument as a TOML value: a string when it is UTF-8, else its bytes.
    pub fn to_toml(&self) -> toml::Value {
        match self.0.to_str() {
            Some(s) => toml::Value::String(s.to_string()),
            None => toml::Value::Array(
                self.0
                    .as_bytes()
                    .iter()
                    .map(|b| toml::Value::Integer(i64::from(*b)))
                    .collect(),
            ),
        }
    }
}

impl<'de> Deserialize<'de> for ArgText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = ArgText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string (or an array of byte values, for bytes that are not UTF-8)")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> std::result::Result<ArgText, E> {
                Ok(ArgText::from(s))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<ArgText, A::Error> {
                let mut bytes = Vec::new();
                while let Some(b) = seq.next_element::<u8>()? {
                    bytes.push(b);
                }
                Ok(ArgText(OsString::from_vec(bytes)))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// One argument: literal bytes and placeholders.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Arg(Vec<Piece>);

#[derive(Clone, PartialEq)]
enum Piece {
    Text(Vec<u8>),
    Date,
    Scope,
    RunId,
    Trigger,
    Job,
    Param(String),
}

/// As the derived `Debug` printed it when the text was a `String` (`Text("echo")`): the
/// command's version digests this text.
impl fmt::Debug for Piece {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Piece::Text(t) => match std::str::from_utf8(t) {
                Ok(s) => f.debug_tuple("Text").field(&s).finish(),
                Err(_) => f.debug_tuple("Text").field(t).finish(),
            },
            Piece::Date => f.write_str("Date"),
            Piece::Scope => f.write_str("Scope"),
            Piece::RunId => f.write_str("RunId"),
            Piece::Trigger => f.write_str("Trigger"),
            Piece::Job => f.write_str("Job"),
            Piece::Param(p) => f.debug_tuple("Param").field(p).finish(),
        }
    }
}

/// The placeholder `{…}` at the start of `s`, and its length.
fn placeholder(s: &[u8]) -> Option<(Piece, usize)> {
    if s.first() != Some(&b'{') {
        return None;
    }
    let end = s.iter().position(|b| *b == b'}')?;
    let name = &s[1..end];
    let piece = match name {
        b"date" => Piece::Date,
        b"scope" => Piece::Scope,
        b"run_id" => Piece::RunId,
        b"trigger" => Piece::Trigger,
        b"job" => Piece::Job,
        _ => {
            let param = name.strip_prefix(b"param.")?;
            let param = std::str::from_utf8(param).ok()?;
            if param.is_empty() || param.contains(|c: char| c == '{' || c.is_whitespace()) {
                return None;
            }
            Piece::Param(param.to_string())
        }
    };
    Some((piece, end + 1))
}

impl Arg {
    /// Splits `s` into text and placeholders (never fails: what is not a placeholder is
    /// text).
    pub(super) fn parse(s: &[u8]) -> Arg {
        let mut pieces = Vec::new();
        let mut text = Vec::new();
        let mut i = 0;
        while i < s.len() {
            let rest = &s[i..];
            // `{{date}}`: the literal `{date}`.
            if rest.starts_with(b"{{") {
                if let Some((_, len)) = placeholder(&rest[1..]) {
                    if rest.get(1 + len) == Some(&b'}') {
                        text.extend_from_slice(&rest[1..1 + len]);
                        i += len + 2;
                        continue;
                    }
                }
            }
            // `${…}` is the shell's.
            let after_dollar = i > 0 && s[i - 1] == b'$';
            match placeholder(rest).filter(|_| !after_dollar) {
                Some((piece, len)) => {
                    if !text.is_empty() {
                        pieces.push(Piece::Text(std::mem::take(&mut text)));
                    }
                    pieces.push(piece);
                    i += len;
                }
                None => {
                    text.push(s[i]);
                    i += 1;
                }
            }
        }
        if !text.is_empty() || pieces.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Arg(pieces)
    }

    /// The literal bytes, when the argument has no placeholder.
    pub(super) fn literal(&self) -> Option<&[u8]> {
        match self.0.as_slice() {
            [Piece::Text(t)] => Some(t),
            _ => None,
        }
    }

    /// The names of the parameters it uses.
    pub(super) fn params(&self) -> impl Iterator<Item = &str> {
        self.0.iter().filter_map(|p| match p {
            Piece::Param(name) => Some(name.as_str()),
            _ => None,
        })
    }

    /// The argument for `request`; an error names a parameter the request lacks.
    pub(super) fn render(&self, request: &RunRequest) -> std::result::Result<OsString, String> {
        let mut out: Vec<u8> = Vec::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.extend_from_slice(t),
                Piece::Date => out
                    .extend_from_slice(crate::model::time::day_text(request.scope_date).as_bytes()),
                Piece::Scope => out.extend_from_slice(request.scope.as_bytes()),
                Piece::RunId => out.extend_from_slice(request.run_id.as_bytes()),
                Piece::Trigger => out.extend_from_slice(request.trigger.as_str().as_bytes()),
                Piece::Job => out.extend_from_slice(request.processor.as_bytes()),
                Piece::Param(name) => match request.params.get(name) {
                    Some(serde_json::Value::String(s)) => out.extend_from_slice(s.as_bytes()),
                    Some(serde_json::Value::Null) | None => {
                        return Err(format!(
                            "{{param.{name}}}: no parameter {name:?} ([params] or --param)"
                        ))
                    }
                    Some(other) => out.extend_from_slice(other.to_string().as_bytes()),
                },
            }
        }
        Ok(OsString::from_vec(out))
    }
}

/// Parses `argv` (`field` names it in errors): a program and its arguments.
pub(super) fn parse_argv(field: &str, argv: &[ArgText]) -> Result<Vec<Arg>> {
    if argv.is_empty() || argv[0].0.is_empty() {
        return Err(Error::config(format!(
            "[command] {field} is empty: give the program and its arguments, as a list \
             ([\"python3\", \"export.py\", \"{{date}}\"])"
        )));
    }
    Ok(argv.iter().map(|a| Arg::parse(a.0.as_bytes())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(s: &str) -> String {
        let mut r = RunRequest::new("j", chrono::NaiveDate::from_ymd_opt(2026, 1, 2).unwrap());
        r.params = serde_json::json!({"n": 5, "b": "gs://x"});
        Arg::parse(s.as_bytes())
            .render(&r)
            .unwrap()
            .into_string()
            .unwrap()
    }

    #[test]
    fn only_idems_placeholders_are_replaced_and_every_other_brace_stays() {
        assert_eq!(render("{date}"), "2026-01-02");
        assert_eq!(
            render("{job}:{scope}:{trigger}:{param.n}:{param.b}"),
            "j:2026-01-02:manual:5:gs://x"
        );
        for verbatim in [
            "BEGIN{print}",
            "{}",
            "{\"a\":1}",
            "${HOME}",
            "${date}",
            "x{{y}}z",
            "{dat}",
            "{date",
            "a}b",
            "{param.}",
            "{param.a b}",
            "}{",
        ] {
            assert_eq!(render(verbatim), verbatim);
        }
        assert_eq!(render("{{date}}"), "{date}");
        assert_eq!(render("a{{param.n}}b{date}"), "a{param.n}b2026-01-02");
    }

    #[test]
    fn bytes_that_are_not_utf8_pass_through() {
        let bytes = b"\xff{date}\xfe".to_vec();
        let r = RunRequest::new("j", chrono::NaiveDate::from_ymd_opt(2026, 1, 2).unwrap());
        let out = Arg::parse(&bytes).render(&r).unwrap();
        assert_eq!(out.as_bytes(), b"\xff2026-01-02\xfe");
        let text = ArgText(OsString::from_vec(bytes.clone()));
        let back: ArgText = text.to_toml().try_into().unwrap();
        assert_eq!(back, text);
    }

    #[test]
    fn a_missing_parameter_is_named() {
        let r = RunRequest::new("j", chrono::NaiveDate::from_ymd_opt(2026, 1, 2).unwrap());
        let e = Arg::parse(b"{param.who}").render(&r).unwrap_err();
        assert!(e.contains("no parameter \"who\""), "{e}");
    }
}
