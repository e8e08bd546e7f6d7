//! `idem fingerprint`: the fingerprint of a set of trade events.

use clap::Args;
use std::path::PathBuf;

use super::output;
use super::{GlobalOptions, EXIT_OK};
use crate::error::{Error, Result};

/// `idem fingerprint [FILE]`.
pub(super) fn fingerprint(args: &FingerprintArgs, g: &GlobalOptions) -> Result<u8> {
    let (fingerprint, events) = fingerprint_events(args.file.as_deref())?;
    output::print_fingerprint(&fingerprint, events, g.format);
    Ok(EXIT_OK)
}

/// `idem fingerprint`: reads NDJSON events (blank lines skipped) from `file` or standard
/// input; a line that is not an event is an error naming the line and the field.
fn fingerprint_events(file: Option<&std::path::Path>) -> Result<(String, usize)> {
    use std::io::BufRead;
    // `-` is standard input, as for most Unix tools.
    let file = file.filter(|p| p.as_os_str() != "-");
    let (name, reader): (String, Box<dyn BufRead>) = match file {
        Some(path) => {
            let f = std::fs::File::open(path).map_err(|e| Error::io("read", path, e))?;
            (
                path.display().to_string(),
                Box::new(std::io::BufReader::with_capacity(1 << 16, f)),
            )
        }
        None => ("standard input".into(), Box::new(std::io::stdin().lock())),
    };
    let mut signatures = Vec::new();
    for (i, line) in reader.split(b'\n').enumerate() {
        let at = || format!("{name} line {}", i + 1);
        let line = line.map_err(|e| Error::io("read", at(), e))?;
        let line = std::str::from_utf8(&line)
            .map_err(|_| Error::input(format!("{}: not UTF-8 text", at())))?;
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.trim().is_empty() {
            continue;
        }
        let signature = crate::events::EventSignature::from_json(line)
            .map_err(|e| Error::input(format!("{}: {e}", at())))?;
        signatures.push(signature);
    }
    Ok((crate::events::fingerprint(&signatures), signatures.len()))
}

#[derive(Debug, Args)]
pub(crate) struct FingerprintArgs {
    /// NDJSON file of events, one JSON object a line (`-` or none: standard input).
    pub(super) file: Option<PathBuf>,
}
