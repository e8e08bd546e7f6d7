//! Named parameters and statement splitting for job SQL.
//!
//! Job SQL names its parameters BigQuery-style (`@scope`). For each dialect the text is
//! rewritten to the driver's placeholders (`?1` for SQLite, `$1` for Postgres, `@scope`
//! kept for BigQuery) and the values are bound, never spliced into the text. Scripts are
//! split into statements on `;`.
//!
//! An `@name` or a `;` inside a literal, a quoted identifier or a comment is text, not
//! syntax, so the scanner reads those the way each database's own lexer does:
//!
//! | | Postgres | SQLite | BigQuery |
//! |---|---|---|---|
//! | `'…'` | `''` doubles; a backslash is a plain character (standard strings) | `''` doubles | backslash escapes (`\'`); `'''…'''` triple-quoted |
//! | `E'…'` | backslash escapes and `''` | – | – |
//! | `"…"` | identifier, `""` doubles | identifier, `""` doubles | string, as `'…'` (and `"""…"""`) |
//! | `` `…` `` | not a quote | identifier, doubled backtick | identifier, backslash escapes |
//! | `[…]` | not a quote (arrays) | identifier | not a quote (arrays) |
//! | `$tag$…$tag$` | dollar quoting | – | – |
//! | comments | `--`, `/* */` nested | `--`, `/* */` | `--`, `#`, `/* */` |
//!
//! BigQuery's raw (`r'…'`) and bytes (`b'…'`) prefixes do not change where a literal ends
//! (its lexer reads `\x` as a pair in raw strings too), and `@@name` is a system variable
//! (in Postgres, the `@@` text-search operator), never a parameter.
//!
//! Postgres is read with `standard_conforming_strings = on`, its default since 9.1.
//!
//! A `;` inside a body of statements does not split it: SQLite's `CREATE TRIGGER … BEGIN
//! …; END` and Postgres's `BEGIN ATOMIC …; END` end at the first `;` after `END`.

use crate::error::{Error, Result};

/// SQL dialects idem speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// SQLite: `?N` placeholders.
    Sqlite,
    /// Postgres: `$N` placeholders.
    Postgres,
    /// BigQuery: `@name` named parameters.
    BigQuery,
}

impl Dialect {
    /// The dialect's name (`sqlite`, `postgres`, `bigquery`).
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Sqlite => "sqlite",
            Dialect::Postgres => "postgres",
            Dialect::BigQuery => "bigquery",
        }
    }

    /// Parses a dialect name (`postgresql` is `postgres`).
    pub fn parse(s: &str) -> Result<Dialect> {
        match s {
            "sqlite" => Ok(Dialect::Sqlite),
            "postgres" | "postgresql" => Ok(Dialect::Postgres),
            "bigquery" => Ok(Dialect::BigQuery),
            _ => Err(Error::config(format!(
                "unknown dialect {s:?}: expected sqlite, postgres or bigquery"
            ))),
        }
    }

    /// The dialect a URL's scheme names (whether or not this build can open it).
    pub fn of_url(url: &str) -> Option<Dialect> {
        super::Backend::named(url).and_then(super::Backend::dialect)
    }
}

impl std::fmt::Display for Dialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One statement ready for a driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The text with placeholders.
    pub sql: String,
    /// Parameter names in placeholder order (`?1`/`$1` is `params[0]`); for BigQuery the
    /// distinct names used.
    pub params: Vec<String>,
}

/// Splits a script into statements and rewrites `@name` parameters for `dialect`.
///
/// Fails on text the scanner cannot read (an unterminated string, quoted identifier,
/// comment or dollar-quoted body), naming the line and column where it starts.
///
/// ```
/// use idem::warehouse::{prepare, Dialect};
/// let s = prepare("DELETE FROM t WHERE d = @scope; INSERT INTO t SELECT '@scope;', @scope", Dialect::Postgres).unwrap();
/// assert_eq!(s.len(), 2);
/// assert_eq!(s[0].sql, "DELETE FROM t WHERE d = $1");
/// assert_eq!(s[1].sql, "INSERT INTO t SELECT '@scope;', $1");
/// assert_eq!(s[1].params, vec!["scope"]);
/// ```
pub fn prepare(script: &str, dialect: Dialect) -> Result<Vec<Statement>> {
    let bytes = script.as_bytes();
    let mut statements = Vec::new();
    let mut sql = String::new();
    let mut params: Vec<String> = Vec::new();
    let mut meaningful = false;
    let mut words = Words::default();
    let mut i = 0;
    let mut copied = 0; // bytes of `script` up to here already copied to `sql`
    let flush = |sql: &mut String,
                 params: &mut Vec<String>,
                 meaningful: &mut bool,
                 statements: &mut Vec<Statement>| {
        let text = sql.trim().to_string();
        if *meaningful && !text.is_empty() {
            statements.push(Statement {
                sql: text,
                params: std::mem::take(params),
            });
        }
        params.clear();
        sql.clear();
        *meaningful = false;
    };
    while i < bytes.len() {
        if let Some(token) = opaque_at(script, i, dialect)? {
            match token {
                Opaque::Comment(end) => i = end,
                Opaque::Literal(end) => {
                    meaningful = true;
                    words.other();
                    i = end;
                }
            }
            continue;
        }
        match bytes[i] {
            b'@' if bytes.get(i + 1) == Some(&b'@') => {
                // BigQuery system variable (@@project_id), Postgres `@@` operator: not a
                // parameter.
                meaningful = true;
                i += 2;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
            }
            b'@' if bytes
                .get(i + 1)
                .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_') =>
            {
                let start = i + 1;
                let mut end = start;
                while end < bytes.len()
                    && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_')
                {
                    end += 1;
                }
                let name = &script[start..end];
                sql.push_str(&script[copied..i]);
                match dialect {
                    Dialect::BigQuery => {
                        sql.push('@');
                        sql.push_str(name);
                        if !params.iter().any(|p| p == name) {
                            params.push(name.to_string());
                        }
                    }
                    Dialect::Sqlite | Dialect::Postgres => {
                        let n = match params.iter().position(|p| p == name) {
                            Some(p) => p + 1,
                            None => {
                                params.push(name.to_string());
                                params.len()
                            }
                        };
                        // `x@scope` must not become the identifier `x$1`.
                        if dialect == Dialect::Postgres
                            && sql.as_bytes().last().is_some_and(|&b| is_ident_byte(b))
                        {
                            sql.push(' ');
                        }
                        sql.push(if dialect == Dialect::Sqlite { '?' } else { '$' });
                        sql.push_str(&n.to_string());
                    }
                }
                copied = end;
                meaningful = true;
                words.other();
                i = end;
            }
            b';' if words.splits() => {
                sql.push_str(&script[copied..i]);
                copied = i + 1;
                i += 1;
                flush(&mut sql, &mut params, &mut meaningful, &mut statements);
                words = Words::default();
            }
            c if c.is_ascii_whitespace() => i += 1,
            c if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                let end = bytes[i..]
                    .iter()
                    .position(|&b| !is_ident_byte(b))
                    .map_or(bytes.len(), |p| i + p);
                words.word(&script[i..end], dialect);
                meaningful = true;
                i = end;
            }
            _ => {
                meaningful = true;
                words.other();
                i += 1;
            }
        }
    }
    sql.push_str(&script[copied..]);
    flush(&mut sql, &mut params, &mut meaningful, &mut statements);
    Ok(statements)
}

/// The keywords of the statement being read, so that a `;` inside a body that holds
/// statements does not split it: SQLite's `CREATE [TEMP] TRIGGER … BEGIN …; …; END` and
/// Postgres's `BEGIN ATOMIC …; END`. As in SQLite's own `sqlite3_complete()`, such a
/// statement ends at the first `;` right after the keyword `END`.
#[derive(Debug, Default)]
struct Words {
    /// The first three words, upper-cased.
    leading: Vec<String>,
    /// The previous token, when it was a word (upper-cased).
    previous: Option<String>,
    /// Inside a body whose statements end with `;`.
    in_body: bool,
}

impl Words {
    fn word(&mut self, word: &str, dialect: Dialect) {
        let upper = word.to_ascii_uppercase();
        if self.leading.len() < 3 {
            self.leading.push(upper.clone());
        }
        let leading: Vec<&str> = self.leading.iter().map(String::as_str).collect();
        match dialect {
            Dialect::Sqlite
                if matches!(
                    leading.as_slice(),
                    ["CREATE", "TRIGGER", ..] | ["CREATE", "TEMP" | "TEMPORARY", "TRIGGER"]
                ) =>
            {
                self.in_body = true
            }
            Dialect::Postgres if upper == "ATOMIC" && self.previous.as_deref() == Some("BEGIN") => {
                self.in_body = true
            }
            _ => {}
        }
        self.previous = Some(upper);
    }

    fn other(&mut self) {
        self.previous = None;
    }

    /// Whether a `;` here ends the statement.
    fn splits(&self) -> bool {
        !self.in_body || self.previous.as_deref() == Some("END")
    }
}

/// A stretch of text in which `@` and `;` are not syntax; the index just past it.
enum Opaque {
    /// A comment.
    Comment(usize),
    /// A string or quoted identifier (or dollar-quoted body).
    Literal(usize),
}

/// A byte that may continue an identifier (non-ASCII bytes are letters to every dialect).
fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

/// `line L, column C` (1-based, columns in characters) of byte `at`.
fn position(script: &str, at: usize) -> String {
    let before = &script[..at];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}")
}

fn unterminated(script: &str, at: usize, what: &str) -> Error {
    Error::config(format!(
        "unterminated {what} starting at {} of the SQL",
        position(script, at)
    ))
}

/// The comment, literal or quoted identifier starting at byte `i`, if one does.
fn opaque_at(script: &str, i: usize, dialect: Dialect) -> Result<Option<Opaque>> {
    let bytes = script.as_bytes();
    let next = bytes.get(i + 1).copied();
    let prev = i.checked_sub(1).map(|p| bytes[p]);
    let literal = |end: Option<usize>, what: &str| {
        end.map(|e| Some(Opaque::Literal(e)))
            .ok_or_else(|| unterminated(script, i, what))
    };
    match (bytes[i], dialect) {
        (b'-', _) if next == Some(b'-') => Ok(Some(Opaque::Comment(line_end(bytes, i)))),
        (b'#', Dialect::BigQuery) => Ok(Some(Opaque::Comment(line_end(bytes, i)))),
        (b'/', _) if next == Some(b'*') => {
            let end = block_comment_end(bytes, i, dialect == Dialect::Postgres)
                .ok_or_else(|| unterminated(script, i, "/* comment"))?;
            Ok(Some(Opaque::Comment(end)))
        }
        (q @ (b'\'' | b'"'), Dialect::BigQuery) => {
            let what = if q == b'\'' { "string" } else { "\"string\"" };
            if bytes.get(i + 1) == Some(&q) && bytes.get(i + 2) == Some(&q) {
                literal(triple_quoted_end(bytes, i, q), "triple-quoted string")
            } else {
                literal(backslash_quoted_end(bytes, i, q), what)
            }
        }
        (b'\'', Dialect::Postgres) => {
            // E'…' (escape string): the E must stand alone, not end an identifier.
            let escape = matches!(prev, Some(b'E' | b'e'))
                && !i.checked_sub(2).is_some_and(|p| is_ident_byte(bytes[p]));
            if escape {
                literal(escape_string_end(bytes, i), "E'…' string")
            } else {
                literal(doubled_quoted_end(bytes, i, b'\''), "string")
            }
        }
        (b'\'', Dialect::Sqlite) => literal(doubled_quoted_end(bytes, i, b'\''), "string"),
        (b'"', _) => literal(
            doubled_quoted_end(bytes, i, b'"'),
            "quoted identifier \"…\"",
        ),
        (b'`', Dialect::Sqlite) => {
            literal(doubled_quoted_end(bytes, i, b'`'), "quoted identifier `…`")
        }
        (b'`', Dialect::BigQuery) => literal(
            backslash_quoted_end(bytes, i, b'`'),
            "quoted identifier `…`",
        ),
        (b'[', Dialect::Sqlite) => literal(
            bytes[i..]
                .iter()
                .position(|&b| b == b']')
                .map(|p| i + p + 1),
            "quoted identifier […]",
        ),
        (b'$', Dialect::Postgres) if !prev.is_some_and(is_ident_byte) => {
            // Dollar quoting: $tag$ … $tag$ (the tag may be empty, never starts with a
            // digit: `$1` is a positional parameter).
            let tag_len = bytes[i + 1..]
                .iter()
                .position(|&b| !(b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80));
            match tag_len {
                Some(n)
                    if bytes[i + 1 + n] == b'$'
                        && !bytes.get(i + 1).is_some_and(u8::is_ascii_digit) =>
                {
                    let tag = &script[i..=i + 1 + n];
                    let body = i + tag.len();
                    let close = script[body..].find(tag).ok_or_else(|| {
                        unterminated(script, i, &format!("dollar-quoted string {tag}"))
                    })?;
                    Ok(Some(Opaque::Literal(body + close + tag.len())))
                }
                _ => Ok(None),
            }
        }
        _ => Ok(None),
    }
}

/// Index of the newline ending the line comment at `i` (or the end of the text).
fn line_end(bytes: &[u8], i: usize) -> usize {
    bytes[i..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bytes.len(), |p| i + p)
}

/// Index just past the `*/` closing the comment at `i`; Postgres comments nest.
fn block_comment_end(bytes: &[u8], i: usize, nested: bool) -> Option<usize> {
    let mut depth = 1;
    let mut j = i + 2;
    while j + 1 < bytes.len() {
        match (bytes[j], bytes[j + 1]) {
            (b'*', b'/') => {
                depth -= 1;
                j += 2;
                if depth == 0 {
                    return Some(j);
                }
            }
            (b'/', b'*') if nested => {
                depth += 1;
                j += 2;
            }
            _ => j += 1,
        }
    }
    None
}

/// Index just past the closing quote; a doubled quote does not close.
fn doubled_quoted_end(bytes: &[u8], start: usize, quote: u8) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        if bytes[i] == quote {
            if bytes.get(i + 1) == Some(&quote) {
                i += 2;
                continue;
            }
            return Some(i + 1);
        }
        i += 1;
    }
    None
}

/// Index just past the closing quote; a backslash escapes the next byte.
fn backslash_quoted_end(bytes: &[u8], start: usize, quote: u8) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b if b == quote => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// Postgres `E'…'`: a backslash escapes the next byte, and `''` is a quote too.
fn escape_string_end(bytes: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'\'' if bytes.get(i + 1) == Some(&b'\'') => i += 2,
            b'\'' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// BigQuery `'''…'''` / `"""…"""`: index just past the closing triple quote.
fn triple_quoted_end(bytes: &[u8], start: usize, quote: u8) -> Option<usize> {
    let mut i = start + 3;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b if b == quote
                && bytes.get(i + 1) == Some(&quote)
                && bytes.get(i + 2) == Some(&quote) =>
            {
                return Some(i + 3)
            }
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parameters `script` uses in `dialect`, statement by statement.
    fn params(script: &str, dialect: Dialect) -> Vec<Vec<String>> {
        prepare(script, dialect)
            .unwrap_or_else(|e| panic!("{dialect:?} {script:?}: {e}"))
            .into_iter()
            .map(|s| s.params)
            .collect()
    }

    #[test]
    fn rewrites_outside_quotes_and_comments() {
        let script = "-- uses @scope; really\nSELECT a FROM t WHERE d = @scope AND x = 'it''s @scope; ok' /* @scope; */ AND y = @other AND z = @scope";
        let s = prepare(script, Dialect::Sqlite).unwrap();
        assert_eq!(s.len(), 1, "{s:?}");
        assert!(
            s[0].sql.ends_with(
                "WHERE d = ?1 AND x = 'it''s @scope; ok' /* @scope; */ AND y = ?2 AND z = ?1"
            ),
            "{}",
            s[0].sql
        );
        assert_eq!(s[0].params, vec!["scope", "other"]);
        let bq = prepare(script, Dialect::BigQuery).unwrap();
        assert!(bq[0].sql.contains("d = @scope AND"));
        assert_eq!(bq[0].params, vec!["scope", "other"]);
    }

    #[test]
    fn splits_statements_and_drops_empty_ones() {
        let s = prepare(
            " ; CREATE TABLE t (a);\n-- comment only;\n INSERT INTO t VALUES (@v);; ",
            Dialect::Postgres,
        )
        .unwrap();
        assert_eq!(
            s.iter().map(|s| s.sql.as_str()).collect::<Vec<_>>(),
            vec![
                "CREATE TABLE t (a)",
                "-- comment only;\n INSERT INTO t VALUES ($1)"
            ]
        );
    }

    #[test]
    fn postgres_dollar_quotes_and_casts() {
        let s = prepare(
            "SELECT $$ @scope; $$, $fn$ x; $fn$, @scope::date, $1",
            Dialect::Postgres,
        )
        .unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].sql, "SELECT $$ @scope; $$, $fn$ x; $fn$, $1::date, $1");
        // A body holding another dollar quote, `$` inside identifiers, `::` everywhere.
        let s = prepare(
            "CREATE FUNCTION f() RETURNS text AS $body$ SELECT $q$ @a; $q$ || ';' $body$ LANGUAGE sql; \
             SELECT a$b$ FROM t WHERE x = @scope::text::date AND y::int = @n",
            Dialect::Postgres,
        )
        .unwrap();
        assert_eq!(s.len(), 2, "{s:?}");
        assert!(s[0].params.is_empty(), "{s:?}");
        assert_eq!(s[1].params, vec!["scope", "n"]);
        assert!(s[1]
            .sql
            .contains("a$b$ FROM t WHERE x = $1::text::date AND y::int = $2"));
        let e = prepare("SELECT $x$ never closed", Dialect::Postgres).unwrap_err();
        assert!(e.to_string().contains("dollar-quoted string $x$"), "{e}");
    }

    #[test]
    fn postgres_escape_strings_and_standard_strings() {
        // In E'…' a backslash escapes the quote; the string goes on past `\'`.
        assert_eq!(
            params(r"SELECT E'it\'s @x', e'a\\', @scope", Dialect::Postgres),
            vec![vec!["scope"]]
        );
        // A standard string ends at the quote after a backslash (backslash is literal).
        assert_eq!(
            params(r"SELECT 'C:\', @scope, 'it''s @x'", Dialect::Postgres),
            vec![vec!["scope"]]
        );
        // An identifier ending in e before a quote is not an E string.
        assert!(prepare(r"SELECT typE'\', @x", Dialect::Postgres).is_ok());
        assert_eq!(
            params(
                r"SELECT U&'d\0061t@x', B'1010', X'1F', @scope",
                Dialect::Postgres
            ),
            vec![vec!["scope"]]
        );
    }

    #[test]
    fn postgres_comments_nest_and_sqlite_bigquery_ones_do_not() {
        let nested = "SELECT 1 /* outer /* inner @a; */ still comment @b; */, @scope";
        assert_eq!(params(nested, Dialect::Postgres), vec![vec!["scope"]]);
        // SQLite and BigQuery end the comment at the first `*/`.
        let flat = "SELECT 1 /* a /* b */ , @scope";
        assert_eq!(params(flat, Dialect::Sqlite), vec![vec!["scope"]]);
        assert_eq!(params(flat, Dialect::BigQuery), vec![vec!["scope"]]);
        let e = prepare(flat, Dialect::Postgres).unwrap_err();
        assert!(e.to_string().contains("unterminated /* comment"), "{e}");
        assert!(e.to_string().contains("line 1, column 10"), "{e}");
    }

    #[test]
    fn sqlite_quoted_identifiers() {
        assert_eq!(
            params(
                "SELECT [a@b;c], \"x@y;\"\"z\", `q@r;``s`, 'it''s @t;', @scope FROM [t]",
                Dialect::Sqlite
            ),
            vec![vec!["scope"]]
        );
        // A backslash is an ordinary character in SQLite backticks and strings.
        assert_eq!(
            params(r"SELECT `a\`, 'b\', @scope", Dialect::Sqlite),
            vec![vec!["scope"]]
        );
        let e = prepare("SELECT [never closed", Dialect::Sqlite).unwrap_err();
        assert!(e.to_string().contains("quoted identifier […]"), "{e}");
    }

    #[test]
    fn bigquery_strings_identifiers_and_comments() {
        let script = r#"SELECT `p.d.t@x`, `a\`b@c`, 'it\'s @s;', "say \"@d;\"",
            '''multi 'line' @e;
            text''', """and "@f;" too""", r'raw\'@g', R"C:\@h", b'\x00@i', rb'@j', B"@k",
            @@project_id, @scope -- @l;
            # @m;
            FROM t WHERE d = @scope_date"#;
        assert_eq!(
            params(script, Dialect::BigQuery),
            vec![vec!["scope", "scope_date"]]
        );
        // `#` is not a comment in the other dialects, `[` is an array, not a quote.
        assert_eq!(
            params("SELECT [1, 2][OFFSET(0)], @scope", Dialect::BigQuery),
            vec![vec!["scope"]]
        );
        let e = prepare("SELECT '''never closed", Dialect::BigQuery).unwrap_err();
        assert!(e.to_string().contains("triple-quoted string"), "{e}");
    }

    #[test]
    fn bodies_of_statements_are_not_split() {
        let trigger = "CREATE TABLE IF NOT EXISTS t (a);\n\
            CREATE TEMP TRIGGER IF NOT EXISTS tr AFTER INSERT ON t BEGIN\n\
              UPDATE t SET a = a + 1; DELETE FROM t WHERE a > 10;\n\
            END;\n\
            INSERT INTO t VALUES (@scope)";
        let s = prepare(trigger, Dialect::Sqlite).unwrap();
        assert_eq!(s.len(), 3, "{s:?}");
        assert!(s[1].sql.starts_with("CREATE TEMP TRIGGER") && s[1].sql.ends_with("END"));
        assert_eq!(s[2].params, vec!["scope"]);
        let atomic = "CREATE FUNCTION f(d date) RETURNS int LANGUAGE sql BEGIN ATOMIC \
            DELETE FROM t WHERE day = d; SELECT 1; END; SELECT f(@scope_date)";
        let s = prepare(atomic, Dialect::Postgres).unwrap();
        assert_eq!(s.len(), 2, "{s:?}");
        assert_eq!(s[1].params, vec!["scope_date"]);
        // Elsewhere BEGIN/END are ordinary words: `BEGIN; …; COMMIT` splits.
        assert_eq!(
            prepare("BEGIN; SELECT 1; END;", Dialect::Sqlite)
                .unwrap()
                .len(),
            3
        );
    }

    #[test]
    fn bigquery_system_variables_and_backticks() {
        let s = prepare("SELECT @@project_id, `p.d.t@x`, @scope", Dialect::BigQuery).unwrap();
        assert_eq!(s[0].params, vec!["scope"]);
        assert_eq!(s[0].sql, "SELECT @@project_id, `p.d.t@x`, @scope");
    }

    #[test]
    fn an_identifier_before_a_parameter_stays_apart_in_postgres() {
        let s = prepare("SELECT x@scope", Dialect::Postgres).unwrap();
        assert_eq!(s[0].sql, "SELECT x $1");
    }

    #[test]
    fn unterminated_quotes_are_errors_with_their_position() {
        let e = prepare("SELECT 1;\nSELECT 'abc", Dialect::Sqlite).unwrap_err();
        assert!(
            e.to_string()
                .contains("unterminated string starting at line 2, column 8"),
            "{e}"
        );
        assert!(prepare("SELECT /* x", Dialect::Sqlite).is_err());
        assert!(prepare("SELECT \"x", Dialect::Postgres).is_err());
        assert!(prepare(r"SELECT E'it\'s", Dialect::Postgres).is_err());
        assert!(prepare(r"SELECT 'it\'s", Dialect::BigQuery).is_err());
    }
}
