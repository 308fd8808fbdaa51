//! One request as one script call (`EVALSHA`, loading the script on `NOSCRIPT`) on any
//! connection: what the node kinds without batching (cluster, sentinel) send, and the
//! advisory calls every node kind makes (inspect, eviction policy, guarded write).

use std::future::Future;
use std::sync::{Arc, LazyLock};

use futures::future::BoxFuture;
use redis::aio::ConnectionLike;
use redis::{RedisError, Script};

use super::{GuardedWrite, KeyRow, Op, Request};
use crate::error::NodeFailure;
use crate::guard::DropGuard;

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/acquire.lua")));
static EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/extend.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/release.lua")));
static INSPECT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/inspect.lua")));
static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/force_release.lua")));
static WRITE_IF_HELD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/write_if_held.lua")));

/// Runs `req`'s script on `conn` and returns its integer reply.
#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
pub(crate) async fn run<C: ConnectionLike + Send>(
    conn: &mut C,
    req: &Request,
) -> Result<i64, redis::RedisError> {
    let script: &Script = match req.op {
        Op::Acquire => &ACQUIRE,
        Op::Extend => &EXTEND,
        Op::Release => &RELEASE,
        // These voters have no fair queue (`build()` refuses fair mode over them).
        Op::Leave => return Ok(0),
    };
    let mut invocation = script.prepare_invoke();
    invocation.key(&*req.keys).arg(&*req.token);
    if req.op != Op::Release {
        invocation.arg(req.ttl_ms);
    }
    invocation.invoke_async(conn).await
}

/// Reads (and with `delete`, deletes) `keys` on `conn`, as [`Node::inspect`](super::Node::inspect).
pub(crate) async fn inspect<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &[String],
    delete: bool,
) -> Result<Vec<KeyRow>, redis::RedisError> {
    let script: &Script = if delete { &FORCE_RELEASE } else { &INSPECT };
    let mut invocation = script.prepare_invoke();
    invocation.key(keys);
    invocation.invoke_async(conn).await
}

/// The server's `maxmemory-policy`, as [`Node::eviction_policy`](super::Node::eviction_policy).
pub(crate) async fn eviction_policy<C: ConnectionLike + Send>(
    conn: &mut C,
) -> Result<String, redis::RedisError> {
    let reply: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory-policy")
        .query_async(conn)
        .await?;
    reply.into_iter().nth(1).ok_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "CONFIG GET maxmemory-policy returned no value",
        ))
    })
}

/// The server's `run_id` (`INFO server`), as [`Node::run_id`](super::Node::run_id).
pub(crate) async fn run_id<C: ConnectionLike + Send>(
    conn: &mut C,
) -> Result<Option<String>, redis::RedisError> {
    let info: String = redis::cmd("INFO").arg("server").query_async(conn).await?;
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned()))
}

/// [`Node::run_id`](super::Node::run_id) over a [`Connector`].
#[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
pub(crate) fn run_id_on<C: Connector>(
    connector: &Arc<C>,
) -> BoxFuture<'static, Result<Option<String>, NodeFailure>> {
    let connector = Arc::clone(connector);
    Box::pin(async move { on(&*connector, async |conn| run_id(conn).await).await })
}

/// Writes `write.key` if `write.lock_key` still holds our token, as
/// [`Node::write_if_held`](super::Node::write_if_held).
pub(crate) async fn write_if_held<C: ConnectionLike + Send>(
    conn: &mut C,
    write: &GuardedWrite,
) -> Result<bool, redis::RedisError> {
    let mut invocation = WRITE_IF_HELD.prepare_invoke();
    invocation
        .key(&*write.lock_key)
        .key(&*write.key)
        .arg(&*write.token)
        .arg(write.value.as_deref().unwrap_or(""))
        .arg(write.ttl_ms);
    let written: i64 = invocation.invoke_async(conn).await?;
    Ok(written == 1)
}

/// Where a node that sends one script per request (a cluster or a Sentinel voter) gets its
/// connection, and when it drops it.
#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
pub(crate) trait Connector: Send + Sync + 'static {
    /// The connection the scripts run on.
    type Conn: ConnectionLike + Send;

    /// The shared connection, made on first use, with its generation (see
    /// [`given_up`](Self::given_up)).
    fn connection(&self) -> impl Future<Output = Result<(u64, Self::Conn), RedisError>> + Send;

    /// Drops the connection of `generation` (if still the current one) after `err`, if it is
    /// a failure this kind of node recovers from only by connecting afresh.
    fn forget_after(&self, err: &RedisError, generation: u64) -> impl Future<Output = ()> + Send;

    /// A call on the connection of `generation` was given up before its answer, after
    /// `waited` (its `node_timeout` passed, or its caller cancelled it): the server may be
    /// hung, and this kind of node may recover only by connecting afresh (see
    /// [`Cached::try_forget`] and [`Cached::renew`]). Must not block (it runs on drop).
    fn given_up(&self, _generation: u64, _waited: std::time::Duration) {}
}

/// A connection made once and shared by a voter that finds its server through others (the
/// sentinels, a cluster's seeds). Making it takes several round trips, more than one
/// `node_timeout` when those servers are far away; it runs in a task of its own, bounded by
/// the time given to [`new`](Self::new), that a call given up at `node_timeout` does not
/// abandon, so a later
/// call finds the connection made.
#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
pub(crate) struct Cached<T> {
    slot: Arc<tokio::sync::Mutex<Slot<T>>>,
    connect_timeout: std::time::Duration,
    /// The least time between the end of one [`renew`](Self::renew) and the start of the next.
    renewal_spacing: std::time::Duration,
}

/// What [`Cached`] holds.
struct Slot<T> {
    /// The connection and its generation.
    current: Option<(u64, T)>,
    /// How many connections were made: the generation of the last one.
    made: u64,
    /// The last failed attempt: when it ended, and why. Callers that were already waiting
    /// for it get its error instead of trying again one after the other.
    failed: Option<(tokio::time::Instant, String)>,
    /// Whether a [`Cached::renew`] is under way.
    renewing: bool,
    /// When the last [`Cached::renew`] ended.
    renewed_at: Option<tokio::time::Instant>,
}

#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
impl<T: Clone + Send + 'static> Cached<T> {
    /// Nothing made yet; `connect_timeout` bounds each making, and spaces renewals until
    /// [`renewals_spaced`](Self::renewals_spaced) says otherwise.
    pub(crate) fn new(connect_timeout: std::time::Duration) -> Self {
        Cached {
            slot: Arc::new(tokio::sync::Mutex::new(Slot {
                current: None,
                made: 0,
                failed: None,
                renewing: false,
                renewed_at: None,
            })),
            connect_timeout,
            renewal_spacing: connect_timeout,
        }
    }

    /// Leaves at least `spacing` between the end of one renewal and the start of the next.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn renewals_spaced(mut self, spacing: std::time::Duration) -> Self {
        self.renewal_spacing = spacing;
        self
    }

    /// The connection and its generation, made by `make` (in a task of its own) when there
    /// is none.
    pub(crate) async fn get_or_make<Fut>(
        &self,
        make: impl FnOnce() -> Fut + Send + 'static,
    ) -> Result<(u64, T), RedisError>
    where
        Fut: Future<Output = Result<T, RedisError>> + Send,
    {
        if let Ok(slot) = self.slot.try_lock()
            && let Some(current) = slot.current.as_ref()
        {
            return Ok(current.clone());
        }
        let (slot, timeout) = (Arc::clone(&self.slot), self.connect_timeout);
        let asked = tokio::time::Instant::now();
        let task = tokio::spawn(async move {
            let mut slot = slot.lock().await;
            if let Some(current) = slot.current.as_ref() {
                return Ok(current.clone());
            }
            if let Some((at, why)) = &slot.failed
                && *at > asked
            {
                return Err(RedisError::from((
                    redis::ErrorKind::Io,
                    "connecting failed just now",
                    why.clone(),
                )));
            }
            let made_now = match tokio::time::timeout(timeout, make()).await {
                Ok(result) => result,
                Err(_) => Err(RedisError::from((
                    redis::ErrorKind::Io,
                    "no connection within the connect timeout",
                ))),
            };
            match made_now {
                Ok(conn) => {
                    slot.made += 1;
                    slot.current = Some((slot.made, conn.clone()));
                    slot.failed = None;
                    Ok((slot.made, conn))
                }
                Err(err) => {
                    slot.failed = Some((tokio::time::Instant::now(), err.to_string()));
                    Err(err)
                }
            }
        });
        task.await.map_err(|err| {
            RedisError::from((redis::ErrorKind::Io, "connect task", err.to_string()))
        })?
    }

    /// Drops the connection of `generation` if it is still the current one (a newer one
    /// stands): the next call makes a new one.
    pub(crate) async fn forget(&self, generation: u64) {
        self.slot.lock().await.forget(generation);
    }

    /// Drops the connection of `generation` if it is still the current one and not being
    /// replaced right now (a newer connection stands). Does not block.
    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    pub(crate) fn try_forget(&self, generation: u64) {
        if let Ok(mut slot) = self.slot.try_lock() {
            slot.forget(generation);
        }
    }

    /// Makes a new connection with `make`, in a task of its own, and puts it in place of the
    /// connection of `generation` once made; calls go on with that one meanwhile (the members
    /// of a cluster that answer keep answering), and a failed making leaves it in place. Only
    /// when `generation` is still the current one, no renewal is under way, and the last one
    /// ended at least the renewal spacing ago: a server that stays hung costs one renewal at
    /// a time, not one per call. Does not block; outside a Tokio runtime, does nothing.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn renew<Fut>(&self, generation: u64, make: impl FnOnce() -> Fut + Send + 'static)
    where
        Fut: Future<Output = Result<T, RedisError>> + Send + 'static,
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(mut slot) = self.slot.try_lock() else {
            return;
        };
        let now = tokio::time::Instant::now();
        let recent = slot
            .renewed_at
            .is_some_and(|at| now.duration_since(at) < self.renewal_spacing);
        if slot.renewing || recent || !slot.holds(generation) {
            return;
        }
        slot.renewing = true;
        drop(slot);
        let (slot, timeout) = (Arc::clone(&self.slot), self.connect_timeout);
        runtime.spawn(async move {
            let made = tokio::time::timeout(timeout, make()).await;
            let mut slot = slot.lock().await;
            slot.renewing = false;
            slot.renewed_at = Some(tokio::time::Instant::now());
            // Not over a newer connection; in place of a forgotten one, as the next call
            // would make.
            if let Ok(Ok(conn)) = made
                && (slot.current.is_none() || slot.holds(generation))
            {
                slot.made += 1;
                slot.current = Some((slot.made, conn));
                slot.failed = None;
            }
        });
    }
}

impl<T> Slot<T> {
    /// Whether the current connection is that of `generation`.
    fn holds(&self, generation: u64) -> bool {
        self.current
            .as_ref()
            .is_some_and(|(current, _)| *current == generation)
    }

    /// Drops the connection of `generation`, if it is the current one.
    fn forget(&mut self, generation: u64) {
        if self.holds(generation) {
            self.current = None;
        }
    }
}

/// Runs `op` on `connector`'s connection and reports its failure to the connector, a call
/// dropped before its answer included.
pub(crate) async fn on<C: Connector, T>(
    connector: &C,
    op: impl AsyncFnOnce(&mut C::Conn) -> Result<T, RedisError>,
) -> Result<T, NodeFailure> {
    // A connect that failed left nothing to forget.
    let (generation, mut conn) = connector.connection().await?;
    let sent = tokio::time::Instant::now();
    let mut abandoned = DropGuard::new((connector, generation, sent), |(c, generation, sent)| {
        c.given_up(*generation, sent.elapsed());
    });
    let result = op(&mut conn).await;
    abandoned.disarm();
    if let Err(err) = &result {
        connector.forget_after(err, generation).await;
    }
    Ok(result?)
}

/// [`Node::call`](super::Node::call) over a [`Connector`].
#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
pub(crate) fn call<C: Connector>(
    connector: &Arc<C>,
    req: &Request,
) -> BoxFuture<'static, Result<i64, NodeFailure>> {
    let (connector, req) = (Arc::clone(connector), req.clone());
    Box::pin(async move { on(&*connector, async |conn| run(conn, &req).await).await })
}

/// [`Node::inspect`](super::Node::inspect) over a [`Connector`].
#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
pub(crate) fn inspect_on<C: Connector>(
    connector: &Arc<C>,
    keys: Arc<[String]>,
    delete: bool,
) -> BoxFuture<'static, Result<Vec<KeyRow>, NodeFailure>> {
    let connector = Arc::clone(connector);
    Box::pin(async move { on(&*connector, async |conn| inspect(conn, &keys, delete).await).await })
}

/// [`Node::write_if_held`](super::Node::write_if_held) over a [`Connector`].
#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
pub(crate) fn write_if_held_on<C: Connector>(
    connector: &Arc<C>,
    write: &GuardedWrite,
) -> BoxFuture<'static, Result<bool, NodeFailure>> {
    let (connector, write) = (Arc::clone(connector), write.clone());
    Box::pin(async move { on(&*connector, async |conn| write_if_held(conn, &write).await).await })
}

/// [`Node::eviction_policy`](super::Node::eviction_policy) over a [`Connector`] (one server).
#[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
pub(crate) fn eviction_policy_on<C: Connector>(
    connector: &Arc<C>,
) -> BoxFuture<'static, Result<String, NodeFailure>> {
    let connector = Arc::clone(connector);
    Box::pin(async move { on(&*connector, async |conn| eviction_policy(conn).await).await })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use super::*;

    /// A `make` that counts its calls and, after `delay`, fails or returns the call's number.
    fn maker(
        calls: &Arc<AtomicU32>,
        delay: Duration,
        fail: bool,
    ) -> impl FnOnce() -> BoxFuture<'static, Result<u32, RedisError>> + Send + 'static {
        let calls = Arc::clone(calls);
        move || {
            Box::pin(async move {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(delay).await;
                if fail {
                    Err(RedisError::from((redis::ErrorKind::Io, "refused")))
                } else {
                    Ok(n)
                }
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn callers_waiting_on_a_failed_attempt_share_its_error() {
        let cached = Arc::new(Cached::<u32>::new(Duration::from_secs(1)));
        let calls = Arc::new(AtomicU32::new(0));
        let waiting: Vec<_> = (0..5)
            .map(|_| {
                let (cached, make) = (
                    Arc::clone(&cached),
                    maker(&calls, Duration::from_millis(100), true),
                );
                tokio::spawn(async move { cached.get_or_make(make).await })
            })
            .collect();
        for caller in waiting {
            assert!(caller.await.expect("task").is_err());
        }
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "one attempt for five callers"
        );
        // A caller that comes after the failure tries again.
        let made = cached
            .get_or_make(maker(&calls, Duration::ZERO, false))
            .await;
        assert_eq!(made.expect("made"), (1, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_forgotten_only_by_its_own_generation() {
        let cached = Cached::<u32>::new(Duration::from_secs(1));
        let calls = Arc::new(AtomicU32::new(0));
        let (first, _) = cached
            .get_or_make(maker(&calls, Duration::ZERO, false))
            .await
            .expect("made");
        cached.forget(first).await;
        let (second, conn) = cached
            .get_or_make(maker(&calls, Duration::ZERO, false))
            .await
            .expect("made again");
        assert_eq!((second, conn), (2, 2));
        // A late forget for the first connection leaves the second alone.
        cached.forget(first).await;
        cached.try_forget(first);
        let again = cached
            .get_or_make(maker(&calls, Duration::ZERO, false))
            .await
            .expect("cached");
        assert_eq!(again, (2, 2));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        cached.try_forget(second);
        let third = cached
            .get_or_make(maker(&calls, Duration::ZERO, false))
            .await
            .expect("made a third time");
        assert_eq!(third, (3, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_serves_the_old_connection_until_the_new_one_is_made() {
        let timeout = Duration::from_secs(1);
        let cached = Cached::<u32>::new(timeout);
        let calls = Arc::new(AtomicU32::new(0));
        let first = cached
            .get_or_make(maker(&calls, Duration::ZERO, false))
            .await
            .expect("made");
        assert_eq!(first, (1, 1));
        cached.renew(1, maker(&calls, Duration::from_millis(500), false));
        // Under way: callers keep the first connection, and a second renewal does nothing.
        cached.renew(1, maker(&calls, Duration::ZERO, false));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = cached
            .get_or_make(maker(&calls, Duration::ZERO, false))
            .await;
        assert_eq!(now.expect("cached"), (1, 1));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = cached
            .get_or_make(maker(&calls, Duration::ZERO, false))
            .await;
        assert_eq!(now.expect("renewed"), (2, 2));
        assert_eq!(calls.load(Ordering::SeqCst), 2, "one renewal");
        // Spaced from the end of the last one, and never for an old generation.
        cached.renew(2, maker(&calls, Duration::ZERO, false));
        cached.renew(1, maker(&calls, Duration::ZERO, false));
        tokio::time::sleep(timeout).await;
        cached.renew(1, maker(&calls, Duration::ZERO, false));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "none for an old generation"
        );
        // A failed renewal leaves the connection in place.
        cached.renew(2, maker(&calls, Duration::ZERO, true));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        let now = cached
            .get_or_make(maker(&calls, Duration::ZERO, false))
            .await;
        assert_eq!(now.expect("kept"), (2, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_never_replaces_a_newer_connection_and_fills_a_forgotten_one() {
        let cached = Cached::<u32>::new(Duration::from_secs(1)).renewals_spaced(Duration::ZERO);
        let calls = Arc::new(AtomicU32::new(0));
        let made = cached
            .get_or_make(maker(&calls, Duration::ZERO, false))
            .await;
        assert_eq!(made.expect("made"), (1, 1));
        // Forgotten while renewing, and made again by a call: the renewal is dropped.
        cached.renew(1, maker(&calls, Duration::from_millis(500), false));
        cached.forget(1).await;
        let again = cached
            .get_or_make(maker(&calls, Duration::ZERO, false))
            .await;
        assert_eq!(again.expect("made again"), (2, 3));
        tokio::time::sleep(Duration::from_millis(600)).await;
        let now = cached
            .get_or_make(maker(&calls, Duration::ZERO, false))
            .await;
        assert_eq!(
            now.expect("kept"),
            (2, 3),
            "not replaced by the late renewal"
        );
        // Forgotten while renewing, and no call since: the renewal takes its place.
        cached.renew(2, maker(&calls, Duration::from_millis(500), false));
        cached.forget(2).await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        let now = cached
            .get_or_make(maker(&calls, Duration::ZERO, false))
            .await;
        assert_eq!(now.expect("renewed"), (3, 4));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }
}
