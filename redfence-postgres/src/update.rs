//! [`FencedUpdate`]: the single-statement form of a fenced write.

use std::fmt;

use tokio_postgres::GenericClient;
use tokio_postgres::types::ToSql;

use crate::{FenceCheck, FencedWriteError, StaleFence, quote_ident, quote_table};

/// Default [`FencedUpdate::fence_column`]: `last_fence`.
pub(crate) const DEFAULT_FENCE_COLUMN: &str = "last_fence";

/// The single-statement form: one `UPDATE` of one row that carries its own fence column,
/// applied only if the row's fence is not greater than the one offered: a smaller fence
/// (a stale owner) is refused, the owner's own fence is accepted again, so it may write the
/// row several times per acquisition.
///
/// ```sql
/// UPDATE invoices SET status = $3, last_fence = $1
/// WHERE id = $2 AND (last_fence IS NULL OR last_fence <= $1)
/// ```
///
/// With [`fence_check(FenceCheck::Strict)`](Self::fence_check) the comparison is
/// `last_fence < $1`: each fence is accepted once.
///
/// When no row is updated, a follow-up `SELECT` in the same session tells why: a stale
/// fence ([`FencedWriteError::Stale`]) or no such row ([`FencedWriteError::NotFound`]).
/// The fence column is a `bigint` (`NOT NULL DEFAULT 0` is best; `NULL` counts as "no fence
/// accepted yet"); the key column must be unique. Table and column names are quoted as
/// identifiers (case-sensitive; `schema.table` is split at the dot); values are parameters.
///
/// Run it on a [`Transaction`](tokio_postgres::Transaction) to make it part of a larger atomic write, or on a `Client`
/// for a write that is this one statement.
///
/// ```no_run
/// use redfence_postgres::{FencedUpdate, FencedWriteError};
/// # async fn run(
/// #     client: &mut redfence_postgres::tokio_postgres::Client,
/// #     lock: &redfence::Lock,
/// # ) -> Result<(), Box<dyn std::error::Error>> {
/// let fence = lock.fence().ok_or("fencing is not configured")?;
/// let tx = client.transaction().await?;
/// let result = FencedUpdate::new("invoices", "id", &4821_i64)
///     .set("status", &"posted")
///     .set_expr("posted_at", "now()")
///     .execute(&tx, fence)
///     .await;
/// match result {
///     Ok(_) => tx.commit().await?,
///     Err(FencedWriteError::Stale(stale)) => {
///         // A newer owner has written: stop, and do not retry with this fence.
///         return Err(stale.into());
///     }
///     Err(other) => return Err(other.into()),
/// }
/// # Ok(())
/// # }
/// # fn main() { let _ = run; }
/// ```
#[must_use = "a FencedUpdate does nothing until `execute` is called"]
pub struct FencedUpdate<'a> {
    table: String,
    key_column: String,
    key: &'a (dyn ToSql + Sync),
    fence_column: String,
    check: FenceCheck,
    sets: Vec<(String, Value<'a>)>,
}

enum Value<'a> {
    Param(&'a (dyn ToSql + Sync)),
    Expr(&'static str),
}

impl<'a> FencedUpdate<'a> {
    /// An update of the row of `table` whose `key_column` equals `key`.
    pub fn new(table: &str, key_column: &str, key: &'a (dyn ToSql + Sync)) -> Self {
        FencedUpdate {
            table: table.to_owned(),
            key_column: key_column.to_owned(),
            key,
            fence_column: DEFAULT_FENCE_COLUMN.to_owned(),
            check: FenceCheck::default(),
            sets: Vec::new(),
        }
    }

    /// The row's fence column. Defaults to `last_fence`.
    pub fn fence_column(mut self, column: &str) -> Self {
        self.fence_column = column.to_owned();
        self
    }

    /// Which fences are accepted: [`FenceCheck::AllowOwnerRewrite`] (a fence equal to the
    /// row's is accepted: the owner writes again) or [`FenceCheck::Strict`] (only a greater
    /// one). Defaults to [`FenceCheck::AllowOwnerRewrite`].
    pub fn fence_check(mut self, check: FenceCheck) -> Self {
        self.check = check;
        self
    }

    /// Sets `column` to `value` (sent as a parameter).
    pub fn set(mut self, column: &str, value: &'a (dyn ToSql + Sync)) -> Self {
        self.sets.push((column.to_owned(), Value::Param(value)));
        self
    }

    /// Sets `column` to a SQL expression written into the statement, e.g. `"now()"` or
    /// `"attempts + 1"`. It must be a `'static` string: code, never data.
    pub fn set_expr(mut self, column: &str, expr: &'static str) -> Self {
        self.sets.push((column.to_owned(), Value::Expr(expr)));
        self
    }

    /// The `UPDATE` statement this sends: `$1` is the fence, `$2` the key, then the values
    /// given with [`set`](Self::set), in order.
    pub fn sql(&self) -> String {
        let fence_column = quote_ident(&self.fence_column);
        let mut assignments = String::new();
        let mut param = 2;
        for (column, value) in &self.sets {
            let column = quote_ident(column);
            match value {
                Value::Param(_) => {
                    param += 1;
                    assignments.push_str(&format!("{column} = ${param}, "));
                }
                Value::Expr(expr) => assignments.push_str(&format!("{column} = {expr}, ")),
            }
        }
        format!(
            "UPDATE {table} SET {assignments}{fence_column} = $1 \
             WHERE {key} = $2 AND ({fence_column} IS NULL OR {fence_column} {op} $1)",
            op = self.check.accepts_op(),
            table = quote_table(&self.table),
            key = quote_ident(&self.key_column),
        )
    }

    /// Applies the update with `fence` on `client` (a [`Transaction`](tokio_postgres::Transaction) or a `Client`);
    /// returns how many rows it changed (1 with a unique key).
    ///
    /// # Errors
    ///
    /// [`FencedWriteError::Stale`] when the row's fence is greater than `fence` (or equal,
    /// with [`FenceCheck::Strict`])
    /// (nothing was changed: roll back and stop), [`FencedWriteError::NotFound`] when no row
    /// has the key, [`FencedWriteError::FenceOutOfRange`] for a fence above `i64::MAX`
    /// ([`FencedWriteError::ZeroFence`] for 0), and
    /// [`FencedWriteError::Database`] when a statement fails.
    pub async fn execute<C>(&self, client: &C, fence: u64) -> Result<u64, FencedWriteError>
    where
        C: GenericClient + Sync,
    {
        let fence_param = crate::error::fence_param(fence)?;
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&fence_param, self.key];
        params.extend(self.sets.iter().filter_map(|(_, value)| match value {
            Value::Param(p) => Some(*p),
            Value::Expr(_) => None,
        }));
        let updated = client
            .execute(self.sql().as_str(), &params)
            .await
            .map_err(|err| FencedWriteError::db(&self.table, "the fenced UPDATE", err))?;
        if updated > 0 {
            return Ok(updated);
        }
        let check = format!(
            "SELECT {fence} FROM {table} WHERE {key} = $1",
            fence = quote_ident(&self.fence_column),
            table = quote_table(&self.table),
            key = quote_ident(&self.key_column),
        );
        let row = client
            .query_opt(check.as_str(), &[self.key])
            .await
            .map_err(|err| FencedWriteError::db(&self.table, "the existence check", err))?;
        let last: Option<i64> = match &row {
            Some(row) => row.try_get(0).map_err(|err| {
                FencedWriteError::db(&self.table, "reading the fence column", err)
            })?,
            None => None,
        };
        match last {
            Some(last) if self.check.refuses(fence_param, last) => {
                redfence::fence::record_rejected_write(&self.table);
                Err(StaleFence {
                    resource: format!("{}({} = {:?})", self.table, self.key_column, self.key),
                    offered: fence,
                    last_accepted: u64::try_from(last).unwrap_or(0),
                }
                .into())
            }
            _ => Err(FencedWriteError::NotFound {
                table: self.table.clone(),
                key_column: self.key_column.clone(),
                key: format!("{:?}", self.key),
            }),
        }
    }
}

impl fmt::Debug for FencedUpdate<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedUpdate")
            .field("sql", &self.sql())
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_update_sql() {
        let update = FencedUpdate::new("invoices", "id", &7_i64)
            .set("status", &"posted")
            .set_expr("posted_at", "now()")
            .set("amount", &10_i64);
        assert_eq!(
            update.sql(),
            "UPDATE \"invoices\" SET \"status\" = $3, \"posted_at\" = now(), \"amount\" = $4, \
             \"last_fence\" = $1 WHERE \"id\" = $2 AND (\"last_fence\" IS NULL OR \"last_fence\" <= $1)"
        );
        assert!(
            update
                .fence_check(FenceCheck::Strict)
                .sql()
                .ends_with("(\"last_fence\" IS NULL OR \"last_fence\" < $1)")
        );
    }
}
