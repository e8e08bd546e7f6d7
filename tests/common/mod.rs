//! Helpers shared by the integration tests.

use std::io::Write;

/// The URL of a service a test needs, from the environment variable `var`.
///
/// When it is unset the test is skipped: a message says which variable to set, and the
/// skip is appended to the file `IDEM_SKIP_LOG` names (CI counts them). With
/// `IDEM_REQUIRE_SERVICES=1` (set by `.ci/run`) a missing service fails the test instead,
/// so nothing is silently skipped in CI.
#[allow(dead_code)]
pub fn service_url(var: &str, test: &str, how: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            let message = format!("skipped {test}: {var} is not set ({how})");
            if std::env::var("IDEM_REQUIRE_SERVICES").as_deref() == Ok("1") {
                panic!("{message}, but IDEM_REQUIRE_SERVICES=1 requires it");
            }
            eprintln!("{message}");
            if let Ok(path) = std::env::var("IDEM_SKIP_LOG") {
                if let Ok(mut f) = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                {
                    let _ = writeln!(f, "{message}");
                }
            }
            None
        }
    }
}

/// How to get a Postgres URL.
#[allow(dead_code)]
pub const POSTGRES_HOW: &str =
    "set it to postgres://USER@HOST:PORT/DATABASE, a database the tests may fill";

/// How to get a BigQuery emulator URL.
#[allow(dead_code)]
pub const BIGQUERY_HOW: &str = "start the emulator: .ci/bqemulator.sh install && \
     URL=$(.ci/bqemulator.sh start) and set it to bigquery://idem-test/idem_local?endpoint=$URL";
