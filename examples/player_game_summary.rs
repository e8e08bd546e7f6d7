//! A Rust processor you can copy: register it and hand over to idem's CLI, so every
//! `idem` subcommand works for it.
//!
//! ```sh
//! cargo run --example player_game_summary -- --jobs-dir examples/jobs \
//!     run player_game_summary --date 2025-11-18
//! ```

use std::process::ExitCode;

use idem::{async_trait, BoxError, Content, Outcome, Processor, Registry, RunRequest};

/// Summarises the players of a game day. A real one would query the warehouse; this one
/// derives its players from the date so the example runs anywhere.
struct PlayerGameSummary;

impl PlayerGameSummary {
    fn players(&self, request: &RunRequest) -> Vec<String> {
        use chrono::Datelike;
        let n = 3 + request.scope_date.day() as usize % 5;
        (0..n).map(|i| format!("player-{}", i * 7 + 1)).collect()
    }
}

#[async_trait]
impl Processor for PlayerGameSummary {
    /// Stable: the ledger and the keys refer to jobs by name, jobs refer to this.
    fn name(&self) -> &str {
        "player_game_summary"
    }

    /// What the run would consume; identical content within the window ⇒ skip.
    async fn describe(&self, request: &RunRequest) -> Result<Option<Content>, BoxError> {
        let season = request
            .params
            .get("season")
            .and_then(|v| v.as_str())
            .unwrap_or("2025-26");
        Ok(Some(
            Content::new()
                .entities(self.players(request))
                .field("season", season),
        ))
    }

    /// The work. Return an error to fail the run: no key is written and the retry runs.
    async fn process(&self, request: &RunRequest) -> Result<Outcome, BoxError> {
        let players = self.players(request);
        tracing::info!(players = players.len(), scope = %request.scope, "summarising");
        Ok(Outcome::records(players.len() as i64)
            .with_output(serde_json::json!({ "players": players })))
    }
}

fn main() -> ExitCode {
    let registry = Registry::new().with(PlayerGameSummary);
    idem::cli::main_with(registry)
}
