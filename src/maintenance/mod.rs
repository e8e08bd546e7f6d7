//! Keeping the store small: the built-in `cleanup` processor that a scheduled job runs
//! (retention from [`crate::store::CleanupPolicy`]).

pub mod cleanup;
