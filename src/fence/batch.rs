//! Group commit for fencing counters ([`Batcher`], [`IssueBatch`]): token requests that
//! arrive while one batch is in flight wait in a queue and go out together, in arrival order,
//! as the next batch. [`RedisCounter`](crate::RedisCounter) uses it, and so does
//! `redfence-postgres`'s `PostgresCounter`; a counter of your own may too.
//!
//! One background task per counter owns the sending: it takes the first request it finds,
//! drains whatever else is queued (up to [`MAX_BATCH`]), issues the batch with one call to
//! the counter's [`IssueBatch`], and answers every request of it. Nothing waits for a batch
//! to fill: a request that finds the task idle goes out at once, alone. The task is started
//! on the first request, in the caller's Tokio runtime, and ends when the counter (the only
//! holder of the queue's sender) is dropped.
//!
//! Failure model: a batch that fails or times out fails every request in it (each caller
//! then fails closed); a request whose caller is gone (timed out, dropped) before its batch
//! went out is skipped, and one that is dropped while its batch is in flight simply never
//! uses its token (a gap). After a batch timed out, [`IssueBatch::reset`] lets the counter
//! drop a connection that may be dead, so that the next batch reconnects.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{mpsc, oneshot};

use crate::error::BoxError;

/// The most requests one batch carries; the rest wait for the next one.
pub const MAX_BATCH: usize = 256;

/// Issues the tokens of one batch, for a counter that group-commits through a [`Batcher`].
///
/// ```
/// use futures::future::BoxFuture;
/// use redfence::BoxError;
/// use redfence::fence::IssueBatch;
///
/// /// One global sequence (illustration only: a real issuer commits the batch durably, in
/// /// one transaction, before it returns the tokens).
/// struct Sequence(std::sync::Mutex<u64>);
///
/// impl IssueBatch for Sequence {
///     fn issue<'a>(
///         &'a self,
///         requests: &'a [&'a [String]],
///     ) -> BoxFuture<'a, Result<Vec<u64>, BoxError>> {
///         Box::pin(async move {
///             let mut last = self.0.lock().map_err(|_| "poisoned")?;
///             let first = *last + 1;
///             *last += requests.len() as u64;
///             Ok((first..=*last).collect())
///         })
///     }
/// }
/// ```
pub trait IssueBatch: Send + Sync + 'static {
    /// One token per request, in the order given: `requests[i]` are the resource names of
    /// request `i` (at least one, no duplicates). Tokens of requests that share a resource
    /// increase in that order, and every token is greater than every token issued before for
    /// any of its resources. All or nothing: on error no token of the batch is used.
    fn issue<'a>(
        &'a self,
        requests: &'a [&'a [String]],
    ) -> BoxFuture<'a, Result<Vec<u64>, BoxError>>;

    /// Called after a batch took longer than the timeout: forget a connection that may be
    /// dead, so that the next batch makes a new one. The default does nothing.
    fn reset(&self) {}
}

/// An error shared by every request of a failed batch.
#[derive(Clone)]
struct SharedError(Arc<dyn std::error::Error + Send + Sync>);

impl fmt::Debug for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for SharedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for SharedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

struct Request {
    names: Vec<String>,
    reply: oneshot::Sender<Result<u64, SharedError>>,
}

/// The queue of a counter's token requests, and its background task: the group commit of
/// [`RedisCounter`](crate::RedisCounter), for a [`FencingCounter`](crate::FencingCounter) of
/// your own over an [`IssueBatch`].
///
/// One background task per batcher sends one batch at a time through the issuer; requests
/// that arrive meanwhile go together in the next one (up to [`MAX_BATCH`]), in arrival
/// order. Nothing waits for a batch to fill. The task starts on the first request, in the
/// caller's Tokio runtime, and ends when the batcher is dropped. A batch that fails, or takes
/// longer than the batcher's timeout, fails every request in it (after a timeout
/// [`IssueBatch::reset`] is called); a request whose caller gave up before its batch went out
/// is skipped.
///
/// ```
/// use std::time::Duration;
/// use futures::future::BoxFuture;
/// use redfence::fence::{Batcher, IssueBatch};
/// use redfence::{BoxError, FencingCounter};
///
/// # struct Sequence(std::sync::Mutex<u64>);
/// # impl IssueBatch for Sequence {
/// #     fn issue<'a>(&'a self, requests: &'a [&'a [String]]) -> BoxFuture<'a, Result<Vec<u64>, BoxError>> {
/// #         Box::pin(async move {
/// #             let mut last = self.0.lock().map_err(|_| "poisoned")?;
/// #             let first = *last + 1;
/// #             *last += requests.len() as u64;
/// #             Ok((first..=*last).collect())
/// #         })
/// #     }
/// # }
/// struct GroupCommitted(Batcher<Sequence>);
///
/// impl FencingCounter for GroupCommitted {
///     fn next_fence<'a>(&'a self, resources: &'a [String]) -> BoxFuture<'a, Result<u64, BoxError>> {
///         Box::pin(self.0.request(resources.to_vec()))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), BoxError> {
/// let issuer = Sequence(std::sync::Mutex::new(0));
/// let counter = GroupCommitted(Batcher::new(issuer, "sequence counter", Duration::from_secs(1)));
/// assert_eq!(counter.next_fence(&["a".to_owned()]).await?, 1);
/// # Ok(())
/// # }
/// ```
pub struct Batcher<I> {
    issuer: Arc<I>,
    /// Who issues the tokens, for messages (e.g. "PostgreSQL fencing counter").
    name: &'static str,
    timeout: Duration,
    queue: Mutex<Option<mpsc::UnboundedSender<Request>>>,
}

impl<I> fmt::Debug for Batcher<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batcher")
            .field("name", &self.name)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl<I: IssueBatch> Batcher<I> {
    /// A batcher over `issuer`, each batch bounded by `timeout`; `name` says who issues the
    /// tokens in error messages (e.g. `"PostgreSQL fencing counter"`). Starts no task yet.
    pub fn new(issuer: I, name: &'static str, timeout: Duration) -> Self {
        Batcher {
            issuer: Arc::new(issuer),
            name,
            timeout,
            queue: Mutex::new(None),
        }
    }

    /// The issuer, e.g. to read its configuration.
    pub fn issuer(&self) -> &I {
        &self.issuer
    }

    /// Queues a request for `names` (at least one, no duplicates: the issuer's contract) and
    /// waits for its token. Unbounded in time beyond the batch's own timeout: the caller
    /// bounds it (and may drop it at any point; its token, if issued, is then skipped).
    ///
    /// # Errors
    ///
    /// The batch failed or timed out, or there is no Tokio runtime to run the batch task on.
    pub async fn request(&self, names: Vec<String>) -> Result<u64, BoxError> {
        let (reply, answer) = oneshot::channel();
        self.enqueue(Request { names, reply })?;
        match answer.await {
            Ok(Ok(token)) => Ok(token),
            Ok(Err(err)) => Err(Box::new(err)),
            Err(_) => Err(format!(
                "{}: its background task ended before answering (its Tokio runtime shut down?)",
                self.name
            )
            .into()),
        }
    }

    fn enqueue(&self, request: Request) -> Result<(), BoxError> {
        let mut queue = self
            .queue
            .lock()
            .map_err(|_| format!("{}: its queue's mutex is poisoned", self.name))?;
        let request = match queue.as_ref() {
            Some(sender) => match sender.send(request) {
                Ok(()) => return Ok(()),
                // The task is gone (the runtime it ran on shut down): start another.
                Err(mpsc::error::SendError(request)) => request,
            },
            None => request,
        };
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| format!("{}: needs a Tokio runtime", self.name))?;
        let (sender, receiver) = mpsc::unbounded_channel();
        sender
            .send(request)
            .map_err(|_| format!("{}: its new queue is closed", self.name))?;
        runtime.spawn(run(
            Arc::clone(&self.issuer),
            receiver,
            self.name,
            self.timeout,
        ));
        *queue = Some(sender);
        Ok(())
    }
}

/// The background task: one batch at a time, until the queue's sender is dropped.
async fn run<I: IssueBatch>(
    issuer: Arc<I>,
    mut queue: mpsc::UnboundedReceiver<Request>,
    name: &'static str,
    timeout: Duration,
) {
    let mut batch: Vec<Request> = Vec::new();
    while let Some(first) = queue.recv().await {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        // A caller that gave up before its batch went out needs no token.
        batch.retain(|request| !request.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        let result = issue(&*issuer, &batch, name, timeout).await;
        match result {
            Ok(tokens) => {
                for (request, token) in batch.drain(..).zip(tokens) {
                    // A caller dropped meanwhile: its token is skipped.
                    let _ = request.reply.send(Ok(token));
                }
            }
            Err(err) => {
                for request in batch.drain(..) {
                    let _ = request.reply.send(Err(err.clone()));
                }
            }
        }
    }
}

/// Issues one batch within `timeout`; exactly one token per request, or an error for all.
async fn issue<I: IssueBatch>(
    issuer: &I,
    batch: &[Request],
    name: &'static str,
    timeout: Duration,
) -> Result<Vec<u64>, SharedError> {
    let requests: Vec<&[String]> = batch.iter().map(|r| r.names.as_slice()).collect();
    let error = match tokio::time::timeout(timeout, issuer.issue(&requests)).await {
        Ok(Ok(tokens)) if tokens.len() == batch.len() => return Ok(tokens),
        Ok(Ok(tokens)) => format!(
            "{name}: a batch of {} requests got {} tokens",
            batch.len(),
            tokens.len()
        )
        .into(),
        Ok(Err(err)) => err,
        Err(_) => {
            issuer.reset();
            format!(
                "{name}: issuing a batch of {} tokens: no answer within {timeout:?}",
                batch.len()
            )
            .into()
        }
    };
    Err(SharedError(Arc::from(error)))
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use tokio::sync::Notify;

    /// Hands out 1, 2, 3 ... in order; the first batch waits until released, so that
    /// requests pile up behind it. Records each batch's size.
    #[derive(Default)]
    struct Fake {
        next: AtomicUsize,
        gate: Notify,
        entered: Notify,
        gated: AtomicBool,
        sizes: Mutex<Vec<usize>>,
        fail: AtomicBool,
    }

    impl IssueBatch for Fake {
        fn issue<'a>(
            &'a self,
            requests: &'a [&'a [String]],
        ) -> BoxFuture<'a, Result<Vec<u64>, BoxError>> {
            Box::pin(async move {
                self.entered.notify_one();
                if self.gated.swap(false, Ordering::SeqCst) {
                    self.gate.notified().await;
                }
                self.sizes.lock().expect("sizes").push(requests.len());
                if self.fail.load(Ordering::SeqCst) {
                    return Err("the store is read-only".into());
                }
                Ok(requests
                    .iter()
                    .map(|_| self.next.fetch_add(1, Ordering::SeqCst) as u64 + 1)
                    .collect())
            })
        }

        fn reset(&self) {}
    }

    fn names(r: &str) -> Vec<String> {
        vec![r.to_owned()]
    }

    #[tokio::test]
    async fn requests_behind_a_batch_in_flight_go_out_together_in_arrival_order() {
        let batcher = Arc::new(Batcher::new(
            Fake::default(),
            "fake",
            Duration::from_secs(5),
        ));
        batcher.issuer().gated.store(true, Ordering::SeqCst);
        let first = tokio::spawn({
            let b = Arc::clone(&batcher);
            async move { b.request(names("a")).await.ok() }
        });
        // The first batch is in flight, held at the gate.
        batcher.issuer().entered.notified().await;
        // One request queued behind it and cancelled before its batch goes out: skipped.
        let mut cancelled = Box::pin(batcher.request(names("a")));
        assert!(futures::poll!(&mut cancelled).is_pending());
        drop(cancelled);
        // Five more queue (polled in order), then the gate opens.
        let rest = futures::future::join_all((0..5).map(|_| batcher.request(names("a"))));
        let release = async { batcher.issuer().gate.notify_one() };
        let (rest, ()) = futures::join!(rest, release);
        assert_eq!(first.await.expect("task"), Some(1));
        let tokens: Vec<u64> = rest.into_iter().map(|t| t.expect("token")).collect();
        assert_eq!(tokens, vec![2, 3, 4, 5, 6]);
        assert_eq!(*batcher.issuer().sizes.lock().expect("sizes"), vec![1, 5]);
    }

    #[tokio::test]
    async fn a_failed_batch_fails_every_request_and_the_next_one_goes_out() {
        let batcher = Batcher::new(Fake::default(), "fake", Duration::from_secs(5));
        batcher.issuer().fail.store(true, Ordering::SeqCst);
        let err = batcher.request(names("a")).await.expect_err("fails");
        assert!(err.to_string().contains("read-only"), "{err}");
        batcher.issuer().fail.store(false, Ordering::SeqCst);
        assert_eq!(batcher.request(names("a")).await.ok(), Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_that_hangs_times_out() {
        let batcher = Batcher::new(Fake::default(), "fake", Duration::from_millis(100));
        batcher.issuer().gated.store(true, Ordering::SeqCst);
        let err = batcher.request(names("a")).await.expect_err("times out");
        assert!(err.to_string().contains("no answer within 100ms"), "{err}");
        assert_eq!(batcher.request(names("a")).await.ok(), Some(1));
    }

    #[tokio::test]
    async fn the_task_ends_when_the_batcher_is_dropped() {
        let batcher = Batcher::new(Fake::default(), "fake", Duration::from_secs(5));
        assert_eq!(batcher.request(names("a")).await.ok(), Some(1));
        let issuer = Arc::downgrade(&batcher.issuer);
        drop(batcher);
        // The task holds the only other reference: it is released when the task ends.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while issuer.strong_count() > 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the task is still running"
            );
            tokio::task::yield_now().await;
        }
    }
}
