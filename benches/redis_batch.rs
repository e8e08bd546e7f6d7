//! Batch check-and-mark throughput on Redis: `RedisStore::check_and_mark` (fingerprint,
//! one-hour TTL, decided replay/conflict) against a raw pipeline of `SET key 1 NX PX ttl`
//! over the same keys, one connection each, on the same server in the same run, batches
//! rotating which goes first so all see the same server state. A third side, raw
//! `SET key VALUE NX PX ttl GET` with values of idem's size and layout, separates what
//! storing and returning a fingerprint costs Redis from idem's own work. Every side's
//! timer covers building its commands from the batch's keys (or marks) and the round trip.
//!
//! `IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo bench --bench redis_batch`
//! (prints a skip message without it). `IDEM_BENCH_KEYS` (default 200000) and
//! `IDEM_BENCH_BATCH` (default 1000) change the size. Every key it wrote is deleted at the
//! end (its own prefix, `SCAN` + `DEL`).

use std::time::{Duration, Instant};

use chrono::Utc;
use idem::store::prelude::*;
use idem::store::redis::RedisStore;
use idem::store::EventMark;

/// The TTL of every mark, both sides.
const TTL: Duration = Duration::from_secs(3600);

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

async fn delete_prefix(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> usize {
    let mut cursor: u64 = 0;
    let mut deleted = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .expect("scan");
        if !keys.is_empty() {
            deleted += redis::cmd("DEL")
                .arg(&keys)
                .query_async::<usize>(conn)
                .await
                .expect("del");
        }
        if next == 0 {
            return deleted;
        }
        cursor = next;
    }
}

fn main() {
    let Some(url) = std::env::var("IDEM_TEST_REDIS_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    else {
        println!(
            "redis_batch: skipped, IDEM_TEST_REDIS_URL is not set \
             (set it to redis://HOST:PORT of a redis >= 7 to measure)"
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
        let tag = &idem::new_run_id()[..8];
        let prefix = format!("idem-bench-{tag}:");
        let separator = if url.contains('?') { '&' } else { '?' };
        let store = RedisStore::connect(&format!("{url}{separator}prefix={prefix}"))
            .await
            .expect("open the redis store");
        let client = redis::Client::open(url.as_str()).expect("redis url");
        let mut raw = client
            .get_multiplexed_async_connection()
            .await
            .expect("raw connection");
        let ttl_ms = TTL.as_millis() as u64;
        let (ns_idem, ns_raw) = ("idem", "raw");
        let batches = total.div_ceil(batch);
        let keys_of = |b: usize| -> Vec<String> {
            (b * batch..((b + 1) * batch).min(total))
                .map(|i| format!("evt-{i:09}"))
                .collect()
        };
        let marks_of = |keys: &[String]| -> Vec<EventMark> {
            keys.iter()
                .map(|k| EventMark::key(k).fingerprint(&k[4..]).ttl(TTL))
                .collect()
        };
        // The raw side writes the same key layout under the same prefix, in its own
        // namespace.
        let raw_set = |keys: &[String]| {
            let mut pipe = redis::pipe();
            for k in keys {
                pipe.cmd("SET")
                    .arg(store.redis_key(ns_raw, k))
                    .arg(1)
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms);
            }
            pipe
        };

        // The same command and bytes as idem sends (see `src/store/redis.rs`), no verdicts.
        let raw_get = |keys: &[String]| {
            let first_seen = Utc::now().timestamp_micros();
            let mut pipe = redis::pipe();
            for k in keys {
                pipe.cmd("SET")
                    .arg(store.redis_key("rawget", k))
                    .arg(format!("{first_seen}:{}:={}\n", ttl_ms * 1000, &k[4..]))
                    .arg("NX")
                    .arg("PX")
                    .arg(ttl_ms)
                    .arg("GET");
            }
            pipe
        };

        // Warm-up (not measured).
        for b in 0..5 {
            let keys: Vec<String> = keys_of(b).iter().map(|k| format!("warm-{k}")).collect();
            store
                .check_and_mark(ns_idem, &marks_of(&keys), Utc::now())
                .await
                .expect("mark");
            let _: Vec<Option<String>> = raw_set(&keys).query_async(&mut raw).await.expect("raw");
            let _: Vec<Option<Vec<u8>>> = raw_get(&keys).query_async(&mut raw).await.expect("raw");
        }

        let mut results = Vec::new();
        for pass in ["fresh", "replay"] {
            let (mut t_idem, mut t_raw, mut t_get) = (Vec::new(), Vec::new(), Vec::new());
            let (mut new_idem, mut new_raw) = (0usize, 0usize);
            for b in 0..batches {
                let keys = keys_of(b);
                for side in 0..3 {
                    let side = (side + b) % 3;
                    if side == 2 {
                        // Building the commands from the keys is timed on every side.
                        let t = Instant::now();
                        let pipe = raw_get(&keys);
                        let _: Vec<Option<Vec<u8>>> =
                            pipe.query_async(&mut raw).await.expect("raw set get");
                        t_get.push(t.elapsed());
                    } else if side == 0 {
                        let marks = marks_of(&keys);
                        let t = Instant::now();
                        let verdicts = store
                            .check_and_mark(ns_idem, &marks, Utc::now())
                            .await
                            .expect("mark");
                        t_idem.push(t.elapsed());
                        new_idem += verdicts.iter().filter(|v| v.is_new()).count();
                    } else {
                        let t = Instant::now();
                        let pipe = raw_set(&keys);
                        let set: Vec<Option<String>> =
                            pipe.query_async(&mut raw).await.expect("raw set");
                        t_raw.push(t.elapsed());
                        new_raw += set.iter().filter(|s| s.is_some()).count();
                    }
                }
            }
            assert_eq!(new_idem, new_raw, "both saw the same new keys");
            let expected_new = if pass == "fresh" { total } else { 0 };
            assert_eq!(new_idem, expected_new, "{pass}: new keys");
            let (sum_idem, sum_raw, sum_get) =
                (t_idem.iter().sum(), t_raw.iter().sum(), t_get.iter().sum());
            let (r_idem, r_raw, r_get) = (
                rate(total, sum_idem),
                rate(total, sum_raw),
                rate(total, sum_get),
            );
            let median_ratio =
                median(&mut t_raw).as_secs_f64() / median(&mut t_idem).as_secs_f64();
            println!(
                "redis_batch {pass:<6}: {total} keys in batches of {batch}: \
                 raw SET NX PX {r_raw:>7.0} keys/s ({sum_raw:.2?})  idem check_and_mark {r_idem:>7.0} keys/s ({sum_idem:.2?})  \
                 ratio {:.3} (median batch: {median_ratio:.3}); \
                 raw SET NX PX GET of idem-sized values {r_get:>7.0} keys/s: idem/that {:.3}",
                r_idem / r_raw,
                r_idem / r_get
            );
            results.push((pass, r_raw, r_idem));
        }

        let deleted = delete_prefix(&mut raw, &prefix).await;
        println!("redis_batch: removed {deleted} bench keys");
        let (_, raw_rate, idem_rate) = results[0];
        if idem_rate / raw_rate < 0.9 {
            println!(
                "redis_batch: WARNING fresh-key ratio {:.3} is below the 0.9 target",
                idem_rate / raw_rate
            );
        }
    });
}
