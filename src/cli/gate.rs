//! `idem gate`: the idempotency gate over NDJSON ([`crate::events::stream`] does the work).

use clap::Args;
use std::path::PathBuf;

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

use super::{metrics, output};
use super::{FormatArg, GlobalOptions, EXIT_OK, EXIT_RUN_FAILED, EXIT_STORE_UNAVAILABLE};
use crate::error::{Error, Result};
use crate::events::dedup::{Deduplicator, Ttl};
use crate::events::strategy::{EventGate, Strategy};
use crate::events::stream::{self, OutputFormat, Stream, StreamCursor, StreamSummary};
use crate::events::ContentHashExtractor;
use crate::model::duration::parse_duration_field;
use crate::runner::Cancel;
use crate::store::breaker::BreakerPhase;
use crate::store::{self, BreakerConfig, EventKeyStore};

/// A comma-separated field list of `flag`: at least one field, none empty.
fn fields(flag: &str, text: &str) -> Result<Vec<String>> {
    let list: Vec<String> = text.split(',').map(|f| f.trim().to_string()).collect();
    if list.iter().all(String::is_empty) {
        return Err(Error::input(format!(
            "{flag} names no field: give FIELD[,FIELD...]"
        )));
    }
    if list.iter().any(String::is_empty) {
        return Err(Error::input(format!(
            "{flag} {text:?} has an empty field name"
        )));
    }
    if let Some(twice) = list
        .iter()
        .enumerate()
        .find(|(i, f)| list[..*i].contains(f))
    {
        return Err(Error::input(format!(
            "{flag} {text:?} names {:?} twice",
            twice.1
        )));
    }
    Ok(list)
}

fn named(flag: &str) -> impl Fn(Error) -> Error + '_ {
    move |e| Error::input(format!("{flag}: {e}"))
}

fn ttl(text: &str) -> Result<Ttl> {
    if matches!(text.trim(), "never" | "none") {
        return Ok(Ttl::never());
    }
    let d = parse_duration_field("--ttl", text).map_err(Error::input)?;
    if d.is_zero() {
        return Err(Error::input("--ttl must be longer than 0 (or `never`)"));
    }
    Ok(Ttl::fixed(d))
}

fn format(g: &GlobalOptions) -> Result<OutputFormat> {
    match g.format_arg {
        FormatArg::Human | FormatArg::Json | FormatArg::Ndjson => Ok(OutputFormat::Ndjson),
        FormatArg::Csv => Ok(OutputFormat::Csv),
        FormatArg::Markdown | FormatArg::Html => Err(Error::input(
            "idem gate writes --format ndjson (the default) or csv",
        )),
    }
}

fn stdio_or(path: Option<&Path>) -> Option<&Path> {
    path.filter(|p| p.as_os_str() != "-")
}

/// The cursor `--cursor` and `--order-by` describe.
fn stream_cursor(args: &GateArgs) -> Result<Option<StreamCursor>> {
    let (Some(name), Some(order_by)) = (&args.cursor, &args.order_by) else {
        return Ok(None);
    };
    if name.trim().is_empty() {
        return Err(Error::input("--cursor must not be empty"));
    }
    match fields("--order-by", order_by)?.as_slice() {
        [timestamp, id] => Ok(Some(StreamCursor {
            name: name.clone(),
            timestamp_field: timestamp.clone(),
            id_field: id.clone(),
        })),
        _ => Err(Error::input(format!(
            "--order-by {order_by:?}: give two fields, TIMESTAMP,ID"
        ))),
    }
}

/// The deduplicator the arguments describe.
fn deduplicator(args: &GateArgs, store: Arc<dyn EventKeyStore>) -> Result<Deduplicator> {
    let keys = fields("--key", &args.key)?;
    let mut spec = ContentHashExtractor::new();
    spec = match (&args.fingerprint_fields, &args.exclude_fields) {
        (Some(only), _) => spec
            .include(fields("--fingerprint-fields", only)?)
            .map_err(named("--fingerprint-fields"))?,
        (None, Some(without)) => {
            let mut all = keys.clone();
            all.extend(fields("--exclude-fields", without)?);
            spec.exclude(all).map_err(named("--exclude-fields"))?
        }
        (None, None) => spec.exclude(&keys).map_err(named("--key"))?,
    };
    if let Some(amounts) = &args.normalize_amounts {
        spec = spec
            .normalize_amounts(fields("--normalize-amounts", amounts)?)
            .map_err(named("--normalize-amounts"))?;
    }
    Ok(Deduplicator::new(store, &args.namespace, &keys)
        .map_err(named("--key"))?
        .fingerprint(Some(spec))
        .ttl(ttl(&args.ttl)?))
}

/// `idem gate`.
pub(super) async fn gate(args: &GateArgs, g: &GlobalOptions) -> Result<u8> {
    let format = format(g)?;
    let strategy: Strategy = args.strategy.parse().map_err(named("--strategy"))?;
    check_namespace(&args.namespace)?;
    // Every argument is checked before the store is opened.
    parse_duration_field("--pending-timeout", &args.pending_timeout).map_err(Error::input)?;
    deduplicator(args, Arc::new(store::MemoryStore::new()))?;
    let cursor = stream_cursor(args)?;
    // An output file must not be the input, the other output or a SQLite database (the
    // ledger): writing it would destroy what the gate reads or records.
    let input_path = stdio_or(args.input.as_deref());
    let output_path = stdio_or(args.output.as_deref());
    if let Some(out) = output_path {
        super::refuse_to_overwrite("--output", out, input_path.as_slice(), &[&g.store])?;
    }
    if let Some(m) = &args.metrics_file {
        let others: Vec<&std::path::Path> = input_path.into_iter().chain(output_path).collect();
        super::refuse_to_overwrite("--metrics-file", m, &others, &[&g.store])?;
    }
    let (input_name, source) = open_input(input_path)?;
    let (output_name, out) = open_output(output_path)?;
    let gate = open_gate(args, g, strategy).await?;
    if let Some(c) = &cursor {
        // A store without cursors (BigQuery) says so before any line is read.
        gate.cursor(&c.name).await?;
    }
    // SIGINT/SIGTERM: read no further, mark and write the batches already read, print
    // the summary, exit 1 (also while waiting for input, between two lines). A second
    // signal stops at once (e.g. in the middle of a line typed on a terminal).
    let stop = super::cancel_on_signals()?;
    // Read on a thread of its own, so a batch goes as soon as the input pauses (a
    // terminal, `tail -f`) instead of waiting for a full one; a signal ends the wait.
    let input = super::feed::Feed::new(source, Some(stop.clone()))
        .map_err(|e| Error::io("read", &input_name, e))?;
    let ready = input.ready();
    announce_stop(stop.clone());
    let bar = output::gate_bar();
    let mut done = StreamSummary::default();
    let mut metrics_written = std::time::Instant::now();
    let mut metrics_error: Option<Error> = None;
    let result = stream::run_with_cursor(
        &gate,
        Stream {
            input,
            input_name: &input_name,
            output: out,
            output_name: &output_name,
            stop: Some(&stop),
            ready: Some(&ready),
            max_line_bytes: args.max_line_bytes as usize,
        },
        format,
        args.batch as usize,
        cursor.as_ref(),
        |s| {
            done.clone_from(s);
            if let Some(path) = &args.metrics_file {
                if metrics_written.elapsed() >= METRICS_EVERY && metrics_error.is_none() {
                    metrics_written = std::time::Instant::now();
                    let text = metrics::gate_metrics(s, &gate, false);
                    if let Err(e) = metrics::write_atomically(path, &text) {
                        metrics_error = Some(e);
                    }
                }
            }
            if let Some(bar) = &bar {
                bar.set_position(s.lines);
                bar.set_message(progress_message(s));
            }
        },
    )
    .await;
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    if let Some(e) = metrics_error {
        return Err(e);
    }
    finish(args, &gate, result, &done)
}

/// A namespace is not empty and holds no control character.
fn check_namespace(namespace: &str) -> Result<()> {
    if namespace.is_empty() {
        return Err(Error::input("--namespace must not be empty"));
    }
    if let Some(c) = namespace.chars().find(|c| crate::model::is_control(*c)) {
        return Err(Error::input(format!(
            "--namespace {namespace:?} holds the control character {c:?}: a namespace is printable text"
        )));
    }
    Ok(())
}

/// The input (`None`: standard input) and its name for messages.
fn open_input(path: Option<&Path>) -> Result<(String, Box<dyn Read + Send>)> {
    Ok(match path {
        Some(path) => {
            let f = std::fs::File::open(path).map_err(|e| Error::io("read", path, e))?;
            (path.display().to_string(), Box::new(f))
        }
        None => ("standard input".into(), Box::new(std::io::stdin())),
    })
}

/// The output (`None`: standard output), buffered, and its name for messages.
fn open_output(path: Option<&Path>) -> Result<(String, Box<dyn Write + Send>)> {
    Ok(match path {
        Some(path) => {
            let f = std::fs::File::create(path).map_err(|e| Error::io("write", path, e))?;
            (
                path.display().to_string(),
                Box::new(std::io::BufWriter::with_capacity(1 << 18, f)),
            )
        }
        None => (
            "standard output".into(),
            Box::new(std::io::BufWriter::with_capacity(
                1 << 18,
                std::io::stdout(),
            )),
        ),
    })
}

/// The gate on the store. A store that cannot be opened fails the gate under `strict`;
/// otherwise lines go through unverified until it answers.
async fn open_gate(args: &GateArgs, g: &GlobalOptions, strategy: Strategy) -> Result<EventGate> {
    let mut down = false;
    let store: Arc<dyn EventKeyStore> = match store::open_event_keys(&g.store).await {
        Ok(store) => store,
        Err(e) if e.is_store_failure() && strategy != Strategy::Strict => {
            // Lines go through unverified until the store answers: the breaker in front
            // tries to open it again once per reset timeout.
            tracing::warn!("{e}; {strategy}: lines go through unverified until the store answers");
            down = true;
            Arc::new(store::ReopeningEventStore::new(&g.store))
        }
        Err(e) => return Err(e),
    };
    let pending =
        parse_duration_field("--pending-timeout", &args.pending_timeout).map_err(Error::input)?;
    let mut gate = EventGate::new(
        deduplicator(args, store)?,
        strategy,
        BreakerConfig::default(),
    );
    if !pending.is_zero() {
        gate = gate.pending(pending);
    }
    if down {
        // That was the first failure: the next try waits for the breaker's timeout.
        gate.trip_breaker();
    }
    Ok(gate)
}

/// On the first signal, says the gate is stopping; on a second, exits at once.
fn announce_stop(stop: Cancel) {
    tokio::spawn(async move {
        let reason = stop.cancelled().await;
        output::print_gate_summary(&format!(
            "gate: {reason}: stopping after the lines already read (again to stop now)"
        ));
        if let Ok(again) = super::cancel_on_signals() {
            again.cancelled().await;
            std::process::exit(i32::from(EXIT_RUN_FAILED));
        }
    });
}

/// After the stream: the metrics file and the summary (a line, or JSON); the exit code.
/// A stream that failed says how far it got (`done`) and fails the gate.
fn finish(
    args: &GateArgs,
    gate: &EventGate,
    result: Result<StreamSummary>,
    done: &StreamSummary,
) -> Result<u8> {
    let json = args.stats_format == "json";
    let summary = match result {
        Ok(summary) => summary,
        Err(e) => {
            if let Some(path) = &args.metrics_file {
                metrics::write_atomically(path, &metrics::gate_metrics(done, gate, false))?;
            }
            // What was written before the failure is recorded: say how far it got.
            if json {
                output::print_gate_summary(&stats_json(done, gate, Some(&e)));
            } else {
                output::print_gate_summary(&format!(
                    "{} (stopped there: the lines after these have no record)",
                    summary_line(done, gate)
                ));
            }
            return Err(e);
        }
    };
    if let Some(path) = &args.metrics_file {
        metrics::write_atomically(
            path,
            &metrics::gate_metrics(
                &summary,
                gate,
                summary.interrupted.is_none() && !summary.output_closed,
            ),
        )?;
    }
    if json {
        output::print_gate_summary(&stats_json(&summary, gate, None));
    } else {
        output::print_gate_summary(&summary_line(&summary, gate));
    }
    Ok(if summary.interrupted.is_some() {
        EXIT_RUN_FAILED
    } else if gate.stats().confirm_failures > 0 && gate.strategy() == Strategy::Strict {
        // Every line has its record, but the store failed to confirm some new ones: under
        // `strict` a store failure fails the gate, so that whoever runs it knows those
        // events will be reported `new` again.
        EXIT_STORE_UNAVAILABLE
    } else {
        EXIT_OK
    })
}

/// How often `--metrics-file` is rewritten while the gate runs.
const METRICS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// `--stats-format json`: the summary, the gate's counters and rates, the latency
/// histogram and the breaker, as one JSON document.
fn stats_json(s: &StreamSummary, gate: &EventGate, error: Option<&Error>) -> String {
    let stats = gate.stats();
    serde_json::json!({
        "summary": s,
        "elapsed_seconds": s.elapsed.as_secs_f64(),
        "lines_per_second": s.lines_per_second(),
        "stats": stats,
        "rates": {
            "duplicate": stats.duplicate_rate(),
            "store_error": stats.error_rate(),
            "fallback": stats.fallback_rate(),
            "extraction_failure": stats.extraction_failure_rate(),
        },
        "batch_latency": gate.batch_latency_histogram(),
        "breaker": match gate.breaker_phase() {
            BreakerPhase::Closed => "closed",
            BreakerPhase::HalfOpen => "half_open",
            BreakerPhase::Open => "open",
        },
        "store": gate.location(),
        "namespace": gate.deduplicator().namespace(),
        "strategy": gate.strategy().name(),
        // Read to the end of the input without an error (not stopped by a signal or a
        // closed output: `summary.interrupted`, `summary.output_closed` say which).
        "finished": error.is_none() && s.interrupted.is_none() && !s.output_closed,
        "error": error.map(ToString::to_string),
    })
    .to_string()
}

fn progress_message(s: &StreamSummary) -> String {
    let mut text = format!(
        "{} new, {} replay, {} conflict, {} invalid",
        s.new, s.replay, s.conflict, s.invalid
    );
    if s.before_cursor > 0 {
        text.push_str(&format!(", {} before_cursor", s.before_cursor));
    }
    text
}

/// `gate: N lines …` for stderr.
fn summary_line(s: &StreamSummary, gate: &EventGate) -> String {
    let stats = gate.stats();
    let mut line = format!(
        "gate: {} line(s) ({} blank): {} in {:.2} s ({:.0} lines/s); store {}, namespace {}, strategy {}",
        s.lines,
        s.blank,
        progress_message(s),
        s.elapsed.as_secs_f64(),
        s.lines_per_second(),
        gate.location(),
        gate.deduplicator().namespace(),
        gate.strategy(),
    );
    if stats.store_errors > 0 || stats.fallbacks > 0 {
        line.push_str(&format!(
            "; {} store error(s), {} fallback(s): {} line(s) let through unverified",
            stats.store_errors, stats.fallbacks, s.unverified
        ));
    }
    if stats.unconfirmed > 0 {
        line.push_str(&format!(
            "; {} new line(s) unconfirmed: written after their pending marks expired, the \
             next run reports them `new` again (raise --pending-timeout)",
            stats.unconfirmed
        ));
    }
    if stats.confirm_failures > 0 {
        line.push_str(&format!(
            "; {} new line(s) not confirmed: the store failed to confirm their batch, so the \
             next run after --pending-timeout reports them `new` again",
            stats.confirm_failures
        ));
    }
    if stats.batches > 0 {
        line.push_str(&format!(
            "; batch latency avg {:.1} ms, p99 {:.1} ms",
            stats.avg_batch_latency_us as f64 / 1000.0,
            stats.p99_batch_latency_us as f64 / 1000.0
        ));
    }
    if let Some(c) = &s.cursor {
        line.push_str(&format!(
            "; cursor at ({}, {})",
            c.last_timestamp, c.last_id
        ));
    }
    if s.output_closed {
        line.push_str("; stopped: the output was closed");
    }
    if let Some(reason) = s.interrupted {
        line.push_str(&format!(
            "; stopped by {reason}: the lines after line {} were not read",
            s.lines
        ));
    }
    line
}

#[derive(Debug, Args)]
pub(crate) struct GateArgs {
    /// The event's key: a field, or several separated by commas (`id,customer_id`: their
    /// values joined with `:`); dotted paths for nested ones.
    #[arg(long, value_name = "FIELD[,FIELD...]")]
    pub(super) key: String,
    /// Fingerprint only these fields of the payload (default: every field but the key's).
    #[arg(long, value_name = "F,..", conflicts_with = "exclude_fields")]
    pub(super) fingerprint_fields: Option<String>,
    /// Fingerprint the payload without these fields (in addition to the key's).
    #[arg(long, value_name = "F,..")]
    pub(super) exclude_fields: Option<String>,
    /// Money amounts in these fields are compared as numbers of scale 2 ("100.5",
    /// "$100.50" and 100.50 are the same payload).
    #[arg(long, value_name = "F,..")]
    pub(super) normalize_amounts: Option<String>,
    /// How long a mark lasts (e.g. 24h, 7d; `never`: forever).
    #[arg(long, default_value = "never")]
    pub(super) ttl: String,
    /// The namespace of the keys in the store (separate gates, separate keys).
    #[arg(long, default_value = "gate")]
    pub(super) namespace: String,
    /// NDJSON input (`-` or none: standard input).
    #[arg(long, value_name = "FILE")]
    pub(super) input: Option<PathBuf>,
    /// Where the records go (`-` or none: standard output).
    #[arg(long, value_name = "FILE")]
    pub(super) output: Option<PathBuf>,
    /// Lines per batch: one store round trip each.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub(super) batch: u32,
    /// What a store failure does: strict (exit 3), best_effort (let the lines through as
    /// new, unverified), log_only (never filter: every line passes; store failures as
    /// best_effort).
    #[arg(long, default_value = "strict")]
    pub(super) strategy: String,
    /// A named cursor in the store (seed 003): events at or before it in --order-by order
    /// are skipped without a store lookup (`before_cursor`); it advances with each batch's
    /// marks.
    #[arg(long, value_name = "NAME", requires = "order_by")]
    pub(super) cursor: Option<String>,
    /// The timestamp field and the id field that order the input (with --cursor).
    #[arg(long, value_name = "TIMESTAMP,ID", requires = "cursor")]
    pub(super) order_by: Option<String>,
    /// Write the gate's metrics to FILE in Prometheus text format (for node_exporter's
    /// textfile collector), atomically: every 10 s while running and at the end.
    #[arg(long, value_name = "FILE")]
    pub(super) metrics_file: Option<PathBuf>,
    /// The summary on standard error: `human` (one line) or `json` (one JSON document).
    #[arg(long, value_name = "FORMAT", default_value = "human", value_parser = ["human", "json"])]
    pub(super) stats_format: String,
    /// A key found new stays *pending* until its record is written; a gate that dies first
    /// (SIGKILL, power loss, a lost connection) leaves marks that expire after this, and
    /// the next run reports those events `new`. `0s` turns it off (marks are final at once).
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub(super) pending_timeout: String,
    /// The longest line taken, in bytes: a longer one gets an `invalid` record naming its
    /// length and is read past without being held in memory (batches are bounded in
    /// bytes too, so memory does not grow with line length).
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20, value_parser = clap::value_parser!(u64).range(1..=1 << 30))]
    pub(super) max_line_bytes: u64,
}
