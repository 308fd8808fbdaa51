//! Fencing tokens: numbers that only grow, issued once per acquisition by a durable counter,
//! so that the storage the work writes to can reject a stale owner.
//!
//! A lock alone is never enough for correctness: a worker paused past its lease (a GC pause,
//! CPU starvation, a slow network) wakes up and writes after the next owner. With fencing,
//! every acquisition gets a token greater than all earlier ones for its resources, the work
//! sends it with each write, and the storage rejects any write whose token is smaller than
//! the last one it accepted:
//!
//! ```text
//! A acquires "invoice:4821", fence 41 ... pauses past its TTL ...
//! B acquires "invoice:4821", fence 42, writes: storage records 42
//! B writes again with 42: 42 >= 42, accepted (the owner's own token)
//! A wakes up and writes with 41: 41 < 42, rejected (StaleFence) — A has lost ownership
//! ```
//!
//! Tokens are unique per acquisition *of a resource* (two unrelated resources may both be at
//! 5: compare a resource's tokens only with its own), so accepting the owner's own token again
//! is as safe as accepting each token once, and lets the owner write many times with one lock. The
//! PostgreSQL helpers of the `redfence-postgres` crate offer the once-per-acquisition check as
//! an option (`redfence_postgres::FenceCheck::Strict`).
//!
//! Configure a counter with [`RedlockBuilder::fencing`](crate::RedlockBuilder::fencing);
//! every lock then carries [`Lock::fence`](crate::Lock::fence).
//!
//! # When tokens are issued
//!
//! After a quorum granted the lock and before `acquire` (or `using`) returns, bounded by the
//! builder's `fencing_timeout` and the lock's remaining validity. Fail closed: if the counter errs,
//! does not answer in time, or answers after the lock expired, the lock is released on every
//! node and the caller gets [`Error::Fencing`](crate::Error::Fencing); no lock is ever handed
//! out without a token. Extending a lock keeps its token (ownership did not change).
//!
//! A multi-resource lock gets **one** token, greater than the last token of every resource
//! in it, so each of its resources sees a strictly increasing sequence.
//!
//! # Per resource or striped
//!
//! By default `RedisCounter` and `PostgresCounter` keep one counter (key, row) per resource.
//! Striped (`striped(`[`Stripes`]`)`), they keep S counters, a resource's tokens coming from
//! stripe [`Stripes::of`]`(resource)`, and issue a **range** of tokens per batch: one update
//! of a stripe issues every token of the batch on it, so a busy batch updates at most S
//! counters instead of one per resource. Tokens still increase for each resource (the
//! argument: [`Stripes`]); they grow faster, shared by the resources of a stripe. The two
//! modes must not serve one resource at once: `PostgresCounter` makes its per-resource mode
//! fail closed on a striped table, `RedisCounter` cannot, so switch all of its clients at once.
//!
//! # What each counter guarantees (the failure model)
//!
//! | counter | monotonic across | breaks when |
//! | --- | --- | --- |
//! | [`MemoryCounter`](crate::MemoryCounter) | one process's lifetime | the process restarts, or a second process issues tokens: **not durable** — tests and single-process use only |
//! | [`RedisCounter`](crate::RedisCounter) | one Redis primary's history of acknowledged writes | that primary loses a write: restart without `appendfsync always`, **failover** to an asynchronously replicated replica, restore from an older snapshot |
//! | `PostgresCounter` (crate `redfence-postgres`) | every committed transaction: survives crashes through the WAL, and failover with synchronous replication | the database itself loses committed transactions (`fsync = off`, asynchronous standby promoted, restore from an old backup) |
//!
//! `RedisCounter` and `PostgresCounter` **group-commit**: one call (a script call, a
//! statement) is in flight at a time, and requests that arrive meanwhile go together in the
//! next one, in arrival order; a request that finds nothing in flight goes out at once
//! ([`Batcher`], which a counter of your own may use too). The batches keep the guarantees
//! above, and fail like this:
//!
//! | event | effect |
//! | --- | --- |
//! | a batch commits | every request in it gets its token, after the commit; tokens of one resource increase in arrival order |
//! | a batch fails, or takes longer than the counter's `timeout` | every request in it fails, and each of those locks is released (fail closed) |
//! | a batch may have committed (a timeout, a lost connection) | its tokens are never handed out: gaps, never a repeat |
//! | a request's caller gives up before its batch goes out | the request is skipped |
//! | a request's caller gives up while its batch is in flight | its token is skipped; the other requests of the batch are unaffected |
//!
//! **On Redis failover** replication is asynchronous, so the promoted replica may lack the
//! last increments and issue those tokens again. The danger is an old owner holding a
//! token *greater* than the new owner's: A gets 42 from the old primary, which dies before
//! replicating it; B gets 41 from the new one and writes; A wakes up and writes with 42,
//! and the storage accepts it, overwriting B. A repeated *equal* token is just as bad: A and
//! B would both hold 42, and the storage accepts the owner's own token again, so both write
//! (the strict once-per-acquisition check only narrows that to "whoever writes first").
//! `appendfsync always` protects a single primary's crash, not a failover; `WAIT` narrows
//! the window, it does not close it. When that matters, use `PostgresCounter`, ideally in
//! the database the work writes to.
//!
//! **Everyone who locks a resource must share one counter**, and the counter's record of
//! each resource must never go back:
//!
//! - Every process (and every service) that locks `invoice:4821` must fence it through the
//!   same counter: the same PostgreSQL table in the same database (schema-qualify the table
//!   name when `search_path`s differ), or the same Redis server. Counters are named by the
//!   resource name, without the lock manager's key prefix: two services that lock the same
//!   keys through different prefixes must still name the same resources.
//! - **Never delete, truncate or expire** a counter's rows or keys (`redfence_fences`,
//!   `fence:{…}`), nor a fenced row's last token or a guard row: the next token (or the next
//!   accepted write) starts again from 1, and a stale owner holding 41 is accepted. They are
//!   one small row or key per resource; keep them.
//! - On PostgreSQL, keep `synchronous_commit` on for the counter's sessions (the default):
//!   with it off, a commit is acknowledged before it is durable, and a crash can hand out a
//!   token again. A connection the counter makes itself is checked, and refused when it is
//!   off.
//!
//! Whatever the counter, the guarantee ends at the storage: it must compare and record the
//! token atomically with the write (see the `redfence-postgres` crate for PostgreSQL
//! helpers; the same conditional write works in any store with compare-and-set). Targets
//! that **cannot check a token** — sending an email, calling an external API without
//! conditional writes, a device that executes commands directly — are not protected by
//! fencing at all: give them an **idempotency key** (e.g. the job id), route them through an
//! outbox committed with the fenced write, or serialize them through a single consumer.
//!
//! # Writing your own counter
//!
//! Implement [`FencingCounter`] over a store whose increments are durable and
//! linearizable once acknowledged. One global counter for all resources is valid too (it
//! is monotonic for every resource); one per resource lets unrelated resources proceed
//! without contending on one row or key; [`Stripes`] maps resources to a fixed number of
//! counters in between. To group-commit its requests as the built-in
//! counters do, implement [`IssueBatch`] and send them through a [`Batcher`]. A fenced-write
//! helper for your store can count its rejections with [`record_rejected_write`].

mod batch;
pub(crate) mod counter;
pub(crate) mod redis;
mod redis_stripes;
mod stripes;

pub use batch::{Batcher, IssueBatch, MAX_BATCH};
pub(crate) use counter::FencingCounter;
pub use stripes::Stripes;

use std::time::{Duration, Instant};

use crate::clock;
use crate::error::FencingError;
use crate::metrics::{self, TypeLabel};

/// Counts one write that a storage-side fence check refused as stale, in
/// `redfence_fence_rejected_total{type}` (feature `metrics`; without it, this does nothing).
///
/// For fenced-write helpers of any store, so that their rejections are counted with the
/// lock manager's own metrics: `redfence-postgres`'s `FenceGuards` and `FencedUpdate` call
/// it. `resource_type` is the label: the stale resource's type under the lock manager's
/// [`ResourceType`](crate::ResourceType) rule (`rule.of(resource)`), or a table name. Like
/// every `type` label it is cut to [`ResourceType::MAX_LEN`](crate::ResourceType::MAX_LEN)
/// bytes (empty is [`ResourceType::OTHER`](crate::ResourceType::OTHER)), and counts towards
/// the process's [`ResourceType::MAX_TYPES`](crate::ResourceType::MAX_TYPES) labels.
///
/// ```
/// use redfence::ResourceType;
///
/// // A write to invoice:4821 was refused: a newer owner has written.
/// redfence::fence::record_rejected_write(ResourceType::default().of("invoice:4821"));
/// ```
pub fn record_rejected_write(resource_type: &str) {
    metrics::fence_rejected(&TypeLabel::of_name(resource_type));
}

/// Asks `counter`, if any, for a token for a lock on `resources` valid until `expires_at`,
/// within that validity and `timeout` (the builder's `fencing_timeout`).
pub(crate) async fn issue_within(
    counter: Option<&dyn FencingCounter>,
    timeout: Duration,
    resources: &[String],
    expires_at: Instant,
) -> Result<Option<u64>, FencingError> {
    let Some(counter) = counter else {
        return Ok(None);
    };
    let remaining = expires_at.saturating_duration_since(clock::now());
    let limit = timeout.min(remaining);
    match tokio::time::timeout(limit, counter.next_fence(resources)).await {
        Ok(Ok(_)) | Err(_) if clock::now() >= expires_at => Err(FencingError::LockExpired),
        // The storage helpers refuse 0 (`lock.fence().unwrap_or(0)` without a counter), and
        // a check against a fresh row's 0 would accept it: not a token.
        Ok(Ok(0)) => Err(FencingError::counter(
            "the counter returned 0, which is not a token (tokens start at 1)",
        )),
        Ok(Ok(token)) => Ok(Some(token)),
        Ok(Err(error)) => Err(FencingError::counter(error)),
        Err(_) => Err(FencingError::Timeout(limit)),
    }
}
