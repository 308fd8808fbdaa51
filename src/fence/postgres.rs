//! PostgreSQL: a durable fencing counter ([`PostgresCounter`]), and the storage side, which
//! checks tokens inside the caller's own transaction ([`FencedUpdate`], [`FenceGuards`]).
//!
//! Needs the `postgres` feature. The crate re-exports [`tokio_postgres`] so that callers
//! name the same types.
//!
//! # The two storage-side forms
//!
//! Both reject a write whose fence is not greater than the last one accepted, with a typed
//! [`StaleFence`] (inside [`FencedWriteError::Stale`]): the caller has **lost ownership**
//! and must stop, not retry the same write.
//!
//! - [`FencedUpdate`], the single-statement form, for a write that is one `UPDATE` of one row
//!   that carries its own `last_fence` column:
//!   `UPDATE t SET …, last_fence = $fence WHERE id = $id AND last_fence < $fence`.
//!   Zero rows is told apart: stale ([`FencedWriteError::Stale`]) or no such row
//!   ([`FencedWriteError::NotFound`]).
//! - [`FenceGuards`], the guard-row form, for anything else (several statements, several
//!   tables, inserts): one guard row per resource, claimed inside the caller's transaction
//!   before the mutations, released by its commit or rollback.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Mutex;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, GenericClient, NoTls, Socket, Transaction};

use super::FencingCounter;
use crate::error::BoxError;

/// Default [`PostgresCounter::table`]: `redfence_fences`.
pub const DEFAULT_FENCE_TABLE: &str = "redfence_fences";
/// Default [`FenceGuards::table`]: `redfence_guards`.
pub const DEFAULT_GUARD_TABLE: &str = "redfence_guards";
/// Default [`FencedUpdate::fence_column`]: `last_fence`.
pub const DEFAULT_FENCE_COLUMN: &str = "last_fence";
/// Set before a multi-resource claim, rolled back to when one of them is stale.
const SAVEPOINT: &str = "SAVEPOINT redfence_claim_guards";
const ROLLBACK_TO_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT redfence_claim_guards";
const RELEASE_SAVEPOINT: &str = "RELEASE SAVEPOINT redfence_claim_guards";

/// Default [`PostgresCounter::timeout`]: 1 s.
pub const DEFAULT_POSTGRES_FENCE_TIMEOUT: Duration = Duration::from_secs(1);

/// How often a token request that hit a serialization failure or a deadlock is retried.
const TRANSIENT_RETRIES: usize = 3;

// ---------------------------------------------------------------------------------------------
// The counter
// ---------------------------------------------------------------------------------------------

/// Durable fencing tokens in a PostgreSQL table: **the recommended counter**.
///
/// One row per resource in a table (default `redfence_fences`, created on first use with
/// `CREATE TABLE IF NOT EXISTS` unless [`create_table(false)`](Self::create_table)):
///
/// ```sql
/// CREATE TABLE IF NOT EXISTS redfence_fences (
///     resource   text   PRIMARY KEY,
///     last_fence bigint NOT NULL CHECK (last_fence >= 0)
/// );
/// ```
///
/// A token is one committed statement, so it survives a crash of the server (through the
/// WAL, with PostgreSQL's default `fsync = on` and `synchronous_commit = on`) and, with
/// synchronous replication, a failover. A lock on one resource takes one round trip:
///
/// ```sql
/// INSERT INTO redfence_fences AS f (resource, last_fence) VALUES ($1, 1)
/// ON CONFLICT (resource) DO UPDATE SET last_fence = f.last_fence + 1
/// RETURNING last_fence
/// ```
///
/// A lock on several resources also takes one round trip once their rows exist (the first
/// lock on a new resource adds one `INSERT … ON CONFLICT DO NOTHING` and repeats it). The
/// rows are locked in sorted order, so concurrent multi-resource requests never deadlock,
/// and all are set to one token greater than the largest of them:
///
/// ```sql
/// WITH locked AS (
///     SELECT resource, last_fence FROM redfence_fences
///     WHERE resource = ANY($1) ORDER BY resource FOR UPDATE
/// ), next AS (
///     SELECT max(last_fence) + 1 AS fence, count(*) AS found FROM locked
/// )
/// UPDATE redfence_fences AS f SET last_fence = next.fence FROM next
/// WHERE f.resource = ANY($1) AND next.found = cardinality($1)
/// RETURNING f.last_fence
/// ```
///
/// Statements are sent unprepared with typed parameters (`query_typed`), so they work
/// through PgBouncer in transaction mode and leave no prepared statement behind. They run in
/// autocommit at the session's isolation level; serialization failures and deadlocks (from
/// a stricter `default_transaction_isolation`) are retried up to three times.
///
/// # Connections: yours or ours
///
/// - [`PostgresCounter::new`] shares a [`Client`] you connected (wrap it in an `Arc` to keep
///   using it yourself; a `Client` pipelines concurrent queries). **Reconnecting is then
///   yours**: once its connection closes, every token request fails, and so every lock
///   (fail closed), until you build a new counter with a new client.
/// - [`PostgresCounter::connect`] (no TLS) and [`PostgresCounter::with_config`] (any TLS)
///   connect on the first request, inside the caller's Tokio runtime, and **reconnect** on
///   the next request after the connection closed.
///
/// Every request, connecting included, is bounded by [`timeout`](Self::timeout); after a
/// request timed out (or was dropped at the lock manager's `fencing_timeout`), a counter
/// that connects itself drops its connection and makes a new one on the
/// next request (a socket to a vanished server may never report itself closed). A request
/// that times out or loses its connection may still have committed: that token is skipped,
/// which is harmless (gaps are allowed, only the order matters).
///
/// ```no_run
/// use redfence::{PostgresCounter, Redlock};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let counter = PostgresCounter::connect("host=10.0.0.5 user=app dbname=app")?;
/// let redlock = Redlock::builder()
///     .nodes(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"])
///     .fencing(counter)
///     .build()?;
/// # drop(redlock);
/// # Ok(())
/// # }
/// ```
pub struct PostgresCounter {
    source: Source,
    table: String,
    sql: CounterSql,
    create_table: bool,
    timeout: Duration,
}

enum Source {
    Shared(Arc<Client>),
    Owned(Connector),
}

type ConnectFn =
    dyn Fn() -> BoxFuture<'static, Result<Client, tokio_postgres::Error>> + Send + Sync;

struct Connector {
    connect: Box<ConnectFn>,
    current: Mutex<Option<Arc<Client>>>,
    target: String,
}

struct CounterSql {
    single: String,
    multi: String,
    insert_missing: String,
    create: String,
}

impl CounterSql {
    fn new(table: &str) -> Self {
        let t = quote_table(table);
        CounterSql {
            single: format!(
                "INSERT INTO {t} AS f (resource, last_fence) VALUES ($1, 1) \
                 ON CONFLICT (resource) DO UPDATE SET last_fence = f.last_fence + 1 \
                 RETURNING last_fence"
            ),
            multi: format!(
                "WITH locked AS (\
                     SELECT resource, last_fence FROM {t} \
                     WHERE resource = ANY($1) ORDER BY resource FOR UPDATE\
                 ), next AS (\
                     SELECT max(last_fence) + 1 AS fence, count(*) AS found FROM locked\
                 ) \
                 UPDATE {t} AS f SET last_fence = next.fence FROM next \
                 WHERE f.resource = ANY($1) AND next.found = cardinality($1) \
                 RETURNING f.last_fence"
            ),
            insert_missing: format!(
                "INSERT INTO {t} (resource, last_fence) \
                 SELECT r, 0 FROM unnest($1::text[]) AS r ORDER BY r \
                 ON CONFLICT (resource) DO NOTHING"
            ),
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                     resource text PRIMARY KEY, \
                     last_fence bigint NOT NULL CHECK (last_fence >= 0)\
                 )"
            ),
        }
    }
}

impl PostgresCounter {
    /// A counter over a client you connected and keep alive (see the type's docs:
    /// reconnecting is then yours). Pass an `Arc<Client>` to share it with your own code.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use redfence::{PostgresCounter, tokio_postgres};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let (client, connection) =
    ///     tokio_postgres::connect("host=localhost user=app dbname=app", tokio_postgres::NoTls)
    ///         .await?;
    /// tokio::spawn(connection); // drives the socket; ends when the connection closes
    /// let client = Arc::new(client);
    /// let counter = PostgresCounter::new(Arc::clone(&client));
    /// # drop(counter);
    /// # Ok(())
    /// # }
    /// # fn main() { let _ = run; }
    /// ```
    pub fn new(client: impl Into<Arc<Client>>) -> Self {
        Self::from_source(Source::Shared(client.into()))
    }

    /// A counter that connects (without TLS) with a `tokio-postgres` connection string,
    /// e.g. `"host=localhost port=5432 user=app dbname=app"` or
    /// `"postgresql://app@localhost/app"`, on the first request, and reconnects after the
    /// connection closed.
    ///
    /// # Errors
    ///
    /// The connection string does not parse. Nothing is connected yet.
    pub fn connect(config: &str) -> Result<Self, tokio_postgres::Error> {
        Ok(Self::with_config(config.parse()?, NoTls))
    }

    /// A counter that connects with `config` and `tls` (e.g. from `postgres-native-tls` or
    /// `tokio-postgres-rustls`) on the first request, and reconnects after the connection
    /// closed. Set `config.connect_timeout` to bound a hung connect below
    /// [`timeout`](Self::timeout) if you like; the timeout bounds it anyway.
    pub fn with_config<T>(config: Config, tls: T) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let target = describe_config(&config);
        let config = Arc::new(config);
        let connect = move || -> BoxFuture<'static, Result<Client, tokio_postgres::Error>> {
            let config = Arc::clone(&config);
            let tls = tls.clone();
            Box::pin(async move {
                let (client, connection) = config.connect(tls).await?;
                tokio::spawn(async move {
                    if let Err(err) = connection.await {
                        tracing::warn!(error = %chain(&err), "fencing counter: PostgreSQL connection ended");
                    }
                });
                Ok(client)
            })
        };
        Self::from_source(Source::Owned(Connector {
            connect: Box::new(connect),
            current: Mutex::new(None),
            target,
        }))
    }

    fn from_source(source: Source) -> Self {
        PostgresCounter {
            source,
            table: DEFAULT_FENCE_TABLE.to_owned(),
            sql: CounterSql::new(DEFAULT_FENCE_TABLE),
            create_table: true,
            timeout: DEFAULT_POSTGRES_FENCE_TIMEOUT,
        }
    }

    /// The counter table, optionally schema-qualified (`"locks.fences"`). Each dot-separated
    /// part is quoted as an identifier: case-sensitive, and safe from SQL injection.
    /// Defaults to `redfence_fences`.
    #[must_use]
    pub fn table(mut self, table: &str) -> Self {
        self.table = table.to_owned();
        self.sql = CounterSql::new(table);
        self
    }

    /// Whether a missing table is created (`CREATE TABLE IF NOT EXISTS`, when a request finds
    /// no table). Turn it off when the application's role may not create tables; create it in
    /// a migration with [`create_table_sql`](Self::create_table_sql). Defaults to `true`.
    #[must_use]
    pub fn create_table(mut self, create: bool) -> Self {
        self.create_table = create;
        self
    }

    /// The longest one token request may take, connecting included; a slower one fails (and
    /// the lock with it: fail closed). Defaults to 1 s. The lock manager also bounds it by
    /// its `fencing_timeout` and the lock's validity.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The `CREATE TABLE IF NOT EXISTS` statement of the counter table, for migrations.
    pub fn create_table_sql(&self) -> &str {
        &self.sql.create
    }

    /// The client to use: the shared one, or the cached connection, (re)connecting if there
    /// is none or it closed.
    async fn client(&self) -> Result<Arc<Client>, CounterError> {
        match &self.source {
            Source::Shared(client) if client.is_closed() => Err(CounterError::new(
                "using the shared client",
                "its connection is closed; build a new PostgresCounter with a new client \
                 (or use PostgresCounter::connect, which reconnects)",
            )),
            Source::Shared(client) => Ok(Arc::clone(client)),
            Source::Owned(connector) => {
                let mut current = connector.current.lock().await;
                if let Some(client) = current.as_ref()
                    && !client.is_closed()
                {
                    return Ok(Arc::clone(client));
                }
                *current = None;
                let client = (connector.connect)().await.map_err(|err| {
                    CounterError::pg(format!("connecting to {}", connector.target), err)
                })?;
                let client = Arc::new(client);
                *current = Some(Arc::clone(&client));
                Ok(client)
            }
        }
    }

    /// Forgets the cached connection if it is `dead`, so that the next request reconnects.
    async fn forget(&self, dead: &Arc<Client>) {
        if let Source::Owned(connector) = &self.source {
            let mut current = connector.current.lock().await;
            if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, dead)) {
                *current = None;
            }
        }
    }

    async fn next(&self, resources: &[String]) -> Result<u64, CounterError> {
        let mut names: Vec<String> = resources.to_vec();
        names.sort_unstable();
        names.dedup();
        if names.is_empty() {
            return Err(CounterError::new(
                "checking the request",
                "no resource given",
            ));
        }
        let mut client = self.client().await?;
        let mut reconnected = false;
        let mut created = false;
        let mut transient = 0;
        loop {
            let error = match self.issue(&client, &names).await {
                Ok(fence) => return Ok(fence),
                Err(error) => error,
            };
            let closed = error.source.as_ref().is_some_and(|e| e.is_closed());
            if closed && !reconnected && matches!(self.source, Source::Owned(_)) {
                // The connection died (e.g. the server restarted): reconnect once. Whatever
                // the lost request did, a skipped token is harmless.
                self.forget(&client).await;
                client = self.client().await?;
                reconnected = true;
                continue;
            }
            match error.source.as_ref().and_then(|e| e.code()) {
                Some(&SqlState::UNDEFINED_TABLE) if self.create_table && !created => {
                    self.create(&client).await?;
                    created = true;
                }
                Some(&SqlState::T_R_SERIALIZATION_FAILURE | &SqlState::T_R_DEADLOCK_DETECTED)
                    if transient < TRANSIENT_RETRIES =>
                {
                    transient += 1;
                }
                _ => return Err(error),
            }
        }
    }

    /// One token request over `client`: one statement, or for several resources whose rows
    /// do not all exist yet, the statement, an insert of the missing rows and the statement.
    async fn issue(&self, client: &Client, names: &[String]) -> Result<u64, CounterError> {
        if let [name] = names {
            let row = client
                .query_typed_one(&self.sql.single, &[(name, Type::TEXT)])
                .await
                .map_err(|err| CounterError::pg(self.step("incrementing", names), err))?;
            return fence_of(&row, names);
        }
        let names_param: &(dyn ToSql + Sync) = &names;
        for attempt in 0..2 {
            let rows = client
                .query_typed(&self.sql.multi, &[(names_param, Type::TEXT_ARRAY)])
                .await
                .map_err(|err| CounterError::pg(self.step("incrementing", names), err))?;
            if let Some(row) = rows.first() {
                return fence_of(row, names);
            }
            if attempt == 0 {
                client
                    .execute_typed(&self.sql.insert_missing, &[(names_param, Type::TEXT_ARRAY)])
                    .await
                    .map_err(|err| {
                        CounterError::pg(self.step("inserting the rows of", names), err)
                    })?;
            }
        }
        Err(CounterError::new(
            self.step("incrementing", names),
            "the rows disappeared between their insert and the increment (deleted concurrently?)",
        ))
    }

    async fn create(&self, client: &Client) -> Result<(), CounterError> {
        match create_if_absent(client, &self.sql.create).await {
            Ok(()) => Ok(()),
            Err(err) => Err(CounterError::pg(
                format!("creating the counter table {}", self.table),
                err,
            )),
        }
    }

    fn step(&self, what: &str, names: &[String]) -> String {
        format!("{what} the counter of {names:?} in table {}", self.table)
    }
}

fn fence_of(row: &tokio_postgres::Row, names: &[String]) -> Result<u64, CounterError> {
    let value: i64 = row
        .try_get(0)
        .map_err(|err| CounterError::pg(format!("reading the token of {names:?}"), err))?;
    match u64::try_from(value) {
        Ok(fence) if fence > 0 => Ok(fence),
        _ => Err(CounterError::new(
            format!("reading the token of {names:?}"),
            format!("the counter returned {value}, not a positive token"),
        )),
    }
}

impl FencingCounter for PostgresCounter {
    fn next_fence<'a>(&'a self, resources: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
        Box::pin(async move {
            // If this request times out or is dropped unfinished (the lock manager's own
            // timeout), the server may be gone for good behind a socket that never reports
            // itself closed (a partition, a failover to another address): reconnect next time.
            let mut reset = ResetOnCancel(Some(self));
            match tokio::time::timeout(self.timeout, self.next(resources)).await {
                Ok(Ok(fence)) => {
                    reset.0 = None;
                    Ok(fence)
                }
                Ok(Err(err)) => {
                    reset.0 = None;
                    Err(err.into())
                }
                Err(_) => {
                    // `reset` stays armed: the connection is dropped when it goes out of scope.
                    Err(CounterError::new(
                        format!("issuing a token for {resources:?}"),
                        format!("no answer within {:?}", self.timeout),
                    )
                    .into())
                }
            }
        })
    }
}

/// Drops the cached connection of a counter that connects itself, when dropped armed.
struct ResetOnCancel<'a>(Option<&'a PostgresCounter>);

impl Drop for ResetOnCancel<'_> {
    fn drop(&mut self) {
        if let Some(PostgresCounter {
            source: Source::Owned(connector),
            ..
        }) = self.0
            // Busy means another request is (re)connecting right now: nothing to drop.
            && let Ok(mut current) = connector.current.try_lock()
        {
            *current = None;
        }
    }
}

impl fmt::Debug for PostgresCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.source {
            Source::Shared(_) => "shared client".to_owned(),
            Source::Owned(connector) => format!("connects to {}", connector.target),
        };
        f.debug_struct("PostgresCounter")
            .field("source", &source)
            .field("table", &self.table)
            .field("create_table", &self.create_table)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Why the PostgreSQL counter could not issue a token; says which step failed.
#[derive(Debug)]
struct CounterError {
    step: String,
    detail: String,
    source: Option<tokio_postgres::Error>,
}

impl CounterError {
    fn new(step: impl Into<String>, detail: impl Into<String>) -> Self {
        CounterError {
            step: step.into(),
            detail: detail.into(),
            source: None,
        }
    }

    fn pg(step: impl Into<String>, err: tokio_postgres::Error) -> Self {
        CounterError {
            step: step.into(),
            detail: chain(&err),
            source: Some(err),
        }
    }
}

impl fmt::Display for CounterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PostgreSQL fencing counter: {}: {}",
            self.step, self.detail
        )
    }
}

impl std::error::Error for CounterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|e| e as _)
    }
}

// ---------------------------------------------------------------------------------------------
// The storage side
// ---------------------------------------------------------------------------------------------

/// A write refused because its fence is not greater than the last one the storage accepted:
/// a newer owner has written since. Treat it as **ownership lost**: stop the work, never
/// retry the same write with the same fence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "stale fence for {resource}: offered {offered}, but {last_accepted} was already accepted (ownership of the lock was lost)"
)]
pub struct StaleFence {
    /// What was guarded: the guard's resource name ([`FenceGuards`]), or
    /// `table(key_column = key)` for a [`FencedUpdate`].
    pub resource: String,
    /// The fence the write carried.
    pub offered: u64,
    /// The last fence the storage accepted, greater than or equal to `offered`.
    pub last_accepted: u64,
}

/// Why a fenced write was not applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FencedWriteError {
    /// The fence is stale: ownership was lost. Roll back and stop; do not retry.
    #[error(transparent)]
    Stale(#[from] StaleFence),

    /// A [`FencedUpdate`] matched no row: there is no row with that key (at the time of
    /// the update). Not an ownership problem.
    #[error("fenced update of {table}: no row with {key_column} = {key}")]
    NotFound {
        /// The table, as given.
        table: String,
        /// The key column, as given.
        key_column: String,
        /// The key, as `Debug` text.
        key: String,
    },

    /// The fence does not fit PostgreSQL's `bigint` (it is above `i64::MAX`): it cannot
    /// have come from a counter that stores `bigint`s.
    #[error("fence {0} does not fit a bigint column (the largest is {max})", max = i64::MAX)]
    FenceOutOfRange(u64),

    /// [`FenceGuards::claim_lock`] was given a lock that carries no fence: the lock
    /// manager has no fencing counter configured.
    #[error("the lock on {0:?} carries no fence: configure a counter with RedlockBuilder::fencing")]
    NoFence(Vec<String>),

    /// [`FenceGuards::claim_all`] was given no resource, which would protect nothing.
    #[error("no resource to claim a guard for")]
    NoResource,

    /// A statement failed: a database error, to handle like any other (e.g. retry the
    /// transaction on a serialization failure).
    #[error("fenced write on {table}: {step}: {detail}")]
    Database {
        /// The table the statement ran on.
        table: String,
        /// Which statement failed.
        step: &'static str,
        /// The error text, with PostgreSQL's message.
        detail: String,
        /// The error.
        #[source]
        source: tokio_postgres::Error,
    },
}

impl FencedWriteError {
    /// Whether the write was refused because a newer owner has written: stop the work.
    pub fn is_ownership_lost(&self) -> bool {
        matches!(self, FencedWriteError::Stale(_))
    }

    /// The stale fence, if that is why the write was refused.
    pub fn stale(&self) -> Option<&StaleFence> {
        match self {
            FencedWriteError::Stale(stale) => Some(stale),
            _ => None,
        }
    }

    fn db(table: &str, step: &'static str, source: tokio_postgres::Error) -> Self {
        FencedWriteError::Database {
            table: table.to_owned(),
            step,
            detail: chain(&source),
            source,
        }
    }
}

/// The single-statement form: one `UPDATE` of one row that carries its own fence column,
/// applied only if the fence is greater than the row's.
///
/// ```sql
/// UPDATE invoices SET status = $3, last_fence = $1
/// WHERE id = $2 AND (last_fence IS NULL OR last_fence < $1)
/// ```
///
/// When no row is updated, a follow-up `SELECT` in the same session tells why: a stale
/// fence ([`FencedWriteError::Stale`]) or no such row ([`FencedWriteError::NotFound`]).
/// The fence column is a `bigint` (`NOT NULL DEFAULT 0` is best; `NULL` counts as "no fence
/// accepted yet"); the key column must be unique. Table and column names are quoted as
/// identifiers (case-sensitive; `schema.table` is split at the dot); values are parameters.
///
/// Run it on a [`Transaction`] to make it part of a larger atomic write, or on a `Client`
/// for a write that is this one statement.
///
/// ```no_run
/// use redfence::fence::postgres::{FencedUpdate, FencedWriteError};
/// # async fn run(
/// #     client: &mut redfence::tokio_postgres::Client,
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
            sets: Vec::new(),
        }
    }

    /// The row's fence column. Defaults to `last_fence`.
    pub fn fence_column(mut self, column: &str) -> Self {
        self.fence_column = column.to_owned();
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
             WHERE {key} = $2 AND ({fence_column} IS NULL OR {fence_column} < $1)",
            table = quote_table(&self.table),
            key = quote_ident(&self.key_column),
        )
    }

    /// Applies the update with `fence` on `client` (a [`Transaction`] or a `Client`);
    /// returns how many rows it changed (1 with a unique key).
    ///
    /// # Errors
    ///
    /// [`FencedWriteError::Stale`] when the row's fence is greater than or equal to `fence`
    /// (nothing was changed: roll back and stop), [`FencedWriteError::NotFound`] when no row
    /// has the key, [`FencedWriteError::FenceOutOfRange`] for a fence above `i64::MAX`, and
    /// [`FencedWriteError::Database`] when a statement fails.
    pub async fn execute<C>(&self, client: &C, fence: u64) -> Result<u64, FencedWriteError>
    where
        C: GenericClient + Sync,
    {
        let fence_param =
            i64::try_from(fence).map_err(|_| FencedWriteError::FenceOutOfRange(fence))?;
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
            Some(last) if last >= fence_param => Err(StaleFence {
                resource: format!("{}({} = {:?})", self.table, self.key_column, self.key),
                offered: fence,
                last_accepted: u64::try_from(last).unwrap_or(0),
            }
            .into()),
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

/// The guard-row form: one row per resource in a guard table that holds the last fence
/// accepted for it, claimed inside the caller's transaction before its mutations.
///
/// [`claim`](Self::claim) locks the guard row and records the new fence in **one
/// statement**, and refuses a fence not greater than the recorded one with
/// [`StaleFence`]:
///
/// ```sql
/// INSERT INTO redfence_guards AS g (resource, last_fence) VALUES ($1, $2)
/// ON CONFLICT (resource) DO UPDATE SET last_fence = EXCLUDED.last_fence
/// WHERE g.last_fence < EXCLUDED.last_fence
/// RETURNING g.resource
/// ```
///
/// This is the classic `SELECT last_fence … FOR UPDATE`, compare, mutate, `UPDATE` guard,
/// `COMMIT`, in one round trip and with nothing for the caller to forget: the row stays
/// locked until the transaction ends, so a concurrent writer waits and then sees the new
/// fence; a rollback undoes the claim with the mutations; and a resource seen for the first
/// time gets its guard row (the classic form locks nothing when the row is missing, so two
/// first writers would both pass). [`claim`](Self::claim) takes a [`Transaction`], so it
/// cannot run in autocommit by mistake.
///
/// ```no_run
/// use redfence::fence::postgres::FenceGuards;
/// # async fn run(
/// #     client: &mut redfence::tokio_postgres::Client,
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
    /// [`PostgresCounter::table`].
    pub fn in_table(table: &str) -> Self {
        let t = quote_table(table);
        FenceGuards {
            table: table.to_owned(),
            claim: format!(
                "INSERT INTO {t} AS g (resource, last_fence) \
                 SELECT r, $2 FROM unnest($1::text[]) AS r ORDER BY r \
                 ON CONFLICT (resource) DO UPDATE SET last_fence = EXCLUDED.last_fence \
                 WHERE g.last_fence < EXCLUDED.last_fence \
                 RETURNING g.resource"
            ),
            last: format!("SELECT resource, last_fence FROM {t} WHERE resource = ANY($1)"),
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                     resource text PRIMARY KEY, \
                     last_fence bigint NOT NULL\
                 )"
            ),
        }
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
    /// refuses a fence not greater than the last one accepted, and records `fence`
    /// (visible to others when `tx` commits, undone if it rolls back). Run the mutations
    /// after it, in `tx`.
    ///
    /// # Errors
    ///
    /// [`FencedWriteError::Stale`] when a fence greater than or equal to `fence` was
    /// accepted (roll back and stop), [`FencedWriteError::FenceOutOfRange`] for a fence
    /// above `i64::MAX`, [`FencedWriteError::Database`] when the statement fails.
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
        lock: &crate::Lock,
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
        let fence_param =
            i64::try_from(fence).map_err(|_| FencedWriteError::FenceOutOfRange(fence))?;
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
        Err(StaleFence {
            resource,
            offered: fence,
            last_accepted: u64::try_from(last).unwrap_or(fence),
        }
        .into())
    }
}

impl fmt::Debug for FenceGuards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FenceGuards")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A quoted identifier: `"name"`, with inner quotes doubled.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A possibly schema-qualified table name, each dot-separated part quoted.
fn quote_table(name: &str) -> String {
    name.split('.')
        .map(quote_ident)
        .collect::<Vec<_>>()
        .join(".")
}

/// The error with its causes, e.g. `db error: ERROR: relation "x" does not exist`.
fn chain(err: &tokio_postgres::Error) -> String {
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
fn describe_config(config: &Config) -> String {
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
async fn create_if_absent<C>(client: &C, sql: &str) -> Result<(), tokio_postgres::Error>
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

    #[test]
    fn fenced_update_sql() {
        let update = FencedUpdate::new("invoices", "id", &7_i64)
            .set("status", &"posted")
            .set_expr("posted_at", "now()")
            .set("amount", &10_i64);
        assert_eq!(
            update.sql(),
            "UPDATE \"invoices\" SET \"status\" = $3, \"posted_at\" = now(), \"amount\" = $4, \
             \"last_fence\" = $1 WHERE \"id\" = $2 AND (\"last_fence\" IS NULL OR \"last_fence\" < $1)"
        );
    }

    #[test]
    fn stale_fence_names_the_resource_and_both_fences() {
        let stale = StaleFence {
            resource: "invoice:1".into(),
            offered: 41,
            last_accepted: 42,
        };
        let text = stale.to_string();
        assert!(text.contains("invoice:1") && text.contains("41") && text.contains("42"));
        assert!(FencedWriteError::from(stale).is_ownership_lost());
    }
}
