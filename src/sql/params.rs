//! Named parameters and statement splitting for job SQL.
//!
//! Job SQL names its parameters BigQuery-style (`@scope`). For each dialect the text is
//! rewritten to the driver's placeholders (`?1` for SQLite, `$1` for Postgres, `@scope`
//! kept for BigQuery) and the values are bound, never spliced into the text. Quoted
//! strings, quoted identifiers, comments and Postgres dollar-quoted bodies are left alone,
//! and scripts are split into statements on `;` outside them.

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
/// ```
/// use idem::sql::{prepare, Dialect};
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
        let c = bytes[i];
        match c {
            b'\'' | b'"' | b'`' => {
                let end = skip_quoted(bytes, i, c).ok_or_else(|| {
                    Error::config(format!(
                        "unterminated {} starting at byte {i} of job SQL",
                        match c {
                            b'\'' => "string",
                            _ => "quoted identifier",
                        }
                    ))
                })?;
                meaningful = true;
                i = end;
            }
            b'-' if bytes.get(i + 1) == Some(&b'-') => {
                i = bytes[i..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(bytes.len(), |p| i + p);
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = script[i + 2..]
                    .find("*/")
                    .map(|p| i + 2 + p + 2)
                    .ok_or_else(|| Error::config("unterminated /* comment in job SQL"))?;
            }
            b'$' if dialect == Dialect::Postgres => {
                // Dollar quoting: $tag$ ... $tag$ (tag may be empty).
                let tag_end = bytes[i + 1..]
                    .iter()
                    .position(|&b| !(b.is_ascii_alphanumeric() || b == b'_'))
                    .map(|p| i + 1 + p);
                match tag_end {
                    Some(e)
                        if bytes[e] == b'$'
                            && !bytes[i + 1..e].first().is_some_and(|b| b.is_ascii_digit()) =>
                    {
                        let tag = &script[i..=e];
                        let close = script[e + 1..].find(tag).ok_or_else(|| {
                            Error::config(format!(
                                "unterminated dollar-quoted string {tag} in job SQL"
                            ))
                        })?;
                        meaningful = true;
                        i = e + 1 + close + tag.len();
                    }
                    _ => {
                        meaningful = true;
                        i += 1;
                    }
                }
            }
            b'@' if bytes.get(i + 1) == Some(&b'@') => {
                // BigQuery system variable (@@project_id): not a parameter.
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
                        sql.push(if dialect == Dialect::Sqlite { '?' } else { '$' });
                        sql.push_str(&n.to_string());
                    }
                }
                copied = end;
                meaningful = true;
                i = end;
            }
            b';' => {
                sql.push_str(&script[copied..i]);
                copied = i + 1;
                i += 1;
                flush(&mut sql, &mut params, &mut meaningful, &mut statements);
            }
            c if c.is_ascii_whitespace() => i += 1,
            _ => {
                meaningful = true;
                i += 1;
            }
        }
    }
    sql.push_str(&script[copied..]);
    flush(&mut sql, &mut params, &mut meaningful, &mut statements);
    Ok(statements)
}

/// Index just past the closing quote; doubled quotes (and backslash escapes inside
/// backticks and BigQuery strings) do not close.
fn skip_quoted(bytes: &[u8], start: usize, quote: u8) -> Option<usize> {
    let mut i = start + 1;
    while i < bytes.len() {
        if bytes[i] == b'\\' && quote == b'`' {
            i += 2;
            continue;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn bigquery_system_variables_and_backticks() {
        let s = prepare("SELECT @@project_id, `p.d.t@x`, @scope", Dialect::BigQuery).unwrap();
        assert_eq!(s[0].params, vec!["scope"]);
        assert_eq!(s[0].sql, "SELECT @@project_id, `p.d.t@x`, @scope");
    }

    #[test]
    fn unterminated_quotes_are_errors() {
        let e = prepare("SELECT 'abc", Dialect::Sqlite).unwrap_err();
        assert!(e.to_string().contains("unterminated string"), "{e}");
        assert!(prepare("SELECT /* x", Dialect::Sqlite).is_err());
    }
}
