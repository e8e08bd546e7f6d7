//! The event fingerprint of seed 000: one SHA-256 for a set of trade events, equal to the
//! value the Python services compute, whatever the order of the events.
//!
//! The Python reference is
//!
//! ```text
//! signatures = sorted((e.timestamp.isoformat(), e.account_id, e.product_id, e.side,
//!                      str(e.price), e.quantity, e.event_type) for e in events)
//! hashlib.sha256(json.dumps(signatures).encode()).hexdigest()
//! ```
//!
//! Byte compatibility is the whole point, so every step follows Python exactly:
//!
//! * the timestamp (RFC 3339 text with a UTC offset or `Z`) is converted to UTC and
//!   rendered as `datetime.isoformat()` renders an aware UTC value:
//!   `2025-11-18T09:00:00+00:00`, with `.ffffff` only when the microseconds are not zero;
//!   digits past the sixth are dropped (as `datetime.fromisoformat` drops them);
//! * the price is the decimal text it was given: a JSON string as is, a JSON number as it
//!   is written in the input (`100.50` stays `100.50`; the number never goes through a
//!   float); either must be a JSON-style decimal number;
//! * the quantity is a JSON integer (any size up to 128 bits);
//! * the list is sorted as Python sorts tuples: element by element, strings by code point
//!   (UTF-8 byte order is code point order), integers numerically. Timestamps compare as
//!   instants, which orders their rendered texts the same way;
//! * it is serialised as `json.dumps` does by default: `", "` between items, non-ASCII as
//!   lower-case `\uXXXX` (surrogate pairs beyond the BMP), `\"`, `\\`, `\n`, `\r`, `\t`,
//!   `\b`, `\f`, other control characters and DEL as `\u00XX`;
//! * and hashed with SHA-256, lower-case hex.
//!
//! `tests/vectors/fingerprint_vectors.py` is the reference written in Python; it generates
//! `tests/vectors/fingerprint.json`, which the tests recompute.
//!
//! Speed: the signature is kept in its typed form (the timestamp as microseconds), so
//! sorting compares integers first. Events already in order are serialised straight into
//! the hash in 16 KiB chunks; otherwise each event's row is written in input order into
//! one buffer (reading the events front to back) and the rows are hashed in sorted order.
//! `cargo bench --bench fingerprint` compares both with serde_json + SHA-256 of the same
//! bytes (docs/events.md has the figures).

use crate::key::hex;
use chrono::{DateTime, FixedOffset, Timelike, Utc};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::{json_kind_of_raw, EventError, InvalidEvent};

/// The fields of one event that its fingerprint covers, in the order they are compared.
///
/// Build it from a JSON object with [`EventSignature::from_json`] (the way to keep a
/// numeric price's text) or from typed values with [`EventSignature::new`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventSignature {
    // Field order is the sort order (derived `Ord`), the tuple order of the reference.
    timestamp_micros: i64,
    account_id: String,
    product_id: String,
    side: String,
    price: String,
    quantity: i128,
    event_type: String,
}

/// Python's `datetime` range: years 1 to 9999.
const MIN_MICROS: i64 = -62_135_596_800_000_000; // 0001-01-01T00:00:00Z
const MAX_MICROS: i64 = 253_402_300_799_999_999; // 9999-12-31T23:59:59.999999Z

impl EventSignature {
    /// A signature from typed values. The price is decimal text (`"100.50"`); it is kept
    /// as given. Fails when the price is not a decimal number or the timestamp is outside
    /// the years 1 to 9999 that Python can represent.
    ///
    /// ```
    /// use idem::events::EventSignature;
    /// let at: chrono::DateTime<chrono::FixedOffset> = "2025-11-18T10:00:00+01:00".parse().unwrap();
    /// let s = EventSignature::new(at, "acc-1", "BTC-USD", "buy", "100.50", 5, "trade").unwrap();
    /// assert_eq!(s.timestamp_iso(), "2025-11-18T09:00:00+00:00");
    /// assert!(EventSignature::new(at, "acc-1", "BTC-USD", "buy", "1,5", 5, "trade").is_err());
    /// ```
    pub fn new<Tz: chrono::TimeZone>(
        timestamp: DateTime<Tz>,
        account_id: impl Into<String>,
        product_id: impl Into<String>,
        side: impl Into<String>,
        price: impl Into<String>,
        quantity: impl Into<i128>,
        event_type: impl Into<String>,
    ) -> Result<Self, EventError> {
        let price = price.into();
        check_decimal(&price)?;
        Ok(EventSignature {
            timestamp_micros: micros_in_range(&timestamp.with_timezone(&Utc))?,
            account_id: account_id.into(),
            product_id: product_id.into(),
            side: side.into(),
            price,
            quantity: quantity.into(),
            event_type: event_type.into(),
        })
    }

    /// The signature of one event given as a JSON object (an NDJSON line). Other fields
    /// are ignored; each missing or ill-typed field is an error naming it.
    ///
    /// ```
    /// use idem::events::{EventError, EventSignature};
    /// let line = r#"{"timestamp": "2025-11-18T09:00:00Z", "account_id": "acc-1",
    ///     "product_id": "BTC-USD", "side": "buy", "price": 100.50, "quantity": 5,
    ///     "event_type": "trade", "id": "e-1"}"#;
    /// let s = EventSignature::from_json(line).unwrap();
    /// assert_eq!(s.price(), "100.50");
    /// let err = EventSignature::from_json(r#"{"timestamp": "2025-11-18T09:00:00Z"}"#);
    /// assert_eq!(err.unwrap_err().field(), Some("account_id"));
    /// ```
    pub fn from_json(json: &str) -> Result<Self, EventError> {
        // serde would also read a struct from an array: only an object is an event.
        let start = json.trim_start();
        if !start.starts_with('{') {
            return Err(EventError::Malformed {
                message: format!("found {}", json_kind_of_raw(start)),
            });
        }
        let wire: Wire<'_> = serde_json::from_str(json).map_err(|e| EventError::Malformed {
            message: e.to_string(),
        })?;
        Ok(EventSignature {
            timestamp_micros: parse_timestamp(wire.timestamp)?,
            account_id: string_field("account_id", wire.account_id)?,
            product_id: string_field("product_id", wire.product_id)?,
            side: string_field("side", wire.side)?,
            price: parse_price(wire.price)?,
            quantity: parse_quantity(wire.quantity)?,
            event_type: string_field("event_type", wire.event_type)?,
        })
    }

    /// The timestamp, in UTC, to the microsecond.
    pub fn timestamp(&self) -> DateTime<Utc> {
        DateTime::from_timestamp_micros(self.timestamp_micros).expect("checked when built")
    }

    /// The timestamp as the signature renders it (`2025-11-18T09:00:00+00:00`).
    pub fn timestamp_iso(&self) -> String {
        let mut out = Vec::with_capacity(32);
        write_timestamp(&mut out, self.timestamp_micros);
        String::from_utf8(out).expect("ASCII")
    }

    /// The account id.
    pub fn account_id(&self) -> &str {
        &self.account_id
    }

    /// The product id.
    pub fn product_id(&self) -> &str {
        &self.product_id
    }

    /// The side (`buy`, `sell`…).
    pub fn side(&self) -> &str {
        &self.side
    }

    /// The price, as the decimal text it was given.
    pub fn price(&self) -> &str {
        &self.price
    }

    /// The quantity.
    pub fn quantity(&self) -> i128 {
        self.quantity
    }

    /// The event type.
    pub fn event_type(&self) -> &str {
        &self.event_type
    }
}

/// The fingerprint of a set of events: SHA-256 (64 lower-case hex characters) of the
/// sorted signatures serialised as Python's `json.dumps` does. The order of `events`
/// never changes the result; duplicates count.
///
/// ```
/// use idem::events::{fingerprint, EventSignature};
/// let a = EventSignature::from_json(r#"{"timestamp": "2025-11-18T09:00:00Z",
///     "account_id": "acc-1", "product_id": "BTC-USD", "side": "buy",
///     "price": "100.50", "quantity": 5, "event_type": "trade"}"#).unwrap();
/// let b = EventSignature::from_json(r#"{"timestamp": "2025-11-18T11:00:00+01:00",
///     "account_id": "acc-2", "product_id": "ETH-USD", "side": "sell",
///     "price": "2500.00", "quantity": 2, "event_type": "trade"}"#).unwrap();
/// let fp = fingerprint(&[a.clone(), b.clone()]);
/// assert_eq!(fp, fingerprint(&[b, a]));
/// assert_eq!(fp, "a74bf4d95ff28a7b9a7504132faeb5d466d0e4fb4e345ad9abe7d99802bd5ab7");
/// ```
pub fn fingerprint(events: &[EventSignature]) -> String {
    let mut hasher = Sha256::new();
    write_sorted(events, |chunk| hasher.update(chunk));
    hex(&hasher.finalize())
}

/// The fingerprint of events given as JSON objects (NDJSON lines, for example); an event
/// that cannot be read is an error naming its 1-based position and the field.
///
/// ```
/// use idem::events::fingerprint_json;
/// let err = fingerprint_json([r#"{"timestamp": "2025-11-18T09:00:00Z", "account_id": 1}"#])
///     .unwrap_err();
/// assert_eq!(err.to_string(), "event 1: field `account_id` is a number, expected a string");
/// ```
pub fn fingerprint_json<I, S>(events: I) -> Result<String, InvalidEvent>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let signatures = events
        .into_iter()
        .enumerate()
        .map(|(i, e)| EventSignature::from_json(e.as_ref()).map_err(|err| err.at(i + 1)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(fingerprint(&signatures))
}

/// The exact text [`fingerprint`] hashes: `json.dumps` of the sorted signatures.
///
/// ```
/// use idem::events::{signature_json, EventSignature};
/// let e = EventSignature::from_json(r#"{"timestamp": "2025-11-18T09:00:00.5Z",
///     "account_id": "café", "product_id": "p", "side": "buy", "price": 1.0,
///     "quantity": 3, "event_type": "trade"}"#).unwrap();
/// assert_eq!(
///     signature_json(&[e]),
///     r#"[["2025-11-18T09:00:00.500000+00:00", "caf\u00e9", "p", "buy", "1.0", 3, "trade"]]"#
/// );
/// ```
pub fn signature_json(events: &[EventSignature]) -> String {
    let mut out = Vec::new();
    write_sorted(events, |chunk| out.extend_from_slice(chunk));
    String::from_utf8(out).expect("json.dumps with ensure_ascii is ASCII")
}

const CHUNK: usize = 16 * 1024;

fn write_sorted(events: &[EventSignature], mut emit: impl FnMut(&[u8])) {
    // Sort (timestamp, index) pairs, plain integers, then put each run of equal
    // timestamps in the order of the other fields.
    let mut order: Vec<(i64, usize)> = events
        .iter()
        .enumerate()
        .map(|(i, e)| (e.timestamp_micros, i))
        .collect();
    order.sort_unstable();
    let mut start = 0;
    while start < order.len() {
        let at = order[start].0;
        let end = start + order[start..].iter().take_while(|o| o.0 == at).count();
        if end - start > 1 {
            order[start..end].sort_unstable_by(|a, b| events[a.1].cmp(&events[b.1]));
        }
        start = end;
    }
    let mut timestamps = TimestampWriter::default();
    let mut buf = Vec::with_capacity(CHUNK + 512);
    buf.push(b'[');
    if order.iter().enumerate().all(|(n, o)| o.1 == n) {
        // Already in order (the usual case): one pass.
        for (n, e) in events.iter().enumerate() {
            if n > 0 {
                buf.extend_from_slice(b", ");
            }
            write_row(&mut buf, &mut timestamps, e);
            if buf.len() >= CHUNK {
                emit(&buf);
                buf.clear();
            }
        }
    } else {
        // Each row is written in input order first (reading the events front to back is
        // much faster than hopping between them and their strings in sorted order), then
        // the rows are copied out in sorted order from one contiguous buffer.
        let mut rows = Vec::with_capacity(events.len() * 96);
        let mut ends = Vec::with_capacity(events.len());
        for e in events {
            write_row(&mut rows, &mut timestamps, e);
            ends.push(rows.len());
        }
        for (n, &(_, i)) in order.iter().enumerate() {
            if n > 0 {
                buf.extend_from_slice(b", ");
            }
            let from = if i == 0 { 0 } else { ends[i - 1] };
            buf.extend_from_slice(&rows[from..ends[i]]);
            if buf.len() >= CHUNK {
                emit(&buf);
                buf.clear();
            }
        }
    }
    buf.push(b']');
    emit(&buf);
}

/// One signature as `json.dumps` writes the tuple.
fn write_row(buf: &mut Vec<u8>, timestamps: &mut TimestampWriter, e: &EventSignature) {
    buf.extend_from_slice(b"[\"");
    timestamps.write(buf, e.timestamp_micros);
    buf.extend_from_slice(b"\", ");
    write_py_str(buf, &e.account_id);
    buf.extend_from_slice(b", ");
    write_py_str(buf, &e.product_id);
    buf.extend_from_slice(b", ");
    write_py_str(buf, &e.side);
    buf.extend_from_slice(b", ");
    write_py_str(buf, &e.price);
    buf.extend_from_slice(b", ");
    write_int(buf, e.quantity);
    buf.extend_from_slice(b", ");
    write_py_str(buf, &e.event_type);
    buf.push(b']');
}

/// `datetime.isoformat()` of an aware UTC value.
fn write_timestamp(out: &mut Vec<u8>, micros: i64) {
    TimestampWriter::default().write(out, micros)
}

/// Renders timestamps, remembering the last day's date: sorted events mostly share it.
struct TimestampWriter {
    day: i64,
    date: [u8; 10],
}

impl Default for TimestampWriter {
    fn default() -> Self {
        TimestampWriter {
            day: i64::MIN,
            date: [0; 10],
        }
    }
}

impl TimestampWriter {
    fn write(&mut self, out: &mut Vec<u8>, micros: i64) {
        let secs = micros.div_euclid(1_000_000);
        let frac = micros.rem_euclid(1_000_000) as u32;
        let day = secs.div_euclid(86_400);
        let in_day = secs.rem_euclid(86_400) as u32;
        if day != self.day {
            let (year, month, day_of_month) = civil_from_days(day);
            let mut date = *b"0000-00-00";
            put_digits(&mut date[0..4], year);
            put_digits(&mut date[5..7], month);
            put_digits(&mut date[8..10], day_of_month);
            self.day = day;
            self.date = date;
        }
        let mut text = *b"0000-00-00T00:00:00.000000+00:00";
        text[..10].copy_from_slice(&self.date);
        put_digits(&mut text[11..13], in_day / 3600);
        put_digits(&mut text[14..16], in_day / 60 % 60);
        put_digits(&mut text[17..19], in_day % 60);
        if frac == 0 {
            text[19..25].copy_from_slice(b"+00:00");
            out.extend_from_slice(&text[..25]);
        } else {
            put_digits(&mut text[20..26], frac);
            out.extend_from_slice(&text);
        }
    }
}

/// (year, month, day) of a day number since 1970-01-01 in the proleptic Gregorian
/// calendar (H. Hinnant's `civil_from_days`); years 1 to 9999 only, as checked when the
/// signature is built.
fn civil_from_days(days: i64) -> (u32, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11], March first
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = (yoe + era * 400 + i64::from(month <= 2)) as u32;
    (year, month, day)
}

fn put_digits(slot: &mut [u8], mut n: u32) {
    for d in slot.iter_mut().rev() {
        *d = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// Bytes `json.dumps` copies as they are: printable ASCII but `"` and `\\`.
static PLAIN: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0x20;
    while b < 0x7f {
        t[b] = b != b'"' as usize && b != b'\\' as usize;
        b += 1;
    }
    t
};

/// A string as `json.dumps` writes it with `ensure_ascii=True`.
fn write_py_str(out: &mut Vec<u8>, s: &str) {
    let bytes = s.as_bytes();
    out.push(b'"');
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if PLAIN[b as usize] {
            i += 1;
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        if b < 0x80 {
            match b {
                b'"' => out.extend_from_slice(b"\\\""),
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                0x08 => out.extend_from_slice(b"\\b"),
                0x0c => out.extend_from_slice(b"\\f"),
                _ => push_unit(out, u16::from(b)),
            }
            i += 1;
        } else {
            let c = s[i..].chars().next().expect("a char starts here");
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                push_unit(out, *u);
            }
            i += c.len_utf8();
        }
        start = i;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// `\uXXXX`, lower-case hex as Python writes it.
fn push_unit(out: &mut Vec<u8>, u: u16) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(&[
        b'\\',
        b'u',
        HEX[(u >> 12) as usize],
        HEX[((u >> 8) & 15) as usize],
        HEX[((u >> 4) & 15) as usize],
        HEX[(u & 15) as usize],
    ]);
}

/// Writes `n` in decimal, without allocating.
pub(super) fn write_int(out: &mut Vec<u8>, n: i128) {
    if n < 0 {
        out.push(b'-');
    }
    let mut n = n.unsigned_abs();
    let mut tmp = [0u8; 40];
    let mut at = tmp.len();
    loop {
        at -= 1;
        tmp[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[at..]);
}

/// The fields as raw JSON texts: a number's text survives (no `arbitrary_precision`
/// needed, which would change `serde_json::Number` for the whole crate), and `null` is
/// told apart from an absent field.
#[derive(Deserialize)]
#[serde(expecting = "an event object")]
struct Wire<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    timestamp: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    account_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    product_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    side: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    price: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    quantity: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    event_type: Option<&'a RawValue>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

fn required<'a>(field: &str, raw: Option<&'a RawValue>) -> Result<&'a str, EventError> {
    raw.map(RawValue::get)
        .ok_or_else(|| EventError::MissingField {
            field: field.to_string(),
        })
}

fn string_field(field: &str, raw: Option<&RawValue>) -> Result<String, EventError> {
    let raw = required(field, raw)?;
    if !raw.starts_with('"') {
        return Err(EventError::WrongType {
            field: field.to_string(),
            expected: "a string",
            found: json_kind_of_raw(raw),
        });
    }
    serde_json::from_str(raw).map_err(|e| EventError::InvalidField {
        field: field.to_string(),
        reason: e.to_string(),
    })
}

fn parse_timestamp(raw: Option<&RawValue>) -> Result<i64, EventError> {
    let text = string_field("timestamp", raw)?;
    let invalid = |why: &str| EventError::InvalidField {
        field: "timestamp".into(),
        reason: format!("{text:?} {why}"),
    };
    let parsed: DateTime<FixedOffset> = DateTime::parse_from_rfc3339(&text).map_err(|_| {
        invalid("is not an RFC 3339 time with a UTC offset (e.g. 2025-11-18T09:00:00Z)")
    })?;
    if parsed.nanosecond() >= 1_000_000_000 {
        return Err(invalid(
            "is a leap second, which Python's datetime cannot hold",
        ));
    }
    micros_in_range(&parsed.with_timezone(&Utc))
        .map_err(|_| invalid("is outside the years 1 to 9999 in UTC"))
}

fn micros_in_range(t: &DateTime<Utc>) -> Result<i64, EventError> {
    let micros = t.timestamp_micros();
    if (MIN_MICROS..=MAX_MICROS).contains(&micros) && t.nanosecond() < 1_000_000_000 {
        Ok(micros)
    } else {
        Err(EventError::InvalidField {
            field: "timestamp".into(),
            reason: format!("{} is outside the years 1 to 9999", t.to_rfc3339()),
        })
    }
}

fn parse_price(raw: Option<&RawValue>) -> Result<String, EventError> {
    let text = required("price", raw)?;
    match text.as_bytes()[0] {
        b'"' => {
            let text = string_field("price", raw)?;
            check_decimal(&text)?;
            Ok(text)
        }
        b'-' | b'0'..=b'9' => Ok(text.to_string()),
        _ => Err(EventError::WrongType {
            field: "price".into(),
            expected: "a decimal string or a number",
            found: json_kind_of_raw(text),
        }),
    }
}

/// A decimal number as JSON writes one: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
fn check_decimal(text: &str) -> Result<(), EventError> {
    let b = text.as_bytes();
    let mut i = 0;
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    if b.first() == Some(&b'-') {
        i += 1;
    }
    let int_start = i;
    let n = digits(&mut i);
    let mut ok = n > 0 && !(n > 1 && b[int_start] == b'0');
    if ok && i < b.len() && b[i] == b'.' {
        i += 1;
        ok = digits(&mut i) > 0;
    }
    if ok && i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
            i += 1;
        }
        ok = digits(&mut i) > 0;
    }
    if ok && i == b.len() {
        Ok(())
    } else {
        Err(EventError::InvalidField {
            field: "price".into(),
            reason: format!("{text:?} is not a decimal number (e.g. \"100.50\")"),
        })
    }
}

fn parse_quantity(raw: Option<&RawValue>) -> Result<i128, EventError> {
    let raw = required("quantity", raw)?;
    let kind = json_kind_of_raw(raw);
    if kind != "a number" {
        return Err(EventError::WrongType {
            field: "quantity".into(),
            expected: "an integer",
            found: kind,
        });
    }
    if raw.contains(['.', 'e', 'E']) {
        return Err(EventError::WrongType {
            field: "quantity".into(),
            expected: "an integer",
            found: "a number with a fraction or exponent",
        });
    }
    raw.parse::<i128>().map_err(|_| EventError::InvalidField {
        field: "quantity".into(),
        reason: format!("{raw} does not fit in 128 bits"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Datelike;

    fn event(fields: &str) -> String {
        let mut base = serde_json::json!({
            "timestamp": "2025-11-18T09:00:00Z", "account_id": "a", "product_id": "p",
            "side": "buy", "price": "1", "quantity": 1, "event_type": "trade"
        });
        let over: serde_json::Value = serde_json::from_str(fields).unwrap();
        for (k, v) in over.as_object().unwrap() {
            if v.is_string() && v.as_str() == Some("<absent>") {
                base.as_object_mut().unwrap().remove(k);
            } else {
                base[k] = v.clone();
            }
        }
        base.to_string()
    }

    fn err(fields: &str) -> String {
        EventSignature::from_json(&event(fields))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn timestamps_render_as_python_isoformat() {
        let iso = |t: &str| {
            EventSignature::from_json(&event(&format!(r#"{{"timestamp": "{t}"}}"#)))
                .unwrap()
                .timestamp_iso()
        };
        assert_eq!(iso("2025-11-18T09:00:00Z"), "2025-11-18T09:00:00+00:00");
        assert_eq!(iso("2025-11-18T09:00:00.000Z"), "2025-11-18T09:00:00+00:00");
        assert_eq!(
            iso("2025-11-18T09:00:00.05Z"),
            "2025-11-18T09:00:00.050000+00:00"
        );
        assert_eq!(
            iso("2025-11-18T09:00:00.0000009Z"),
            "2025-11-18T09:00:00+00:00"
        );
        assert_eq!(
            iso("2025-11-18T01:00:00-08:00"),
            "2025-11-18T09:00:00+00:00"
        );
        assert_eq!(
            iso("1969-12-31T23:59:59.5Z"),
            "1969-12-31T23:59:59.500000+00:00"
        );
        assert_eq!(iso("0001-01-01T00:00:00Z"), "0001-01-01T00:00:00+00:00");
    }

    #[test]
    fn each_bad_field_is_named() {
        assert_eq!(err(r#"{"side": "<absent>"}"#), "field `side` is missing");
        assert_eq!(
            err(r#"{"side": null}"#),
            "field `side` is null, expected a string"
        );
        assert_eq!(
            err(r#"{"quantity": "5"}"#),
            "field `quantity` is a string, expected an integer"
        );
        assert_eq!(
            err(r#"{"quantity": 5.0}"#),
            "field `quantity` is a number with a fraction or exponent, expected an integer"
        );
        assert_eq!(
            err(r#"{"price": true}"#),
            "field `price` is a boolean, expected a decimal string or a number"
        );
        assert_eq!(
            err(r#"{"price": "1,50"}"#),
            r#"field `price` is invalid: "1,50" is not a decimal number (e.g. "100.50")"#
        );
        assert_eq!(
            err(r#"{"timestamp": "2025-11-18T09:00:00"}"#),
            r#"field `timestamp` is invalid: "2025-11-18T09:00:00" is not an RFC 3339 time with a UTC offset (e.g. 2025-11-18T09:00:00Z)"#
        );
        assert_eq!(
            err(r#"{"timestamp": "0001-01-01T00:00:00+01:00"}"#),
            r#"field `timestamp` is invalid: "0001-01-01T00:00:00+01:00" is outside the years 1 to 9999 in UTC"#
        );
        assert_eq!(
            err(r#"{"timestamp": 1763456400}"#),
            "field `timestamp` is a number, expected a string"
        );
        let malformed = EventSignature::from_json("[1, 2]").unwrap_err();
        assert!(
            matches!(malformed, EventError::Malformed { .. }),
            "{malformed}"
        );
        assert_eq!(malformed.to_string(), "not a JSON object: found an array");
        let truncated = EventSignature::from_json(r#"{"timestamp": "#).unwrap_err();
        assert!(
            matches!(truncated, EventError::Malformed { .. }),
            "{truncated}"
        );
    }

    #[test]
    fn numeric_price_text_is_the_number_alone() {
        let line = "{\"timestamp\":\"2025-11-18T09:00:00Z\",\"account_id\":\"a\",\"product_id\":\"p\",\
                    \"side\":\"buy\",\"price\" :\t 100.50 \n,\"quantity\": -0 ,\"event_type\":\"t\"}";
        let s = EventSignature::from_json(line).unwrap();
        assert_eq!(s.price(), "100.50");
        assert_eq!(s.quantity(), 0);
        let dup = r#"{"price": "1", "price": "2"}"#;
        assert!(matches!(
            EventSignature::from_json(dup),
            Err(EventError::Malformed { .. })
        ));
    }

    #[test]
    fn decimal_grammar() {
        for ok in ["0", "-0", "100.50", "1e3", "1.5E-3", "-12.000"] {
            assert!(check_decimal(ok).is_ok(), "{ok}");
        }
        for bad in [
            "", "-", "01", "1.", ".5", "+1", "1e", " 1", "1 ", "NaN", "1,5",
        ] {
            assert!(check_decimal(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn civil_dates_agree_with_chrono_over_the_whole_range() {
        let first = MIN_MICROS.div_euclid(86_400_000_000);
        let last = MAX_MICROS.div_euclid(86_400_000_000);
        for day in first..=last {
            let t = DateTime::from_timestamp(day * 86_400, 0).unwrap();
            assert_eq!(
                civil_from_days(day),
                (t.year() as u32, t.month(), t.day()),
                "day {day}"
            );
        }
    }

    #[test]
    fn python_string_escapes() {
        let mut out = Vec::new();
        write_py_str(&mut out, "a\"\\\n\r\t\u{8}\u{c}\u{1}\u{7f}é😀/");
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#""a\"\\\n\r\t\b\f\u0001\u007f\u00e9\ud83d\ude00/""#
        );
    }

    #[test]
    fn integers_any_sign_and_size() {
        let mut out = Vec::new();
        for n in [0i128, -1, 42, i128::MIN, i128::MAX] {
            out.clear();
            write_int(&mut out, n);
            assert_eq!(String::from_utf8(out.clone()).unwrap(), n.to_string());
        }
        assert_eq!(
            parse_quantity(RawValue::from_string("-0".into()).ok().as_deref()).unwrap(),
            0
        );
    }
}
