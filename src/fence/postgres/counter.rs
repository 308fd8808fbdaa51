//! [`PostgresCounter`]: durable fencing tokens in a PostgreSQL table.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::Mutex;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, NoTls, Socket};

use super::{chain, create_if_absent, describe_config, quote_table};
use crate::error::BoxError;
use crate::fence::FencingCounter;

/// Default [`PostgresCounter::table`]: `redfence_fences`.
pub const DEFAULT_FENCE_TABLE: &str = "redfence_fences";
/// Default [`FenceGuards::table`]: `redfence_guards`.
/// Default [`PostgresCounter::timeout`]: 1 s.
pub const DEFAULT_POSTGRES_FENCE_TIMEOUT: Duration = Duration::from_secs(1);

/// How often a token request that hit a serialization failure or a deadlock is retried.
const TRANSIENT_RETRIES: usize = 3;

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
