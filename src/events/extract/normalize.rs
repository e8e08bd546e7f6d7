//! Rewriting an event before its digest: amounts normalized, fields kept or removed at
//! their paths.

use serde_json::{Map, Value};

pub(super) fn get_mut_at<'v>(target: &'v mut Value, segments: &[String]) -> Option<&'v mut Value> {
    let mut at = target;
    for segment in segments {
        at = match at {
            Value::Object(map) => map.get_mut(segment)?,
            Value::Array(items) => items.get_mut(segment.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(at)
}

/// The canonical text of a money amount given as a JSON **number** (which may carry an
/// exponent: `1.005e2`), as [`normalize_amount`] writes it.
pub fn normalize_number_amount(text: &str) -> std::result::Result<String, String> {
    normalize(text, true)
}

/// The canonical text of a money amount (seed 004: "numeric scale 2"): an optional sign,
/// an optional `$`, digits with an optional fraction (and, for JSON numbers, an exponent:
/// see [`normalize_number_amount`]; a string such as `"1e2"` is refused),
/// written back as `[-]INTEGER.FRACTION` with no leading zeros and at least two fraction
/// digits. `"100.5"`, `"$100.50"`, `" 100.500 "`, `100.5` and `1.005e2` all give
/// `"100.50"`; `"-$0.00"` gives `"0.00"`.
///
/// Digits beyond the second decimal are **kept**, not rounded (`"100.505"` stays
/// `"100.505"`): rounding would make two different amounts the same payload and turn a
/// conflict into a replay. Thousands separators and other currencies are refused (is
/// `1,500` one and a half or fifteen hundred?).
///
/// ```
/// use idem::events::extract::normalize_amount;
/// assert_eq!(normalize_amount("$100.5").unwrap(), "100.50");
/// assert_eq!(normalize_amount("0100.500").unwrap(), "100.50");
/// assert_eq!(normalize_amount("100.505").unwrap(), "100.505");
/// assert!(normalize_amount("1,500").is_err());
/// ```
pub fn normalize_amount(text: &str) -> std::result::Result<String, String> {
    normalize(text, false)
}

pub(super) fn normalize(text: &str, exponent_allowed: bool) -> std::result::Result<String, String> {
    let bad = |why: &str| format!("{text:?} is not an amount ({why})");
    let mut s = text.trim();
    let mut negative = false;
    if let Some(rest) = s.strip_prefix('-') {
        negative = true;
        s = rest;
    } else if let Some(rest) = s.strip_prefix('+') {
        s = rest;
    }
    s = s.strip_prefix('$').unwrap_or(s);
    let only_digits = "only digits, one `.`, an optional sign and `$` are allowed";
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(_) if !exponent_allowed => return Err(bad(only_digits)),
        Some(at) if !s[..at].bytes().all(|b| b.is_ascii_digit() || b == b'.') => {
            return Err(bad(only_digits))
        }
        Some(at) => {
            let exp: i32 = s[at + 1..]
                .parse()
                .ok()
                .filter(|e: &i32| e.abs() <= 64)
                .ok_or_else(|| bad("bad exponent"))?;
            (&s[..at], exp)
        }
        None => (s, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int.is_empty() && frac.is_empty() {
        return Err(bad("no digits"));
    }
    if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return Err(bad(
            "only digits, one `.`, an optional sign and `$` are allowed",
        ));
    }
    // All digits, and where the decimal point falls among them.
    let mut digits: Vec<u8> = int.bytes().chain(frac.bytes()).collect();
    let mut point = int.len() as i64 + exponent as i64;
    if point < 0 {
        let pad = (-point) as usize;
        digits.splice(0..0, std::iter::repeat_n(b'0', pad));
        point = 0;
    }
    let point = point as usize;
    if point > digits.len() {
        digits.resize(point, b'0');
    }
    let (int, frac) = digits.split_at(point);
    let int = match int.iter().position(|&b| b != b'0') {
        Some(first) => &int[first..],
        None => b"0".as_slice(),
    };
    let mut frac = frac.to_vec();
    while frac.len() > 2 && frac.last() == Some(&b'0') {
        frac.pop();
    }
    frac.resize(frac.len().max(2), b'0');
    let zero = int == b"0" && frac.iter().all(|&b| b == b'0');
    let mut out = String::with_capacity(int.len() + frac.len() + 2);
    if negative && !zero {
        out.push('-');
    }
    out.push_str(std::str::from_utf8(int).expect("ASCII digits"));
    out.push('.');
    out.push_str(std::str::from_utf8(&frac).expect("ASCII digits"));
    Ok(out)
}

pub(super) fn insert_at(target: &mut Value, segments: &[String], value: Value) {
    let Some((last, parents)) = segments.split_last() else {
        return;
    };
    let mut at = target;
    for segment in parents {
        let map = at.as_object_mut().expect("built from objects");
        at = map
            .entry(segment.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !at.is_object() {
            // A shorter included path already holds this whole value.
            return;
        }
    }
    at.as_object_mut()
        .expect("built from objects")
        .insert(last.clone(), value);
}

pub(super) fn remove_at(target: &mut Value, segments: &[String]) {
    let Some((last, parents)) = segments.split_last() else {
        return;
    };
    let mut at = target;
    for segment in parents {
        at = match at {
            Value::Object(map) => match map.get_mut(segment) {
                Some(v) => v,
                None => return,
            },
            Value::Array(items) => {
                match segment.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                    Some(v) => v,
                    None => return,
                }
            }
            _ => return,
        };
    }
    match at {
        Value::Object(map) => {
            map.remove(last);
        }
        Value::Array(items) => {
            if let Some(i) = last.parse::<usize>().ok().filter(|i| *i < items.len()) {
                items.remove(i);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod amount_tests {
    use super::*;
    use crate::events::extract::{ContentHashExtractor, Extractor};
    use crate::key::{digest_value, HashAlgorithm};
    use serde_json::json;

    #[test]
    fn the_in_place_digest_equals_the_digest_of_the_content() {
        let events = [
            json!({"id": 1, "b": [1, {"z": 1, "a": null}], "a": "x", "é": 1.5}),
            json!({"z": 1, "id": "k", "customer_id": "c"}),
            json!({"id": 1}),
            json!({}),
        ];
        for exclude in [vec![], vec!["id"], vec!["id", "customer_id", "nope"]] {
            for algorithm in [HashAlgorithm::Sha256, HashAlgorithm::Md5] {
                let spec = ContentHashExtractor::new()
                    .exclude(&exclude)
                    .unwrap()
                    .algorithm(algorithm);
                for e in &events {
                    assert_eq!(
                        spec.extract(e).unwrap(),
                        digest_value(&spec.content(e).unwrap(), algorithm),
                        "{e} without {exclude:?}"
                    );
                }
                assert!(spec.extract(&json!([1])).is_err());
            }
        }
    }

    #[test]
    fn amounts_equal_as_numbers_are_one_text() {
        for (given, want) in [
            ("100.5", "100.50"),
            ("$100.50", "100.50"),
            ("100.500", "100.50"),
            ("0100.5", "100.50"),
            ("+$100.5", "100.50"),
            ("-$3.1", "-3.10"),
            ("-0", "0.00"),
            (".5", "0.50"),
            ("7", "7.00"),
            ("100.505", "100.505"),
        ] {
            assert_eq!(normalize_amount(given).unwrap(), want, "{given}");
        }
        // Exponents are a JSON number's notation, not an amount's text (issue 21.11).
        for (given, want) in [("1.005e2", "100.50"), ("5e-3", "0.005"), ("1e2", "100.00")] {
            assert_eq!(normalize_number_amount(given).unwrap(), want, "{given}");
            let e = normalize_amount(given).unwrap_err();
            assert!(e.contains("only digits, one `.`"), "{e}");
        }
        for bad in ["", "$", "1,500", "€5", "1.2.3", "12abc", "1e999"] {
            let e = normalize_amount(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn normalized_fingerprints_make_replays_of_equal_amounts() {
        let spec = ContentHashExtractor::new()
            .exclude(["id"])
            .unwrap()
            .normalize_amounts(["load_amount"])
            .unwrap();
        let fp = |v: Value| spec.extract(&v);
        let a = fp(json!({"id": 1, "load_amount": "100.5"})).unwrap();
        assert_eq!(fp(json!({"id": 2, "load_amount": "$100.50"})).unwrap(), a);
        assert_eq!(fp(json!({"id": 3, "load_amount": 100.50})).unwrap(), a);
        assert_ne!(fp(json!({"id": 4, "load_amount": "100.51"})).unwrap(), a);
        // Without the option the texts differ.
        let plain = ContentHashExtractor::new().exclude(["id"]).unwrap();
        assert_ne!(
            plain.extract(&json!({"load_amount": "100.5"})).unwrap(),
            plain.extract(&json!({"load_amount": "$100.50"})).unwrap()
        );
        assert_eq!(
            fp(json!({"load_amount": "ten"})).unwrap_err().to_string(),
            "field `load_amount` is invalid: \"ten\" is not an amount (only digits, one `.`, an optional sign and `$` are allowed)"
        );
        assert!(fp(json!({"load_amount": null})).is_ok());
        assert_eq!(
            fp(json!({"load_amount": [1]})).unwrap_err().to_string(),
            "field `load_amount` is an array, expected an amount (a string or a number)"
        );
    }
}
