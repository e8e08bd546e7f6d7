//! `--log-format json` (env `IDEM_LOG_FORMAT`): one JSON object per line on standard
//! error, with the keys Cloud Logging and most collectors read (`time`, `severity`,
//! `message`) and the event's own fields beside them (`job`, `scope`, `run_id`…). Log
//! events go through [`JsonLines`]; idem's own lines on standard error (`error: …`,
//! `warning: …`, notes) through [`stderr_line`], so nothing on standard error is plain text
//! that a platform would file at one severity whatever it says.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Whether standard error carries JSON lines (set once, before anything is logged).
static JSON: AtomicBool = AtomicBool::new(false);

/// The values of `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Plain lines, for a terminal.
    Human,
    /// One JSON object per line: `time`, `severity`, `message` and the event's fields.
    Json,
}

pub(crate) fn set(format: LogFormat) {
    JSON.store(format == LogFormat::Json, Ordering::SeqCst);
}

pub(crate) fn is_json() -> bool {
    JSON.load(Ordering::SeqCst)
}

/// Cloud Logging's severity names for tracing's levels.
fn severity(level: &Level) -> &'static str {
    match *level {
        Level::ERROR => "ERROR",
        Level::WARN => "WARNING",
        Level::INFO => "INFO",
        Level::DEBUG | Level::TRACE => "DEBUG",
    }
}

/// One JSON line: `time` (RFC 3339, UTC, microseconds), `severity`, `message`, then
/// `fields`.
fn line(severity: &str, message: &str, fields: Map<String, Value>) -> String {
    let mut doc = Map::new();
    doc.insert(
        "time".into(),
        Value::String(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
    );
    doc.insert("severity".into(), Value::String(severity.into()));
    doc.insert("message".into(), Value::String(message.into()));
    for (k, v) in fields {
        doc.entry(k).or_insert(v);
    }
    Value::Object(doc).to_string()
}

/// A line idem writes on standard error itself: as it is, or in JSON mode as an object
/// whose severity its prefix says (`error: ` ERROR, `warning: ` WARNING, else INFO).
pub(crate) fn stderr_line(text: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    if !is_json() {
        let _ = writeln!(err, "{text}");
        return;
    }
    let text = text.to_string();
    let (severity, message) = if let Some(m) = text.strip_prefix("error: ") {
        ("ERROR", m)
    } else if let Some(m) = text.strip_prefix("warning: ") {
        ("WARNING", m)
    } else {
        ("INFO", text.as_str())
    };
    let _ = writeln!(err, "{}", line(severity, message, Map::new()));
}

/// The [`FormatEvent`] of `--log-format json`.
pub(crate) struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        let mut fields = fields.0;
        let message = match fields.remove("message") {
            Some(Value::String(s)) => s,
            Some(other) => other.to_string(),
            None => String::new(),
        };
        fields.insert(
            "target".into(),
            Value::String(event.metadata().target().into()),
        );
        let severity = severity(event.metadata().level());
        writeln!(writer, "{}", line(severity, &message, fields))
    }
}

/// An event's fields as JSON values.
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().into(), Value::String(value.into()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
}
