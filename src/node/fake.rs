//! Fake nodes for unit tests: each one grants, denies, fails, is slow, never answers, or keeps
//! keys in memory like a Redis server would (with expiry on Tokio's clock, so a paused clock
//! drives it). Like a node's queue, a fake runs each request when the call is made (so in the
//! order the calls were made, and whether or not its caller waits for the answer) and bounds
//! each call itself (its node timeout); the answer comes as its behaviour says. What a
//! node's queue does besides (batching, what a hung call does to the calls behind it) is
//! tested in `pipeline.rs` and on real servers: these test the quorum logic.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::batch::error_reply;
use super::{Advice, Advisory, Claim, GuardedWrite, KeyRow, Node, NodeCall, Op, Request, advice};
use crate::error::NodeFailure;

/// How a fake node answers one kind of request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Fake {
    /// Runs the script on the node's in-memory keys, as Redis would.
    Real,
    /// Answers 1 whatever the keys.
    Grant,
    /// Answers 0 (refused).
    Deny,
    /// Answers an error reply.
    Fail,
    /// Grants after a delay.
    Slow(Duration),
    /// Never answers.
    Never,
}

/// A fake node: a behaviour per kind of request (by default its acquire behaviour, and
/// [`Fake::Real`] for extend and release), a log of the calls it was asked to run, and its
/// keys.
pub(crate) struct FakeNode {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    behaviour: Mutex<HashMap<Op, Fake>>,
    /// The scripts it was asked to run, in order.
    seen: Mutex<Vec<Op>>,
    /// key -> (token, expires at)
    keys: Mutex<HashMap<String, (String, Instant)>>,
    /// What `INFO memory` says of `maxmemory_policy`.
    eviction: Mutex<String>,
    /// Guarded writes (the election's record) never answer.
    writes_hang: std::sync::atomic::AtomicBool,
    /// How long a call may take before it fails with a time-out, as a node's queue bounds the
    /// call in flight.
    timeout: Mutex<Duration>,
}

/// A fake's node timeout until [`FakeNode::set_timeout`] says otherwise.
pub(crate) const FAKE_TIMEOUT: Duration = Duration::from_millis(50);

impl FakeNode {
    /// A node that answers acquires as `acquire` says and runs extends and releases for real.
    pub(crate) fn new(acquire: Fake) -> Self {
        let node = FakeNode {
            inner: Arc::default(),
        };
        node.set_eviction_policy("noeviction");
        node.set_timeout(FAKE_TIMEOUT);
        node.set(Op::Acquire, acquire);
        node.set(Op::Extend, Fake::Real);
        node.set(Op::Release, Fake::Real);
        node
    }

    /// From now on, answers `op` as `behaviour` says.
    pub(crate) fn set(&self, op: Op, behaviour: Fake) {
        if let Ok(mut b) = self.inner.behaviour.lock() {
            b.insert(op, behaviour);
        }
    }

    /// From now on, fails a call with a time-out once it has taken `timeout`.
    pub(crate) fn set_timeout(&self, timeout: Duration) {
        if let Ok(mut t) = self.inner.timeout.lock() {
            *t = timeout;
        }
    }

    /// Answers every kind of request as `behaviour` says.
    pub(crate) fn set_all(&self, behaviour: Fake) {
        for op in [Op::Acquire, Op::Extend, Op::Release] {
            self.set(op, behaviour);
        }
    }

    /// The scripts it was asked to run, in order.
    pub(crate) fn calls(&self) -> Vec<Op> {
        self.inner
            .seen
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// The token at `key`, if it holds one that has not expired.
    pub(crate) fn holder(&self, key: &str) -> Option<String> {
        let keys = self.inner.keys.lock().ok()?;
        keys.get(key)
            .filter(|(_, expires)| *expires > Instant::now())
            .map(|(token, _)| token.clone())
    }

    /// Makes guarded writes (the election's record) never answer.
    pub(crate) fn hang_writes(&self) {
        self.inner
            .writes_hang
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Makes the node report `policy` as its `maxmemory-policy`.
    pub(crate) fn set_eviction_policy(&self, policy: &str) {
        if let Ok(mut p) = self.inner.eviction.lock() {
            *p = policy.to_owned();
        }
    }

    /// Puts `token` at `key` for `ttl`, as another client would.
    pub(crate) fn put(&self, key: &str, token: &str, ttl: Duration) {
        if let Ok(mut keys) = self.inner.keys.lock() {
            keys.insert(key.to_owned(), (token.to_owned(), Instant::now() + ttl));
        }
    }
}

impl Inner {
    fn run(&self, req: &Request) -> i64 {
        let Ok(mut keys) = self.keys.lock() else {
            return 0;
        };
        let now = Instant::now();
        keys.retain(|_, (_, expires)| *expires > now);
        let ours = |k: &String, keys: &HashMap<String, (String, Instant)>| {
            keys.get(k).map(|(t, _)| t.as_str()) == Some(&*req.token)
        };
        let ttl = Duration::from_millis(req.ttl_ms);
        match req.op {
            Op::Acquire => {
                if req
                    .keys
                    .iter()
                    .any(|k| keys.contains_key(k) && !ours(k, &keys))
                {
                    return 0;
                }
                for k in req.keys.iter() {
                    keys.insert(k.clone(), (req.token.to_string(), now + ttl));
                }
                req.keys.len() as i64
            }
            Op::Extend => {
                if !req.keys.iter().all(|k| ours(k, &keys)) {
                    return 0;
                }
                for k in req.keys.iter() {
                    keys.insert(k.clone(), (req.token.to_string(), now + ttl));
                }
                req.keys.len() as i64
            }
            Op::Leave => 0,
            Op::Release => {
                let mine: Vec<String> = req
                    .keys
                    .iter()
                    .filter(|k| ours(k, &keys))
                    .cloned()
                    .collect();
                for k in &mine {
                    keys.remove(k);
                }
                mine.len() as i64
            }
        }
    }
}

impl FakeNode {
    fn inspect(
        &self,
        keys: Arc<[String]>,
        delete: bool,
    ) -> BoxFuture<'static, Result<Vec<KeyRow>, NodeFailure>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            let mut held = inner
                .keys
                .lock()
                .map_err(|_| error_reply("poisoned".to_owned()))?;
            let now = Instant::now();
            held.retain(|_, (_, expires)| *expires > now);
            // As scripts/inspect.lua: a string longer than that is not read (no value).
            const MAX_READ: usize = 4096;
            let rows = keys
                .iter()
                .map(|k| match held.get(k) {
                    Some((token, expires)) => (
                        "string".to_owned(),
                        (token.len() <= MAX_READ).then(|| token.clone().into_bytes()),
                        i64::try_from((*expires - now).as_millis()).unwrap_or(i64::MAX),
                    ),
                    None => ("none".to_owned(), None, -2),
                })
                .collect();
            if delete {
                for k in keys.iter() {
                    held.remove(k);
                }
            }
            Ok(rows)
        })
    }

    fn write_if_held(&self, write: &GuardedWrite) -> BoxFuture<'static, Result<bool, NodeFailure>> {
        let inner = Arc::clone(&self.inner);
        let write = write.clone();
        Box::pin(async move {
            if inner.writes_hang.load(std::sync::atomic::Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            let Ok(mut keys) = inner.keys.lock() else {
                return Ok(false);
            };
            let now = Instant::now();
            keys.retain(|_, (_, expires)| *expires > now);
            if keys.get(&*write.lock_key).map(|(t, _)| t.as_str()) != Some(&*write.token) {
                return Ok(false);
            }
            match &write.value {
                Some(value) => {
                    let expires = now + Duration::from_millis(write.ttl_ms);
                    keys.insert(write.key.to_string(), (value.to_string(), expires));
                }
                None => {
                    keys.remove(&*write.key);
                }
            }
            Ok(true)
        })
    }

    fn claim(&self, claim: &Claim) -> BoxFuture<'static, Result<String, NodeFailure>> {
        let inner = Arc::clone(&self.inner);
        let claim = claim.clone();
        Box::pin(async move {
            let mut keys = inner
                .keys
                .lock()
                .map_err(|_| error_reply("poisoned".to_owned()))?;
            let now = Instant::now();
            keys.retain(|_, (_, expires)| *expires > now);
            let expires = now + Duration::from_millis(claim.ttl_ms);
            let entry = keys
                .entry(claim.key.to_string())
                .or_insert_with(|| (claim.value.to_string(), expires));
            if entry.0 == *claim.value {
                entry.1 = expires;
            }
            Ok(entry.0.clone())
        })
    }

    fn eviction_policy(&self) -> BoxFuture<'static, Result<String, NodeFailure>> {
        let policy = self
            .inner
            .eviction
            .lock()
            .map(|p| p.clone())
            .unwrap_or_default();
        Box::pin(async move { Ok(policy) })
    }
}

impl Node for FakeNode {
    fn call(&self, req: &Request) -> NodeCall {
        let behaviour = self
            .inner
            .behaviour
            .lock()
            .ok()
            .and_then(|b| b.get(&req.op).copied())
            .unwrap_or(Fake::Real);
        let timeout = self
            .inner
            .timeout
            .lock()
            .map(|t| *t)
            .unwrap_or(FAKE_TIMEOUT);
        if let Ok(mut seen) = self.inner.seen.lock() {
            seen.push(req.op);
        }
        // Run now, when the call is made, as a node's queue takes it in order: what a lock
        // sends later runs after it, and it runs even if its caller stops waiting. The answer
        // comes as the behaviour says.
        let ran = match behaviour {
            Fake::Real => Some(self.inner.run(req)),
            Fake::Slow(_) => Some(self.inner.run(req).max(1)),
            _ => None,
        };
        let call = async move {
            match behaviour {
                Fake::Grant => Ok(1),
                Fake::Deny => Ok(0),
                Fake::Fail => Err(error_reply("injected".to_owned())),
                Fake::Slow(d) => {
                    tokio::time::sleep(d).await;
                    Ok(ran.unwrap_or(1))
                }
                Fake::Real => Ok(ran.unwrap_or(0)),
                Fake::Never => std::future::pending().await,
            }
        };
        NodeCall::boxed(async move {
            tokio::time::timeout(timeout, call)
                .await
                .unwrap_or(Err(NodeFailure::Timeout(timeout)))
        })
    }

    fn advise(&self, advisory: Advisory) -> BoxFuture<'static, Result<Advice, NodeFailure>> {
        match advisory {
            Advisory::Inspect { keys, delete } => advice(self.inspect(keys, delete), Advice::Keys),
            Advisory::WriteIfHeld(write) => advice(self.write_if_held(&write), Advice::Written),
            Advisory::EvictionPolicy => advice(self.eviction_policy(), Advice::EvictionPolicy),
            Advisory::RunId => Box::pin(async { Ok(Advice::RunId(None)) }),
            Advisory::Claim(claim) => advice(self.claim(&claim), Advice::Claimed),
            // Fakes hold no read-write lock.
            Advisory::RwInspect { .. } => {
                Box::pin(async { Ok(Advice::RwKeys((None, -2, Vec::new(), None, -2))) })
            }
        }
    }

    fn addr(&self) -> &str {
        "fake"
    }
}

/// Fake nodes with these acquire behaviours, both as fakes (to steer and inspect) and as the
/// `Node`s a `Redlock` or a round runs over.
pub(crate) fn fakes(behaviours: &[Fake]) -> (Vec<Arc<FakeNode>>, Vec<Arc<dyn Node>>) {
    let fakes: Vec<Arc<FakeNode>> = behaviours
        .iter()
        .map(|b| Arc::new(FakeNode::new(*b)))
        .collect();
    let nodes = fakes
        .iter()
        .map(|f| Arc::clone(f) as Arc<dyn Node>)
        .collect();
    (fakes, nodes)
}
