//! Batch check-and-mark throughput on Postgres: `Store::mark_event_keys` against the raw
//! `INSERT … SELECT FROM UNNEST($1::text[]) ON CONFLICT DO NOTHING RETURNING` statement
//! on the same data, one connection each, batches alternating so both see the same server
//! state.
//!
//! `IDEM_TEST_POSTGRES_URL=postgres://USER@HOST:PORT/DB cargo bench --bench postgres_batch`
//! (prints a skip message without it). `IDEM_BENCH_KEYS` (default 200000) and
//! `IDEM_BENCH_BATCH` (default 1000) change the size.

use std::time::{Duration, Instant};

use chrono::Utc;
use idem::store::postgres::PostgresStore;
use idem::store::prelude::*;
use sqlx::{Connection, PgConnection};

const RAW: &str = "INSERT INTO event_keys (namespace, event_key, first_seen) \
                   SELECT $1, k, $3 FROM UNNEST($2::text[]) AS t(k) \
                   ON CONFLICT (namespace, event_key) DO NOTHING RETURNING event_key";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

fn median(times: &mut [Duration]) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

fn rate(keys: usize, took: Duration) -> f64 {
    keys as f64 / took.as_secs_f64()
}

fn main() {
    let Some(url) = std::env::var("IDEM_TEST_POSTGRES_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    else {
        println!(
            "postgres_batch: skipped, IDEM_TEST_POSTGRES_URL is not set \
             (set it to postgres://USER@HOST:PORT/DATABASE to measure)"
        );
        return;
    };
    let total = env_usize("IDEM_BENCH_KEYS", 200_000);
    let batch = env_usize("IDEM_BENCH_BATCH", 1000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async move {
        let store = PostgresStore::connect(&url)
            .await
            .expect("open the postgres store");
        let mut raw = PgConnection::connect(&url).await.expect("raw connection");
        let tag = &idem::new_run_id()[..8];
        let (ns_idem, ns_raw) = (format!("bench-idem-{tag}"), format!("bench-raw-{tag}"));
        let batches = total.div_ceil(batch);
        let keys_of = |b: usize| -> Vec<String> {
            (b * batch..((b + 1) * batch).min(total))
                .map(|i| format!("evt-{tag}-{i:09}"))
                .collect()
        };

        // Warm-up (not measured): connections, prepared statements, caches.
        for b in 0..5 {
            let keys: Vec<String> = keys_of(b).iter().map(|k| format!("warm-{k}")).collect();
            store
                .mark_event_keys(&ns_idem, &keys, Utc::now())
                .await
                .expect("mark");
            let _: Vec<String> = sqlx::query_scalar(RAW)
                .bind(&ns_raw)
                .bind(&keys)
                .bind(Utc::now())
                .fetch_all(&mut raw)
                .await
                .expect("raw insert");
        }

        // Fresh keys, then the same keys again (every one already seen).
        let mut results = Vec::new();
        for pass in ["fresh", "replay"] {
            let (mut t_idem, mut t_raw) = (Vec::new(), Vec::new());
            let (mut new_idem, mut new_raw) = (0usize, 0usize);
            for b in 0..batches {
                let keys = keys_of(b);
                // Alternate which goes first, so neither always meets a warmer server.
                for first_idem in [b % 2 == 0, b % 2 != 0] {
                    if first_idem {
                        let t = Instant::now();
                        let marks = store
                            .mark_event_keys(&ns_idem, &keys, Utc::now())
                            .await
                            .expect("mark");
                        t_idem.push(t.elapsed());
                        new_idem += marks.iter().filter(|m| **m).count();
                    } else {
                        let t = Instant::now();
                        let fresh: Vec<String> = sqlx::query_scalar(RAW)
                            .bind(&ns_raw)
                            .bind(&keys)
                            .bind(Utc::now())
                            .fetch_all(&mut raw)
                            .await
                            .expect("raw insert");
                        t_raw.push(t.elapsed());
                        new_raw += fresh.len();
                    }
                }
            }
            assert_eq!(new_idem, new_raw, "both saw the same new keys");
            let expected_new = if pass == "fresh" { total } else { 0 };
            assert_eq!(new_idem, expected_new, "{pass}: new keys");
            // Totals give the throughput; the ratio of median batch times is also shown,
            // as it is not moved by a checkpoint or another process hitting one side.
            let (sum_idem, sum_raw) = (t_idem.iter().sum(), t_raw.iter().sum());
            let (r_idem, r_raw) = (rate(total, sum_idem), rate(total, sum_raw));
            let median_ratio = median(&mut t_raw).as_secs_f64() / median(&mut t_idem).as_secs_f64();
            println!(
                "postgres_batch {pass:<6}: {total} keys in batches of {batch}: \
                 raw {r_raw:>7.0} keys/s ({sum_raw:.2?})  idem {r_idem:>7.0} keys/s ({sum_idem:.2?})  \
                 ratio {:.3} (median batch: {median_ratio:.3})",
                r_idem / r_raw
            );
            results.push((pass, r_raw, r_idem));
        }

        let deleted = sqlx::query("DELETE FROM event_keys WHERE namespace = $1 OR namespace = $2")
            .bind(&ns_idem)
            .bind(&ns_raw)
            .execute(&mut raw)
            .await
            .expect("clean up")
            .rows_affected();
        println!("postgres_batch: removed {deleted} bench rows");
        let (_, raw_rate, idem_rate) = results[0];
        if idem_rate / raw_rate < 0.9 {
            println!(
                "postgres_batch: WARNING fresh-key ratio {:.3} is below the 0.9 target",
                idem_rate / raw_rate
            );
        }
    });
}
