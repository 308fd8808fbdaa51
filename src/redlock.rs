//! `Redlock`: the lock manager over N independent Redis masters, and its public entry points
//! (but `Redlock::builder`, declared in builder/mod.rs, and `Redlock::election`, declared in
//! election/builder.rs, beside the builders they return).

use std::convert::identity;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::acquisition::{self, Acquired};
use crate::clock;
use crate::error::Error;
use crate::inner::{Shared, Target};
use crate::inspect::{self, Inspection, NodeCheck};
use crate::lock::Lock;
use crate::metrics::{Tries, TypeLabel};
use crate::quorum;
use crate::trace;
use crate::using::{self, Signal};
#[cfg(doc)]
use crate::{Event, InvalidInput};

/// A distributed lock manager over N independent Redis masters (the Redlock algorithm).
///
/// Cheap to clone (an `Arc` inside): share one per process. Every lock shares the same
/// connection and request queue per node. Build it with [`Redlock::builder`].
///
/// **Runtimes.** The node queues run on the Tokio runtime of the first call. Calls from
/// another runtime are served while that one runs (a multi-thread runtime always does). If it
/// is a current-thread runtime left idle outside `block_on`, such calls fail after twice
/// `node_timeout` with a node error that says so, instead of waiting for it; if it shut down,
/// the next call starts the queues again on the caller's runtime.
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), redfence::Error> {
/// let redlock = redfence::Redlock::builder()
///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
///     .build()?;
///
/// let mut lock = redlock.acquire(&["invoice:4821"], Duration::from_secs(5)).await?;
/// // ... work, checking `lock.remaining()` ...
/// lock.extend(Duration::from_secs(5)).await?;
/// lock.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Redlock {
    shared: Arc<Shared>,
}

impl Redlock {
    pub(crate) fn from_shared(shared: Shared) -> Self {
        Redlock {
            shared: Arc::new(shared),
        }
    }

    /// What every clone shares (for the modules that declare `Redlock` methods of their own:
    /// [`Redlock::election`] in `election/builder.rs`).
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// How many nodes there are.
    pub fn node_count(&self) -> usize {
        self.shared.nodes.len()
    }

    /// How many nodes must grant a lock: `node_count() / 2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum::quorum(self.shared.nodes.len())
    }

    /// Acquires a lock on every resource in `resources` (all or none) for `ttl`, retrying
    /// on contention and node failures as the builder configured (`retry_count`, the backoff
    /// schedule, `acquire_timeout`).
    ///
    /// The lock is valid for `ttl` minus the time the winning attempt took and the clock-drift
    /// allowance; see [`Lock::expires_at`]. If fencing is configured, the lock carries a fresh
    /// token ([`Lock::fence`]).
    ///
    /// Calls for the same resources on this `Redlock` wait in line, first come first served:
    /// only the first asks the nodes, and it retries as soon as a release reaches it (from
    /// this process at once, from another one once a majority of nodes reported it), or
    /// after its retry delay. Each retry delay spent further back in line uses up a retry.
    /// With [`fair`](crate::RedlockBuilder::fair) the line extends across processes. See the
    /// README's "Hot resources".
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidInput`] for no, empty or duplicate resources, more than
    ///   [`MAX_RESOURCES`](crate::MAX_RESOURCES), a name the fencing counter cannot store, or a
    ///   TTL that is below
    ///   1 ms, not above the drift allowance, or above [`MAX_TTL`](crate::MAX_TTL); nothing is sent.
    /// - [`Error::Contended`] when another owner still held it after the last retry.
    /// - [`Error::QuorumUnreachable`] when too many nodes failed in the last attempt.
    /// - [`Error::NoValidity`] when the last attempt reached a majority too late.
    /// - [`Error::AcquireTimeout`] when `acquire_timeout` ran out first.
    /// - [`Error::Fencing`] when the fencing counter could not issue a token.
    /// - [`Error::Closed`] after [`close`](Self::close).
    ///
    /// Whatever the error, nothing is left locked: a failed attempt releases on every node
    /// that did not refuse it. It waits for the answers still due until one `node_timeout`
    /// after it started, and for its release on the nodes that answered; on a node that did
    /// not (hung), the release is queued behind the acquire and finishes in the background
    /// ([`close`](Self::close) waits for it). So a hung node costs a failed attempt at most
    /// about one `node_timeout`. A call dropped before it returns (e.g. under
    /// `tokio::time::timeout`) releases in the background.
    pub async fn acquire(
        &self,
        resources: &[impl AsRef<str>],
        ttl: Duration,
    ) -> Result<Lock, Error> {
        self.acquire_traced(resources, ttl, true, identity).await
    }

    /// Makes exactly one attempt to acquire a lock; the same as [`acquire`](Self::acquire)
    /// without retries. It does not wait in line behind other callers (in fair mode it still
    /// respects the nodes' queues: a waiter ahead makes it [`Error::Contended`]).
    pub async fn try_acquire(
        &self,
        resources: &[impl AsRef<str>],
        ttl: Duration,
    ) -> Result<Lock, Error> {
        self.acquire_traced(resources, ttl, false, identity).await
    }

    /// `acquire` (with `retry`) or `try_acquire`, in a `redfence.acquire` span, with metrics;
    /// `shape` adjusts the validated request (a primitive's own locks: see [`Target`]).
    pub(crate) async fn acquire_traced(
        &self,
        resources: &[impl AsRef<str>],
        ttl: Duration,
        retry: bool,
        shape: impl FnOnce(Target) -> Target,
    ) -> Result<Lock, Error> {
        let shared = &self.shared;
        let acquire = async |tries: &mut Tries, ty: &mut TypeLabel| {
            let target = shape(shared.target(resources, ttl)?);
            *ty = TypeLabel::of_lock(&shared.config.resource_type, &target.resources);
            acquisition::acquire(shared, &target, tries, retry).await
        };
        self.traced(resources, TypeLabel::other(), retry, acquire)
            .await
    }

    /// The one wrapper of every acquisition of a lock (a mutex, a slot, a line, a read-write
    /// lock's side): `acquire` in a `redfence.acquire` span over `resources`, its outcome and
    /// fence recorded there and in the metrics, under the type label `acquire` leaves in `ty`
    /// (`ty` until then); with `retries`, its retries and the time waited between attempts
    /// too.
    pub(crate) async fn traced(
        &self,
        resources: &[impl AsRef<str>],
        mut ty: TypeLabel,
        retries: bool,
        acquire: impl AsyncFnOnce(&mut Tries, &mut TypeLabel) -> Result<Acquired, Error>,
    ) -> Result<Lock, Error> {
        let span = trace::acquire_span(resources, self.quorum());
        let started = clock::now();
        let mut tries = Tries::default();
        let result = acquire(&mut tries, &mut ty)
            .instrument(span.clone())
            .await
            .map(|acquired| Lock::new(acquired, ty.clone()));
        trace::outcome(&span, result.as_ref().map(|_| "acquired"), started);
        if let Ok(lock) = &result {
            trace::fence(&span, lock.fence());
        }
        let took = clock::since(started);
        crate::metrics::acquisition(&ty, result.as_ref().map(|_| ()), took, &tries);
        if retries && tries.attempts > 0 {
            crate::metrics::acquisition_retries(&ty, tries.attempts - 1, tries.backoff);
        }
        result
    }

    /// Runs `routine` while holding a lock on `resources`: acquires it (with the configured
    /// retries), keeps it alive in the background while the routine runs, and releases it
    /// when the routine is done.
    ///
    /// The routine gets a [`Signal`] that says whether the lock is still held. It **aborts as
    /// soon as ownership can no longer be guaranteed**: when extension rounds failed and the
    /// remaining validity fell below `automatic_extension_threshold` (so that much time is
    /// left to stop cleanly), when a majority of nodes answered that the lock is no longer
    /// ours, when the validity ran out for any other reason (e.g. a starved runtime), or when
    /// a renewal bound was reached.
    ///
    /// # Extension
    ///
    /// Extension rounds start shortly before the remaining validity falls below
    /// `automatic_extension_threshold` (default 500 ms): up to a threshold earlier, and at
    /// most half-way through the time above it for short TTLs. A failed round is retried
    /// quickly while more than the threshold is left: retries start every
    /// `min(threshold / 5, node_timeout)`, or at once after a round that took longer (keep
    /// `node_timeout` well below the threshold so that several rounds fit). Each successful
    /// round re-extends the lock to the full `ttl` on a majority ([`Event::Extended`](crate::Event::Extended)); each
    /// failed one is reported as [`Event::ExtensionFailed`](crate::Event::ExtensionFailed) with every node's error. After an
    /// abort the lock is no longer extended.
    ///
    /// # Bounded renewal
    ///
    /// With [`max_extensions`](crate::RedlockBuilder::max_extensions) or
    /// [`max_hold`](crate::RedlockBuilder::max_hold) set, extension stops once the bound is
    /// reached, and the signal aborts with [`Error::RenewalLimit`] when the next extension
    /// would have been needed: when the remaining validity falls below the threshold.
    ///
    /// `max_hold` is a hard bound on the lock's life, on this client's clock: an extension is
    /// made only if the lease it asks for, counted from the start of its round, ends within
    /// `max_hold` of the acquisition's start, and a `ttl` above `max_hold` is refused
    /// ([`InvalidInput::TtlAboveMaxHold`](crate::InvalidInput::TtlAboveMaxHold)). So the
    /// signal aborts *before* `max_hold` has passed — up to one `ttl` before it, with the
    /// threshold left on the last lease — and never after. If the routine keeps going, the
    /// lock expires on its own by `max_hold`; it is still released at the end. A node counts a
    /// key's TTL from when the request reached it, on its own clock: the keys themselves may
    /// outlive `max_hold` by the last round's latency and the clocks' drift.
    ///
    /// # Cancellation model
    ///
    /// Cancellation is **cooperative**: the library never drops the routine. The routine
    /// decides when to look — [`Signal::check`] before each irreversible step, or
    /// `tokio::select!` on [`Signal::aborted`] to stop at once:
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redfence::{Error, Redlock};
    ///
    /// # async fn copy_next_chunk() -> Result<bool, Error> { Ok(false) }
    /// # async fn run(redlock: Redlock) -> Result<(), Error> {
    /// redlock
    ///     .using(&["export:daily"], Duration::from_secs(10), |signal| async move {
    ///         loop {
    ///             tokio::select! {
    ///                 // Lost: stop here; the chunk in flight is dropped.
    ///                 err = signal.aborted() => return Err(err),
    ///                 more = copy_next_chunk() => if !more? { return Ok(()) },
    ///             }
    ///         }
    ///     })
    ///     .await
    /// # }
    /// # fn main() { let _ = run; }
    /// ```
    ///
    /// The lock is released when the routine returns `Ok` or `Err`, and when it panics (the
    /// lock is released, then the panic resumes). If the future returned by `using` is
    /// dropped (the caller cancelled it), the extension task stops and releases the lock in
    /// the background at once. No task, timer or connection of this call outlives it: when
    /// `using` returns, the extension task has ended and every node has answered the release
    /// or timed out.
    ///
    /// Even so, a lock is a lease, not a proof: send [`Signal::fence`] with every write to
    /// storage that rejects stale fences.
    ///
    /// # Errors
    ///
    /// The routine's own result or error is returned unchanged. A failed release does not
    /// hide it: it is reported as [`Event::ReleaseFailed`](crate::Event::ReleaseFailed) (and logged), and the keys expire
    /// at the end of their TTL. Errors of `using` itself go through `E::from`:
    ///
    /// - [`Error::InvalidInput`] for anything [`acquire`](Self::acquire) rejects, and for a
    ///   `ttl` not above `automatic_extension_threshold` plus its drift allowance
    ///   ([`InvalidInput::TtlNotAboveThreshold`](crate::InvalidInput::TtlNotAboveThreshold)), or above `max_hold`
    ///   ([`InvalidInput::TtlAboveMaxHold`](crate::InvalidInput::TtlAboveMaxHold)); nothing is sent and the routine never runs.
    /// - Any error of [`acquire`](Self::acquire) (`Contended`, `QuorumUnreachable`,
    ///   `AcquireTimeout`, `Fencing`, ...); the routine never runs.
    ///
    /// # Panics
    ///
    /// Resumes the routine's panic, after releasing the lock. Panics when called outside a
    /// Tokio runtime (the extension task is spawned on it).
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redfence::{Error, Redlock};
    ///
    /// # struct Invoice;
    /// # async fn load_invoice(_: u32) -> Result<Invoice, Error> { Ok(Invoice) }
    /// # async fn post_to_ledger(_: &Invoice, _: Option<u64>) -> Result<u64, Error> { Ok(1) }
    /// # async fn run() -> Result<(), Error> {
    /// let redlock = Redlock::builder()
    ///     .nodes(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    ///     .build()?;
    ///
    /// let entry = redlock
    ///     .using(&["invoice:4821"], Duration::from_secs(5), |signal| async move {
    ///         let invoice = load_invoice(4821).await?;
    ///         signal.check()?; // stop before the irreversible step if ownership is gone
    ///         post_to_ledger(&invoice, signal.fence()).await
    ///     })
    ///     .await?;
    /// # let _ = entry;
    /// # Ok(())
    /// # }
    /// # fn main() { let _ = run; }
    /// ```
    pub async fn using<T, E, F, Fut>(
        &self,
        resources: &[impl AsRef<str>],
        ttl: Duration,
        routine: F,
    ) -> Result<T, E>
    where
        F: FnOnce(Signal) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let span = trace::using_span(resources, self.quorum());
        let started = clock::now();
        let scope = async {
            let config = &self.shared.config;
            let policy = using::Policy::checked(config, ttl);
            let lock = match policy {
                Ok(policy) => self
                    .acquire_traced(resources, ttl, true, identity)
                    .await
                    .map(|lock| (lock, policy)),
                Err(error) => Err(error.into()),
            };
            let (lock, policy) = match lock {
                Ok(acquired) => acquired,
                Err(error) => {
                    trace::outcome(&span, Err(&error), started);
                    return Err(E::from(error));
                }
            };
            trace::fence(&span, lock.fence());
            let tasks = &self.shared.tasks;
            let release = using::Release::Awaited;
            let result = using::scope_with(lock, policy, config, tasks, release, routine).await;
            let outcome = if result.is_ok() {
                "done"
            } else {
                "routine_error"
            };
            trace::outcome(&span, Ok(outcome), started);
            result
        };
        scope.instrument(span.clone()).await
    }

    /// Reads what every node holds at the keys of `resources`: per node, whether each key
    /// exists, a short prefix of the holder's token and its remaining TTL (or the node's
    /// error); [`Inspection::views`] then gives the quorum view of each resource, e.g. "held
    /// by one owner on 4/5 nodes, ~12.3 s left".
    ///
    /// The report is **advisory**: a snapshot taken outside the lock protocol, stale as soon
    /// as it returns. Use it to look, never to decide whether to write.
    ///
    /// ```no_run
    /// # async fn run(redlock: redfence::Redlock) -> Result<(), redfence::Error> {
    /// let report = redlock.inspect(&["invoice:4821"]).await?;
    /// for view in report.views() {
    ///     println!("{}: {view}", view.resource); // e.g. "held by one owner (1f0c9a2e) on 3/3 nodes, ~4.2 s left"
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for no, empty or duplicate resources, more than
    /// [`MAX_RESOURCES`](crate::MAX_RESOURCES), or, with a Redis Cluster voter, resources in
    /// different hash slots ([`InvalidInput::KeysAcrossSlots`](crate::InvalidInput::KeysAcrossSlots):
    /// inspect them one call each), before any traffic. A node that fails is reported in the
    /// [`Inspection`], not as an error.
    pub async fn inspect(&self, resources: &[impl AsRef<str>]) -> Result<Inspection, Error> {
        inspect::read(&self.shared, resources, false).await
    }

    /// Deletes the keys of `resources` on every node **whoever holds them**, and reports what
    /// each node held just before (the same report as [`inspect`](Self::inspect)): the
    /// operator's break-glass for a lock whose owner is gone for good.
    ///
    /// **Dangerous.** If the owner is still running, another process can now take the lock
    /// while it works: two owners at once. Only fencing ([`crate::FencingCounter`]), with
    /// storage that rejects stale tokens, keeps that safe. A node that failed still holds its
    /// key until it expires; the lock is free once a majority has deleted it.
    ///
    /// It also deletes each key's fair queue and waiting mark (a fair holder stays at the head
    /// of its queue until its own release, which this stands in for) and announces the
    /// release, so that waiters retry at once; the first to retry then heads the queue on
    /// that node. On a Cluster voter, or with an ACL that does not cover those keys, only the
    /// lock keys are deleted.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`], as for [`inspect`](Self::inspect), before any traffic.
    pub async fn force_release(&self, resources: &[impl AsRef<str>]) -> Result<Inspection, Error> {
        let report = inspect::read(&self.shared, resources, true).await?;
        tracing::warn!(resources = ?report.resources, deleted = report.present(), "forced release");
        Ok(report)
    }

    /// Reads every node's `maxmemory-policy` and `run_id` and reports them. Each node whose
    /// policy may evict lock keys before their TTL (anything but `noeviction`) is also
    /// reported as [`Event::EvictionPolicy`](crate::Event::EvictionPolicy) and logged as a
    /// warning: an evicted lock key lets a second owner in. A node that is the same server as
    /// an earlier one (the same `run_id` at another address, which `build()` cannot see: a
    /// Sentinel group and its master's own URL, two proxies) is reported in
    /// [`NodeCheck::same_server_as`] and as [`Event::SameServer`](crate::Event::SameServer),
    /// logged as an error: its vote counts twice. Call it once at start-up; it sends one
    /// `INFO memory` and one `INFO server` per node, each bounded by the node timeout, and
    /// never fails as a whole (a node that cannot be read says why in its [`NodeCheck`]).
    ///
    /// ```no_run
    /// # async fn run(redlock: redfence::Redlock) {
    /// for node in redlock.check().await {
    ///     if node.may_evict_locks() {
    ///         eprintln!("node {} may evict lock keys: {:?}", node.addr, node.maxmemory_policy);
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn check(&self) -> Vec<NodeCheck> {
        inspect::check(&self.shared).await
    }

    /// Shuts the lock manager down gracefully: refuses new acquisitions from now on (they fail
    /// with [`Error::Closed`], in every clone), then waits for the background work already
    /// started — releases of dropped locks and of abandoned attempts, and calls still running
    /// on slow nodes — each of which is bounded by the node timeout; and for the releases a node
    /// has not confirmed. A release whose call timed out or lost its connection is sent to that
    /// node again (after a reconnect if need be) until a call carrying it is answered or its
    /// lock's TTL has passed, so on a node that stays unreachable `close` may wait up to the
    /// longest TTL of the locks released there (bound it with `tokio::time::timeout` if
    /// shutdown must be quicker).
    ///
    /// Call it before the process exits, after dropping or releasing its locks: without it,
    /// `main` can return before a dropped lock's release has run, and the other replicas
    /// then wait out the TTL. On a current-thread runtime this matters even more: its tasks
    /// run only while it is in `block_on`, so background releases (a dropped lock's, those of
    /// a failed attempt on nodes that did not answer) and requests still queued for a node are
    /// never sent once the last `block_on` has returned; `close` is where they go out. Locks
    /// still held stay usable (extend, release) after `close`, and `using()` scopes already
    /// running go on to their end.
    ///
    /// ```no_run
    /// # async fn run(redlock: redfence::Redlock) -> Result<(), redfence::Error> {
    /// let lock = redlock.acquire(&["nightly-report"], std::time::Duration::from_secs(30)).await?;
    /// drop(lock); // released in the background...
    /// redlock.close().await; // ...and done by now
    /// # Ok(())
    /// # }
    /// ```
    pub async fn close(&self) {
        self.shared.close();
        self.shared.tasks.close();
        self.shared.tasks.wait().await;
        // Then whatever is still queued for each node (calls nobody waits for any more).
        futures::future::join_all(self.shared.nodes.iter().map(|node| node.flush())).await;
    }
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<&str> = self.shared.nodes.iter().map(|n| n.addr()).collect();
        f.debug_struct("Redlock")
            .field("nodes", &nodes)
            .field("config", &self.shared.config)
            .finish()
    }
}

#[cfg(test)]
mod tests;
