//! A Sentinel-managed master as one voter: the node's queue ([`Queue`]) sends its batches to
//! the current master, resolved through the sentinels, and resolved again after a failure of
//! its connection (a failover demotes it: `READONLY`; it refuses writes: `NOREPLICAS`) or
//! once calls have gone unanswered for [`PATIENCE`].

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, RedisError, RedisFuture, Value};
use tokio::sync::Mutex;
use tokio::time::{Instant, Sleep};

use super::batch::{Link, PATIENCE, Replies, Run, Touch, evalsha, write_script};
use super::queue::Queue;
use super::{Advice, Advisory, Node, NodeCall, Request, advice, advisory, cached};
use crate::error::NodeFailure;

/// The master named `master` in a Sentinel group, voting once.
pub(crate) struct SentinelNode {
    addr: String,
    shared: Arc<Shared>,
    queue: Queue,
}

/// The master's connection, and the address the sentinels named it at.
#[derive(Clone)]
struct Master {
    addr: Arc<str>,
    conn: MultiplexedConnection,
}

impl ConnectionLike for Master {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.conn.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

struct Shared {
    /// One client per sentinel, asked all at once: redis-rs's client over several sentinels
    /// takes their answers in the order given, so a hung first sentinel (it accepts
    /// connections and never answers) costs its connect and response timeouts (1 s and
    /// 0.5 s) before the next one counts, and that takes the whole of a short connect bound.
    clients: Arc<[Arc<Mutex<SentinelClient>>]>,
    conn: cached::Cached<Master>,
    /// How the master connection is made: `connect_timeout` bounds connecting.
    config: AsyncConnectionConfig,
}

impl SentinelNode {
    /// A voter over the master `master` that the sentinels at `sentinels` watch; `addr`
    /// names it in messages; a call in flight waits `node_timeout` for the master. Nothing is
    /// connected yet.
    pub(crate) fn new(
        sentinels: Vec<redis::ConnectionInfo>,
        master: String,
        addr: String,
        node_timeout: Duration,
    ) -> Result<Self, RedisError> {
        let connect_timeout = super::redis::connect_timeout(node_timeout);
        if sentinels.is_empty() {
            return Err(no_sentinel());
        }
        let clients = sentinels
            .into_iter()
            .map(|sentinel| {
                let client = SentinelClient::build(
                    vec![sentinel],
                    master.clone(),
                    None,
                    SentinelServerType::Master,
                )?;
                Ok(Arc::new(Mutex::new(client)))
            })
            .collect::<Result<_, RedisError>>()?;
        let shared = Arc::new(Shared {
            clients,
            conn: cached::Cached::new(connect_timeout),
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect_timeout))
                // Every call is bounded by node_timeout; a response timeout would only race it.
                .set_response_timeout(None),
        });
        let link_shared = Arc::clone(&shared);
        let queue = Queue::new(&addr, node_timeout, move || SentinelLink {
            shared: Arc::clone(&link_shared),
            script: Cmd::new(),
            stalled_since: None,
            generation: 0,
        });
        Ok(SentinelNode {
            addr,
            shared,
            queue,
        })
    }
}

impl Shared {
    /// Asks the sentinels again, in the background, and puts a connection to the master they
    /// name in place of the connection of `generation`, `current` (see
    /// [`Cached::renew`](cached::Cached::renew)) if that master is another server; when they
    /// still name the same one, the connection is kept (a new one could run a call before
    /// those still waiting in the old one).
    fn renew(&self, generation: u64, current: Arc<str>) {
        let (clients, config) = (Arc::clone(&self.clients), self.config.clone());
        self.conn.renew(generation, move || async move {
            let master = first_master(clients, config, Some(current)).await?;
            Ok(master)
        });
    }
}

impl advisory::Connector for Shared {
    type Conn = Master;

    /// The cached master connection, or a new one through the sentinels (asking them,
    /// checking the master's `ROLE`, connecting), made in a task of its own.
    async fn connection(&self) -> Result<(u64, Master), RedisError> {
        let (clients, config) = (Arc::clone(&self.clients), self.config.clone());
        self.conn
            .get_or_make(move || first_master(clients, config, None))
            .await
    }

    /// Forgets the master after a failure that may mean it is no longer the master (its
    /// connection broke, it was demoted, it refuses writes), so that the next call asks the
    /// sentinels again.
    async fn forget_after(&self, err: &RedisError, generation: u64) {
        if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_unrecoverable_error()
            || matches!(
                err.code(),
                Some("READONLY" | "MASTERDOWN" | "LOADING" | "NOAUTH" | "WRONGPASS" | "NOREPLICAS")
            )
        {
            self.conn.forget(generation).await;
        }
    }
}

/// A Sentinel voter's link: the batch as one `EVALSHA` on the master's connection.
///
/// A master that hangs is kept: its connection carries the calls made before, and a call
/// sent now goes behind them, so when it resumes a release runs after its acquire. Only once
/// calls have gone unanswered for [`PATIENCE`] are the sentinels asked again (they may have
/// promoted a replica by then); the connection is replaced only if they name another server.
struct SentinelLink {
    shared: Arc<Shared>,
    /// The call being sent, kept for the next batch's (its allocation reused).
    script: Cmd,
    /// Since when calls on the connection of `generation` have gone unanswered.
    stalled_since: Option<Instant>,
    generation: u64,
}

impl Link for SentinelLink {
    async fn send<'a>(
        &'a mut self,
        runs: &'a [Run],
        timeout: Duration,
        deadline: Pin<&'a mut Sleep>,
    ) -> Result<Replies, NodeFailure> {
        use advisory::Connector as _;
        write_script(runs.iter(), Touch::WithHelpers, &mut self.script);
        let at = deadline.deadline();
        let (generation, mut master) =
            match tokio::time::timeout_at(at, self.shared.connection()).await {
                Ok(made) => made?,
                Err(_) => return Err(NodeFailure::Timeout(timeout)),
            };
        if generation != self.generation {
            self.generation = generation;
            self.stalled_since = None;
        }
        match tokio::time::timeout_at(at, evalsha(&self.script, &mut master)).await {
            Ok(Ok(replies)) => {
                self.stalled_since = None;
                Ok(Replies::All(replies))
            }
            Ok(Err(err)) => {
                self.stalled_since = None;
                self.shared.forget_after(&err, generation).await;
                Err(err.into())
            }
            Err(_) => {
                let now = Instant::now();
                let since = *self.stalled_since.get_or_insert(now);
                if now.duration_since(since) >= PATIENCE {
                    tracing::debug!(
                        "the master has not answered for the patience window; asking the sentinels again"
                    );
                    self.shared.renew(generation, master.addr);
                }
                Err(NodeFailure::Timeout(timeout))
            }
        }
    }
}

/// Asks every sentinel at once (one client each) for the master and connects to it: the
/// first sentinel whose master answers as a master wins, and the others are dropped (a hung
/// one included). When all fail, an error about a master a sentinel named (a refused login,
/// a master that is not one) is kept over a sentinel that does not know the name. A master at
/// `not_at` (the one connected already) is an error: no new connection is made to it.
async fn first_master(
    clients: Arc<[Arc<Mutex<SentinelClient>>]>,
    config: AsyncConnectionConfig,
    not_at: Option<Arc<str>>,
) -> Result<Master, RedisError> {
    let mut asked: FuturesUnordered<_> = clients
        .iter()
        .cloned()
        .map(|client| {
            let (config, not_at) = (config.clone(), not_at.clone());
            async move {
                let client = client.lock().await.async_get_client().await?;
                let addr: Arc<str> = client.get_connection_info().addr().to_string().into();
                if not_at.as_deref() == Some(&*addr) {
                    return Err(RedisError::from((
                        redis::ErrorKind::Io,
                        "the sentinels still name the master connected to",
                    )));
                }
                let conn = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                Ok(Master { addr, conn })
            }
        })
        .collect();
    let unnamed = |e: &RedisError| e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel;
    let mut failure: Option<RedisError> = None;
    while let Some(answer) = asked.next().await {
        match answer {
            Ok(conn) => return Ok(conn),
            Err(err)
                if failure
                    .as_ref()
                    .is_none_or(|kept| unnamed(kept) && !unnamed(&err)) =>
            {
                failure = Some(err);
            }
            Err(_) => {}
        }
    }
    Err(failure.unwrap_or_else(no_sentinel))
}

fn no_sentinel() -> RedisError {
    RedisError::from((
        redis::ErrorKind::EmptySentinelList,
        "a sentinel voter needs at least one sentinel",
    ))
}

impl Node for SentinelNode {
    fn call(&self, req: &Request) -> NodeCall {
        self.queue.call(req)
    }

    fn flush(&self) -> BoxFuture<'static, ()> {
        self.queue.flush()
    }

    fn advise(&self, advisory: Advisory) -> BoxFuture<'static, Result<Advice, NodeFailure>> {
        match advisory {
            Advisory::Inspect { keys, delete } => advice(
                advisory::inspect_on(&self.shared, keys, delete),
                Advice::Keys,
            ),
            Advisory::WriteIfHeld(write) => advice(
                advisory::write_if_held_on(&self.shared, &write),
                Advice::Written,
            ),
            Advisory::Claim(claim) => {
                advice(advisory::claim_on(&self.shared, &claim), Advice::Claimed)
            }
            Advisory::EvictionPolicy => advice(
                advisory::eviction_policy_on(&self.shared),
                Advice::EvictionPolicy,
            ),
            Advisory::RunId => advice(advisory::run_id_on(&self.shared), Advice::RunId),
            Advisory::RwInspect { keys } => {
                advice(advisory::rw_inspect_on(&self.shared, keys), Advice::RwKeys)
            }
        }
    }

    fn addr(&self) -> &str {
        &self.addr
    }
}
