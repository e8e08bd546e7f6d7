//! The ledger's, keys' and leases' columns, and how one stored row becomes a model record:
//! one column list for every SQL family; one decoder for the sqlx family (SQLite and
//! Postgres differ only in how they store instants, days and JSON, so the row structs are
//! generic over those three column types); BigQuery's decoder beside it.

use chrono::{DateTime, Utc};

use super::LeaseHolder;

/// The ledger's columns (`processing_runs`), in the order every store writes them.
pub const RUN_COLUMNS: &str = "run_id, processor_name, scope, scope_date, trigger_source, mode, \
started_at, finished_at, duration_ms, status, skip_reason, would_skip_reason, \
previous_run_id, records_processed, processing_key, error, output";

/// The keys' columns (`processing_keys`), in the order every store writes them.
pub const KEY_COLUMNS: &str = "processing_key, kind, processor_name, scope, scope_date, \
processed_at, entity_count, metadata, run_id, keep_until";

/// The lease columns a store reads (`processing_leases`).
pub const LEASE_COLUMNS: &str = "holder_run_id, token, acquired_at, expires_at";

/// A lease row as stored: held by `holder` until `expires_at`, or free.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRow {
    /// The holding run, `None` once released.
    pub holder: Option<String>,
    /// The fencing token.
    pub token: i64,
    /// When it was claimed.
    pub acquired_at: DateTime<Utc>,
    /// When it expires unless renewed.
    pub expires_at: DateTime<Utc>,
}

impl LeaseRow {
    /// Who holds the lease at `now`: `None` when released or expired.
    pub fn held_at(&self, now: DateTime<Utc>) -> Option<LeaseHolder> {
        self.holder
            .as_ref()
            .filter(|_| self.expires_at > now)
            .map(|run_id| LeaseHolder {
                run_id: run_id.clone(),
                token: self.token,
                acquired_at: self.acquired_at,
                expires_at: self.expires_at,
            })
    }
}

/// The columns of an open lease ([`crate::store::OpenLease`]), as every store reads them.
pub const OPEN_LEASE_COLUMNS: &str = "processor_name, scope, holder_run_id, token, acquired_at, \
expires_at, renewed_at, holder_host, holder_pid";

#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use self::sql::{KeyRow, LeaseColumns, OpenLeaseRow, RunRow};

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql {
    use chrono::{DateTime, NaiveDate, Utc};
    use serde_json::Value;
    use sqlx::error::BoxDynError;
    use sqlx::{ColumnIndex, Database, Decode, FromRow, Row, Type};

    use super::LeaseRow;
    use crate::model::{KeyKind, KeyRecord, Mode, RunRecord, RunStatus, SkipReason, Trigger};
    use crate::store::OpenLease;

    /// A column as one SQL family stores it, turned into the model's value `T`: instants
    /// are microseconds (`i64`) in SQLite and `TIMESTAMPTZ` in Postgres, days `TEXT` or
    /// `DATE`, JSON `TEXT` or `JSONB`.
    pub(crate) trait Stored<T> {
        /// The model's value.
        fn restore(self) -> T;
    }

    impl Stored<DateTime<Utc>> for i64 {
        fn restore(self) -> DateTime<Utc> {
            DateTime::from_timestamp_micros(self).unwrap_or_default()
        }
    }

    impl Stored<DateTime<Utc>> for DateTime<Utc> {
        fn restore(self) -> DateTime<Utc> {
            self
        }
    }

    impl Stored<NaiveDate> for String {
        fn restore(self) -> NaiveDate {
            crate::model::time::parse_day(&self).unwrap_or_default()
        }
    }

    impl Stored<NaiveDate> for NaiveDate {
        fn restore(self) -> NaiveDate {
            self
        }
    }

    /// JSON kept as text: unreadable text reads as no value.
    impl Stored<Option<Value>> for String {
        fn restore(self) -> Option<Value> {
            serde_json::from_str(&self).ok()
        }
    }

    impl Stored<Option<Value>> for Value {
        fn restore(self) -> Option<Value> {
            Some(self)
        }
    }

    /// The model's enums are stored as their names (`TEXT`) in every SQL family.
    macro_rules! text_enum {
        ($($ty:ty => $parse:expr),* $(,)?) => {$(
            impl<DB: Database> Type<DB> for $ty
            where
                str: Type<DB>,
            {
                fn type_info() -> DB::TypeInfo {
                    <str as Type<DB>>::type_info()
                }
                fn compatible(ty: &DB::TypeInfo) -> bool {
                    <str as Type<DB>>::compatible(ty)
                }
            }

            impl<'r, DB: Database> Decode<'r, DB> for $ty
            where
                &'r str: Decode<'r, DB>,
            {
                fn decode(value: DB::ValueRef<'r>) -> Result<Self, BoxDynError> {
                    let text = <&'r str as Decode<'r, DB>>::decode(value)?;
                    let parse: fn(&str) -> crate::Result<$ty> = $parse;
                    Ok(parse(text)?)
                }
            }
        )*};
    }

    text_enum! {
        Mode => str::parse,
        Trigger => str::parse,
        RunStatus => str::parse,
        KeyKind => KeyKind::parse,
        SkipReason => |s| Ok(SkipReason::parse(s)),
    }

    /// A `processing_runs` row; `T`, `D`, `J`: how the family stores instants, days, JSON.
    #[derive(Debug)]
    pub(crate) struct RunRow<T, D, J>(pub RunRecord, std::marker::PhantomData<(T, D, J)>);

    /// A `processing_keys` row; `T`, `D`, `J` as for [`RunRow`].
    #[derive(Debug)]
    pub(crate) struct KeyRow<T, D, J>(pub KeyRecord, std::marker::PhantomData<(T, D, J)>);

    /// A `processing_leases` row ([`super::LEASE_COLUMNS`]); `T` as for [`RunRow`].
    #[derive(Debug)]
    pub(crate) struct LeaseColumns<T>(pub LeaseRow, std::marker::PhantomData<T>);

    /// `T` decodes from a column of `R`.
    pub(crate) trait Column<'r, R: Row>:
        Decode<'r, R::Database> + Type<R::Database>
    {
    }
    impl<'r, R: Row, T: Decode<'r, R::Database> + Type<R::Database>> Column<'r, R> for T {}

    impl<'r, R, T, D, J> FromRow<'r, R> for RunRow<T, D, J>
    where
        R: Row,
        &'static str: ColumnIndex<R>,
        String: Column<'r, R>,
        Option<String>: Column<'r, R>,
        i64: Column<'r, R>,
        Option<i64>: Column<'r, R>,
        Mode: Column<'r, R>,
        Trigger: Column<'r, R>,
        RunStatus: Column<'r, R>,
        Option<SkipReason>: Column<'r, R>,
        T: Column<'r, R> + Stored<DateTime<Utc>>,
        D: Column<'r, R> + Stored<NaiveDate>,
        Option<J>: Column<'r, R>,
        J: Stored<Option<Value>>,
    {
        fn from_row(r: &'r R) -> sqlx::Result<Self> {
            let run = RunRecord {
                run_id: r.try_get("run_id")?,
                processor: r.try_get("processor_name")?,
                scope: r.try_get("scope")?,
                scope_date: r.try_get::<D, _>("scope_date")?.restore(),
                trigger: r.try_get("trigger_source")?,
                mode: r.try_get("mode")?,
                started_at: r.try_get::<T, _>("started_at")?.restore(),
                finished_at: r.try_get::<T, _>("finished_at")?.restore(),
                duration_ms: r.try_get("duration_ms")?,
                status: r.try_get("status")?,
                skip_reason: r.try_get("skip_reason")?,
                would_skip_reason: r.try_get("would_skip_reason")?,
                previous_run_id: r.try_get("previous_run_id")?,
                records_processed: r.try_get("records_processed")?,
                processing_key: r.try_get("processing_key")?,
                error: r.try_get("error")?,
                output: r
                    .try_get::<Option<J>, _>("output")?
                    .and_then(<J as Stored<Option<Value>>>::restore),
            };
            Ok(RunRow(run, std::marker::PhantomData))
        }
    }

    impl<'r, R, T, D, J> FromRow<'r, R> for KeyRow<T, D, J>
    where
        R: Row,
        &'static str: ColumnIndex<R>,
        String: Column<'r, R>,
        Option<i64>: Column<'r, R>,
        KeyKind: Column<'r, R>,
        T: Column<'r, R> + Stored<DateTime<Utc>>,
        Option<T>: Column<'r, R>,
        D: Column<'r, R> + Stored<NaiveDate>,
        Option<J>: Column<'r, R>,
        J: Stored<Option<Value>>,
    {
        fn from_row(r: &'r R) -> sqlx::Result<Self> {
            let key = KeyRecord {
                key: r.try_get("processing_key")?,
                kind: r.try_get("kind")?,
                processor: r.try_get("processor_name")?,
                scope: r.try_get("scope")?,
                scope_date: r.try_get::<D, _>("scope_date")?.restore(),
                processed_at: r.try_get::<T, _>("processed_at")?.restore(),
                entity_count: r.try_get("entity_count")?,
                metadata: r
                    .try_get::<Option<J>, _>("metadata")?
                    .and_then(<J as Stored<Option<Value>>>::restore)
                    .unwrap_or(Value::Null),
                run_id: r.try_get("run_id")?,
                keep_until: r
                    .try_get::<Option<T>, _>("keep_until")?
                    .map(Stored::restore),
            };
            Ok(KeyRow(key, std::marker::PhantomData))
        }
    }

    /// An open lease row ([`super::OPEN_LEASE_COLUMNS`]); `T` as for [`RunRow`].
    #[derive(Debug)]
    pub(crate) struct OpenLeaseRow<T>(pub OpenLease, std::marker::PhantomData<T>);

    impl<'r, R, T> FromRow<'r, R> for OpenLeaseRow<T>
    where
        R: Row,
        &'static str: ColumnIndex<R>,
        String: Column<'r, R>,
        Option<String>: Column<'r, R>,
        i64: Column<'r, R>,
        Option<i64>: Column<'r, R>,
        T: Column<'r, R> + Stored<DateTime<Utc>>,
        Option<T>: Column<'r, R>,
    {
        fn from_row(r: &'r R) -> sqlx::Result<Self> {
            let lease = OpenLease {
                processor: r.try_get("processor_name")?,
                scope: r.try_get("scope")?,
                run_id: r.try_get("holder_run_id")?,
                token: r.try_get("token")?,
                acquired_at: r.try_get::<T, _>("acquired_at")?.restore(),
                expires_at: r.try_get::<T, _>("expires_at")?.restore(),
                heartbeat_at: r
                    .try_get::<Option<T>, _>("renewed_at")?
                    .map(Stored::restore),
                host: r.try_get("holder_host")?,
                pid: r.try_get("holder_pid")?,
            };
            Ok(OpenLeaseRow(lease, std::marker::PhantomData))
        }
    }

    impl<'r, R, T> FromRow<'r, R> for LeaseColumns<T>
    where
        R: Row,
        &'static str: ColumnIndex<R>,
        Option<String>: Column<'r, R>,
        i64: Column<'r, R>,
        T: Column<'r, R> + Stored<DateTime<Utc>>,
    {
        fn from_row(r: &'r R) -> sqlx::Result<Self> {
            let lease = LeaseRow {
                holder: r.try_get("holder_run_id")?,
                token: r.try_get("token")?,
                acquired_at: r.try_get::<T, _>("acquired_at")?.restore(),
                expires_at: r.try_get::<T, _>("expires_at")?.restore(),
            };
            Ok(LeaseColumns(lease, std::marker::PhantomData))
        }
    }
}

#[cfg(feature = "bigquery")]
pub(crate) use self::bigquery::{
    key_from_record, lease_from_record, open_lease_from_record, run_from_record,
};

#[cfg(feature = "bigquery")]
mod bigquery {
    use super::LeaseRow;
    use crate::backend::bigquery::Record;
    use crate::error::Error;
    use crate::model::{KeyKind, KeyRecord, Mode, RunRecord, RunStatus, SkipReason};

    /// A `processing_keys` row of a BigQuery result.
    pub(crate) fn key_from_record(r: &Record<'_>) -> Result<KeyRecord, String> {
        Ok(KeyRecord {
            key: r.str("processing_key")?,
            kind: KeyKind::parse(&r.str("kind")?).map_err(|e| e.to_string())?,
            processor: r.str("processor_name")?,
            scope: r.str("scope")?,
            scope_date: r.date("scope_date")?,
            processed_at: r.timestamp("processed_at")?,
            entity_count: r.opt_i64("entity_count")?,
            metadata: r.opt_json("metadata")?.unwrap_or(serde_json::Value::Null),
            run_id: r.str("run_id")?,
            keep_until: r.opt_timestamp("keep_until")?,
        })
    }

    /// A `processing_runs` row of a BigQuery result.
    pub(crate) fn run_from_record(r: &Record<'_>) -> Result<RunRecord, String> {
        let text = |e: Error| e.to_string();
        Ok(RunRecord {
            run_id: r.str("run_id")?,
            processor: r.str("processor_name")?,
            scope: r.str("scope")?,
            scope_date: r.date("scope_date")?,
            trigger: r.str("trigger_source")?.parse().map_err(text)?,
            mode: r.str("mode")?.parse::<Mode>().map_err(text)?,
            started_at: r.timestamp("started_at")?,
            finished_at: r.timestamp("finished_at")?,
            duration_ms: r.i64("duration_ms")?,
            status: r.str("status")?.parse::<RunStatus>().map_err(text)?,
            skip_reason: r.opt_str("skip_reason")?.map(|s| SkipReason::parse(&s)),
            would_skip_reason: r
                .opt_str("would_skip_reason")?
                .map(|s| SkipReason::parse(&s)),
            previous_run_id: r.opt_str("previous_run_id")?,
            records_processed: r.opt_i64("records_processed")?,
            processing_key: r.opt_str("processing_key")?,
            error: r.opt_str("error")?,
            output: r.opt_json("output")?,
        })
    }

    /// An open lease row ([`super::OPEN_LEASE_COLUMNS`]) of a BigQuery result.
    pub(crate) fn open_lease_from_record(
        r: &Record<'_>,
    ) -> Result<crate::store::OpenLease, String> {
        Ok(crate::store::OpenLease {
            processor: r.str("processor_name")?,
            scope: r.str("scope")?,
            run_id: r.str("holder_run_id")?,
            token: r.i64("token")?,
            acquired_at: r.timestamp("acquired_at")?,
            expires_at: r.timestamp("expires_at")?,
            heartbeat_at: r.opt_timestamp("renewed_at")?,
            host: r.opt_str("holder_host")?,
            pid: r.opt_i64("holder_pid")?,
        })
    }

    /// A `processing_leases` row of a BigQuery result.
    pub(crate) fn lease_from_record(r: &Record<'_>) -> Result<LeaseRow, String> {
        Ok(LeaseRow {
            holder: r.opt_str("holder_run_id")?,
            token: r.i64("token")?,
            acquired_at: r.timestamp("acquired_at")?,
            expires_at: r.timestamp("expires_at")?,
        })
    }
}
