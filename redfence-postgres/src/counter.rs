//! [`PostgresCounter`]: durable fencing tokens in a PostgreSQL table, group-committed.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, Config, NoTls, Socket};

use crate::issuer::{Connector, CounterError, PgIssuer, Source};
use crate::sql::CounterSql;
use crate::stripes::{STRIPE_ROW_PREFIX, StripedSql};
use crate::{chain, describe_config};
use redfence::BoxError;
use redfence::FencingCounter;
use redfence::fence::{Batcher, Stripes};

/// Default [`PostgresCounter::table`]: `redfence_fences`.
pub(crate) const DEFAULT_FENCE_TABLE: &str = "redfence_fences";
/// Default [`PostgresCounter::timeout`]: 1 s.
pub(crate) const DEFAULT_POSTGRES_FENCE_TIMEOUT: Duration = Duration::from_secs(1);

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
/// Or, [`striped`](Self::striped), S rows `redfence:stripe:i/S` in the same table, each
/// shared by the resources that map to it: one statement per batch updates at most S rows
/// and issues a range of tokens, whatever the number of resources (the per-resource mode
/// then fails closed on that table).
///
/// A token is a committed statement, so it survives a crash of the server (through the
/// WAL, with PostgreSQL's default `fsync = on` and `synchronous_commit = on`) and, with
/// synchronous replication, a failover.
///
/// # Group commit
///
/// Token requests are **batched**: one background task per counter sends one statement at
/// a time, and requests that arrive while it is in flight go together in the next one (up
/// to 256 per statement). A request that finds nothing in flight goes out at once; nothing
/// waits for a batch to fill. So under load one commit (one WAL flush) issues many tokens,
/// instead of every acquisition queueing behind the others' commits on one connection.
///
/// A batch of single-resource requests is one round trip, new resources included: an upsert
/// that adds to each row the number of requests on it, the `k`-th request on a resource
/// getting `last + k`, in arrival order:
///
/// ```sql
/// WITH req AS (SELECT r, i FROM unnest($1::text[]) WITH ORDINALITY AS u(r, i)),
///      counts AS (SELECT r, count(*) AS n FROM req GROUP BY r),
///      bumped AS (
///          INSERT INTO redfence_fences AS f (resource, last_fence)
///          SELECT r, n FROM counts ORDER BY r
///          ON CONFLICT (resource) DO UPDATE SET last_fence = f.last_fence + EXCLUDED.last_fence
///          RETURNING f.resource, f.last_fence)
/// SELECT req.i, b.last_fence - c.n + row_number() OVER (PARTITION BY req.r ORDER BY req.i)
/// FROM req JOIN counts c ON c.r = req.r JOIN bumped b ON b.resource = req.r ORDER BY req.i
/// ```
///
/// A batch with a multi-resource request is also one round trip once its rows exist (the
/// first lock on a new resource adds one `INSERT … ON CONFLICT DO NOTHING` and repeats it).
/// It locks every row of the batch **in sorted order** (`SELECT … ORDER BY resource FOR
/// UPDATE`, so concurrent counters never deadlock), takes `base`, the largest `last_fence`
/// among them, and gives request `i` (in arrival order) the token `base + i`; each row is
/// set to the token of the last request on it. So a multi-resource token exceeds the last
/// token of every one of its resources, and tokens of one resource increase in arrival
/// order (a resource's tokens may skip numbers; only their order matters).
///
/// Statements are sent unprepared with typed parameters (`query_typed`), so they work
/// through PgBouncer in transaction mode and leave no prepared statement behind; over a
/// direct connection, [`prepare_statements(true)`](Self::prepare_statements) prepares the
/// single-resource ones once per connection (less server CPU per token). Each is one autocommit
/// transaction at the session's isolation level; serialization failures and deadlocks (from
/// a stricter `default_transaction_isolation`) are retried up to three times.
///
/// One connection is enough: measured with 64 concurrent acquisitions on a local
/// PostgreSQL 15 with `fsync` on, a second connection (two counters) gave no more
/// throughput than one, because a batch already carries every waiting request.
///
/// # Failure model
///
/// - A token is durable before any lock carries it: the request is answered only after its
///   batch's transaction committed.
/// - A batch that fails, or takes longer than [`timeout`](Self::timeout), fails **every**
///   request in it, and each of those locks is released (fail closed).
/// - A batch that may have committed (a timeout, a lost connection) only leaves gaps: its
///   tokens are never handed out, and later ones are greater. Never a repeat.
/// - A request whose caller gave up (the lock manager's `fencing_timeout`, a dropped
///   `acquire`) before its batch went out is skipped; one dropped while its batch is in
///   flight does not affect the others in the batch, its token is simply never used.
///
/// # Connections: yours or ours
///
/// - [`PostgresCounter::new`] takes a [`Client`] you connected. Give it a client of its own:
///   its statements run on that client's session, so a transaction you open on a shared
///   client (`BEGIN` through an `Arc<Client>`) would hold the counter's updates, and hand
///   their tokens out before they commit; a `ROLLBACK` would then issue the same tokens
///   again. Session settings apply too (keep `synchronous_commit` on). **Reconnecting is
///   then yours**: once its connection closes, every token request fails, and so every lock
///   (fail closed), until you build a new counter with a new client.
/// - [`PostgresCounter::connect`] (no TLS) and [`PostgresCounter::with_config`] (any TLS)
///   connect on the first request, inside the caller's Tokio runtime, and **reconnect** on
///   the next batch after the connection closed, or after a batch timed out (a socket to a
///   vanished server may never report itself closed).
///
/// Every request, waiting in the queue and connecting included, is bounded by
/// [`timeout`](Self::timeout), and so is every batch. The background task is started on the
/// first request, in the caller's Tokio runtime, and ends when the counter is dropped.
///
/// Resource names must not contain NUL (`'\0'`): PostgreSQL `text` cannot hold it, so
/// the lock manager refuses such a name before any traffic
/// ([`InvalidInput::ResourceNotFenceable`](redfence::InvalidInput::ResourceNotFenceable)).
///
/// ```no_run
/// use redfence::Redlock;
/// use redfence_postgres::PostgresCounter;
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
    batcher: Batcher<PgIssuer>,
    timeout: Duration,
}

impl PostgresCounter {
    /// A counter over a client you connected and keep alive (see the type's docs:
    /// reconnecting is then yours). Pass an `Arc<Client>` to share it with your own code.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use redfence_postgres::{PostgresCounter, tokio_postgres};
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
        let issuer = PgIssuer {
            source: Arc::new(source),
            table: DEFAULT_FENCE_TABLE.to_owned(),
            sql: CounterSql::new(DEFAULT_FENCE_TABLE),
            striped: None,
            create_table: true,
            prepare: false,
            prepared: Arc::default(),
        };
        Self::with_issuer(issuer, DEFAULT_POSTGRES_FENCE_TIMEOUT)
    }

    fn with_issuer(issuer: PgIssuer, timeout: Duration) -> Self {
        PostgresCounter {
            batcher: Batcher::new(issuer, "PostgreSQL fencing counter", timeout),
            timeout,
        }
    }

    /// The same counter with its configuration changed by `change` (a new batch queue; the
    /// connection is kept).
    fn reconfigured(self, change: impl FnOnce(&mut PgIssuer)) -> Self {
        let mut issuer = self.batcher.issuer().clone();
        change(&mut issuer);
        // Statements are prepared for the table in use.
        issuer.prepared = Arc::default();
        Self::with_issuer(issuer, self.timeout)
    }

    /// The counter table, optionally schema-qualified (`"locks.fences"`). Each dot-separated
    /// part is quoted as an identifier: case-sensitive, and safe from SQL injection.
    /// Defaults to `redfence_fences`.
    #[must_use]
    pub fn table(self, table: &str) -> Self {
        self.reconfigured(|issuer| {
            issuer.table = table.to_owned();
            issuer.sql = CounterSql::new(table);
            if let Some(striped) = &mut issuer.striped {
                *striped = Arc::new(StripedSql::new(table, striped.stripes));
            }
        })
    }

    /// Issues tokens from `stripes` rows of the table instead of one row per resource: a
    /// resource's tokens come from the row of stripe [`Stripes::of`]`(resource)`, and one
    /// statement issues the tokens of a whole batch, a **range**, updating at most
    /// `stripes` rows whatever the number of resources, and adds no row per new resource.
    /// Measured on the project's 2-core machine (PostgreSQL 15, fsync on, 64 concurrent
    /// acquisitions) it did not raise throughput measurably: there the commit's latency, not
    /// the rows' work, bounds a fenced acquisition (see BENCHMARKS.md). Tokens still increase for
    /// each resource; they grow faster, shared by the resources of a stripe. Off by default
    /// (one row per resource).
    ///
    /// Each batch locks its stripe rows in sorted order (`SELECT … ORDER BY resource FOR
    /// UPDATE`), takes `base`, the largest of them, gives its `i`-th request `base + i`,
    /// and sets every one of them to `base + n`, the batch's last token (one
    /// `UPDATE … SET last_fence = base + n`). So a lock over resources on
    /// several stripes gets a token above the last of every one of them, and raises each
    /// of them to it; and a resource's next holder, who asks for a token only after the
    /// previous holder's was committed (a token that arrives after the lock's validity is
    /// never used), gets a greater one. The argument in full: [`Stripes`].
    ///
    /// # Moving a table to stripes
    ///
    /// The stripes are rows `redfence:stripe:i/S` of the same table. The first striped
    /// request on a table makes them, in one transaction under an `ACCESS EXCLUSIVE` lock
    /// of the table: each starts at the table's largest `last_fence` (no resource fenced
    /// before goes back), and the constraint `redfence_striped_S`, `CHECK (resource LIKE
    /// 'redfence:stripe:%/S') NOT VALID`, is added. From then on **every per-resource write
    /// to the table fails**: a client of the per-resource mode (of this version or an older
    /// one) fails closed, each of its locks with `Error::Fencing`, instead of issuing tokens
    /// unrelated to the stripes; so does a client configured with another stripe count. (A
    /// resource whose name starts with `redfence:stripe:` would pass the constraint as a
    /// stripe's row: this version's per-resource counter refuses such names before any
    /// traffic, `InvalidInput::ResourceNotFenceable`; an older client does not.) So
    /// the two modes never mix on one table, but switching is all at once: move every client
    /// of the table to the same `striped(…)` in one deploy (the old ones fail closed until
    /// then). Adding the constraint needs the table's owner: if the counter's role is not,
    /// run [`striped_migration_sql`](Self::striped_migration_sql) as the owner beforehand.
    /// Going back means dropping the constraint, with every client stopped, and letting each
    /// resource's row start above the stripes (`UPDATE … SET last_fence = (SELECT max(…))`).
    #[must_use]
    pub fn striped(self, stripes: Stripes) -> Self {
        self.reconfigured(|issuer| {
            issuer.striped = Some(Arc::new(StripedSql::new(&issuer.table, stripes)));
        })
    }

    /// The stripes, if the counter is [`striped`](Self::striped).
    pub fn stripes(&self) -> Option<Stripes> {
        self.batcher.issuer().striped.as_ref().map(|s| s.stripes)
    }

    /// The SQL that moves the table to the counter's stripes (a `DO` block, repeatable),
    /// for a migration run by the table's owner; `None` if the counter is not striped.
    pub fn striped_migration_sql(&self) -> Option<&str> {
        self.batcher
            .issuer()
            .striped
            .as_ref()
            .map(|s| s.migrate.as_str())
    }

    /// Whether a missing table is created (`CREATE TABLE IF NOT EXISTS`, when a request finds
    /// no table). Turn it off when the application's role may not create tables; create it in
    /// a migration with [`create_table_sql`](Self::create_table_sql). Defaults to `true`.
    #[must_use]
    pub fn create_table(self, create: bool) -> Self {
        self.reconfigured(|issuer| issuer.create_table = create)
    }

    /// Whether the single-resource statements are prepared once per connection (parsed and
    /// planned once, not per batch). Defaults to `false`: each statement is sent unprepared
    /// with typed parameters, which is right behind any pooler.
    ///
    /// Turn it on only over a direct connection to PostgreSQL, or a pooler in session mode:
    /// measured on a local PostgreSQL 15, it takes a quarter off the server's CPU per token
    /// and brings a sequential token within one commit round trip. Behind a pooler in
    /// transaction mode (PgBouncer before 1.21, or with `max_prepared_statements = 0`) a
    /// statement is named only by its number within this process, so the pooler may run it on
    /// a server connection where another client's statement has the same name: that can fail,
    /// or return that statement's number as a token, which fencing cannot survive.
    #[must_use]
    pub fn prepare_statements(self, prepare: bool) -> Self {
        self.reconfigured(|issuer| issuer.prepare = prepare)
    }

    /// The longest one token request may take, waiting for its batch and connecting
    /// included; a slower one fails (and the lock with it: fail closed). Also bounds each
    /// batch: a batch slower than this fails every request in it, and the next batch
    /// reconnects. Defaults to 1 s. The lock manager also bounds each request by its
    /// `fencing_timeout` and the lock's validity.
    #[must_use]
    pub fn timeout(self, timeout: Duration) -> Self {
        let issuer = self.batcher.issuer().clone();
        Self::with_issuer(issuer, timeout)
    }

    /// The `CREATE TABLE IF NOT EXISTS` statement of the counter table, for migrations.
    pub fn create_table_sql(&self) -> &str {
        &self.batcher.issuer().sql.create
    }
}

impl FencingCounter for PostgresCounter {
    fn next_fence<'a>(&'a self, resources: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
        Box::pin(async move {
            let mut names: Vec<String> = resources.to_vec();
            names.sort_unstable();
            names.dedup();
            if names.is_empty() {
                return Err(CounterError::new("checking the request", "no resource given").into());
            }
            // A name PostgreSQL refuses would fail the whole batch it joins: refuse it alone.
            for name in &names {
                if let Err(reason) = self.check_resource(name) {
                    return Err(CounterError::new(format!("checking {name:?}"), reason).into());
                }
            }
            match tokio::time::timeout(self.timeout, self.batcher.request(names)).await {
                Ok(result) => result,
                Err(_) => Err(CounterError::new(
                    format!("issuing a token for {resources:?}"),
                    format!("no answer within {:?}", self.timeout),
                )
                .into()),
            }
        })
    }

    /// PostgreSQL `text` cannot hold NUL: a name containing `'\0'` could never be fenced.
    fn check_resource(&self, resource: &str) -> Result<(), String> {
        if resource.contains('\0') {
            return Err(
                "it contains a NUL character, which PostgreSQL text cannot hold, so the \
                 PostgreSQL fencing counter cannot store its counter"
                    .to_owned(),
            );
        }
        // Per resource, its row would be a stripe's, which the striped table's constraint
        // lets through: two sequences for one resource once the table is striped.
        if self.stripes().is_none() && resource.starts_with(STRIPE_ROW_PREFIX) {
            return Err(format!(
                "names starting with {STRIPE_ROW_PREFIX:?} are the PostgreSQL fencing \
                 counter's stripe rows: a per-resource counter cannot fence them"
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for PostgresCounter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let issuer = self.batcher.issuer();
        let source = match &*issuer.source {
            Source::Shared(_) => "shared client".to_owned(),
            Source::Owned(connector) => format!("connects to {}", connector.target),
        };
        f.debug_struct("PostgresCounter")
            .field("source", &source)
            .field("table", &issuer.table)
            .field("stripes", &self.stripes().map(Stripes::count))
            .field("create_table", &issuer.create_table)
            .field("timeout", &self.timeout)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_nul_cannot_be_fenced() -> Result<(), tokio_postgres::Error> {
        let counter = PostgresCounter::connect("host=127.0.0.1 user=app")?;
        assert_eq!(counter.check_resource("invoice:4821"), Ok(()));
        let reason = counter.check_resource("a\0b").expect_err("NUL");
        assert!(
            reason.contains("NUL") && reason.contains("PostgreSQL"),
            "{reason}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_name_with_nul_is_refused_before_it_joins_a_batch()
    -> Result<(), tokio_postgres::Error> {
        // Nothing listens there: had the request been queued, it would fail to connect.
        let counter = PostgresCounter::connect("host=127.0.0.1 port=1 user=app")?;
        let err = counter
            .next_fence(&["ok".to_owned(), "a\0b".to_owned()])
            .await
            .expect_err("NUL");
        assert!(err.to_string().contains("NUL"), "{err}");
        Ok(())
    }
}
