//! [`PostgresCounter`](crate::PostgresCounter)'s striped mode: S stripe rows in the counter
//! table instead of one row per resource, a range of tokens per batch in one statement, and
//! the one-time move from per-resource rows that also shuts the per-resource mode out.
//!
//! Stripe `i` of `S` is the row `redfence:stripe:i/S`. Making the stripes (`migrate`, one
//! transaction, under an `ACCESS EXCLUSIVE` lock of the table, so after every per-resource
//! write in flight committed and before any other):
//!
//! 1. refuses if the table is striped with another count (constraint `redfence_striped_T`,
//!    `T` ≠ `S`);
//! 2. adds `CONSTRAINT redfence_striped_S CHECK (resource LIKE 'redfence:stripe:%/S') NOT
//!    VALID`: existing rows stay, but from now on a write of any other row fails, so a
//!    client of the per-resource mode (this version's or an older one) fails closed
//!    instead of issuing tokens beside the stripes, and so does a client with another count;
//! 3. makes every stripe row at least the table's largest `last_fence`: no resource fenced
//!    before goes back.

use std::collections::BTreeSet;

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use crate::counter_error::{CounterError, positive};
use crate::quote_table;
use redfence::fence::Stripes;

/// The striped layout of one table: its stripe row names and its migration.
pub(crate) struct StripedSql {
    pub(crate) stripes: Stripes,
    /// The row of each stripe, by index.
    names: Vec<String>,
    /// The `DO` block that makes the stripes (see the module's docs).
    pub(crate) migrate: String,
    /// One batch: `$1`, the batch's stripe rows (distinct); `$2`, its number of requests.
    /// Locks the rows in sorted order, takes `base`, the largest of them, and sets every
    /// one of them to `base + $2`; returns `base` once per row (no row if one is missing).
    issue: String,
}

/// How every stripe row's name starts: a per-resource counter refuses resources named so
/// (their row would be a stripe's, which the striped table's constraint lets through).
pub(crate) const STRIPE_ROW_PREFIX: &str = "redfence:stripe:";

/// The counter table's row of stripe `i` of `count`.
fn row_name(i: u32, count: u32) -> String {
    format!("{STRIPE_ROW_PREFIX}{i}/{count}")
}

impl StripedSql {
    pub(crate) fn new(table: &str, stripes: Stripes) -> Self {
        let s = stripes.count();
        let t = quote_table(table);
        // The table as a string literal, for `::regclass`.
        let literal = format!("'{}'", t.replace('\'', "''"));
        let last = s - 1;
        let migrate = format!(
            "DO $redfence$\n\
             DECLARE other text; floor bigint;\n\
             BEGIN\n\
             LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE;\n\
             SELECT conname INTO other FROM pg_constraint\n\
               WHERE conrelid = {literal}::regclass AND conname LIKE 'redfence\\_striped\\_%'\n\
               AND conname <> 'redfence_striped_{s}';\n\
             IF other IS NOT NULL THEN\n\
               RAISE EXCEPTION 'redfence: the fencing counter table % is striped by another \
                 count (constraint %); every client must use the same count', {literal}, other;\n\
             END IF;\n\
             IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = {literal}::regclass\n\
               AND conname = 'redfence_striped_{s}') THEN\n\
               ALTER TABLE {t} ADD CONSTRAINT redfence_striped_{s}\n\
                 CHECK (resource LIKE 'redfence:stripe:%/{s}') NOT VALID;\n\
             END IF;\n\
             SELECT coalesce(max(last_fence), 0) INTO floor FROM {t};\n\
             INSERT INTO {t} AS f (resource, last_fence)\n\
               SELECT 'redfence:stripe:' || g || '/{s}', floor FROM generate_series(0, {last}) AS g\n\
               ORDER BY 1\n\
               ON CONFLICT (resource) DO UPDATE SET last_fence = greatest(f.last_fence, EXCLUDED.last_fence);\n\
             END\n\
             $redfence$"
        );
        let issue = format!(
            "WITH locked AS (\
                 SELECT last_fence FROM {t} WHERE resource = ANY($1) ORDER BY resource FOR UPDATE\
             ), base AS (\
                 SELECT max(last_fence) AS b, count(*) AS found FROM locked\
             ) \
             UPDATE {t} AS f SET last_fence = base.b + $2 FROM base \
             WHERE f.resource = ANY($1) AND base.found = cardinality($1) \
             RETURNING base.b"
        );
        StripedSql {
            stripes,
            issue,
            names: (0..s).map(|i| row_name(i, s)).collect(),
            migrate,
        }
    }

    fn name(&self, stripe: u32) -> &str {
        usize::try_from(stripe)
            .ok()
            .and_then(|i| self.names.get(i))
            .map_or("", String::as_str)
    }

    /// One token per request, in one statement over the stripe rows of the batch: request
    /// `i` (from 1) gets `base + i`, `base` being the largest of them, and every one of them
    /// ends at `base + n`, the batch's last token: one range for the batch. If a stripe row
    /// is missing, the stripes are made (`migrate`) and the statement repeated once.
    pub(crate) async fn issue(
        &self,
        client: &Client,
        requests: &[&[String]],
        step: impl Fn(&str) -> String,
    ) -> Result<Vec<u64>, CounterError> {
        let distinct: Vec<&str> = requests
            .iter()
            .flat_map(|names| names.iter().map(|name| self.name(self.stripes.of(name))))
            .collect::<BTreeSet<&str>>()
            .into_iter()
            .collect();
        let n = requests.len() as i64;
        for attempt in 0..2 {
            let rows = client
                .query_typed(
                    &self.issue,
                    &[(&distinct, Type::TEXT_ARRAY), (&n, Type::INT8)],
                )
                .await
                .map_err(|err| CounterError::pg(step("incrementing"), err))?;
            if let Some(row) = rows.first() {
                let base: i64 = row
                    .try_get(0)
                    .map_err(|err| CounterError::pg(step("reading"), err))?;
                return (1_i64..=requests.len() as i64)
                    .map(|i| positive(base.checked_add(i), &step("reading")))
                    .collect();
            }
            if attempt == 0 {
                self.make(client, &step).await?;
            }
        }
        Err(CounterError::new(
            step("incrementing"),
            "a stripe row disappeared after the stripes were made (deleted concurrently?)",
        ))
    }

    /// Makes the stripes (see the module's docs).
    async fn make(
        &self,
        client: &Client,
        step: &impl Fn(&str) -> String,
    ) -> Result<(), CounterError> {
        match client.batch_execute(&self.migrate).await {
            Ok(()) => {
                tracing::info!(
                    stripes = self.stripes.count(),
                    "PostgreSQL fencing counter: stripes made"
                );
                Ok(())
            }
            Err(err) => {
                let denied = err.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE);
                let error = CounterError::pg(step("making the stripes of"), err);
                Err(if denied {
                    error.hint(
                        "adding the stripes' constraint needs the table's owner: run \
                         PostgresCounter::striped_migration_sql() as the owner, in a migration",
                    )
                } else {
                    error
                })
            }
        }
    }
}

/// The hint for a per-resource write refused by a striped table's constraint, if that is
/// what `err` is.
pub(crate) fn refused_by_stripes(err: &tokio_postgres::Error) -> Option<String> {
    let db = err.as_db_error()?;
    let constraint = db.constraint()?;
    let count = constraint.strip_prefix("redfence_striped_")?;
    Some(format!(
        "the table's counter is striped ({count} stripes, constraint {constraint}): every \
         client of it must use PostgresCounter::striped with Stripes::new({count})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripe_rows_and_migration_name_the_count() {
        let sql = StripedSql::new("locks.fen'ces", Stripes::DEFAULT);
        assert_eq!(sql.name(3), "redfence:stripe:3/16");
        assert_eq!(sql.name(16), "");
        assert!(sql.migrate.contains("'\"locks\".\"fen''ces\"'::regclass"));
        assert!(
            sql.migrate
                .contains("CHECK (resource LIKE 'redfence:stripe:%/16') NOT VALID")
        );
        assert!(sql.migrate.contains("generate_series(0, 15)"));
    }
}
