//! Fake nodes for unit tests: each one grants, denies, fails, is slow, never answers, or keeps
//! keys in memory like a Redis server would (with expiry on Tokio's clock, so a paused clock
//! drives it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::{Advice, Advisory, GuardedWrite, KeyRow, Node, NodeCall, Op, Request, advice};
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

/// What a fake node saw: which script, when it started and when it ended.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub(crate) op: Op,
    pub(crate) started: Instant,
    pub(crate) ended: Option<Instant>,
}

/// A fake node: a behaviour per kind of request (by default its acquire behaviour, and
/// [`Fake::Real`] for extend and release), a log of the calls it saw, and its keys.
pub(crate) struct FakeNode {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    behaviour: Mutex<HashMap<Op, Fake>>,
    seen: Mutex<Vec<Seen>>,
    /// key -> (token, expires at)
    keys: Mutex<HashMap<String, (String, Instant)>>,
    /// What `CONFIG GET maxmemory-policy` answers.
    eviction: Mutex<String>,
    /// Guarded writes (the election's record) never answer.
    writes_hang: std::sync::atomic::AtomicBool,
    /// Whether it says it orders and bounds its own calls (see `Node::pipelined`).
    pipelined: std::sync::atomic::AtomicBool,
}

impl FakeNode {
    /// A node that answers acquires as `acquire` says and runs extends and releases for real.
    pub(crate) fn new(acquire: Fake) -> Self {
        let node = FakeNode {
            inner: Arc::default(),
        };
        node.set_eviction_policy("noeviction");
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

    /// From now on, says it orders and bounds its own calls, as a node's queue does: rounds
    /// then neither gate nor time its calls.
    pub(crate) fn set_pipelined(&self) {
        self.inner
            .pipelined
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Answers every kind of request as `behaviour` says.
    pub(crate) fn set_all(&self, behaviour: Fake) {
        for op in [Op::Acquire, Op::Extend, Op::Release] {
            self.set(op, behaviour);
        }
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.inner
            .seen
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    pub(crate) fn calls(&self) -> Vec<Op> {
        self.seen().iter().map(|s| s.op).collect()
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
            let mut held = inner.keys.lock().map_err(|_| {
                NodeFailure::Reply(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "poisoned",
                )))
            })?;
            let now = Instant::now();
            held.retain(|_, (_, expires)| *expires > now);
            let rows = keys
                .iter()
                .map(|k| match held.get(k) {
                    Some((token, expires)) => (
                        "string".to_owned(),
                        Some(token.clone().into_bytes()),
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
    fn pipelined(&self) -> bool {
        self.inner
            .pipelined
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn call(&self, req: &Request) -> NodeCall {
        let behaviour = self
            .inner
            .behaviour
            .lock()
            .ok()
            .and_then(|b| b.get(&req.op).copied())
            .unwrap_or(Fake::Real);
        let (inner, req) = (Arc::clone(&self.inner), req.clone());
        NodeCall::boxed(async move {
            // Recorded when the call really starts (after any gate), not when it is made.
            let slot = inner.seen.lock().ok().map(|mut s| {
                s.push(Seen {
                    op: req.op,
                    started: Instant::now(),
                    ended: None,
                });
                s.len() - 1
            });
            let result = match behaviour {
                Fake::Real => Ok(inner.run(&req)),
                Fake::Grant => Ok(1),
                Fake::Deny => Ok(0),
                Fake::Fail => Err(NodeFailure::Reply(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "injected",
                )))),
                Fake::Slow(d) => {
                    tokio::time::sleep(d).await;
                    Ok(inner.run(&req).max(1))
                }
                Fake::Never => std::future::pending().await,
            };
            if let (Some(slot), Ok(mut s)) = (slot, inner.seen.lock()) {
                s[slot].ended = Some(Instant::now());
            }
            result
        })
    }

    fn advise(&self, advisory: Advisory) -> BoxFuture<'static, Result<Advice, NodeFailure>> {
        match advisory {
            Advisory::Inspect { keys, delete } => advice(self.inspect(keys, delete), Advice::Keys),
            Advisory::WriteIfHeld(write) => advice(self.write_if_held(&write), Advice::Written),
            Advisory::EvictionPolicy => advice(self.eviction_policy(), Advice::EvictionPolicy),
            Advisory::RunId => Box::pin(async { Ok(Advice::RunId(None)) }),
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
