//! How [`PostgresCounter`](crate::PostgresCounter) issues a batch of tokens: its connection
//! (shared or its own, reconnecting), the batch statements, and the retries.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, SimpleQueryMessage, Statement};

pub(crate) use crate::counter_error::CounterError;
use crate::counter_error::{positive, token};
use crate::create_if_absent;
use crate::sql::CounterSql;
use crate::stripes::{StripedSql, refused_by_stripes};
use redfence::BoxError;
use redfence::fence::IssueBatch;

/// How often a batch that hit a serialization failure or a deadlock is retried.
const TRANSIENT_RETRIES: usize = 3;

/// Where the connection comes from.
pub(crate) enum Source {
    /// The caller's client: reconnecting is theirs.
    Shared(Arc<Client>),
    /// Our own connection, made on first use and again after it closed.
    Owned(Connector),
}

pub(crate) type ConnectFn =
    dyn Fn() -> BoxFuture<'static, Result<Client, tokio_postgres::Error>> + Send + Sync;

pub(crate) struct Connector {
    pub(crate) connect: Box<ConnectFn>,
    pub(crate) current: Mutex<Option<Arc<Client>>>,
    /// Host, port and database, without credentials, for messages.
    pub(crate) target: String,
}

/// The counter's configuration, owned by its batch task. Cheap to clone: the connection is
/// shared.
#[derive(Clone)]
pub(crate) struct PgIssuer {
    pub(crate) source: Arc<Source>,
    pub(crate) table: String,
    pub(crate) sql: CounterSql,
    /// The stripes, if striped (see `PostgresCounter::striped`).
    pub(crate) striped: Option<Arc<StripedSql>>,
    pub(crate) create_table: bool,
    /// Whether the hot statements are prepared (see `PostgresCounter::prepare_statements`).
    pub(crate) prepare: bool,
    /// The hot statements, prepared on the connection in use.
    pub(crate) prepared: Arc<Mutex<Option<Arc<Prepared>>>>,
}

/// Statements parsed and planned once on one connection, instead of once per batch.
pub(crate) struct Prepared {
    client: Arc<Client>,
    single: Statement,
    distinct: Statement,
}

impl IssueBatch for PgIssuer {
    fn issue<'a>(
        &'a self,
        requests: &'a [&'a [String]],
    ) -> BoxFuture<'a, Result<Vec<u64>, BoxError>> {
        Box::pin(async move { Ok(self.issue_batch(requests).await?) })
    }

    fn reset(&self) {
        // Statements belong to the connection that goes.
        self.forget_prepared();
        // A socket to a vanished server may never report itself closed: start afresh.
        if let Source::Owned(connector) = &*self.source
            && let Ok(mut current) = connector.current.lock()
        {
            *current = None;
        }
    }
}

impl PgIssuer {
    /// The client to use: the shared one, or the cached connection, (re)connecting if there
    /// is none or it closed.
    async fn client(&self) -> Result<Arc<Client>, CounterError> {
        let connector = match &*self.source {
            Source::Shared(client) if client.is_closed() => {
                return Err(CounterError::new(
                    "using the shared client",
                    "its connection is closed; build a new PostgresCounter with a new client \
                     (or use PostgresCounter::connect, which reconnects)",
                ));
            }
            Source::Shared(client) => return Ok(Arc::clone(client)),
            Source::Owned(connector) => connector,
        };
        if let Some(client) = cached(connector)?
            && !client.is_closed()
        {
            return Ok(client);
        }
        // Only the batch task connects, so there is no race to make two connections.
        let client = (connector.connect)()
            .await
            .map_err(|err| CounterError::pg(format!("connecting to {}", connector.target), err))?;
        durable_commits(&client, &connector.target).await?;
        let client = Arc::new(client);
        let mut current = connector
            .current
            .lock()
            .map_err(|_| CounterError::new("connecting", "the connection's mutex is poisoned"))?;
        *current = Some(Arc::clone(&client));
        Ok(client)
    }

    /// One batch, with the retries: once on a new connection if ours closed, once after
    /// creating a missing table, and up to [`TRANSIENT_RETRIES`] times on a serialization
    /// failure or deadlock. A batch that failed may still have committed: retrying only
    /// skips those tokens.
    async fn issue_batch(&self, requests: &[&[String]]) -> Result<Vec<u64>, CounterError> {
        if requests.iter().any(|names| names.is_empty()) {
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
            let error = match self.issue_on(&client, requests).await {
                Ok(tokens) => return Ok(tokens),
                Err(error) => error,
            };
            // Prepare afresh after any failure (a table dropped and made again, a pooler
            // that lost the statements).
            self.forget_prepared();
            let closed = error.source.as_ref().is_some_and(|e| e.is_closed());
            if closed && !reconnected && matches!(*self.source, Source::Owned(_)) {
                // The connection died (e.g. the server restarted): reconnect once.
                self.reset();
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
                Some(&SqlState::INVALID_SQL_STATEMENT_NAME | &SqlState::DUPLICATE_PSTATEMENT)
                    if self.prepare =>
                {
                    return Err(error.hint(
                        "prepared statements need one server session per connection (a pooler \
                         in transaction mode mixes them): use \
                         PostgresCounter::prepare_statements(false), the default",
                    ));
                }
                Some(&SqlState::CHECK_VIOLATION) => {
                    let hint = error.source.as_ref().and_then(refused_by_stripes);
                    return Err(match hint {
                        Some(hint) => error.hint(&hint),
                        None => error,
                    });
                }
                _ => return Err(error),
            }
        }
    }

    /// Drops the prepared statements: the next batch that needs them prepares them again.
    fn forget_prepared(&self) {
        if let Ok(mut cache) = self.prepared.lock() {
            *cache = None;
        }
    }

    /// The hot statements on `client`, prepared on first use of that connection.
    async fn prepared(&self, client: &Arc<Client>) -> Result<Arc<Prepared>, tokio_postgres::Error> {
        if let Ok(cache) = self.prepared.lock()
            && let Some(prepared) = cache.as_ref()
            && Arc::ptr_eq(&prepared.client, client)
        {
            return Ok(Arc::clone(prepared));
        }
        let single = client
            .prepare_typed(&self.sql.single, &[Type::TEXT])
            .await?;
        let distinct = client
            .prepare_typed(&self.sql.distinct, &[Type::TEXT_ARRAY])
            .await?;
        let prepared = Arc::new(Prepared {
            client: Arc::clone(client),
            single,
            distinct,
        });
        if let Ok(mut cache) = self.prepared.lock() {
            *cache = Some(Arc::clone(&prepared));
        }
        Ok(prepared)
    }

    async fn issue_on(
        &self,
        client: &Arc<Client>,
        requests: &[&[String]],
    ) -> Result<Vec<u64>, CounterError> {
        if let Some(striped) = &self.striped {
            return striped
                .issue(client, requests, |what| self.step(what, requests))
                .await;
        }
        if requests.iter().all(|names| names.len() == 1) {
            self.singles(client, requests).await
        } else {
            self.mixed(client, requests).await
        }
    }

    /// Only single-resource requests: one upsert, which also creates new rows. The simplest
    /// statement that fits: one request, distinct resources, or any.
    async fn singles(
        &self,
        client: &Arc<Client>,
        requests: &[&[String]],
    ) -> Result<Vec<u64>, CounterError> {
        let names: Vec<&str> = requests
            .iter()
            .filter_map(|names| names.first().map(String::as_str))
            .collect();
        let distinct: BTreeSet<&str> = names.iter().copied().collect();
        // Only the single and distinct statements are prepared (the others are rarer).
        let prepared = if self.prepare && distinct.len() == names.len() {
            let prepared = self
                .prepared(client)
                .await
                .map_err(|err| CounterError::pg(self.step("preparing", requests), err))?;
            Some(prepared)
        } else {
            None
        };
        if let [name] = names[..] {
            let row = match &prepared {
                Some(prepared) => client.query_one(&prepared.single, &[&name]).await,
                None => {
                    client
                        .query_typed_one(&self.sql.single, &[(&name, Type::TEXT)])
                        .await
                }
            }
            .map_err(|err| CounterError::pg(self.step("incrementing", requests), err))?;
            return Ok(vec![token(&row, 0, &self.step("reading", requests))?]);
        }
        if distinct.len() == names.len() {
            return self
                .distinct(client, prepared.as_deref(), requests, &names)
                .await;
        }
        let rows = client
            .query_typed(&self.sql.singles, &[(&names, Type::TEXT_ARRAY)])
            .await
            .map_err(|err| CounterError::pg(self.step("incrementing", requests), err))?;
        let mut tokens = vec![0; requests.len()];
        for row in &rows {
            let ordinal: i64 = row
                .try_get(0)
                .map_err(|err| CounterError::pg(self.step("reading", requests), err))?;
            let slot = usize::try_from(ordinal)
                .ok()
                .and_then(|i| i.checked_sub(1))
                .and_then(|i| tokens.get_mut(i))
                .ok_or_else(|| {
                    CounterError::new(self.step("reading", requests), "an unknown request")
                })?;
            *slot = token(row, 1, &self.step("reading", requests))?;
        }
        if tokens.contains(&0) {
            return Err(CounterError::new(
                self.step("reading", requests),
                "a request got no token (a row deleted concurrently?)",
            ));
        }
        Ok(tokens)
    }

    /// Single-resource requests on distinct resources: each row is incremented once.
    async fn distinct(
        &self,
        client: &Client,
        prepared: Option<&Prepared>,
        requests: &[&[String]],
        names: &[&str],
    ) -> Result<Vec<u64>, CounterError> {
        let rows = match prepared {
            Some(prepared) => client.query(&prepared.distinct, &[&names]).await,
            None => {
                client
                    .query_typed(&self.sql.distinct, &[(&names, Type::TEXT_ARRAY)])
                    .await
            }
        }
        .map_err(|err| CounterError::pg(self.step("incrementing", requests), err))?;
        let mut tokens: HashMap<String, u64> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let resource: String = row
                .try_get(0)
                .map_err(|err| CounterError::pg(self.step("reading", requests), err))?;
            tokens.insert(resource, token(row, 1, &self.step("reading", requests))?);
        }
        names
            .iter()
            .map(|name| {
                tokens.get(*name).copied().ok_or_else(|| {
                    CounterError::new(
                        self.step("reading", requests),
                        format!("no token for {name:?} (a row deleted concurrently?)"),
                    )
                })
            })
            .collect()
    }

    /// A batch with a multi-resource request: the rows are locked in sorted order and every
    /// request gets `base + its index`, `base` being the largest of them. Rows that do not
    /// exist yet are inserted first (one more round trip), and the statement repeated.
    async fn mixed(
        &self,
        client: &Client,
        requests: &[&[String]],
    ) -> Result<Vec<u64>, CounterError> {
        let distinct: Vec<&str> = requests
            .iter()
            .flat_map(|names| names.iter().map(String::as_str))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut flat: Vec<&str> = Vec::new();
        let mut index: Vec<i64> = Vec::new();
        for (i, names) in (1_i64..).zip(requests) {
            for name in names.iter() {
                flat.push(name);
                index.push(i);
            }
        }
        for attempt in 0..2 {
            let row = client
                .query_typed_one(
                    &self.sql.mixed,
                    &[
                        (&distinct, Type::TEXT_ARRAY),
                        (&flat, Type::TEXT_ARRAY),
                        (&index, Type::INT8_ARRAY),
                    ],
                )
                .await
                .map_err(|err| CounterError::pg(self.step("incrementing", requests), err))?;
            let found: bool = row
                .try_get(1)
                .map_err(|err| CounterError::pg(self.step("reading", requests), err))?;
            if found {
                let base: i64 = row
                    .try_get(0)
                    .map_err(|err| CounterError::pg(self.step("reading", requests), err))?;
                return (1_i64..=requests.len() as i64)
                    .map(|i| positive(base.checked_add(i), &self.step("reading", requests)))
                    .collect();
            }
            if attempt == 0 {
                client
                    .execute_typed(&self.sql.insert_missing, &[(&distinct, Type::TEXT_ARRAY)])
                    .await
                    .map_err(|err| {
                        CounterError::pg(self.step("inserting the rows of", requests), err)
                    })?;
            }
        }
        Err(CounterError::new(
            self.step("incrementing", requests),
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

    fn step(&self, what: &str, requests: &[&[String]]) -> String {
        match requests {
            [names] => format!("{what} the counter of {names:?} in table {}", self.table),
            _ => format!(
                "{what} the counters of a batch of {} requests in table {}",
                requests.len(),
                self.table
            ),
        }
    }
}

fn cached(connector: &Connector) -> Result<Option<Arc<Client>>, CounterError> {
    let current = connector
        .current
        .lock()
        .map_err(|_| CounterError::new("connecting", "the connection's mutex is poisoned"))?;
    Ok(current.clone())
}

/// Refuses a session whose commits are acknowledged before they are durable
/// (`synchronous_commit = off`, for the role, the database or in the connection's options):
/// a crash could lose tokens already handed out, and hand them out again. A durable setting is
/// then pinned to the session (`SET`), so that a configuration reload turning it off for the
/// server (`ALTER SYSTEM`, `pg_reload_conf()`) does not reach the counter's connection.
async fn durable_commits(client: &Client, target: &str) -> Result<(), CounterError> {
    // The simple protocol: no named statement, which a pooler could lose or mix up.
    let messages = client
        .simple_query("SHOW synchronous_commit")
        .await
        .map_err(|err| CounterError::pg(format!("checking {target}"), err))?;
    let setting = messages.iter().find_map(|message| match message {
        SimpleQueryMessage::Row(row) => row.get(0),
        _ => None,
    });
    if setting == Some("off") {
        return Err(CounterError::new(
            format!("checking {target}"),
            "synchronous_commit is off for this session: a commit would be acknowledged \
             before it is durable, and a crash could hand the same tokens out again; turn it \
             on for the counter's role or database (or in its connection options)",
        ));
    }
    // The setting as read (never weakened: `remote_apply` stays), or `on` when the server
    // named none; only the values PostgreSQL knows go into the statement.
    let pinned = setting
        .filter(|value| matches!(*value, "on" | "local" | "remote_write" | "remote_apply"))
        .unwrap_or("on");
    client
        .simple_query(&format!("SET synchronous_commit TO {pinned}"))
        .await
        .map_err(|err| CounterError::pg(format!("pinning synchronous_commit on {target}"), err))?;
    Ok(())
}
