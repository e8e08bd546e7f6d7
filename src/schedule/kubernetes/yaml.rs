//! The YAML the Kubernetes exports print: a tree of maps, lists and scalars written in the
//! order built, strings JSON-quoted.

use std::time::Duration;

/// A YAML value, printed in the order built (Kubernetes readers expect `apiVersion`,
/// `kind`, `metadata`, `spec` first). Strings are JSON-quoted, which YAML reads as the same
/// string whatever they hold.
#[derive(Clone)]
pub(super) enum Yaml {
    Map(Vec<(&'static str, Yaml)>),
    List(Vec<Yaml>),
    Str(String),
    Int(u64),
    Bool(bool),
}

pub(super) fn s(v: &str) -> Yaml {
    Yaml::Str(v.to_string())
}

pub(super) fn secs(d: Duration) -> Yaml {
    Yaml::Int(d.as_secs())
}

impl Yaml {
    pub(super) fn write(&self, indent: usize, out: &mut String) {
        let pad = " ".repeat(indent);
        match self {
            Yaml::Map(entries) => {
                for (key, value) in entries {
                    out.push_str(&pad);
                    out.push_str(key);
                    out.push(':');
                    value.write_after_key(indent, out);
                }
            }
            Yaml::List(items) => {
                for item in items {
                    out.push_str(&pad);
                    out.push('-');
                    match item {
                        Yaml::Map(_) => {
                            // The first entry on the dash's line, the rest under it.
                            let mut text = String::new();
                            item.write(indent + 2, &mut text);
                            out.push(' ');
                            out.push_str(text.trim_start());
                        }
                        scalar => {
                            out.push(' ');
                            scalar.write_scalar(out);
                            out.push('\n');
                        }
                    }
                }
            }
            scalar => {
                out.push_str(&pad);
                scalar.write_scalar(out);
                out.push('\n');
            }
        }
    }

    fn write_after_key(&self, indent: usize, out: &mut String) {
        match self {
            Yaml::Map(entries) if entries.is_empty() => out.push_str(" {}\n"),
            Yaml::List(items) if items.is_empty() => out.push_str(" []\n"),
            Yaml::Map(_) => {
                out.push('\n');
                self.write(indent + 2, out);
            }
            Yaml::List(_) => {
                out.push('\n');
                self.write(indent, out);
            }
            scalar => {
                out.push(' ');
                scalar.write_scalar(out);
                out.push('\n');
            }
        }
    }

    fn write_scalar(&self, out: &mut String) {
        match self {
            Yaml::Str(v) => out.push_str(&serde_json::Value::from(v.as_str()).to_string()),
            Yaml::Int(n) => out.push_str(&n.to_string()),
            Yaml::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Yaml::Map(_) | Yaml::List(_) => unreachable!("only scalars"),
        }
    }
}
