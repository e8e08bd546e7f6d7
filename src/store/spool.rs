//! A local spool for results the store could not take, so the ledger catches up.
//!
//! Under `best_effort`, a run that completes while the store is unreachable still did its
//! work. Its ledger row and keys are appended to a file (one JSON line per run), and the
//! next `idem` command that reaches the store records them before doing anything else, so
//! the time window and content hash see the run and the ledger has no hole. (Under
//! `strict` nothing is spooled: a result that is not recorded did not happen, and the next
//! run redoes the work.)
//!
//! One file per store URL under the spool folder (`IDEM_SPOOL_DIR`, default
//! `.idem-spool`). Appends and replays hold an exclusive lock on a lock file beside it, so
//! concurrent processes neither lose nor double-record entries; a replay skips a run the
//! ledger already has (a replay cut short after recording it).

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::{KeyRecord, RunRecord};
use crate::store::{redact_url, DynStore, Finish, RunFilter};

/// The default spool folder (relative to the current directory).
pub const DEFAULT_SPOOL_DIR: &str = ".idem-spool";

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    run: RunRecord,
    keys: Vec<KeyRecord>,
}

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// Runs recorded now.
    pub recorded: usize,
    /// Runs the ledger already had.
    pub already_recorded: usize,
    /// Runs still waiting (the store failed during the replay).
    pub remaining: usize,
    /// Runs the store refused (not an outage): moved to the rejected file beside the
    /// spool so they do not block the others.
    pub rejected: usize,
}

/// The spool of one store.
#[derive(Debug, Clone)]
pub struct Spool {
    path: PathBuf,
    lock: PathBuf,
}

impl Spool {
    /// The spool for `store_url` under `dir`.
    pub fn new(dir: impl AsRef<Path>, store_url: &str) -> Self {
        let name = &crate::key::digest_value(
            &serde_json::Value::String(redact_url(store_url)),
            crate::key::HashAlgorithm::Sha256,
        )[..16];
        let dir = dir.as_ref();
        Spool {
            path: dir.join(format!("{name}.ndjson")),
            lock: dir.join(format!("{name}.lock")),
        }
    }

    /// The spool for `store_url` under `IDEM_SPOOL_DIR` (default `.idem-spool`).
    pub fn from_env(store_url: &str) -> Self {
        let dir = std::env::var("IDEM_SPOOL_DIR").unwrap_or_else(|_| DEFAULT_SPOOL_DIR.into());
        Spool::new(dir, store_url)
    }

    /// The spool file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether an entry could be spooled: the spool's folder is a folder a file can be
    /// created in, or does not exist yet and could be made in the nearest folder that
    /// does. Asked before a run that may spool, so that a spool that cannot be written is
    /// said before any work, not found out when a finished run's result has nowhere to
    /// go. Creates nothing (a probe file is removed at once).
    pub fn check(&self) -> io::Result<()> {
        let dir = match self.path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut existing = dir.as_path();
        while !existing.exists() {
            match existing.parent() {
                Some(p) if !p.as_os_str().is_empty() => existing = p,
                _ => {
                    existing = Path::new(".");
                    break;
                }
            }
        }
        if !existing.is_dir() {
            return Err(io::Error::other(format!(
                "{} is not a folder",
                existing.display()
            )));
        }
        let probe = existing.join(format!(".idem-spool-probe-{}", std::process::id()));
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)?;
        fs::remove_file(&probe)
    }

    fn locked(&self) -> io::Result<File> {
        if let Some(dir) = self.lock.parent() {
            fs::create_dir_all(dir)?;
        }
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock)?;
        lock.lock()?;
        Ok(lock)
    }

    /// Appends a run (and its keys) to the spool.
    pub fn push(&self, run: &RunRecord, keys: &[KeyRecord]) -> io::Result<()> {
        let _lock = self.locked()?;
        let mut line = serde_json::to_vec(&Entry {
            run: run.clone(),
            keys: keys.to_vec(),
        })
        .map_err(io::Error::other)?;
        line.push(b'\n');
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        file.write_all(&line)?;
        file.sync_data()
    }

    /// Where entries the store refused are kept, for a person to look at.
    pub fn rejected_path(&self) -> PathBuf {
        self.path.with_extension("rejected.ndjson")
    }

    fn reject(&self, line: &str) -> io::Result<()> {
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.rejected_path())?;
        file.write_all(line.as_bytes())?;
        file.write_all(b"\n")?;
        file.sync_data()
    }

    /// Runs waiting in the spool (0 when there is no spool file).
    pub fn len(&self) -> usize {
        File::open(&self.path)
            .map(|f| BufReader::new(f).lines().count())
            .unwrap_or(0)
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records every spooled run in `store`, oldest first; stops at the first store
    /// failure and keeps what is left.
    pub async fn replay(&self, store: &DynStore) -> Result<ReplayReport> {
        if !self.path.exists() {
            return Ok(ReplayReport::default());
        }
        let spool_error = |e: io::Error| Error::io("replay the spool", &self.path, e);
        let _lock = self.locked().map_err(spool_error)?;
        let text = match fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ReplayReport::default()),
            Err(e) => return Err(spool_error(e)),
        };
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let mut report = ReplayReport::default();
        let mut failure = None;
        let mut done = 0;
        for line in &lines {
            let entry: Entry = match serde_json::from_str(line) {
                Ok(entry) => entry,
                Err(e) => {
                    tracing::error!(
                        "spool {} has a malformed line ({e}); moved to {}",
                        self.path.display(),
                        self.rejected_path().display()
                    );
                    self.reject(line).map_err(spool_error)?;
                    report.rejected += 1;
                    done += 1;
                    continue;
                }
            };
            let result = async {
                let known = store
                    .runs(&RunFilter {
                        processor: Some(entry.run.processor.clone()),
                        scope: Some(entry.run.scope.clone()),
                        since: Some(entry.run.started_at),
                        ..Default::default()
                    })
                    .await?;
                if known.iter().any(|r| r.run_id == entry.run.run_id) {
                    return Ok(false);
                }
                let mut finish = Finish {
                    run: entry.run.clone(),
                    keys: entry.keys.clone(),
                    lease: None,
                };
                match store.finish(&finish).await {
                    Err(Error::DuplicateRunId { run_id, .. }) => {
                        // The id is taken by another run (ids may be reused): record
                        // this one under a derived id, as the runner does.
                        let derived = crate::model::derive_run_id(&run_id);
                        finish.run.run_id = derived.clone();
                        for k in &mut finish.keys {
                            k.run_id = derived.clone();
                        }
                        store.finish(&finish).await
                    }
                    other => other,
                }
                .map(|()| true)
            }
            .await;
            match result {
                Ok(true) => report.recorded += 1,
                Ok(false) => report.already_recorded += 1,
                Err(e) if e.is_outage() => {
                    failure = Some(e);
                    break;
                }
                Err(e) => {
                    // The store answered but will never take this entry as it is: set it
                    // aside so it does not block the entries after it.
                    tracing::error!(
                        "spooled run {} cannot be recorded ({e}); moved to {}",
                        entry.run.run_id,
                        self.rejected_path().display()
                    );
                    self.reject(line).map_err(spool_error)?;
                    report.rejected += 1;
                }
            }
            done += 1;
        }
        let rest = &lines[done..];
        report.remaining = rest.len();
        if rest.is_empty() {
            fs::remove_file(&self.path).map_err(spool_error)?;
        } else if done > 0 {
            let tmp = self.path.with_extension("ndjson.tmp");
            let mut body = rest.join("\n");
            body.push('\n');
            fs::write(&tmp, body).map_err(spool_error)?;
            fs::rename(&tmp, &self.path).map_err(spool_error)?;
        }
        if report.recorded > 0 {
            tracing::info!(
                "recorded {} spooled run(s) from {}",
                report.recorded,
                self.path.display()
            );
        }
        match failure {
            Some(e)
                if report.recorded == 0 && report.already_recorded == 0 && report.rejected == 0 =>
            {
                Err(e)
            }
            Some(e) => {
                tracing::warn!("spool replay stopped: {e}");
                Ok(report)
            }
            None => Ok(report),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{micros, RunStatus};
    use crate::store::conformance::{key_record, run_record};
    use crate::store::prelude::*;
    use crate::store::MemoryStore;
    use crate::KeyKind;

    #[tokio::test]
    async fn replay_records_once_and_empties_the_spool() {
        let dir = std::env::temp_dir().join(format!("idem-spool-{}", crate::new_run_id()));
        let spool = Spool::new(&dir, "sqlite://x.db");
        let at = micros(chrono::Utc::now());
        let run = run_record("p", "s", "r1", RunStatus::Completed, at);
        let key = key_record("k", KeyKind::Scope, "p", "s", "r1", at);
        spool.push(&run, std::slice::from_ref(&key)).unwrap();
        spool
            .push(&run_record("p", "s", "r2", RunStatus::Failed, at), &[])
            .unwrap();
        assert_eq!(spool.len(), 2);

        let store = MemoryStore::new();
        // The first entry was recorded already (a replay cut short): not recorded twice.
        store
            .finish(&Finish {
                run: run.clone(),
                keys: vec![key.clone()],
                lease: None,
            })
            .await
            .unwrap();
        let report = spool.replay(&store).await.unwrap();
        assert_eq!(
            report,
            ReplayReport {
                recorded: 1,
                already_recorded: 1,
                remaining: 0,
                rejected: 0,
            }
        );
        assert!(spool.is_empty());
        assert!(!spool.path().exists());
        let runs = store.runs(&RunFilter::default()).await.unwrap();
        assert_eq!(runs.len(), 2);
        // Nothing left: a second replay does nothing.
        assert_eq!(spool.replay(&store).await.unwrap(), ReplayReport::default());
        let _ = fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn an_unrecordable_entry_is_set_aside_and_the_rest_are_recorded() {
        let dir = std::env::temp_dir().join(format!("idem-spool-{}", crate::new_run_id()));
        let spool = Spool::new(&dir, "sqlite://y.db");
        let at = micros(chrono::Utc::now());
        let store = MemoryStore::new();
        // r1 is taken by another run already: recorded under a derived id, not lost.
        store
            .finish(&Finish {
                run: run_record("other", "s", "r1", RunStatus::Completed, at),
                keys: vec![],
                lease: None,
            })
            .await
            .unwrap();
        let key = key_record("k1", KeyKind::Scope, "p", "s", "r1", at);
        spool
            .push(
                &run_record("p", "s", "r1", RunStatus::Completed, at),
                std::slice::from_ref(&key),
            )
            .unwrap();
        // A line no replay can read.
        {
            let mut f = OpenOptions::new().append(true).open(spool.path()).unwrap();
            f.write_all(b"{not json\n").unwrap();
        }
        spool
            .push(&run_record("p", "t", "r2", RunStatus::Completed, at), &[])
            .unwrap();
        let report = spool.replay(&store).await.unwrap();
        assert_eq!(
            report,
            ReplayReport {
                recorded: 2,
                already_recorded: 0,
                remaining: 0,
                rejected: 1,
            }
        );
        assert!(!spool.path().exists());
        let rejected = fs::read_to_string(spool.rejected_path()).unwrap();
        assert_eq!(rejected, "{not json\n");
        let runs = store.runs(&RunFilter::default()).await.unwrap();
        assert_eq!(runs.len(), 3);
        assert!(runs
            .iter()
            .any(|r| r.run_id.starts_with("r1.") && r.processor == "p"));
        let _ = fs::remove_dir_all(&dir);
    }
}
