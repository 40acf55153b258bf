//! The PostgreSQL schema: the SQL files of `bot/migrations/postgres/`, compiled in, applied
//! in order when a [`PgStore`](super::PgStore) opens, each recorded in `parlor_migrations`.
//!
//! Several daemons may open one database at the same moment (a restart overlapping the old
//! process, or tests). The whole check-and-apply is one transaction that first takes a
//! transaction-level advisory lock, so one opener applies what is missing and the others,
//! waiting on the lock, then find it applied. DDL is transactional in PostgreSQL: a failed
//! migration leaves nothing half made.

use super::pool::{Pool, TxError};
use crate::store::StoreError;

/// One migration: its number (the order, and the key recorded), name and SQL.
struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

/// Every migration, in order. A new one is a new file and a new line here; a released one
/// is never edited (databases have it applied already).
const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "init",
    sql: include_str!("../../../migrations/postgres/0001_init.sql"),
}];

/// The advisory lock key the migrations are applied under: any fixed number no other
/// program on the database uses ("parlor" in ASCII).
const MIGRATION_LOCK: i64 = 0x7061_726c_6f72;

/// Applies the migrations the database does not have yet; returns how many it applied.
/// Fails when the database has one this parlor does not know (a newer parlor wrote it).
pub(super) fn migrate(pool: &Pool) -> Result<usize, StoreError> {
    pool.write(|db| {
        db.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
        db.execute(
            "CREATE TABLE IF NOT EXISTS parlor_migrations (
                 version integer PRIMARY KEY,
                 name text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             )",
            &[],
        )?;
        let applied: Vec<i32> = db
            .query(
                "SELECT version FROM parlor_migrations ORDER BY version",
                &[],
            )?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let known = MIGRATIONS.last().map_or(0, |m| m.version);
        if let Some(newest) = applied.iter().copied().max()
            && newest > known
        {
            return Err(TxError::Store(StoreError::Io(format!(
                "the PostgreSQL database has schema version {newest}; this parlor knows up \
                 to {known} (was it written by a newer parlor?)"
            ))));
        }
        let mut count = 0;
        for migration in MIGRATIONS {
            if applied.contains(&migration.version) {
                continue;
            }
            db.batch(migration.sql)?;
            db.execute(
                "INSERT INTO parlor_migrations (version, name) VALUES ($1, $2)",
                &[&migration.version, &migration.name],
            )?;
            tracing::info!(
                version = migration.version,
                name = migration.name,
                "PostgreSQL schema migrated"
            );
            count += 1;
        }
        Ok(count)
    })
}
