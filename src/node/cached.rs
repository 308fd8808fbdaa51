//! A connection made once and shared by the voters that find their server through others
//! (Sentinel, Cluster): made in a task of its own, forgotten or renewed by generation.

use std::future::Future;
use std::sync::Arc;

use redis::RedisError;

/// A connection made once and shared by a voter that finds its server through others (the
/// sentinels, a cluster's seeds). Making it takes several round trips, more than one
/// `node_timeout` when those servers are far away; it runs in a task of its own, bounded by
/// the time given to [`new`](Self::new), that a call given up at `node_timeout` does not
/// abandon, so a later call finds the connection made.
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
                Ok(conn) => Ok((slot.install(conn.clone()), conn)),
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

    /// Makes a new connection with `make`, in a task of its own, and puts it in place of the
    /// connection of `generation` once made; calls go on with that one meanwhile (the members
    /// of a cluster that answer keep answering), and a failed making leaves it in place. Only
    /// when `generation` is still the current one, no renewal is under way, and the last one
    /// ended at least the renewal spacing ago: a server that stays hung costs one renewal at
    /// a time, not one per call. Does not block; outside a Tokio runtime, does nothing.
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
                slot.install(conn);
            }
        });
    }
}

impl<T> Slot<T> {
    /// Makes `conn` the current connection, of a new generation, which it returns.
    fn install(&mut self, conn: T) -> u64 {
        self.made += 1;
        self.current = Some((self.made, conn));
        self.failed = None;
        self.made
    }

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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use futures::future::BoxFuture;

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

    /// What a caller gets now: the cached connection, or one made at once.
    async fn got(cached: &Cached<u32>, calls: &Arc<AtomicU32>) -> Result<(u64, u32), RedisError> {
        cached
            .get_or_make(maker(calls, Duration::ZERO, false))
            .await
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
        let made = got(&cached, &calls).await;
        assert_eq!(made.expect("made"), (1, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_forgotten_only_by_its_own_generation() {
        let cached = Cached::<u32>::new(Duration::from_secs(1));
        let calls = Arc::new(AtomicU32::new(0));
        let (first, _) = got(&cached, &calls).await.expect("made");
        cached.forget(first).await;
        let (second, conn) = got(&cached, &calls).await.expect("made again");
        assert_eq!((second, conn), (2, 2));
        // A late forget for the first connection leaves the second alone.
        cached.forget(first).await;
        let again = got(&cached, &calls).await.expect("cached");
        assert_eq!(again, (2, 2));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        cached.forget(second).await;
        let third = got(&cached, &calls).await.expect("made a third time");
        assert_eq!(third, (3, 3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_serves_the_old_connection_until_the_new_one_is_made() {
        let timeout = Duration::from_secs(1);
        let cached = Cached::<u32>::new(timeout);
        let calls = Arc::new(AtomicU32::new(0));
        let first = got(&cached, &calls).await.expect("made");
        assert_eq!(first, (1, 1));
        cached.renew(1, maker(&calls, Duration::from_millis(500), false));
        // Under way: callers keep the first connection, and a second renewal does nothing.
        cached.renew(1, maker(&calls, Duration::ZERO, false));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = got(&cached, &calls).await;
        assert_eq!(now.expect("cached"), (1, 1));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = got(&cached, &calls).await;
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
        let now = got(&cached, &calls).await;
        assert_eq!(now.expect("kept"), (2, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_never_replaces_a_newer_connection_and_fills_a_forgotten_one() {
        let cached = Cached::<u32>::new(Duration::from_secs(1)).renewals_spaced(Duration::ZERO);
        let calls = Arc::new(AtomicU32::new(0));
        let made = got(&cached, &calls).await;
        assert_eq!(made.expect("made"), (1, 1));
        // Forgotten while renewing, and made again by a call: the renewal is dropped.
        cached.renew(1, maker(&calls, Duration::from_millis(500), false));
        cached.forget(1).await;
        let again = got(&cached, &calls).await;
        assert_eq!(again.expect("made again"), (2, 3));
        tokio::time::sleep(Duration::from_millis(600)).await;
        let now = got(&cached, &calls).await;
        assert_eq!(
            now.expect("kept"),
            (2, 3),
            "not replaced by the late renewal"
        );
        // Forgotten while renewing, and no call since: the renewal takes its place.
        cached.renew(2, maker(&calls, Duration::from_millis(500), false));
        cached.forget(2).await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        let now = got(&cached, &calls).await;
        assert_eq!(now.expect("renewed"), (3, 4));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }
}
