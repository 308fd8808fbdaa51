//! A Cluster voter under faults of one member (from an adversarial review of the non-plain
//! voters): a member stalled within its patience window keeps its connection, and keys across
//! hash slots are refused before any traffic.
//!
//! Run with `cargo test --features cluster --test cluster_voter_faults`.
#![cfg(feature = "cluster")]

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redfence::{Error, InvalidInput, NodeAddr, Redlock};
use support::redis_cluster::RedisCluster;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

/// The documented patience window of a Cluster voter.
const PATIENCE: Duration = Duration::from_secs(5);

/// A TCP proxy whose *existing* connections can be frozen (requests held, in order, as a
/// stalled TCP flow would hold them) while new connections pass.
struct FreezeProxy {
    port: u16,
    conns: Arc<Mutex<Vec<Arc<Conn>>>>,
    accepted: Arc<AtomicUsize>,
}

struct Conn {
    frozen: watch::Sender<bool>,
    /// Bytes read from the client and not yet written to the server.
    held: AtomicUsize,
}

impl FreezeProxy {
    async fn start(upstream: u16) -> FreezeProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let conns: Arc<Mutex<Vec<Arc<Conn>>>> = Arc::default();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (c2, a2) = (Arc::clone(&conns), Arc::clone(&accepted));
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                a2.fetch_add(1, Ordering::SeqCst);
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (frozen, _) = watch::channel(false);
                let conn = Arc::new(Conn {
                    frozen,
                    held: AtomicUsize::new(0),
                });
                c2.lock().unwrap().push(Arc::clone(&conn));
                let (mut cr, cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                // Server to client: straight through.
                let mut cw = cw;
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut sr, &mut cw).await;
                });
                // Client to server: held while frozen.
                let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
                let writer_conn = Arc::clone(&conn);
                tokio::spawn(async move {
                    let mut frozen = writer_conn.frozen.subscribe();
                    while let Some(bytes) = rx.recv().await {
                        while *frozen.borrow_and_update() {
                            if frozen.changed().await.is_err() {
                                return;
                            }
                        }
                        if sw.write_all(&bytes).await.is_err() {
                            return;
                        }
                        writer_conn.held.fetch_sub(bytes.len(), Ordering::SeqCst);
                    }
                });
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        match cr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                conn.held.fetch_add(n, Ordering::SeqCst);
                                if tx.send(buf[..n].to_vec()).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        FreezeProxy {
            port,
            conns,
            accepted,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Freezes every connection open now; later ones pass.
    fn freeze_existing(&self) {
        for conn in self.conns.lock().unwrap().iter() {
            let _ = conn.frozen.send(true);
        }
    }

    fn thaw(&self) {
        for conn in self.conns.lock().unwrap().iter() {
            let _ = conn.frozen.send(false);
        }
    }

    /// Bytes held in frozen connections.
    fn held(&self) -> usize {
        self.conns
            .lock()
            .unwrap()
            .iter()
            .map(|c| c.held.load(Ordering::SeqCst))
            .sum()
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

/// A two-member cluster whose members announce the proxies' ports, so that every connection
/// redis-rs makes (seeds and slot-map members alike) goes through a proxy.
async fn cluster_behind_proxies() -> (RedisCluster, Vec<FreezeProxy>) {
    let cluster = RedisCluster::start();
    let mut proxies = Vec::new();
    for i in 0..2 {
        proxies.push(FreezeProxy::start(cluster.servers.port(i)).await);
    }
    for (i, proxy) in proxies.iter().enumerate() {
        let port = proxy.port.to_string();
        let _: () = cluster
            .servers
            .cmd(i, &["CONFIG", "SET", "cluster-announce-port", &port]);
    }
    // Both members map the slots to the proxies.
    let wanted: Vec<i64> = proxies.iter().map(|p| i64::from(p.port)).collect();
    let deadline = Instant::now() + support::DEADLINE;
    loop {
        let ok = (0..2).all(|i| {
            let slots: Vec<redis::Value> = cluster.servers.cmd(i, &["CLUSTER", "SLOTS"]);
            let ports: Vec<i64> = slots
                .iter()
                .filter_map(|range| match range {
                    redis::Value::Array(items) => match items.get(2) {
                        Some(redis::Value::Array(node)) => match node.get(1) {
                            Some(redis::Value::Int(p)) => Some(*p),
                            _ => None,
                        },
                        _ => None,
                    },
                    _ => None,
                })
                .collect();
            wanted.iter().all(|w| ports.contains(w))
        });
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the members never announced the proxies"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (cluster, proxies)
}

/// Cluster voter: the patience window holds for every member. Member A stalls past the window;
/// member B stalls for far less (a lock's acquire still held in the old connection's flow, the
/// lock granted by the two plain servers). The cluster connection (one for every member) was
/// made again as soon as A's window ran out, so the lock's release went to B over a fresh
/// connection, ahead of its acquire, which then landed and left the key behind its release
/// (until its TTL). It is now made again only once every stalled slot has waited its window.
/// (Found by an adversarial review.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stalled_within_its_window_keeps_its_connection_when_another_runs_out() {
    let (cluster, proxies) = cluster_behind_proxies().await;
    let servers = support::Servers::start(2);
    let redlock = Redlock::builder()
        .node(NodeAddr::cluster(proxies.iter().map(FreezeProxy::url)))
        .nodes(servers.urls())
        .node_timeout(Duration::from_millis(300))
        .retry_count(0)
        .build()
        .expect("config");
    let a_key = "a-key";
    let a = cluster.owner(a_key);
    let b = 1 - a;
    let b_key = (0..)
        .map(|i| format!("b-key:{i}"))
        .find(|k| cluster.owner(k) == b)
        .expect("a key on the other member");
    for key in [a_key, b_key.as_str()] {
        let lock = support::acquire_within(
            &redlock,
            &[key],
            Duration::from_secs(10),
            support::DEADLINE,
            "warm",
        )
        .await;
        lock.release().await.expect("release");
    }
    assert!(
        support::eventually(|| cluster.servers.get(b, &b_key).is_none()).await,
        "warm-up released"
    );
    let ttl = Duration::from_secs(60);

    // A stalls (its connection's requests held): A's slot goes unanswered from now on.
    proxies[a].freeze_existing();
    let t0 = Instant::now();
    let lock = redlock
        .acquire(&[a_key], ttl)
        .await
        .expect("the plain servers grant");
    lock.release().await.expect("released on the plain servers");

    tokio::time::sleep_until((t0 + PATIENCE - Duration::from_millis(1500)).into()).await;
    // B's existing connection stalls now, well within B's own patience window: a lock on
    // b_key is granted by the plain servers while its acquire on the Cluster voter is held
    // in B's old flow.
    proxies[b].freeze_existing();
    let b_frozen_at = Instant::now();
    let b_accepted_before = proxies[b].accepted();
    let lock = redlock
        .acquire(&[b_key.as_str()], ttl)
        .await
        .expect("plain servers grant");
    assert!(
        support::eventually(|| proxies[b].held() > 0).await,
        "the Cluster voter's acquire of {b_key} is held in B's old connection"
    );
    let token = lock.token().to_owned();

    // A's window runs out while B's calls are still within theirs. Calls go on until the
    // connection answers on B again (made anew: what the fix prevents) or B's calls have waited
    // nearly their own window.
    let b_window_nearly = b_frozen_at + PATIENCE - Duration::from_millis(700);
    loop {
        let seen = redlock.inspect(&[b_key.as_str()]).await.expect("inspect");
        if seen.nodes[0].keys.is_ok() || Instant::now() >= b_window_nearly {
            break;
        }
    }
    assert!(
        t0.elapsed() > PATIENCE + Duration::from_millis(500),
        "setup: A's window ran out"
    );
    assert!(
        b_frozen_at.elapsed() < PATIENCE,
        "setup: B's calls still within their window"
    );
    // The lock is released while B's old flow (with the acquire) is still held: the release
    // must go behind the acquire, on the same connection.
    lock.release().await.expect("release");
    let new_to_b = proxies[b].accepted() - b_accepted_before;
    proxies[b].thaw();
    proxies[a].thaw();
    tokio::time::timeout(support::DEADLINE, redlock.close())
        .await
        .expect("close");
    assert!(
        support::eventually(|| proxies.iter().all(|p| p.held() == 0)).await,
        "the proxies drained"
    );
    let _: String = cluster.servers.cmd(b, &["PING"]);
    let left = cluster.servers.get(b, &b_key);
    assert_ne!(
        left.as_deref(),
        Some(token.as_str()),
        "B holds {b_key} with the released lock's token (pttl {} ms): its release ran on a \
         new connection ({new_to_b} made to B) before its acquire, held {:?} in B's old \
         connection, within the {PATIENCE:?} patience window",
        cluster.servers.pttl(b, &b_key),
        b_frozen_at.elapsed()
    );
    assert_eq!(left, None);
}

/// A lock over keys in different hash slots of a Cluster voter is refused with a
/// typed error before any traffic, also when the key prefix makes the hash tag empty (`{}`)
/// or takes part in it.
#[tokio::test]
async fn cross_slot_keys_through_the_prefix_are_refused_before_traffic() {
    let cluster = RedisCluster::start();
    for (prefix, resources, refused) in [
        // Keys "{}a", "{}b": an empty tag hashes the whole key.
        ("{", ["}a", "}b"], true),
        // Keys "x{a}1", "x{b}1": tags "a" and "b".
        ("x{", ["a}1", "b}1"], true),
        // Keys "{t}:a", "{t}:b": one tag.
        ("{t}:", ["a", "b"], false),
        // Keys "{t}a}", "{t}b}": the tag ends at the first '}'.
        ("{t}", ["a}", "b}"], false),
    ] {
        let redlock = Redlock::builder()
            .node(NodeAddr::cluster(cluster.seeds()))
            .key_prefix(prefix)
            .node_timeout(Duration::from_millis(500))
            .build()
            .expect("config");
        let accepted: Vec<_> = (0..2)
            .map(|i| cluster.servers.accepted_connections(i))
            .collect();
        let before: Vec<i64> = accepted.iter().map(|a| a.count()).collect();
        let got = redlock
            .try_acquire(&resources, Duration::from_secs(5))
            .await;
        match (got, refused) {
            (Err(Error::InvalidInput(InvalidInput::KeysAcrossSlots { .. })), true) => {
                let after: Vec<i64> = accepted.iter().map(|a| a.count()).collect();
                assert_eq!(before, after, "traffic before the refusal ({prefix})");
            }
            (Ok(lock), false) => lock.release().await.expect("release"),
            (other, _) => panic!("prefix {prefix:?}, {resources:?}: {:?}", other.map(|_| ())),
        }
    }
}

/// A Cluster voter (node timeout 500 ms, no retry) over a two-member cluster whose member owning
/// `hung` is paused, with a key owned by the other member; the other member will not call the
/// paused one failed for a minute.
async fn one_member_paused() -> (RedisCluster, Redlock, usize, String) {
    let cluster = RedisCluster::start();
    let redlock = Redlock::builder()
        .node(NodeAddr::cluster(cluster.seeds()))
        .node_timeout(Duration::from_millis(500))
        .retry_count(0)
        .build()
        .expect("config");
    support::warm_up(&redlock).await;
    let hung = cluster.owner("hung");
    let healthy_key = (0..1000)
        .map(|i| format!("healthy{i}"))
        .find(|key| cluster.owner(key) != hung)
        .expect("a key on the other member");
    let _: () = cluster.servers.cmd(
        1 - hung,
        &["CONFIG", "SET", "cluster-node-timeout", "60000"],
    );
    cluster.servers.pause(hung);
    (cluster, redlock, hung, healthy_key)
}

/// An advisory call goes through the voter's queue: an inspect of a key on a member that hangs
/// must not fail an acquire on a healthy member queued behind it (from a review of the queue's
/// advisory calls: a timed-out call on one member failed every call behind it).
#[tokio::test]
async fn an_inspect_on_a_hung_member_does_not_fail_a_lock_call_on_a_healthy_one() {
    let (cluster, redlock, hung, healthy_key) = one_member_paused().await;
    // An operator's inspect of a key on the hung member, and, just behind it, an acquire of
    // a key on the healthy member.
    let inspect = {
        let redlock = redlock.clone();
        tokio::spawn(async move { redlock.inspect(&["hung"]).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let acquired = redlock
        .acquire(&[healthy_key.as_str()], Duration::from_secs(10))
        .await;
    cluster.servers.resume(hung);
    let _ = inspect.await;
    let lock = acquired.expect(
        "the healthy member's slot is free: its acquire must not fail because an advisory \
         call to another member hung in front of it",
    );
    lock.release().await.expect("released");
    redlock.close().await;
}

/// The same, with a lock call (an acquire) on the hung member in front: the healthy member's
/// acquire, queued behind it, is granted once the hung call timed out.
#[tokio::test]
async fn a_lock_call_on_a_hung_member_does_not_fail_one_on_a_healthy_one() {
    let (cluster, redlock, hung, healthy_key) = one_member_paused().await;
    let first = {
        let redlock = redlock.clone();
        tokio::spawn(async move {
            redlock
                .acquire(&["hung"], Duration::from_secs(10))
                .await
                .map(drop)
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let acquired = redlock
        .acquire(&[healthy_key.as_str()], Duration::from_secs(10))
        .await;
    cluster.servers.resume(hung);
    let _ = first.await;
    let lock = acquired.expect("the healthy member's slot is free");
    lock.release().await.expect("released");
    redlock.close().await;
}
