//! One server's link under its queue: the batch as one `EVALSHA` of `scripts/batch.lua` over
//! the server's [`ServerConnection`], or, on a server with compare-and-delete, one pipeline of
//! plain commands and script calls ([`plain`](super::plain)); the server's identity read
//! when it is due; a Sentinel source asked again once calls went unanswered for [`PATIENCE`].

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, Value};
use tokio::time::Sleep;

use super::batch::{
    BATCH, Link, PATIENCE, Replies, Run, Touch, check_count, count_mismatch, evalsha, write_call,
};
use super::plain::{self, PlainSupport, Plan};
use super::{Advice, Advisory, Op, advisory};
use crate::connection::{Connection, ServerConnection};
use crate::error::{Class, NodeFailure};
use crate::memory::identity::{Due, Identity};

/// One server's link: the batch as one `EVALSHA` over its [`ServerConnection`], or, on a
/// server with compare-and-delete, as one pipeline of plain commands and script calls (see
/// [`plain`](super::plain)); the server's [`Identity`] read when it is due (first call,
/// lost connection, `NOSCRIPT`, every second).
///
/// A master that hangs is kept: its connection carries the calls made before, and a call
/// sent now goes behind them, so when it resumes a release runs after its acquire. Only once
/// calls have gone unanswered for [`PATIENCE`] is a Sentinel source asked again (the
/// sentinels may have promoted a replica by then); the connection is replaced only if they
/// name another server. A direct source keeps its connection, which redis-rs reconnects.
pub(super) struct ServerLink {
    connection: Arc<ServerConnection>,
    identity: Arc<Identity>,
    /// The call being sent, kept for the next batch's (its allocation reused).
    script: Cmd,
    /// What the server has, for the connection of this generation; `None` when plain
    /// commands are turned off (`RedlockBuilder::native_commands`).
    support: Option<(u64, Option<PlainSupport>)>,
    /// The pipeline being sent, kept for the next batch's.
    plan: Plan,
    /// The connection's generation and since when calls on it have gone unanswered.
    stalled: Option<(u64, tokio::time::Instant)>,
    /// Whether the last call went unanswered (timed out, or its connection was lost): an
    /// extension sent then does not repair a missing key. It may run long after, when the
    /// server resumes, after its lock ended and its release was given up, and would set the
    /// key again for a whole TTL.
    hung: bool,
}

impl ServerLink {
    pub(super) fn new(
        connection: Arc<ServerConnection>,
        native_commands: bool,
        identity: Arc<Identity>,
    ) -> Self {
        ServerLink {
            connection,
            identity,
            script: Cmd::new(),
            support: native_commands.then_some((0, None)),
            plan: Plan::default(),
            stalled: None,
            hung: false,
        }
    }

    /// What the server behind `conn` has: asked once per connection.
    async fn support(&mut self, conn: &mut Connection) -> PlainSupport {
        let Some((generation, support)) = &mut self.support else {
            return PlainSupport::default();
        };
        if let Some(support) = support
            && *generation == conn.generation()
        {
            return *support;
        }
        let detected = match conn.req_packed_command(&plain::detection()).await {
            Ok(command_info) => PlainSupport::detected(&command_info),
            // Lost on the way: ask again on the next call.
            Err(err) if Class::of(&err) == Class::Lost => {
                return PlainSupport::default();
            }
            Err(_) => PlainSupport::default(),
        };
        *generation = conn.generation();
        *support = Some(detected);
        detected
    }

    /// Sends `runs` as one pipeline of plain commands and script calls ([`Plan`]), then what
    /// follows their contended ones, while `deadline` allows.
    async fn send_plain(
        &mut self,
        mut conn: Connection,
        support: PlainSupport,
        runs: &[Run],
        mut deadline: Pin<&mut Sleep>,
        timeout: Duration,
    ) -> Result<Replies, NodeFailure> {
        let mut plan = std::mem::take(&mut self.plan);
        plan.write(runs, support);
        // The memory marker last: a server flushed since it was last read counts no vote.
        let marker = marker_to_check(&self.identity, runs);
        if let Some((key, _)) = &marker {
            plan.pipeline.cmd("GET").arg(*key);
            plan.commands += 1;
        }
        let expected = marker.map(|(_, id)| id);
        let answered = async {
            // Every command is repeat-safe for its token, as the script is: once more after a
            // lost connection.
            let values = match conn
                .req_packed_commands(&plan.pipeline, 0, plan.commands)
                .await
            {
                Err(err) if Class::of(&err) == Class::Lost => {
                    tracing::debug!(%err, "connection lost; retrying the batch once");
                    self.identity.suspect();
                    conn = self.connection.connection().await?;
                    self.check_identity(&mut conn).await?;
                    conn.req_packed_commands(&plan.pipeline, 0, plan.commands)
                        .await?
                }
                other => other?,
            };
            check_count(values.len(), plan.commands)?;
            let values = self.without_marker(expected, values);
            Ok::<_, NodeFailure>(plan.read(runs, values))
        };
        let answered = tokio::select! {
            biased;
            answered = answered => answered,
            () = deadline.as_mut() => Err(NodeFailure::Timeout(timeout)),
        };
        // Read: the plan's allocations are kept for the next batch.
        self.plan = plan;
        let mut outcome = answered?;
        // A script the server no longer has: it may have restarted (plain commands before it
        // went through, but their votes are counted knowing the server's state).
        if outcome.noscript {
            self.identity.suspect();
            let checked = tokio::select! {
                biased;
                checked = self.check_identity(&mut conn) => checked,
                () = deadline.as_mut() => Err(NodeFailure::Timeout(timeout)),
            };
            checked?;
        }
        // Learnt before the refused commands run again in the script, so that a deadline
        // passing meanwhile (and the resent release) does not try the refused command again.
        if outcome.refused {
            self.learn(&conn, |support| *support = PlainSupport::default());
        }
        let again = async {
            // What runs again in the script runs after the whole pipeline: never a request
            // whose lock has a later request in the batch (its release, after a failed
            // attempt's acquire or after an extension), which already ran and must not be
            // overtaken (the key would be set again after its release). Such a request fails
            // instead: its lock is being released anyway.
            let overtakes = |index: usize| {
                let token = &runs[index].req.token;
                runs[index + 1..]
                    .iter()
                    .any(|later| later.req.token == *token)
            };
            // An extension refused by a plain command (the key missing, or another owner's)
            // runs again in the script, which sets a missing key again ("E") on a server out
            // of quarantine.
            let repair = self.repairs();
            if repair {
                for (index, run) in runs.iter().enumerate() {
                    if run.req.op == Op::Extend
                        && run.req.rw.is_none()
                        && matches!(outcome.replies[index], Some(Value::Int(0)))
                        && !outcome.again.contains(&index)
                        && !overtakes(index)
                    {
                        outcome.again.push(index);
                    }
                }
                outcome.again.sort_unstable();
            }
            // A plain command the server will take later (BUSY, LOADING) failed as a call
            // would have: a release there is sent again.
            let mut replies: Vec<Result<Value, NodeFailure>> = std::mem::take(&mut outcome.replies)
                .into_iter()
                .map(|reply| match reply {
                    Some(Value::ServerError(err)) if Class::of_code(err.code()).retried() => {
                        Err(NodeFailure::Reply(RedisError::from(err)))
                    }
                    reply => Ok(reply.unwrap_or(Value::Nil)),
                })
                .collect();
            outcome.again.retain(|&index| {
                let overtaken = overtakes(index);
                if overtaken {
                    replies[index] = Err(not_run_again());
                }
                !overtaken
            });
            if !outcome.again.is_empty() {
                let mut call = Cmd::new();
                let again = outcome.again.iter().map(|&i| &runs[i]);
                let (hash, touch) = (BATCH.get_hash(), Touch::WithHelpers);
                // A call of its own, after the pipeline's marker read: it reads the marker
                // again (a flush in between must not let its grants count).
                let marker =
                    marker_to_check(&self.identity, outcome.again.iter().map(|&i| &runs[i]));
                let key = marker.as_ref().map(|(key, _)| *key);
                write_call(again, touch, &mut call, ("EVALSHA", hash), repair, key);
                let expected = marker.map(|(_, id)| id);
                let values = evalsha(&call, &mut conn)
                    .await
                    .map(|values| self.without_marker(expected, values));
                match values {
                    Ok(values) if values.len() == outcome.again.len() => {
                        for (&i, value) in outcome.again.iter().zip(values) {
                            replies[i] = Ok(value);
                        }
                    }
                    other => {
                        let failure = match other {
                            Err(err) => NodeFailure::from(err),
                            Ok(values) => count_mismatch(values.len(), outcome.again.len()),
                        };
                        for &i in &outcome.again {
                            replies[i] = Err(failure.clone());
                        }
                    }
                }
            }
            replies
        };
        let replies = tokio::select! {
            biased;
            replies = again => Ok(replies),
            () = deadline.as_mut() => Err(NodeFailure::Timeout(timeout)),
        };
        let replies = replies?;
        if outcome.released && !outcome.refused {
            self.learn(&conn, |support| support.released = true);
        }
        // Best effort: a waiter that misses the mark or the message polls.
        if let Some((follow_up, commands)) = plain::follow_up(&outcome) {
            tokio::select! {
                biased;
                _ = conn.req_packed_commands(&follow_up, 0, commands) => {}
                () = deadline => {}
            }
        }
        Ok(Replies::Each(replies))
    }
}

impl ServerLink {
    /// Updates what is known of the server behind `conn`, if it is still the current one.
    fn learn(&mut self, conn: &Connection, update: impl FnOnce(&mut PlainSupport)) {
        if let Some((generation, Some(support))) = &mut self.support
            && *generation == conn.generation()
        {
            update(support);
        }
    }

    /// The script call, its identity check first when due, repeated once after a lost
    /// connection (every operation is repeat-safe for its token: redis-rs's connection
    /// reconnects after it) and run again after loading the script on `NOSCRIPT`. A lost
    /// connection or a `NOSCRIPT` may mean that the server restarted: its identity is read
    /// again before the call is repeated, so that extensions there repair only once it is out
    /// of quarantine, and the votes are counted knowing its state.
    async fn call(&mut self, runs: &[Run]) -> Result<Vec<Value>, NodeFailure> {
        let mut conn = self.connection.connection().await?;
        let beside = match self.identity.due() {
            Due::Before if counts_votes(runs) => {
                self.check_identity(&mut conn).await?;
                false
            }
            // Releases and leaves count no vote: they go at once, beside the check, so that
            // on a server that hangs they are in line behind the lock's earlier calls (an
            // extension there that repairs a key must not run after them).
            Due::Before | Due::Beside => true,
            Due::No => false,
        };
        let expected = self.write(runs);
        let result = if beside {
            // Pipelined on the multiplexed connection: one round trip for both.
            let side = conn.clone();
            let (result, ()) = tokio::join!(
                self.script.query_async::<Vec<Value>>(&mut conn),
                self.identity.check(&side)
            );
            result
        } else {
            self.script.query_async(&mut conn).await
        };
        let err = match result {
            Ok(replies) => return Ok(self.without_marker(expected, replies)),
            Err(err) => err,
        };
        let class = Class::of(&err);
        if !class.restart_sign() {
            return Err(err.into());
        }
        let noscript = class == Class::NoScript;
        self.identity.suspect();
        if noscript {
            // The script is loaded first (beside the identity check, in one round trip), so
            // that a call given up at its deadline still leaves it there for the next.
            let side = conn.clone();
            let (loaded, ()) =
                tokio::join!(BATCH.load_async(&mut conn), self.identity.check(&side));
            loaded?;
        } else {
            tracing::debug!(%err, "connection lost; retrying the batch once");
            conn = self.connection.connection().await?;
            self.identity.check(&conn).await;
        }
        let expected = self.write(runs);
        let replies = evalsha(&self.script, &mut conn).await?;
        Ok(self.without_marker(expected, replies))
    }

    /// Reads the server's identity on `conn`; after a failure (the connection was lost: a
    /// restart, most likely), once more on the connection made again, which `conn` becomes.
    /// A server whose identity is still unknown after that is quarantined until it is read
    /// (see `Identity::quarantined`).
    async fn check_identity(&self, conn: &mut Connection) -> Result<(), NodeFailure> {
        self.identity.check(conn).await;
        if self.identity.due() == Due::Before {
            *conn = self.connection.connection().await?;
            self.identity.check(conn).await;
        }
        Ok(())
    }

    /// Writes `runs` as the call to send, repairing where the server is out of quarantine,
    /// and reading the server's memory marker where `runs` ask for votes (see
    /// [`marker_to_check`]); the marker id expected, if it is read.
    fn write(&mut self, runs: &[Run]) -> Option<String> {
        let repair = self.repairs();
        let marker = marker_to_check(&self.identity, runs);
        write_call(
            runs.iter(),
            Touch::WithHelpers,
            &mut self.script,
            ("EVALSHA", BATCH.get_hash()),
            repair,
            marker.as_ref().map(|(key, _)| *key),
        );
        marker.map(|(_, id)| id)
    }

    /// The batch's `replies`, less the marker's (the last) when `expected` was read, which
    /// the identity notes.
    fn without_marker(&self, expected: Option<String>, mut replies: Vec<Value>) -> Vec<Value> {
        if let Some(expected) = expected {
            let marker = replies.pop();
            self.identity.marker_read(&expected, marker.as_ref());
        }
        replies
    }
}

impl Link for ServerLink {
    async fn advise<'a>(&'a mut self, advisory: &'a Advisory) -> Result<Advice, NodeFailure> {
        let mut conn = self.connection.connection().await?;
        advisory::run(&mut conn, advisory).await
    }

    async fn send<'a>(
        &'a mut self,
        runs: &'a [Run],
        timeout: Duration,
        mut deadline: Pin<&'a mut Sleep>,
    ) -> Result<Replies, NodeFailure> {
        // As plain commands where the server has them, else as the script call.
        let result = async {
            let mut asked = None;
            if self.support.is_some() {
                let ready = async {
                    let mut conn = self.connection.connection().await?;
                    // Plain commands meet no NOSCRIPT after a restart: the identity is read
                    // before them whenever it is due.
                    if self.identity.due() != Due::No && counts_votes(runs) {
                        self.check_identity(&mut conn).await?;
                    }
                    let support = self.support(&mut conn).await;
                    Ok::<_, NodeFailure>((conn, support))
                };
                let (conn, support) = tokio::select! {
                    biased;
                    ready = ready => ready?,
                    () = deadline.as_mut() => return Err(NodeFailure::Timeout(timeout)),
                };
                if support.any_plain(runs) {
                    return self
                        .send_plain(conn, support, runs, deadline, timeout)
                        .await;
                }
                asked = Some(conn);
            }
            let replies = tokio::select! {
                biased;
                replies = self.call(runs) => replies?,
                () = deadline => return Err(NodeFailure::Timeout(timeout)),
            };
            if let Some(conn) = asked
                && runs.iter().any(|run| run.req.op == Op::Release)
            {
                self.learn(&conn, |support| support.released = true);
            }
            Ok(Replies::All(replies))
        }
        .await;
        self.patience(&result);
        result
    }
}

impl ServerLink {
    /// Whether extensions sent now repair a missing key: on a server out of quarantine that
    /// answered the last call.
    fn repairs(&self) -> bool {
        self.identity.repairs() && !self.hung
    }

    /// Notes how a batch ended: a Sentinel source is asked again once calls on one
    /// connection have gone unanswered for [`PATIENCE`] (a timeout, batch after batch).
    fn patience(&mut self, result: &Result<Replies, NodeFailure>) {
        self.hung = result
            .as_ref()
            .is_err_and(|failure| matches!(failure.class(), Class::Unanswered | Class::Lost));
        if !self.connection.asks_again() {
            return;
        }
        match (result, self.connection.generation()) {
            (Err(NodeFailure::Timeout(_)), Some(generation)) => {
                let now = tokio::time::Instant::now();
                let since = match self.stalled {
                    Some((stalled, since)) if stalled == generation => since,
                    _ => now,
                };
                self.stalled = Some((generation, since));
                if now.duration_since(since) >= PATIENCE {
                    self.connection.renew(generation);
                }
            }
            _ => self.stalled = None,
        }
    }
}

/// Whether any of `runs` asks for a vote (an acquire or an extension): releases and leaves
/// are safe on any server, whatever its identity.
fn counts_votes(runs: &[Run]) -> bool {
    runs.iter()
        .any(|run| !matches!(run.req.op, Op::Release | Op::Leave))
}

/// The key and expected id of the memory marker to read in a batch of `runs` (see
/// `Identity::marker_read`): only a batch with an acquire reads it, so that a server flushed
/// since it was last read grants none of them. (An extension there finds its key gone, or
/// sets it again, and counts as no confirmation either way.)
fn marker_to_check<'a, 'r>(
    identity: &'a Identity,
    runs: impl IntoIterator<Item = &'r Run>,
) -> Option<(&'a str, String)> {
    runs.into_iter()
        .any(|run| run.req.op == Op::Acquire)
        .then(|| identity.marker_to_check())
        .flatten()
}

/// The failure of a request not run again in the script because a later request of its lock
/// already ran (see `send_plain`).
fn not_run_again() -> NodeFailure {
    NodeFailure::NotRun(
        "the script was not run for this request: a later request of the same lock (its \
         release) had already run on the node",
    )
}
