//! PostgreSQL fencing for [redfence]: a durable fencing counter
//! ([`PostgresCounter`]), and the storage side, which checks tokens inside the caller's own
//! transaction ([`FencedUpdate`], [`FenceGuards`]).
//!
//! ```no_run
//! use std::time::Duration;
//! use redfence::Redlock;
//! use redfence_postgres::tokio_postgres::{self, NoTls};
//! use redfence_postgres::{FencedUpdate, FencedWriteError, PostgresCounter};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pg = "host=10.0.0.5 user=app dbname=app";
//! // Tokens from PostgreSQL: durable, one committed statement per batch of acquisitions.
//! let redlock = Redlock::builder()
//!     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
//!     .fencing(PostgresCounter::connect(pg)?) // table `redfence_fences`, created on demand
//!     .build()?;
//!
//! let (mut client, connection) = tokio_postgres::connect(pg, NoTls).await?;
//! tokio::spawn(connection);
//!
//! let lock = redlock.acquire(&["invoice:4821"], Duration::from_secs(10)).await?;
//! let fence = lock.fence().ok_or("fencing is not configured")?;
//! let tx = client.transaction().await?;
//! // Applied only if no newer owner has written the row (`last_fence <= fence`).
//! match FencedUpdate::new("invoices", "id", &4821_i64)
//!     .set("status", &"posted")
//!     .execute(&tx, fence)
//!     .await
//! {
//!     Ok(_) => tx.commit().await?,
//!     // A newer owner has written: ownership is lost. Stop; do not retry this write.
//!     Err(FencedWriteError::Stale(stale)) => return Err(stale.into()),
//!     Err(other) => return Err(other.into()),
//! }
//! lock.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! The core crate, `redfence`, has the lock manager, the
//! [`FencingCounter`](redfence::FencingCounter) trait and the other counters; its
//! [`fence`](redfence::fence) module tells what each counter guarantees. This crate
//! re-exports [`tokio_postgres`] so that callers name the same types. With the `metrics` feature (redfence's `metrics`), the writes the helpers refuse
//! are counted in `redfence_fence_rejected_total`.
//!
//! # The two storage-side forms
//!
//! Both reject a write whose fence is **smaller** than the last one accepted, with a typed
//! [`StaleFence`] (inside [`FencedWriteError::Stale`]): the caller has **lost ownership**
//! and must stop, not retry the same write. The owner's own fence is accepted again, so it
//! may write as often as it likes during one acquisition: tokens are unique per
//! acquisition, so a stale owner always holds a smaller one. [`FenceCheck::Strict`] also
//! rejects an equal fence, for writes that must happen once per acquisition.
//!
//! - [`FencedUpdate`], the single-statement form, for a write that is one `UPDATE` of one row
//!   that carries its own `last_fence` column:
//!   `UPDATE t SET …, last_fence = $fence WHERE id = $id AND last_fence <= $fence`.
//!   Zero rows is told apart: stale ([`FencedWriteError::Stale`]) or no such row
//!   ([`FencedWriteError::NotFound`]).
//! - [`FenceGuards`], the guard-row form, for anything else (several statements, several
//!   tables, inserts): one guard row per resource, claimed inside the caller's transaction
//!   before the mutations, released by its commit or rollback.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![warn(missing_debug_implementations, rust_2018_idioms, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod check;
mod counter;
mod counter_error;
mod error;
mod guards;
mod issuer;
mod sql;
mod stripes;
mod update;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Config, GenericClient};

pub use check::FenceCheck;
pub use counter::PostgresCounter;
pub use error::{FencedWriteError, StaleFence};
pub use guards::FenceGuards;
pub use update::FencedUpdate;

/// The tokio-postgres crate redfence-postgres uses, so that callers name the same types
/// (e.g. to pass a [`tokio_postgres::Client`] to [`PostgresCounter::new`]).
pub use tokio_postgres;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A quoted identifier: `"name"`, with inner quotes doubled.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A possibly schema-qualified table name, each dot-separated part quoted.
pub(crate) fn quote_table(name: &str) -> String {
    name.split('.')
        .map(quote_ident)
        .collect::<Vec<_>>()
        .join(".")
}

/// The error with its causes, e.g. `db error: ERROR: relation "x" does not exist`.
pub(crate) fn chain(err: &tokio_postgres::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Host, port and database of a config, without credentials, for messages.
pub(crate) fn describe_config(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    format!(
        "PostgreSQL at {} port {} database {}",
        if hosts.is_empty() {
            "localhost".to_owned()
        } else {
            hosts.join(",")
        },
        if ports.is_empty() {
            "5432".to_owned()
        } else {
            ports.join(",")
        },
        config
            .get_dbname()
            .or(config.get_user())
            .unwrap_or("(default)")
    )
}

/// Runs a `CREATE TABLE IF NOT EXISTS`; two sessions creating the same table at once is not
/// an error (the loser sees a duplicate).
pub(crate) async fn create_if_absent<C>(client: &C, sql: &str) -> Result<(), tokio_postgres::Error>
where
    C: GenericClient + Sync,
{
    match client.batch_execute(sql).await {
        Err(err)
            if matches!(
                err.code(),
                Some(&SqlState::UNIQUE_VIOLATION | &SqlState::DUPLICATE_TABLE)
            ) =>
        {
            Ok(())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_table("redfence_fences"), "\"redfence_fences\"");
        assert_eq!(quote_table("locks.Fences"), "\"locks\".\"Fences\"");
        assert_eq!(
            quote_table("a\"; DROP TABLE x; --"),
            "\"a\"\"; DROP TABLE x; --\""
        );
    }
}
