//! What waits on a node's queue beside a lock call's answer: an advisory call's answer, a
//! flush, a release's wait for room in a full queue, and the watchdog of a queue served on a
//! current-thread runtime.

use std::future::Future;
use std::sync::{Arc, PoisonError};

use futures::future::BoxFuture;
use tokio::sync::oneshot;

use super::{Queue, StartedQueue};
use crate::error::NodeFailure;
use crate::node::batch::{Job, Run};
use crate::node::{Advice, Advisory, Request, stopped};

impl Queue {
    /// The queue requests go to now, if one was started.
    fn current(&self) -> Option<Arc<StartedQueue>> {
        match self.started.get() {
            Some(first) if !first.is_closed() => Some(Arc::clone(first)),
            _ => self
                .restarted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }

    /// Queues `advisory`, a call outside the lock protocol ([`Node::advise`]), in line with
    /// the lock calls: it runs after every call made before it.
    pub(crate) fn advise(
        &self,
        advisory: Advisory,
    ) -> BoxFuture<'static, Result<Advice, NodeFailure>> {
        let queued = self.with_started(|started| {
            let answer = started.submit_advice(advisory)?;
            Ok::<_, NodeFailure>((answer, started.watched().then(|| Arc::clone(started))))
        });
        Box::pin(async move {
            match queued?? {
                (answer, Some(started)) => started.watched_answer(answer).await,
                (answer, None) => answer.await.unwrap_or_else(|_| Err(stopped())),
            }
        })
    }

    /// Resolves once every request queued before it has run ([`Node::flush`]).
    pub(crate) fn flush(&self) -> BoxFuture<'static, ()> {
        let started = self.current();
        Box::pin(async move {
            if let Some(started) = started {
                started.flush().await;
            }
        })
    }
}

impl StartedQueue {
    /// Waits for `answer` with the watchdog of [`served`](StartedQueue::served), for callers of
    /// a [`watched`](StartedQueue::watched) queue (the others simply await `answer`).
    pub(crate) async fn watched_answer<T>(
        &self,
        answer: oneshot::Receiver<Result<T, NodeFailure>>,
    ) -> Result<T, NodeFailure> {
        match self.served(answer).await {
            Some(Ok(reply)) => reply,
            Some(Err(_)) => Err(stopped()),
            None => Err(NodeFailure::NotRun(
                "the node's request queue runs on another Tokio runtime, which is not \
                 running (a current-thread runtime outside block_on?)",
            )),
        }
    }

    /// `wait`, given up (`None`) once twice `node_timeout` has passed without the serving
    /// task taking a request or finishing a call: the serving task's current-thread runtime
    /// may be idle, outside `block_on`, while the caller runs on another runtime, and then
    /// nothing serves the queue. A queue that keeps serving others is waited for, however
    /// long. (Twice: a call the node does not answer is the queue's to time out, after
    /// `node_timeout`, and to answer with the timeout together with every request queued
    /// behind it; a watchdog that fired first would let the caller's next request slip in
    /// behind the hung call.)
    async fn served<F: Future>(&self, wait: F) -> Option<F::Output> {
        tokio::pin!(wait);
        loop {
            match tokio::time::timeout(self.node_timeout, &mut wait).await {
                Ok(out) => return Some(out),
                Err(_) if self.progress.age() >= self.node_timeout.saturating_mul(2) => {
                    return None;
                }
                Err(_) => {}
            }
        }
    }

    /// Queues `advisory`; the answer arrives once it has run (or failed).
    fn submit_advice(
        &self,
        advisory: Advisory,
    ) -> Result<oneshot::Receiver<Result<Advice, NodeFailure>>, NodeFailure> {
        let (reply, answer) = oneshot::channel();
        self.try_send(Job::Advise { advisory, reply })?;
        Ok(answer)
    }

    /// Queues a release or a leave that found the queue full as soon as there is room, behind
    /// everything queued before it (its acquire among them; the channel's waiting senders are
    /// served in order): never refused, as its keys or its place would outlive it, and sent
    /// even if its caller stops waiting for the reply (which arrives as
    /// [`submit`](Self::submit)'s).
    pub(crate) fn submit_when_room(
        &self,
        req: Request,
    ) -> oneshot::Receiver<Result<i64, NodeFailure>> {
        let (reply, answer) = oneshot::channel();
        let job = Job::Run(Run::new(req, reply));
        let jobs = self.jobs.clone();
        tokio::spawn(async move {
            // A queue that stopped answers the reply's sender with its drop: `stopped`.
            let _ = jobs.send(job).await;
        });
        answer
    }

    /// Resolves once every request queued before it has run (or failed); on a watched queue
    /// that nothing serves, once the watchdog gives up.
    pub(crate) async fn flush(&self) {
        let flush = async {
            let (done, flushed) = oneshot::channel();
            if self.jobs.send(Job::Flush(done)).await.is_ok() {
                let _ = flushed.await;
            }
        };
        if self.watched {
            self.served(flush).await;
        } else {
            flush.await;
        }
    }
}
