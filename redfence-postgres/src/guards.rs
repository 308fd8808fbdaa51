//! [`FenceGuards`]: the guard-row form of a fenced write.

use std::fmt;

use tokio_postgres::types::Type;
use tokio_postgres::{GenericClient, Transaction};

use crate::{FenceCheck, FencedWriteError, StaleFence, create_if_absent, quote_table};
use redfence::ResourceType;

/// Default [`FenceGuards::table`]: `redfence_guards`.
pub(crate) const DEFAULT_GUARD_TABLE: &str = "redfence_guards";
/// Set before a multi-resource claim, rolled back to when one of them is stale.
const SAVEPOINT: &str = "SAVEPOINT redfence_claim_guards";
const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT redfence_claim_guards";
const RELEASE_SAVEPOINT: &str = "RELEASE SAVEPOINT redfence_claim_guards";

/// The guard-row form: one row per resource in a guard table that holds the last fence
/// accepted for it, claimed inside the caller's transaction before its mutations.
///
/// [`claim`](Self::claim) locks the guard row and records the new fence in **one
/// statement**, and refuses a fence smaller than the recorded one with [`StaleFence`]
/// (the owner's own fence is accepted again, so it may claim in several transactions of
/// one acquisition):
///
/// ```sql
/// INSERT INTO redfence_guards AS g (resource, last_fence) VALUES ($1, $2)
/// ON CONFLICT (resource) DO UPDATE SET last_fence = EXCLUDED.last_fence
/// WHERE g.last_fence <= EXCLUDED.last_fence
/// RETURNING g.resource
/// ```
///
/// With [`fence_check(FenceCheck::Strict)`](Self::fence_check) the comparison is
/// `g.last_fence < EXCLUDED.last_fence`: each fence is claimed once.
///
/// This is the classic `SELECT last_fence … FOR UPDATE`, compare, mutate, `UPDATE` guard,
/// `COMMIT`, in one round trip and with nothing for the caller to forget: the row stays
/// locked until the transaction ends, so a concurrent writer waits and then sees the new
/// fence; a rollback undoes the claim with the mutations; and a resource seen for the first
/// time gets its guard row (the classic form locks nothing when the row is missing, so two
/// first writers would both pass). [`claim`](Self::claim) takes a [`Transaction`], so it
/// cannot run in autocommit by mistake.
///
/// **Claim first.** A stale owner is shut out only once the new owner's fence is recorded:
/// claim in the same transaction as the reads the work decides on, before them (as below),
/// or claim and commit right after acquiring. A new owner that reads the state outside its
/// claiming transaction may decide on a state that a stale owner, still ahead of it in the
/// guard, changes before the new owner's claim.
///
/// ```no_run
/// use redfence_postgres::FenceGuards;
/// # async fn run(
/// #     client: &mut redfence_postgres::tokio_postgres::Client,
/// #     lock: &redfence::Lock,
/// # ) -> Result<(), Box<dyn std::error::Error>> {
/// let guards = FenceGuards::new(); // table `redfence_guards`
/// guards.create_table(&*client).await?; // once, or in a migration
///
/// let tx = client.transaction().await?;
/// // Every resource of the lock, with its fence (or `claim(&tx, "invoice:4821", fence)`).
/// if let Err(err) = guards.claim_lock(&tx, lock).await {
///     // `err.is_ownership_lost()`: a newer owner has written. The transaction is
///     // rolled back when dropped.
///     return Err(err.into());
/// }
/// tx.execute("UPDATE invoices SET status = 'posted' WHERE id = 4821", &[]).await?;
/// tx.execute("INSERT INTO ledger (invoice, amount) VALUES (4821, 100)", &[]).await?;
/// tx.commit().await?; // the mutations and the new fence, together
/// # Ok(())
/// # }
/// # fn main() { let _ = run; }
/// ```
#[derive(Clone)]
pub struct FenceGuards {
    table: String,
    check: FenceCheck,
    resource_type: ResourceType,
    claim: String,
    last: String,
    create: String,
}

impl Default for FenceGuards {
    fn default() -> Self {
        Self::new()
    }
}

impl FenceGuards {
    /// Guards in the table `redfence_guards`.
    pub fn new() -> Self {
        Self::in_table(DEFAULT_GUARD_TABLE)
    }

    /// Guards in `table`, optionally schema-qualified; quoted as identifiers like
    /// [`PostgresCounter::table`](crate::PostgresCounter::table).
    pub fn in_table(table: &str) -> Self {
        let t = quote_table(table);
        let check = FenceCheck::default();
        FenceGuards {
            table: table.to_owned(),
            check,
            resource_type: ResourceType::default(),
            claim: claim_sql(&t, check),
            last: format!("SELECT resource, last_fence FROM {t} WHERE resource = ANY($1)"),
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                     resource text PRIMARY KEY, \
                     last_fence bigint NOT NULL\
                 )"
            ),
        }
    }

    /// Which fences a claim accepts: [`FenceCheck::AllowOwnerRewrite`] (a fence equal to
    /// the guard's is accepted: the owner claims again) or [`FenceCheck::Strict`] (only a
    /// greater one). Defaults to [`FenceCheck::AllowOwnerRewrite`].
    #[must_use]
    pub fn fence_check(mut self, check: FenceCheck) -> Self {
        self.check = check;
        self.claim = claim_sql(&quote_table(&self.table), check);
        self
    }

    /// How a stale resource's name maps to the `type` label of
    /// `redfence_fence_rejected_total` (feature `metrics`); use the rule given to
    /// [`RedlockBuilder::resource_type`](redfence::RedlockBuilder::resource_type). Defaults to
    /// [`ResourceType::default`], the prefix before the first `:`.
    #[must_use]
    pub fn resource_type(mut self, rule: ResourceType) -> Self {
        self.resource_type = rule;
        self
    }

    /// The guard table's name, as given.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The `CREATE TABLE IF NOT EXISTS` statement of the guard table, for migrations.
    pub fn create_table_sql(&self) -> &str {
        &self.create
    }

    /// Creates the guard table if it does not exist.
    ///
    /// # Errors
    ///
    /// The statement failed (e.g. the role may not create tables).
    pub async fn create_table<C>(&self, client: &C) -> Result<(), FencedWriteError>
    where
        C: GenericClient + Sync,
    {
        match create_if_absent(client, &self.create).await {
            Ok(()) => Ok(()),
            Err(err) => Err(FencedWriteError::db(
                &self.table,
                "creating the guard table",
                err,
            )),
        }
    }

    /// Claims the guard of `resource` for `fence` in `tx`: locks its row until `tx` ends,
    /// refuses a fence smaller than the last one accepted (or equal to it, with
    /// [`FenceCheck::Strict`]), and records `fence`
    /// (visible to others when `tx` commits, undone if it rolls back). Run the mutations
    /// after it, in `tx`.
    ///
    /// # Errors
    ///
    /// [`FencedWriteError::Stale`] when a fence greater than `fence` (or equal, with
    /// [`FenceCheck::Strict`]) was accepted (roll back and stop), [`FencedWriteError::FenceOutOfRange`] for a fence
    /// above `i64::MAX` ([`FencedWriteError::ZeroFence`] for 0), [`FencedWriteError::Database`] when the statement fails.
    pub async fn claim(
        &self,
        tx: &Transaction<'_>,
        resource: &str,
        fence: u64,
    ) -> Result<(), FencedWriteError> {
        self.claim_all(tx, &[resource], fence).await
    }

    /// Claims the guards of every resource of `lock` with its fence: the least room for a
    /// mistake (no resource name or fence to pass by hand). The same as
    /// [`claim_all`](Self::claim_all)`(tx, lock.resources(), fence)`.
    ///
    /// # Errors
    ///
    /// As [`claim_all`](Self::claim_all); [`FencedWriteError::NoFence`] when the lock
    /// carries no fence.
    pub async fn claim_lock(
        &self,
        tx: &Transaction<'_>,
        lock: &redfence::Lock,
    ) -> Result<(), FencedWriteError> {
        let fence = lock
            .fence()
            .ok_or_else(|| FencedWriteError::NoFence(lock.resources().to_vec()))?;
        self.claim_all(tx, lock.resources(), fence).await
    }

    /// [`claim`](Self::claim) for every resource of a multi-resource lock, in one statement
    /// that locks the guard rows in sorted order (so concurrent claims cannot deadlock).
    /// All or nothing: if any is stale, the others' claims are undone (to a savepoint set
    /// before the statement), the error names the stale guard with the greatest accepted
    /// fence, and the caller rolls back.
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim); [`FencedWriteError::NoResource`] for an empty list.
    pub async fn claim_all(
        &self,
        tx: &Transaction<'_>,
        resources: &[impl AsRef<str>],
        fence: u64,
    ) -> Result<(), FencedWriteError> {
        if resources.is_empty() {
            return Err(FencedWriteError::NoResource);
        }
        let fence_param = crate::error::fence_param(fence)?;
        let mut names: Vec<&str> = resources.iter().map(AsRef::as_ref).collect();
        names.sort_unstable();
        names.dedup();
        // With several guards, some may be claimed before one turns out stale: a savepoint
        // lets those be undone, so that even a caller who commits anyway records nothing.
        let several = names.len() > 1;
        if several {
            tx.batch_execute(SAVEPOINT)
                .await
                .map_err(|err| FencedWriteError::db(&self.table, "setting a savepoint", err))?;
        }
        let rows = tx
            .query_typed(
                &self.claim,
                &[(&names, Type::TEXT_ARRAY), (&fence_param, Type::INT8)],
            )
            .await
            .map_err(|err| FencedWriteError::db(&self.table, "claiming the guard rows", err))?;
        let all_claimed = rows.len() == names.len();
        if several {
            // Undo the claims if one is stale, and in any case drop the savepoint, so that
            // repeated claims in one transaction do not pile savepoints up.
            let end = if all_claimed {
                RELEASE_SAVEPOINT.to_owned()
            } else {
                format!("{ROLLBACK_TO_SAVEPOINT}; {RELEASE_SAVEPOINT}")
            };
            tx.batch_execute(&end).await.map_err(|err| {
                FencedWriteError::db(&self.table, "ending the claims' savepoint", err)
            })?;
        }
        if all_claimed {
            return Ok(());
        }
        let claimed: Vec<String> = rows
            .iter()
            .map(|row| row.try_get::<_, String>(0))
            .collect::<Result<_, _>>()
            .map_err(|err| FencedWriteError::db(&self.table, "reading the claimed guards", err))?;
        let stale: Vec<&str> = names
            .iter()
            .copied()
            .filter(|name| !claimed.iter().any(|c| c == name))
            .collect();
        let rows = tx
            .query_typed(&self.last, &[(&stale, Type::TEXT_ARRAY)])
            .await
            .map_err(|err| FencedWriteError::db(&self.table, "reading the stale guards", err))?;
        let mut worst: Option<(String, i64)> = None;
        for row in &rows {
            let resource: String = row.try_get(0).map_err(|err| {
                FencedWriteError::db(&self.table, "reading the stale guards", err)
            })?;
            let last: i64 = row.try_get(1).map_err(|err| {
                FencedWriteError::db(&self.table, "reading the stale guards", err)
            })?;
            if worst.as_ref().is_none_or(|(_, w)| last > *w) {
                worst = Some((resource, last));
            }
        }
        let (resource, last) = worst.unwrap_or_else(|| {
            (
                stale.first().map(|s| (*s).to_owned()).unwrap_or_default(),
                fence_param,
            )
        });
        redfence::fence::record_rejected_write(self.resource_type.of(&resource));
        Err(StaleFence {
            resource,
            offered: fence,
            last_accepted: u64::try_from(last).unwrap_or(fence),
        }
        .into())
    }
}

/// The claim statement: upserts each guard row in sorted order, where `check` accepts it.
fn claim_sql(table: &str, check: FenceCheck) -> String {
    format!(
        "INSERT INTO {table} AS g (resource, last_fence) \
         SELECT r, $2 FROM unnest($1::text[]) AS r ORDER BY r \
         ON CONFLICT (resource) DO UPDATE SET last_fence = EXCLUDED.last_fence \
         WHERE g.last_fence {op} EXCLUDED.last_fence \
         RETURNING g.resource",
        op = check.accepts_op()
    )
}

impl fmt::Debug for FenceGuards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FenceGuards")
            .field("table", &self.table)
            .field("check", &self.check)
            .field("resource_type", &self.resource_type)
            .finish_non_exhaustive()
    }
}
