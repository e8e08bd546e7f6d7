//! Typed query results: what a warehouse returns for the content query, and its canonical
//! encoding in the content key.
//!
//! A row is its cells in column order (duplicate column names are two cells, not one
//! key), and each cell keeps its type, so two different values never encode the same:
//! a NULL, an infinite REAL and a TEXT that is not UTF-8 are three values, the text
//! `'1.5'` is not the numeric `1.5`, and a BLOB is not the text of its hex digits.

use serde_json::{Map, Number, Value};

/// One value of a query result, with its type.
///
/// Each warehouse maps its types onto these (see [`Cell::canonical`] for the encoding
/// and the README's "Canonical row encoding" for the table per dialect). A value a
/// warehouse cannot read as one of the named types is [`Cell::Other`]: its type name and
/// its exact bytes, never dropped and never `NULL`.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// SQL NULL.
    Null,
    /// A 64-bit integer.
    Integer(i64),
    /// A binary floating-point number, including NaN and ±infinity.
    Real(f64),
    /// An exact decimal, as the warehouse prints it (`"12.340"`, `"NaN"`).
    Numeric(String),
    /// A boolean.
    Bool(bool),
    /// Text (valid UTF-8).
    Text(String),
    /// Text whose bytes are not valid UTF-8 (SQLite stores whatever it is given).
    TextBytes(Vec<u8>),
    /// Bytes (SQLite BLOB, Postgres bytea, BigQuery BYTES).
    Blob(Vec<u8>),
    /// A calendar date, `YYYY-MM-DD`.
    Date(String),
    /// A time of day, `HH:MM:SS[.fff]`.
    Time(String),
    /// A date and time without a time zone, `YYYY-MM-DDTHH:MM:SS[.fff]`.
    DateTime(String),
    /// An instant, RFC 3339 in UTC (`…Z`).
    Timestamp(String),
    /// JSON, as the text the warehouse returned.
    Json(String),
    /// A UUID, lower-case hyphenated.
    Uuid(String),
    /// An array (Postgres arrays, BigQuery REPEATED fields), elements in order.
    Array(Vec<Cell>),
    /// A BigQuery STRUCT: its fields in order.
    Struct(Vec<(String, Cell)>),
    /// Any other type: its name (lower case) and the value's exact bytes (Postgres: the
    /// binary wire format; BigQuery: the API's text).
    Other {
        /// The warehouse's name of the type.
        type_name: String,
        /// The value as the warehouse sent it.
        bytes: Vec<u8>,
    },
}

/// The rows of a query: column names and typed cells, both in the query's column order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rows {
    /// Column names in order (may repeat: `SELECT a.id, b.id …`). Empty when the driver
    /// names columns only through rows and there were none.
    pub columns: Vec<String>,
    /// Each row's cells, one per column.
    pub rows: Vec<Vec<Cell>>,
}

impl Rows {
    /// The rows a sqlx driver fetched, each cell typed by `cell(row, column index)`; the
    /// column names come from the first row (none when there are no rows).
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn from_sqlx<R: sqlx::Row>(fetched: &[R], cell: impl Fn(&R, usize) -> Cell) -> Rows {
        use sqlx::Column as _;
        Rows {
            columns: fetched
                .first()
                .map(|r| r.columns().iter().map(|c| c.name().to_string()).collect())
                .unwrap_or_default(),
            rows: fetched
                .iter()
                .map(|r| (0..r.columns().len()).map(|i| cell(r, i)).collect())
                .collect(),
        }
    }

    /// Each row as a JSON object, column name → plain value ([`Cell::to_json`]), for
    /// display. Lossy: of two columns with the same name the last wins, and types are not
    /// kept; the content key uses [`Rows::canonical`] instead.
    pub fn to_objects(&self) -> Vec<Value> {
        self.rows
            .iter()
            .map(|cells| {
                let mut map = Map::new();
                for (name, cell) in self.columns.iter().zip(cells) {
                    map.insert(name.clone(), cell.to_json());
                }
                Value::Object(map)
            })
            .collect()
    }

    /// Each row as its canonical encoding: a JSON array of [`Cell::canonical`] cells in
    /// column order.
    pub fn canonical(&self) -> Vec<Value> {
        self.rows.iter().map(|cells| canonical_row(cells)).collect()
    }
}

/// A row's canonical encoding: its cells' [`Cell::canonical`] in column order.
pub fn canonical_row(cells: &[Cell]) -> Value {
    Value::Array(cells.iter().map(Cell::canonical).collect())
}

fn tagged(tag: &str, value: Value) -> Value {
    Value::Array(vec![Value::from(tag), value])
}

/// Lower-case hex of bytes.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// `NaN`, `Infinity`, `-Infinity` (Postgres's and BigQuery's spelling).
fn non_finite(f: f64) -> &'static str {
    if f.is_nan() {
        "NaN"
    } else if f > 0.0 {
        "Infinity"
    } else {
        "-Infinity"
    }
}

impl Cell {
    /// The typed, collision-free encoding the content key hashes: `null` for NULL, else
    /// `[TAG, VALUE]`:
    ///
    /// | cell | encoding |
    /// |---|---|
    /// | NULL | `null` |
    /// | integer | `["integer", 42]` |
    /// | real | `["real", 2.5]`; non-finite as text: `["real", "NaN"]`, `"Infinity"`, `"-Infinity"` |
    /// | numeric | `["numeric", "12.340"]` |
    /// | bool | `["bool", true]` |
    /// | text | `["text", "abc"]` |
    /// | text, not UTF-8 | `["text_bytes", "ff00"]` (hex) |
    /// | blob | `["blob", "ff00"]` (hex) |
    /// | date, time, datetime, timestamp | `["date", "2025-11-18"]`, `["time", …]`, `["datetime", …]`, `["timestamp", "…Z"]` |
    /// | json | `["json", "{\"a\": 1}"]` (the text as returned) |
    /// | uuid | `["uuid", "a0ee…"]` |
    /// | array | `["array", [CELL, …]]` |
    /// | struct | `["struct", [["NAME", CELL], …]]` |
    /// | other | `["other", "TYPE", "HEX"]` |
    ///
    /// ```
    /// use idem::warehouse::Cell;
    /// use serde_json::json;
    /// assert_eq!(Cell::Real(f64::INFINITY).canonical(), json!(["real", "Infinity"]));
    /// assert_ne!(Cell::Text("ab".into()).canonical(), Cell::Blob(vec![0xab]).canonical());
    /// ```
    pub fn canonical(&self) -> Value {
        match self {
            Cell::Null => Value::Null,
            Cell::Integer(n) => tagged("integer", Value::from(*n)),
            Cell::Real(f) => tagged(
                "real",
                Number::from_f64(*f)
                    .map(Value::Number)
                    .unwrap_or_else(|| Value::from(non_finite(*f))),
            ),
            Cell::Numeric(s) => tagged("numeric", Value::from(s.as_str())),
            Cell::Bool(b) => tagged("bool", Value::Bool(*b)),
            Cell::Text(s) => tagged("text", Value::from(s.as_str())),
            Cell::TextBytes(b) => tagged("text_bytes", Value::from(hex(b))),
            Cell::Blob(b) => tagged("blob", Value::from(hex(b))),
            Cell::Date(s) => tagged("date", Value::from(s.as_str())),
            Cell::Time(s) => tagged("time", Value::from(s.as_str())),
            Cell::DateTime(s) => tagged("datetime", Value::from(s.as_str())),
            Cell::Timestamp(s) => tagged("timestamp", Value::from(s.as_str())),
            Cell::Json(s) => tagged("json", Value::from(s.as_str())),
            Cell::Uuid(s) => tagged("uuid", Value::from(s.as_str())),
            Cell::Array(items) => tagged(
                "array",
                Value::Array(items.iter().map(Cell::canonical).collect()),
            ),
            Cell::Struct(fields) => tagged(
                "struct",
                Value::Array(
                    fields
                        .iter()
                        .map(|(name, cell)| {
                            Value::Array(vec![Value::from(name.as_str()), cell.canonical()])
                        })
                        .collect(),
                ),
            ),
            Cell::Other { type_name, bytes } => Value::Array(vec![
                Value::from("other"),
                Value::from(type_name.as_str()),
                Value::from(hex(bytes)),
            ]),
        }
    }

    /// The value as plain JSON, for display: numbers and booleans as themselves,
    /// non-finite reals and everything else as text (blobs and non-UTF-8 text as hex),
    /// JSON parsed, arrays as arrays, structs as objects. Not injective: never hashed.
    pub fn to_json(&self) -> Value {
        match self {
            Cell::Null => Value::Null,
            Cell::Integer(n) => Value::from(*n),
            Cell::Real(f) => Number::from_f64(*f)
                .map(Value::Number)
                .unwrap_or_else(|| Value::from(non_finite(*f))),
            Cell::Bool(b) => Value::Bool(*b),
            Cell::Numeric(s)
            | Cell::Text(s)
            | Cell::Date(s)
            | Cell::Time(s)
            | Cell::DateTime(s)
            | Cell::Timestamp(s)
            | Cell::Uuid(s) => Value::from(s.as_str()),
            Cell::TextBytes(b) | Cell::Blob(b) => Value::from(hex(b)),
            Cell::Json(s) => serde_json::from_str(s).unwrap_or_else(|_| Value::from(s.as_str())),
            Cell::Array(items) => Value::Array(items.iter().map(Cell::to_json).collect()),
            Cell::Struct(fields) => Value::Object(
                fields
                    .iter()
                    .map(|(name, cell)| (name.clone(), cell.to_json()))
                    .collect(),
            ),
            // Text when the bytes are readable text (enums, citext, geography, …), else
            // `\x` hex.
            Cell::Other { bytes, .. } => match std::str::from_utf8(bytes) {
                Ok(s) if !s.chars().any(|c| c.is_control() && !c.is_whitespace()) => Value::from(s),
                _ => Value::from(format!("\\x{}", hex(bytes))),
            },
        }
    }

    /// Text, or [`Cell::TextBytes`] when the bytes are not UTF-8.
    pub fn text_from_bytes(bytes: Vec<u8>) -> Cell {
        match String::from_utf8(bytes) {
            Ok(s) => Cell::Text(s),
            Err(e) => Cell::TextBytes(e.into_bytes()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every pair of distinct cells of the classes that used to collide encodes
    /// differently.
    #[test]
    fn different_values_never_encode_the_same() {
        let cells = vec![
            Cell::Null,
            Cell::Real(f64::INFINITY),
            Cell::Real(f64::NEG_INFINITY),
            Cell::Real(f64::NAN),
            Cell::Real(0.0),
            Cell::Real(-0.0),
            Cell::Real(1.5),
            Cell::Integer(1),
            Cell::Numeric("1.5".into()),
            Cell::Numeric("NaN".into()),
            Cell::Text("1.5".into()),
            Cell::Text("NaN".into()),
            Cell::Text("Infinity".into()),
            Cell::Text("ff".into()),
            Cell::Text("1".into()),
            Cell::Text("true".into()),
            Cell::TextBytes(vec![0xff]),
            Cell::Blob(vec![0xff]),
            Cell::Blob(Vec::new()),
            Cell::Text(String::new()),
            Cell::Bool(true),
            Cell::Json("true".into()),
            Cell::Json("1".into()),
            Cell::Date("2025-11-18".into()),
            Cell::Text("2025-11-18".into()),
            Cell::Array(vec![Cell::Text("1".into())]),
            Cell::Array(vec![Cell::Integer(1)]),
            Cell::Array(Vec::new()),
            Cell::Other {
                type_name: "mood".into(),
                bytes: b"ff".to_vec(),
            },
        ];
        let encoded: Vec<String> = cells
            .iter()
            .map(|c| crate::key::canonical_json(&c.canonical()))
            .collect();
        for i in 0..encoded.len() {
            for j in i + 1..encoded.len() {
                assert_ne!(
                    encoded[i], encoded[j],
                    "{:?} and {:?} encode the same",
                    cells[i], cells[j]
                );
            }
        }
        assert_eq!(
            canonical_row(&[Cell::Integer(1), Cell::Integer(2), Cell::Null]),
            json!([["integer", 1], ["integer", 2], null]),
            "one cell per column, in order"
        );
    }
}
