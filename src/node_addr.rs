//! `NodeAddr`: one voter as the builder is given it (a URL, a `redis::Client`, a whole
//! cluster) with its TLS settings, and the `Node` it becomes at `build()`.

use std::fmt;
use std::sync::Arc;

use tokio_util::task::TaskTracker;

use crate::address;
use crate::config::Config;
use crate::connection::{Source, Tls, connect};
use crate::error::ConfigError;
use crate::memory::MemoryBook;
use crate::node::{RedisNode, Voter, VoterKind};

/// A Redis master to lock on: a URL (`redis://host:port/db`, `redis://user:password@host`,
/// `rediss://host:port` for TLS, `redis+unix:///path/to/redis.sock`) or a [`redis::Client`],
/// with optional [`Tls`] settings. Anything that converts into it (`&str`, `String`,
/// `redis::Client`) can be given to [`RedlockBuilder::node`](crate::RedlockBuilder::node).
///
/// `rediss://` needs the feature `tls-rustls` (recommended) or `tls-native-tls`; without
/// one, `build()` rejects it with [`ConfigError::BadNodeUrl`] naming the feature.
///
/// Its `Debug` output, like every error that shows a URL, hides the password.
#[derive(Clone)]
pub struct NodeAddr {
    repr: NodeRepr,
    tls: Option<Tls>,
}

impl fmt::Debug for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut t = f.debug_tuple("NodeAddr");
        match &self.repr {
            NodeRepr::Url(url) => t.field(&address::redact_url(url)),
            // redis-rs redacts the password itself.
            NodeRepr::Client(client) => t.field(client),
            #[cfg(feature = "cluster")]
            NodeRepr::Cluster(seeds) => t.field(&cluster_addr(seeds)),
            #[cfg(feature = "sentinel")]
            NodeRepr::Sentinel(sentinels, master) => t.field(&sentinel_addr(sentinels, master)),
            #[cfg(any(test, feature = "testing"))]
            NodeRepr::Sim(endpoint) => t.field(endpoint),
        };
        if let Some(tls) = &self.tls {
            t.field(tls);
        }
        t.finish()
    }
}

#[derive(Clone)]
enum NodeRepr {
    Url(String),
    /// Boxed: with TLS, a client is large.
    Client(Box<redis::Client>),
    /// A whole Redis Cluster, by its seed URLs.
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
    /// A Sentinel-managed master: the sentinels' URLs and the master's name.
    #[cfg(feature = "sentinel")]
    Sentinel(Vec<String>, String),
    /// A simulated server (feature `testing`).
    #[cfg(any(test, feature = "testing"))]
    Sim(crate::testing::SimEndpoint),
}

/// How a sentinel voter is named in messages: `sentinel[master@seed, seed]`.
#[cfg(feature = "sentinel")]
fn sentinel_addr(sentinels: &[String], master: &str) -> String {
    let seeds: Vec<String> = sentinels.iter().map(|s| address::redact_url(s)).collect();
    format!("sentinel[{master}@{}]", seeds.join(", "))
}

/// How a cluster voter is named in messages: `cluster[seed, seed]`, passwords redacted.
#[cfg(feature = "cluster")]
fn cluster_addr(seeds: &[String]) -> String {
    let seeds: Vec<String> = seeds.iter().map(|s| address::redact_url(s)).collect();
    format!("cluster[{}]", seeds.join(", "))
}

impl NodeAddr {
    /// The node at `url`, with the default settings (for `rediss://`: the system's trust
    /// store). Parsed by [`build`](crate::RedlockBuilder::build).
    pub fn url(url: impl Into<String>) -> Self {
        NodeAddr {
            repr: NodeRepr::Url(url.into()),
            tls: None,
        }
    }

    /// A whole Redis Cluster as **one** voter, found through `seeds` (the URLs of one or more
    /// of its members, e.g. `redis://user:password@10.0.1.1:7000`). Each request goes to the
    /// master of its keys' hash slot; redis-rs follows `MOVED` and `ASK` and finds new masters
    /// after a failover. Feature `cluster`.
    ///
    /// All the keys of one lock must be in one hash slot: a lock over resources in different
    /// slots is refused before any traffic with
    /// [`InvalidInput::KeysAcrossSlots`](crate::InvalidInput::KeysAcrossSlots); give them a
    /// common `{hash tag}`. **Safety caveat**: replication inside the cluster is asynchronous,
    /// so a failover can lose a grant the old master acknowledged (the same weakness as a
    /// restart without persistence): see docs/production.md.
    ///
    /// ```no_run
    /// use redfence::{NodeAddr, Redlock};
    ///
    /// # fn main() -> Result<(), redfence::ConfigError> {
    /// let redlock = Redlock::builder()
    ///     .node(NodeAddr::cluster(["redis://10.0.1.1:7000", "redis://10.0.1.2:7000"]))
    ///     .node(NodeAddr::cluster(["redis://10.0.2.1:7000", "redis://10.0.2.2:7000"]))
    ///     .node(NodeAddr::cluster(["redis://10.0.3.1:7000", "redis://10.0.3.2:7000"]))
    ///     .build()?;
    /// # drop(redlock);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "cluster")]
    pub fn cluster<I>(seeds: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        NodeAddr {
            repr: NodeRepr::Cluster(seeds.into_iter().map(Into::into).collect()),
            tls: None,
        }
    }

    /// The master that a Sentinel group calls `master`, as **one** voter, found through the
    /// sentinels at `sentinels` (their URLs). The master is resolved through the sentinels on
    /// first use and again after any failure of its connection (a failover demotes it), or
    /// once calls have gone unanswered for 5 s. It is a server like any other: plain commands,
    /// [fair mode](crate::RedlockBuilder::fair), the release hand-off and the
    /// [restart quarantine](crate::RedlockBuilder::restart_quarantine), where a new master (a
    /// new `run_id`) counts as a restart. The master is reached without TLS, user or password
    /// in this version. Feature `sentinel`.
    ///
    /// **Safety caveat**: replication is asynchronous, so a failover can promote a replica
    /// that never received a grant: the voter forgets the lock, like a restart without
    /// persistence. See docs/production.md.
    ///
    /// ```no_run
    /// use redfence::{NodeAddr, Redlock};
    ///
    /// # fn main() -> Result<(), redfence::ConfigError> {
    /// let sentinels = ["redis://10.0.0.5:26379", "redis://10.0.0.6:26379", "redis://10.0.0.7:26379"];
    /// let redlock = Redlock::builder()
    ///     .node(NodeAddr::sentinel(sentinels, "locks-a"))
    ///     .node(NodeAddr::sentinel(sentinels, "locks-b"))
    ///     .node(NodeAddr::sentinel(sentinels, "locks-c"))
    ///     .build()?;
    /// # drop(redlock);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "sentinel")]
    pub fn sentinel<I>(sentinels: I, master: impl Into<String>) -> Self
    where
        I: IntoIterator,
        I::Item: Into<String>,
    {
        NodeAddr {
            repr: NodeRepr::Sentinel(
                sentinels.into_iter().map(Into::into).collect(),
                master.into(),
            ),
            tls: None,
        }
    }

    /// The voter this address names (node `index`).
    pub(crate) fn into_voter(
        self,
        index: usize,
        config: &Config,
        tasks: &TaskTracker,
        memory: &Arc<MemoryBook>,
    ) -> Result<Voter, ConfigError> {
        #[cfg(feature = "cluster")]
        if let NodeRepr::Cluster(seeds) = &self.repr {
            return cluster_node(index, seeds, self.tls.as_ref(), config);
        }
        #[cfg(feature = "sentinel")]
        if let NodeRepr::Sentinel(sentinels, master) = &self.repr {
            if self.tls.is_some() {
                return Err(ConfigError::BadTls {
                    index,
                    addr: sentinel_addr(sentinels, master),
                    reason: "a Sentinel voter takes no TLS settings in this version: the \
                             master is reached over plain TCP (use `rediss://` sentinel URLs \
                             for the sentinels, trusted by the system's store)"
                        .into(),
                });
            }
            return sentinel_node(index, sentinels, master, config, tasks, memory);
        }
        #[cfg(any(test, feature = "testing"))]
        if let NodeRepr::Sim(endpoint) = &self.repr {
            return Ok(server_voter(
                Source::Sim(endpoint.clone()),
                VoterKind::Server,
                std::collections::BTreeSet::from([endpoint.name()]),
                config,
                tasks,
                memory,
            ));
        }
        let client = self.client(index)?;
        let identities = address::identities(client.get_connection_info());
        Ok(server_voter(
            Source::Direct(Arc::new(client)),
            VoterKind::Server,
            identities,
            config,
            tasks,
            memory,
        ))
    }

    /// A simulated server's address (`testing::SimServers::addrs`).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn simulated(endpoint: crate::testing::SimEndpoint) -> Self {
        NodeAddr {
            repr: NodeRepr::Sim(endpoint),
            tls: None,
        }
    }

    /// Connects with these TLS settings (a custom CA, a client certificate, ...). The URL must
    /// be `rediss://`; `build()` rejects TLS settings on a plain `redis://` node. Defaults to
    /// [`Tls::new`] for `rediss://` URLs.
    #[must_use]
    pub fn tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The `redis::Client` this node connects with, or why it cannot be made (node `index`).
    fn client(self, index: usize) -> Result<redis::Client, ConfigError> {
        match self.repr {
            NodeRepr::Client(client) => {
                let addr = client.get_connection_info().addr().to_string();
                connect::tls_client(*client, self.tls.as_ref()).map_err(|err| ConfigError::BadTls {
                    index,
                    addr,
                    reason: err.to_string(),
                })
            }
            #[cfg(feature = "cluster")]
            NodeRepr::Cluster(seeds) => Err(ConfigError::BadNodeUrl {
                index,
                url: cluster_addr(&seeds),
                reason: "a cluster is not one server".into(),
            }),
            #[cfg(feature = "sentinel")]
            NodeRepr::Sentinel(sentinels, master) => Err(ConfigError::BadNodeUrl {
                index,
                url: sentinel_addr(&sentinels, &master),
                reason: "a sentinel group is not one server".into(),
            }),
            #[cfg(any(test, feature = "testing"))]
            NodeRepr::Sim(endpoint) => Err(ConfigError::BadNodeUrl {
                index,
                url: endpoint.name(),
                reason: "a simulated server has no redis client".into(),
            }),
            NodeRepr::Url(url) => {
                let plain = redis::Client::open(url.as_str());
                connect::open(&url, self.tls.as_ref()).map_err(|err| match plain {
                    // The URL parses: the TLS settings are what is wrong.
                    Ok(_) if self.tls.is_some() => ConfigError::BadTls {
                        index,
                        addr: address::redact_url(&url),
                        reason: err.to_string(),
                    },
                    _ => ConfigError::BadNodeUrl {
                        index,
                        url: address::redact_url(&url),
                        reason: err.to_string(),
                    },
                })
            }
        }
    }
}

/// A cluster voter over `seeds` (node `index`), with every seed's server addresses.
#[cfg(feature = "cluster")]
fn cluster_node(
    index: usize,
    seeds: &[String],
    tls: Option<&Tls>,
    config: &Config,
) -> Result<Voter, ConfigError> {
    let addr = cluster_addr(seeds);
    // redis-rs connects to every node of the cluster with TLS settings of its own, not the
    // seeds': a CA or client certificate given here would be silently left out.
    if tls.is_some_and(Tls::has_certificates) {
        return Err(ConfigError::BadTls {
            index,
            addr,
            reason: "a Cluster voter cannot use a custom CA or a client certificate in this \
                     version: only the system's trust store (or `insecure`)"
                .into(),
        });
    }
    if seeds.is_empty() {
        return Err(ConfigError::BadNodeUrl {
            index,
            url: addr,
            reason: "a cluster needs at least one seed URL".into(),
        });
    }
    let mut infos = Vec::with_capacity(seeds.len());
    let mut identities = std::collections::BTreeSet::new();
    for seed in seeds {
        let client = NodeAddr {
            repr: NodeRepr::Url(seed.clone()),
            tls: tls.cloned(),
        }
        .client(index)?;
        identities.extend(address::identities(client.get_connection_info()));
        infos.push(client.get_connection_info().clone());
    }
    let node =
        crate::node::cluster_node(infos, addr.clone(), config.node_timeout).map_err(|err| {
            ConfigError::BadNodeUrl {
                index,
                url: addr,
                reason: err.to_string(),
            }
        })?;
    Ok(Voter {
        node: Arc::new(node),
        kind: VoterKind::Cluster,
        identities,
        pubsub: None,
    })
}

/// A one-server voter: the server `source` names, as a [`RedisNode`] (its queue, plain
/// commands, restart quarantine, fair queue and release subscriber).
fn server_voter(
    source: Source,
    kind: VoterKind,
    identities: std::collections::BTreeSet<String>,
    config: &Config,
    tasks: &TaskTracker,
    memory: &Arc<MemoryBook>,
) -> Voter {
    let node = RedisNode::new(
        source,
        config.node_timeout,
        config.native_commands,
        config.quarantine(),
        memory,
        &config.key_prefix,
        tasks.clone(),
    );
    Voter {
        pubsub: Some(node.pubsub()),
        node: Arc::new(node.into_node()),
        kind,
        identities,
    }
}

/// A sentinel voter (node `index`): the master the sentinels name, as a server whose
/// connection source is the sentinels. Its identity for duplicate detection is the master's
/// name with the sentinels' addresses: two voters naming one master through one group are one.
#[cfg(feature = "sentinel")]
fn sentinel_node(
    index: usize,
    sentinels: &[String],
    master: &str,
    config: &Config,
    tasks: &TaskTracker,
    memory: &Arc<MemoryBook>,
) -> Result<Voter, ConfigError> {
    let addr = sentinel_addr(sentinels, master);
    let bad = |reason: String| ConfigError::BadNodeUrl {
        index,
        url: addr.clone(),
        reason,
    };
    if sentinels.is_empty() {
        return Err(bad(
            "a sentinel voter needs at least one sentinel URL".into()
        ));
    }
    if master.trim().is_empty() {
        return Err(bad(
            "a sentinel voter needs the name of the master the sentinels monitor".into(),
        ));
    }
    let mut infos = Vec::with_capacity(sentinels.len());
    let mut identities = std::collections::BTreeSet::new();
    for url in sentinels {
        let client = NodeAddr::url(url.clone()).client(index)?;
        for id in address::identities(client.get_connection_info()) {
            identities.insert(format!("{master}@{id}"));
        }
        infos.push(client.get_connection_info().clone());
    }
    let source = crate::connection::Sentinels::new(infos, master.to_owned(), addr.clone())
        .map_err(|err| bad(err.to_string()))?;
    Ok(server_voter(
        Source::Sentinels(Arc::new(source)),
        VoterKind::Sentinel,
        identities,
        config,
        tasks,
        memory,
    ))
}

impl From<&str> for NodeAddr {
    fn from(url: &str) -> Self {
        NodeAddr::url(url)
    }
}

impl From<String> for NodeAddr {
    fn from(url: String) -> Self {
        NodeAddr::url(url)
    }
}

impl From<&String> for NodeAddr {
    fn from(url: &String) -> Self {
        NodeAddr::url(url.clone())
    }
}

impl From<redis::Client> for NodeAddr {
    fn from(client: redis::Client) -> Self {
        NodeAddr {
            repr: NodeRepr::Client(Box::new(client)),
            tls: None,
        }
    }
}
