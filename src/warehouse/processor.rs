//! The built-in SQL processor: runs a job's SQL against a warehouse.
//!
//! A job gives up to three pieces of SQL: `setup` (idempotent statements run first),
//! `content` (rows describing what the run would consume; their canonical hash is the
//! content key) and `process` (the work, possibly several statements, run in one
//! transaction where the warehouse has them). The scope is bound as `@scope`.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::OnceCell;

use super::{prepare, Dialect, Params, Statement, Warehouse};
use crate::error::{BoxError, Error, Result};
use crate::key::Content;
use crate::model::{Outcome, RunRequest};
use crate::processor::Processor;

/// The parameters every job's SQL may use besides its `[sql.params]`: `@scope`,
/// `@scope_date` (`YYYY-MM-DD`), `@run_id` and `@trigger`.
pub const BUILTIN_PARAMS: [&str; 4] = ["scope", "scope_date", "run_id", "trigger"];

/// The SQL a job runs.
#[derive(Debug, Clone, Default)]
pub struct SqlScripts {
    /// Idempotent statements run first.
    pub setup: Option<String>,
    /// A query whose rows describe the content.
    pub content: Option<String>,
    /// The work.
    pub process: String,
}

/// [`SqlScripts`] split into statements with placeholders for one dialect.
#[derive(Debug, Clone)]
pub struct PreparedScripts {
    /// The setup statements.
    pub setup: Vec<Statement>,
    /// The content query.
    pub content: Option<Statement>,
    /// The process statements (at least one).
    pub process: Vec<Statement>,
}

impl SqlScripts {
    /// Splits and rewrites the scripts for `dialect`, checking what can be checked without
    /// a database: text the scanner cannot read (an unterminated string or comment), a
    /// content that is not exactly one query, an empty process, and any `@name` that is
    /// neither a built-in parameter ([`BUILTIN_PARAMS`]) nor a key of `params`. Errors
    /// name the field (`[sql].setup`, `[sql].content`, `[sql].process`).
    pub fn prepare(&self, dialect: Dialect, params: &Params) -> Result<PreparedScripts> {
        let read = |field: &str, script: &str| -> Result<Vec<Statement>> {
            let statements = prepare(script, dialect)
                .map_err(|e| Error::config(format!("[sql].{field}: {e}")))?;
            for statement in &statements {
                if let Some(unknown) = statement
                    .params
                    .iter()
                    .find(|p| !BUILTIN_PARAMS.contains(&p.as_str()) && !params.contains_key(*p))
                {
                    let mut known: Vec<&str> = BUILTIN_PARAMS.to_vec();
                    known.extend(params.keys().map(String::as_str));
                    return Err(Error::config(format!(
                        "[sql].{field} uses unknown parameter @{unknown} (known: @{}; add it to [sql.params])",
                        known.join(", @")
                    )));
                }
            }
            Ok(statements)
        };
        let setup = match &self.setup {
            Some(s) => read("setup", s)?,
            None => Vec::new(),
        };
        let content = match &self.content {
            Some(s) => {
                let mut statements = read("content", s)?;
                if statements.len() != 1 {
                    return Err(Error::config(format!(
                        "[sql].content must be exactly one query, found {} statements",
                        statements.len()
                    )));
                }
                statements.pop()
            }
            None => None,
        };
        let process = read("process", &self.process)?;
        if process.is_empty() {
            return Err(Error::config("[sql].process has no statement"));
        }
        Ok(PreparedScripts {
            setup,
            content,
            process,
        })
    }
}

/// The built-in processor that runs a job's SQL.
#[derive(Debug)]
pub struct SqlProcessor {
    name: String,
    warehouse: Arc<dyn Warehouse>,
    setup: Vec<Statement>,
    content: Option<Statement>,
    process: Vec<Statement>,
    params: Params,
    version: String,
    setup_done: OnceCell<()>,
}

impl SqlProcessor {
    /// Prepares the scripts for the warehouse's dialect; problems such as an unterminated
    /// string or an unknown `@name` are reported now, before anything runs (see
    /// [`SqlScripts::prepare`]).
    pub fn new(
        name: impl Into<String>,
        warehouse: Arc<dyn Warehouse>,
        scripts: &SqlScripts,
        params: Params,
    ) -> Result<Self> {
        let PreparedScripts {
            setup,
            content,
            process,
        } = scripts.prepare(warehouse.dialect(), &params)?;
        let version = code_version(&setup, content.as_ref(), &process, &params);
        Ok(SqlProcessor {
            name: name.into(),
            warehouse,
            setup,
            content,
            process,
            params,
            version,
            setup_done: OnceCell::new(),
        })
    }

    fn params_for(&self, request: &RunRequest) -> Params {
        let mut params = self.params.clone();
        params.insert("scope".into(), request.scope.clone());
        params.insert(
            "scope_date".into(),
            crate::model::time::day_text(request.scope_date),
        );
        params.insert("run_id".into(), request.run_id.clone());
        params.insert("trigger".into(), request.trigger.as_str().into());
        params
    }

    async fn setup(&self, params: &Params) -> Result<(), BoxError> {
        if self.setup.is_empty() {
            return Ok(());
        }
        self.setup_done
            .get_or_try_init(|| async {
                self.warehouse
                    .execute(&self.setup, params)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.into_sql("setup", self.warehouse.location()))
            })
            .await?;
        Ok(())
    }
}

/// A SQL job's code version: SHA-256 of the canonical JSON of its prepared statements
/// (text with the dialect's placeholders, and the parameter names they bind) and its
/// `[sql.params]`: `{"content": S|null, "params": {…}, "process": [S…], "setup": [S…]}`
/// with `S = {"params": […], "sql": "…"}`. Whitespace around statements and empty
/// statements do not count; any other edit does.
fn code_version(
    setup: &[Statement],
    content: Option<&Statement>,
    process: &[Statement],
    params: &Params,
) -> String {
    let statement = |s: &Statement| serde_json::json!({"params": s.params, "sql": s.sql});
    let value = serde_json::json!({
        "content": content.map(statement),
        "params": params,
        "process": process.iter().map(statement).collect::<Vec<_>>(),
        "setup": setup.iter().map(statement).collect::<Vec<_>>(),
    });
    crate::key::digest_value(&value, crate::key::HashAlgorithm::Sha256)
}

#[async_trait]
impl Processor for SqlProcessor {
    fn name(&self) -> &str {
        &self.name
    }

    fn version(&self) -> String {
        self.version.clone()
    }

    async fn prepare(&self, request: &RunRequest) -> Result<(), BoxError> {
        self.setup(&self.params_for(request)).await
    }

    async fn describe(&self, request: &RunRequest) -> Result<Option<Content>, BoxError> {
        let Some(content) = &self.content else {
            return Ok(None);
        };
        let params = self.params_for(request);
        let rows = self
            .warehouse
            .query_rows(content, &params)
            .await
            .map_err(|e| e.into_sql("content", self.warehouse.location()))?;
        Ok(Some(Content::new().rows(rows.canonical())))
    }

    async fn process(&self, request: &RunRequest) -> Result<Outcome, BoxError> {
        let params = self.params_for(request);
        self.setup(&params).await?;
        let affected = self
            .warehouse
            .execute(&self.process, &params)
            .await
            .map_err(|e| e.into_sql("process", self.warehouse.location()))?;
        Ok(Outcome::records(affected as i64))
    }
}
