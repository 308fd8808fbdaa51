//! A Sentinel group as a connection source: the master it names is a server like any other
//! (a `RedisNode`), whose connection ([`ServerConnection`]) asks the sentinels where the
//! master is, asks again after a failure that may mean it is no longer the master (a failover
//! demotes it: `READONLY`; it refuses writes: `NOREPLICAS`), and once calls have gone
//! unanswered for the patience window ([`ServerConnection::renew`]).
//!
//! [`ServerConnection`]: super::ServerConnection
//! [`ServerConnection::renew`]: super::ServerConnection::renew

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::RedisError;
use redis::sentinel::{SentinelClient, SentinelServerType};
use tokio::sync::Mutex;

use crate::error::NodeFailure;

/// The sentinels that watch one master, and its name.
pub(crate) struct Sentinels {
    /// One client per sentinel, asked all at once: redis-rs's client over several sentinels
    /// takes their answers in the order given, so a hung first sentinel (it accepts
    /// connections and never answers) costs its connect and response timeouts (1 s and
    /// 0.5 s) before the next one counts, and that takes the whole of a short connect bound.
    clients: Box<[Arc<Mutex<SentinelClient>>]>,
    /// How the voter is named in messages and in the other voters' rosters.
    name: String,
}

impl Sentinels {
    /// The master `master` that the sentinels at `sentinels` watch, named `name` in
    /// messages. Nothing is connected yet.
    pub(crate) fn new(
        sentinels: Vec<redis::ConnectionInfo>,
        master: String,
        name: String,
    ) -> Result<Self, String> {
        if sentinels.is_empty() {
            return Err(NO_SENTINEL.to_owned());
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
            .collect::<Result<_, RedisError>>()
            .map_err(|err| err.to_string())?;
        Ok(Sentinels { clients, name })
    }

    /// How the voter is named in messages.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Asks every sentinel at once (one client each) for the master and connects to it: the
    /// first sentinel whose master answers as a master wins, and the others are dropped (a
    /// hung one included). When all fail, an error about a master a sentinel named (a refused
    /// login, a master that is not one) is kept over a sentinel that does not know the name. A
    /// master at `not_at` (the one connected already) is an error: no new connection is made
    /// to it. `connect` makes the connection to a master from its client and address.
    pub(super) async fn first_master<T, F>(
        &self,
        connect: impl Fn(redis::Client, Arc<str>) -> F,
        not_at: Option<Arc<str>>,
    ) -> Result<T, NodeFailure>
    where
        F: Future<Output = Result<T, NodeFailure>>,
    {
        let mut asked: FuturesUnordered<_> = self
            .clients
            .iter()
            .cloned()
            .map(|client| {
                let not_at = not_at.clone();
                let connect = &connect;
                async move {
                    let client = client.lock().await.async_get_client().await?;
                    let addr: Arc<str> = client.get_connection_info().addr().to_string().into();
                    if not_at.as_deref() == Some(&*addr) {
                        return Err(NodeFailure::NotRun(
                            "the sentinels still name the master connected to",
                        ));
                    }
                    connect(client, addr).await
                }
            })
            .collect();
        let unnamed = |failure: &NodeFailure| {
            failure
                .redis()
                .is_some_and(|e| e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel)
        };
        let mut failure: Option<NodeFailure> = None;
        while let Some(answer) = asked.next().await {
            match answer {
                Ok(server) => return Ok(server),
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
        Err(failure.unwrap_or(NodeFailure::NotRun(NO_SENTINEL)))
    }
}

/// Why a Sentinel voter without sentinels cannot be: `build()` refuses it.
const NO_SENTINEL: &str = "a sentinel voter needs at least one sentinel";
