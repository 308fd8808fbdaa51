//! One batched script call of a node's queue: the requests it carries (capped by
//! operations, keys and bytes), the [`Link`] it is sent over (for a server, the one `EVALSHA`
//! of `scripts/batch.lua` they become, over the node's multiplexed connection, with its
//! `NOSCRIPT` reload and one retry after a lost connection), and each request's own reply.

use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{Cmd, Script, Value};
use tokio::sync::oneshot;
use tokio::time::Sleep;

use super::{Advice, Advisory, Op, Reply, Request};
use crate::error::{Class, NodeFailure};

const BATCH_SOURCE: &str = include_str!("../../scripts/batch.lua");
/// The batch script, for the links that send it.
pub(crate) static BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(BATCH_SOURCE));

/// How long a link to a voter found through others (a Cluster, a Sentinel group) keeps its
/// connection while calls on it go unanswered, before it looks for the server again (a new
/// slot map; the sentinels asked again). Within this window every call to a hung server goes
/// on the connection that carries the calls before it, so a server that resumes runs a lock's
/// release after its acquire; a connection made anew could run first.
pub(crate) const PATIENCE: Duration = Duration::from_secs(5);

/// What a node's queue sends its batches over: one kind per kind of voter (a server's
/// connection, a Cluster's slots, a Sentinel group's master). The queue sends one batch at a
/// time, in order, and a link keeps that order on the server: a batch given up at its deadline
/// stays ahead of the next one (it went on the same connection first).
pub(crate) trait Link: Send + 'static {
    /// Sends `runs` (in this order) and returns each one's reply, or `Err` when the call as a
    /// whole failed; a call not answered by `deadline` (set `timeout` after the call started)
    /// is a [`NodeFailure::Timeout`].
    fn send<'a>(
        &'a mut self,
        runs: &'a [Run],
        timeout: Duration,
        deadline: Pin<&'a mut Sleep>,
    ) -> impl Future<Output = Result<Replies, NodeFailure>> + Send + 'a;

    /// Whether a call that timed out means the whole voter is hung (one server), so that the
    /// queue answers every call waiting behind it at once; `false` for a voter of several
    /// servers (a Cluster), where one member that hangs says nothing of the others.
    fn hangs_whole(&self) -> bool {
        true
    }

    /// Makes `advisory`, a call outside the lock protocol, on the same connection as the
    /// batches (after those sent before it); the queue bounds it with its deadline.
    fn advise<'a>(
        &'a mut self,
        advisory: &'a Advisory,
    ) -> impl Future<Output = Result<Advice, NodeFailure>> + Send + 'a;
}

/// A batch's replies, one per request, in order.
pub(crate) enum Replies {
    /// Every request answered (one script call).
    All(Vec<Value>),
    /// Each request's own outcome (a batch split over several servers, some of which failed;
    /// a pipeline of plain commands and script calls).
    Each(Vec<Result<Value, NodeFailure>>),
}

/// The most operations one batched call carries.
pub(crate) const MAX_OPS: usize = 512;
/// The most keys one batched call carries (an operation with more keys goes alone).
pub(crate) const MAX_KEYS: usize = 4_096;
/// The most bytes of key names, tokens and waiter ids one batched call carries (an operation
/// with more goes alone).
pub(crate) const MAX_BYTES: usize = 1 << 20;
/// What a node's queue carries: a request and where its reply goes, or a marker that answers
/// once everything queued before it has run.
pub(super) enum Job {
    Run(Run),
    Flush(oneshot::Sender<()>),
    /// An advisory call, sent alone in its place in line.
    Advise {
        advisory: Advisory,
        reply: oneshot::Sender<Result<Advice, NodeFailure>>,
    },
}

/// One request, queued and in a batch.
pub(crate) struct Run {
    pub(crate) req: Request,
    /// `None` once the caller has been answered (it waited behind a hung call, or its call
    /// was given up and the request is resent).
    pub(super) reply: Option<Reply>,
    /// A release or leave given up (its call timed out or its connection was lost) is resent
    /// until this instant, its lock's TTL after it was first given up: it must reach the
    /// node, even after a reconnect. `None` for a request never given up.
    pub(super) resend_until: Option<Instant>,
}

impl Run {
    /// `req`, whose caller waits for its reply at `reply`.
    pub(super) fn new(req: Request, reply: Reply) -> Run {
        Run {
            req,
            reply: Some(reply),
            resend_until: None,
        }
    }

    /// `req` given up, its caller answered: sent again until `until`.
    pub(super) fn resent(req: Request, until: Instant) -> Run {
        Run {
            req,
            reply: None,
            resend_until: Some(until),
        }
    }

    /// A request nobody waits for, for tests of how a batch is written.
    #[cfg(test)]
    pub(super) fn unanswered(req: Request) -> Run {
        Run {
            req,
            reply: None,
            resend_until: None,
        }
    }
}

/// Requests and jobs for the node layer's unit tests.
#[cfg(test)]
pub(super) mod test_jobs {
    use std::sync::Arc;

    use tokio::sync::oneshot;

    use super::{Job, Run};
    use crate::error::NodeFailure;
    use crate::node::{Op, Request};

    /// A one-key request, the key named after the token (`key-{token}`), TTL 1 s.
    pub(in crate::node) fn request(op: Op, token: &str) -> Request {
        Request {
            op,
            keys: Arc::from(vec![format!("key-{token}")]),
            token: Arc::from(token),
            ttl_ms: 1_000,
            queue: None,
            rw: None,
        }
    }

    /// [`request`] as a queued job, and where its reply arrives.
    pub(in crate::node) fn job(
        op: Op,
        token: &str,
    ) -> (Job, oneshot::Receiver<Result<i64, NodeFailure>>) {
        let (reply, answer) = oneshot::channel();
        (Job::Run(Run::new(request(op, token), reply)), answer)
    }
}

/// The requests of one call, and the markers that wait for it.
#[derive(Default)]
pub(super) struct Batch {
    runs: Vec<Run>,
    flushes: Vec<oneshot::Sender<()>>,
    keys: usize,
    bytes: usize,
}

/// The bytes of names and ids a request adds to a call.
fn size(req: &Request) -> usize {
    req.keys.iter().map(String::len).sum::<usize>()
        + req.token.len()
        + req.queue.as_deref().map_or(0, |q| q.waiter.len())
        + req.rw.as_deref().map_or(0, |rw| rw.waiter.len())
}

impl Batch {
    /// Adds `job` whatever its size: the first of a batch (one larger than the caps goes
    /// alone).
    pub(super) fn push(&mut self, job: Job) {
        let _ = self.add(job, true);
    }

    /// Starts the next batch with `job`, as [`push`](Self::push), keeping the last batch's
    /// allocations (a queue under load runs thousands of batches a second). The last batch
    /// was answered ([`run`](Self::run) or [`fail`](Self::fail)).
    pub(super) fn start(&mut self, job: Job) {
        debug_assert!(self.runs.is_empty() && self.flushes.is_empty());
        self.keys = 0;
        self.bytes = 0;
        self.push(job);
    }

    /// Adds `job` if it fits within the caps; gives it back if not.
    pub(super) fn try_push(&mut self, job: Job) -> Result<(), Job> {
        self.add(job, false)
    }

    fn add(&mut self, job: Job, always: bool) -> Result<(), Job> {
        match job {
            Job::Run(run) => {
                let keys = self.keys + run.req.keys.len();
                let bytes = self.bytes + size(&run.req);
                if !always && (keys > MAX_KEYS || bytes > MAX_BYTES) {
                    return Err(Job::Run(run));
                }
                self.keys = keys;
                self.bytes = bytes;
                self.runs.push(run);
            }
            Job::Flush(done) => self.flushes.push(done),
            // Never in a batch: the queue sends it alone.
            advise @ Job::Advise { .. } => return Err(advise),
        }
        Ok(())
    }

    pub(super) fn full(&self) -> bool {
        self.runs.len() >= MAX_OPS || self.keys >= MAX_KEYS || self.bytes >= MAX_BYTES
    }

    /// Sends the batch over `link` and answers each request; `Err` when the call as a whole
    /// failed or `deadline` (set `timeout` after the call starts) passed first (the requests
    /// are then still to be answered, by [`fail`](Self::fail)). `Ok(false)` when some
    /// requests failed alone (a batch split over several servers): each is answered with its
    /// failure and its release or leave handed to `resend` as [`fail`](Self::fail) says; the
    /// batch's flush markers then wait in `flushes` if anything is to be sent again.
    pub(super) async fn run<L: Link>(
        &mut self,
        link: &mut L,
        timeout: Duration,
        deadline: Pin<&mut Sleep>,
        resend: &mut Vec<Job>,
        flushes: &mut Vec<oneshot::Sender<()>>,
    ) -> Result<bool, NodeFailure> {
        let mut whole = true;
        if !self.runs.is_empty() {
            match link.send(&self.runs, timeout, deadline).await? {
                Replies::All(values) => {
                    check_count(values.len(), self.runs.len())?;
                    for (run, value) in self.runs.drain(..).zip(values) {
                        if let Some(reply) = run.reply {
                            let _ = reply.send(parse(value));
                        }
                    }
                }
                Replies::Each(outcomes) => {
                    check_count(outcomes.len(), self.runs.len())?;
                    for (run, outcome) in self.runs.drain(..).zip(outcomes) {
                        match outcome {
                            Ok(value) => {
                                if let Some(reply) = run.reply {
                                    let _ = reply.send(parse(value));
                                }
                            }
                            Err(failure) => {
                                whole = false;
                                fail_run(run, &failure, resend);
                            }
                        }
                    }
                }
            }
        }
        if whole || resend.is_empty() {
            self.answer_flushes();
        } else {
            flushes.append(&mut self.flushes);
        }
        Ok(whole)
    }

    /// Answers every request of a batch whose call failed with `failure`, and hands back the
    /// releases and fair queue leaves to send again (see [`Run::resend_until`]): the call may not have
    /// reached the node (a lost connection), or may yet be lost with its connection (a time-out),
    /// and a lock key must not outlive its release. Only after a time-out or a connection
    /// failure: a reply that refuses the call (no permission, no script) is final. The batch's
    /// flush markers are not answered: they go to `flushes`, to be answered once nothing is left
    /// to send again (a flush must not pass a release queued before it).
    pub(super) fn fail(
        &mut self,
        failure: &NodeFailure,
        resend: &mut Vec<Job>,
        flushes: &mut Vec<oneshot::Sender<()>>,
    ) {
        for run in self.runs.drain(..) {
            fail_run(run, failure, resend);
        }
        flushes.append(&mut self.flushes);
    }

    fn answer_flushes(&mut self) {
        for done in self.flushes.drain(..) {
            let _ = done.send(());
        }
    }
}

/// Which keys a batch may touch besides the lock keys themselves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Touch {
    /// The lock keys and their helper keys (waiting marks, fair queues) and the release
    /// channel: a server, a Sentinel group's master.
    WithHelpers,
    /// The lock keys only (the script's `-` mode): a Cluster voter, where a helper key lies
    /// in another hash slot (which Valkey 9 refuses in a script) and waiters poll.
    KeysOnly,
}

/// `runs` as one `EVALSHA` of `scripts/batch.lua`: every operation's keys, then every
/// operation's arguments (kind, token, TTL, key count, and the fair queue's three for `f`, `l`
/// and `R`), written straight into one command buffer (no allocation per argument). Written
/// into `script`, whose allocation the next batch reuses.
pub(super) fn write_script<'r>(
    runs: impl Iterator<Item = &'r Run> + Clone,
    touch: Touch,
    script: &mut Cmd,
) {
    write_call(
        runs,
        touch,
        script,
        ("EVALSHA", BATCH.get_hash()),
        false,
        None,
    );
}

/// `runs` as one `EVAL` of the batch script's source: what a server that does not have the
/// script yet runs, and keeps (see [`write_script`]).
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(super) fn write_eval<'r>(
    runs: impl Iterator<Item = &'r Run> + Clone,
    touch: Touch,
    script: &mut Cmd,
) {
    write_call(runs, touch, script, ("EVAL", BATCH_SOURCE), false, None);
}

/// `runs` as one call of the batch script (`command` `body`: `EVALSHA` and its hash, or
/// `EVAL` and its source), written into `script`.
///
/// With `repair`, extensions are sent as "E" (extend, and set again a key that is missing:
/// see [`RedlockBuilder::restart_quarantine`](crate::RedlockBuilder::restart_quarantine));
/// otherwise as "e" (extend only). With a `marker` key, the call ends with an "m": the
/// server's memory marker, read in the same call (its reply comes last).
pub(crate) fn write_call<'r>(
    runs: impl Iterator<Item = &'r Run> + Clone,
    touch: Touch,
    script: &mut Cmd,
    (command, body): (&str, &str),
    repair: bool,
    marker: Option<&str>,
) {
    let keys: usize = runs.clone().map(|run| run.req.keys.len()).sum();
    script.clear();
    script
        .arg(command)
        .arg(body)
        .arg(keys + usize::from(marker.is_some()));
    for run in runs.clone() {
        for key in run.req.keys.iter() {
            script.arg(key.as_str());
        }
    }
    if let Some(marker) = marker {
        script.arg(marker);
    }
    if touch == Touch::KeysOnly {
        script.arg("-");
    }
    for Run { req, .. } in runs {
        write_args(script, req, repair);
    }
    if marker.is_some() {
        script.arg("m").arg("").arg(0).arg(1);
    }
}

/// Writes `req`'s arguments in a call of the batch script: its kind, token, TTL and key count,
/// then what its kind takes besides: a fair line's waiter, ticket and lease; a read-write
/// lock's waiter id and waiting-mark time.
fn write_args(script: &mut Cmd, req: &Request, repair: bool) {
    let command = req.command();
    script
        .arg(command.script_kind(repair))
        .arg(&*req.token)
        .arg(req.ttl_ms)
        .arg(req.keys.len());
    if command.in_line() {
        let (waiter, ticket, lease) = req
            .queue
            .as_deref()
            .map_or(("", 0, 0), |q| (&*q.waiter, q.ticket, q.lease_ms));
        script.arg(waiter).arg(ticket).arg(lease);
    }
    if let Some(rw) = req.rw.as_deref() {
        script.arg(&*rw.waiter).arg(rw.wait_ms);
    }
}

/// Answers `run` with `failure` and, after a failure that may pass (`Class::retried`), hands its
/// release or leave to `resend` (see [`Batch::fail`]).
fn fail_run(run: Run, failure: &NodeFailure, resend: &mut Vec<Job>) {
    if let Some(reply) = run.reply {
        let _ = reply.send(Err(failure.clone()));
    }
    if !failure.class().retried() || !matches!(run.req.op, Op::Release | Op::Leave) {
        return;
    }
    // A release until its lock's keys expire; a leave until its waiter's lease ends.
    let ttl_ms = match (run.req.op, run.req.queue.as_deref()) {
        (Op::Leave, Some(place)) => place.lease_ms,
        _ => run.req.ttl_ms,
    };
    let until = run.resend_until.unwrap_or_else(|| resend_deadline(ttl_ms));
    if crate::clock::now() < until {
        resend.push(Job::Run(Run::resent(run.req, until)));
    }
}

/// Until when a release or leave given up now is sent again: `ttl_ms` from now (its lock's TTL,
/// or its waiter's lease: its keys or its place are gone by then anyway); at least a second.
fn resend_deadline(ttl_ms: u64) -> Instant {
    let now = crate::clock::now();
    let ttl = Duration::from_millis(ttl_ms).max(Duration::from_secs(1));
    now.checked_add(ttl)
        .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365))
}

/// Runs `command` (an `EVALSHA` of the batch script), loading the script first when the
/// server does not have it (`NOSCRIPT`: first use, a restart, a `SCRIPT FLUSH`).
pub(crate) async fn evalsha(
    command: &Cmd,
    connection: &mut impl ConnectionLike,
) -> redis::RedisResult<Vec<Value>> {
    match command.query_async(connection).await {
        Err(err) if Class::of(&err) == Class::NoScript => {
            BATCH.load_async(connection).await?;
            command.query_async(connection).await
        }
        other => other,
    }
}

pub(super) fn check_count(replies: usize, requests: usize) -> Result<(), NodeFailure> {
    if replies == requests {
        Ok(())
    } else {
        Err(count_mismatch(replies, requests))
    }
}

pub(super) fn count_mismatch(replies: usize, requests: usize) -> NodeFailure {
    NodeFailure::UnexpectedReply(format!(
        "{replies} replies to a batch of {requests} requests"
    ))
}

/// An operation's error, as the batch script (or a plain command) replied it: that request's
/// own answer, final.
pub(crate) fn error_reply(detail: String) -> NodeFailure {
    NodeFailure::Reply(redis::RedisError::from((
        redis::ErrorKind::Extension,
        "error reply",
        detail,
    )))
}

/// One operation's reply: its integer, or the error of that operation alone.
fn parse(value: Value) -> Result<i64, NodeFailure> {
    let error = error_reply;
    match value {
        Value::Int(n) => Ok(n),
        Value::BulkString(bytes) => Err(error(
            String::from_utf8_lossy(&bytes)
                .trim_start_matches("E:")
                .to_owned(),
        )),
        Value::SimpleString(text) => Err(error(text.trim_start_matches("E:").to_owned())),
        Value::ServerError(err) => Err(NodeFailure::from(redis::RedisError::from(err))),
        other => Err(error(format!("unexpected reply {other:?}"))),
    }
}

#[cfg(test)]
mod tests;
