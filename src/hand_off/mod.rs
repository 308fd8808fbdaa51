//! Hot resources: waiters for the same resources line up, and a release wakes the next one.
//!
//! - **Local queueing.** Inside one `Redlock`, waiters for a resource take turns in FIFO order
//!   ([`HandOff::turn`]): only the head of the line polls the nodes, the others wait in
//!   process. A lock held by this process marks its keys ([`HandOff::hold`]), so the next head
//!   waits for its release instead of polling a lock it knows is taken.
//! - **Notified hand-off.** The release script publishes on `redfence:released:<key>` on
//!   each node where it deleted the key while someone waited for it (a refused acquire and a
//!   fair waiter mark the key `<key>:redfence:waiting`, which the release deletes; an
//!   uncontended release publishes nothing). The head of a line watches its keys
//!   ([`HandOff::watch`]) and retries at once when a release reached a majority of nodes, or
//!   when a lock of this process released them. One subscriber connection per node serves
//!   every watcher (subscriber.rs); a missed message costs at most one retry delay.
//!
//! A key's state lives while someone waits for, holds or watches it. A key that was watched
//! stays subscribed for [`IDLE`] after its last use (so that a busy resource does not
//! subscribe and unsubscribe at every hand-off), then is forgotten and unsubscribed.

mod subscriber;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedMutexGuard, mpsc};

use self::subscriber::{Command, Released};

/// How long a key's state (and its subscription) outlives its last user, so that a busy
/// resource does not subscribe and unsubscribe at every hand-off.
const IDLE: Duration = Duration::from_secs(1);

/// The waiting lines and release watchers of one `Redlock`.
pub(crate) struct HandOff {
    state: Arc<State>,
    /// One subscriber per node that can subscribe, started with the first watch.
    subscribers: Mutex<Option<Vec<mpsc::UnboundedSender<Command>>>>,
    /// Each node's pub/sub client (`None` for voters that cannot subscribe).
    clients: Vec<Option<crate::node::PubSub>>,
}

/// What the subscribers and `HandOff` share.
struct State {
    keys: Mutex<HashMap<Arc<str>, Arc<KeyState>>>,
    quorum: usize,
}

/// One key's line, holders and watchers.
struct KeyState {
    name: Arc<str>,
    /// Subscribed on the nodes (set under the map's lock): forgotten only by the sweeper.
    subscribed: AtomicBool,
    /// Taken by the head of the line until it acquires or gives up (FIFO: tokio's mutex
    /// serves waiters in order).
    turn: Arc<tokio::sync::Mutex<()>>,
    /// Locks of this process that hold the key now.
    holders: Mutex<usize>,
    watchers: Mutex<Vec<Weak<Watcher>>>,
    /// When the key was last given up by a user: forgotten [`IDLE`] later if still unused.
    last_used: Mutex<Instant>,
}

/// One head of a line, waiting for its keys' release.
struct Watcher {
    /// Fair mode: this waiter's id. A release message names the waiter now at the head of
    /// the node's queue; only messages that name this one (or nobody) count, and a local
    /// release (which names nobody) does not wake it.
    waiter: Option<Arc<str>>,
    /// Nodes (bit per index) whose release message arrived since the last reset.
    seen: Mutex<u64>,
    /// Woken since the last reset.
    fired: AtomicBool,
    notify: Notify,
}

/// Some keys' states, in sorted order, given back to the map when dropped (which forgets
/// the unused ones).
struct Users {
    state: Arc<State>,
    keys: Vec<Arc<KeyState>>,
}

/// The head of the line for a lock's keys, until dropped.
pub(crate) struct Turn {
    // Dropped before `keys`, so that the line is left before the state may be forgotten.
    guards: Vec<OwnedMutexGuard<()>>,
    keys: Users,
}

/// A lock of this process holding its keys; dropping it wakes the keys' watchers.
pub(crate) struct Hold {
    keys: Users,
}

/// A head's wait for its keys' release.
pub(crate) struct Watch {
    watcher: Arc<Watcher>,
    _keys: Users,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl HandOff {
    /// Hand-off over the nodes whose pub/sub clients are `clients` (in node order; `None`
    /// for a voter that cannot subscribe).
    pub(crate) fn new(clients: Vec<Option<crate::node::PubSub>>) -> Self {
        HandOff {
            state: Arc::new(State {
                keys: Mutex::default(),
                quorum: crate::quorum::quorum(clients.len()),
            }),
            subscribers: Mutex::new(None),
            clients,
        }
    }

    /// Waits for the head of the line of every key (taken in sorted order, so that two
    /// multi-resource waiters never wait on each other). Cancel-safe: a waiter dropped in
    /// line leaves it.
    pub(crate) async fn turn(&self, keys: &[String]) -> Turn {
        let users = self.users(keys);
        let mut guards = Vec::with_capacity(users.keys.len());
        for state in &users.keys {
            guards.push(Arc::clone(&state.turn).lock_owned().await);
        }
        Turn {
            guards,
            keys: users,
        }
    }

    /// Marks the keys as held by a lock of this process until the `Hold` is dropped.
    pub(crate) fn hold(&self, keys: &[String]) -> Hold {
        let users = self.users(keys);
        for state in &users.keys {
            *lock(&state.holders) += 1;
        }
        Hold { keys: users }
    }

    /// Watches the keys for releases, subscribing on every node that can.
    pub(crate) fn watch(&self, turn: &Turn, waiter: Option<Arc<str>>) -> Watch {
        let keys = Users {
            state: Arc::clone(&self.state),
            keys: turn.keys.keys.clone(),
        };
        self.watch_users(keys, waiter)
    }

    /// Watches the keys as [`watch`](Self::watch) does, if every one is subscribed already
    /// (a resource in use here within [`IDLE`]), so that nothing is sent: the head of a line
    /// then watches from its first attempt on, and a release during that attempt (between
    /// the refusal and the watch) is not missed. `None` otherwise.
    pub(crate) fn watch_subscribed(&self, turn: &Turn, waiter: Option<Arc<str>>) -> Option<Watch> {
        let subscribed = turn
            .keys
            .keys
            .iter()
            .all(|state| state.subscribed.load(Ordering::SeqCst));
        subscribed.then(|| self.watch(turn, waiter))
    }

    /// Watches keys of which any one's release may let the caller in (a semaphore's slots),
    /// without a turn in their lines. The releases of different keys add up towards the
    /// majority, so a wake is a hint to try again, as every wake is.
    pub(crate) fn watch_any(&self, keys: &[String]) -> Watch {
        self.watch_users(self.users(keys), None)
    }

    fn watch_users(&self, keys: Users, waiter: Option<Arc<str>>) -> Watch {
        let watcher = Arc::new(Watcher::new(waiter));
        for state in &keys.keys {
            let mut watchers = lock(&state.watchers);
            watchers.retain(|w| w.strong_count() > 0);
            watchers.push(Arc::downgrade(&watcher));
        }
        self.subscribe(&keys.keys);
        Watch {
            watcher,
            _keys: keys,
        }
    }

    /// The state of each key, sorted by key, made if new.
    fn users(&self, keys: &[String]) -> Users {
        let mut map = lock(&self.state.keys);
        let mut keys: Vec<Arc<KeyState>> = keys
            .iter()
            .map(|key| match map.get(key.as_str()) {
                Some(state) => Arc::clone(state),
                None => {
                    let state = Arc::new(KeyState::new(key.as_str().into()));
                    map.insert(Arc::clone(&state.name), Arc::clone(&state));
                    state
                }
            })
            .collect();
        drop(map);
        keys.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        Users {
            state: Arc::clone(&self.state),
            keys,
        }
    }

    /// Subscribes the keys not yet subscribed on every node that can, starting the
    /// subscribers first if need be.
    fn subscribe(&self, keys: &[Arc<KeyState>]) {
        self.start_subscribers();
        // Under the map's lock, so that a subscribe never overtakes the unsubscribe of a key
        // the sweeper forgot just before.
        let _map = lock(&self.state.keys);
        let new: Vec<String> = keys
            .iter()
            .filter(|state| !state.subscribed.swap(true, Ordering::SeqCst))
            .map(|state| state.name.to_string())
            .collect();
        if new.is_empty() {
            return;
        }
        if let Some(subscribers) = lock(&self.subscribers).as_ref() {
            for subscriber in subscribers {
                let _ = subscriber.send(Command::Subscribe(new.clone()));
            }
        }
    }

    /// Starts one subscriber per node that has a pub/sub client, and the sweeper that
    /// forgets idle keys, once (inside a Tokio runtime; otherwise nothing is started and
    /// waiters poll).
    fn start_subscribers(&self) {
        let mut subscribers = lock(&self.subscribers);
        if subscribers.is_some() || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let senders: Vec<_> = self
            .clients
            .iter()
            .enumerate()
            .filter_map(|(index, client)| {
                let client = client.clone()?;
                let (tx, rx) = mpsc::unbounded_channel();
                let state = Arc::downgrade(&self.state);
                tokio::spawn(subscriber::run(client, index, rx, state));
                Some(tx)
            })
            .collect();
        tokio::spawn(sweep(Arc::downgrade(&self.state), senders.clone()));
        *subscribers = Some(senders);
    }
}

impl Released for State {
    fn released(&self, key: &str, node: usize, next: &str) {
        let Some(state) = lock(&self.keys).get(key).cloned() else {
            return;
        };
        state.wake(Some((node, next)), self.quorum);
    }
}

impl KeyState {
    fn new(name: Arc<str>) -> Self {
        KeyState {
            name,
            subscribed: AtomicBool::new(false),
            turn: Arc::default(),
            holders: Mutex::new(0),
            watchers: Mutex::default(),
            last_used: Mutex::new(crate::clock::now()),
        }
    }

    /// Wakes the watchers for a release on a node (`Some((index, next))`, counted towards a
    /// majority), or by this process (`None`).
    fn wake(&self, node: Option<(usize, &str)>, quorum: usize) {
        let watchers: Vec<Arc<Watcher>> = lock(&self.watchers)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for watcher in watchers {
            let fire = match node {
                None => watcher.waiter.is_none(),
                Some((_, next)) if !next.is_empty() && watcher.waiter.as_deref() != Some(next) => {
                    false
                }
                Some((index, _)) => {
                    let mut seen = lock(&watcher.seen);
                    *seen |= 1u64.checked_shl(index as u32).unwrap_or(0);
                    seen.count_ones() as usize >= quorum
                }
            };
            if fire {
                watcher.fired.store(true, Ordering::SeqCst);
                watcher.notify.notify_waiters();
            }
        }
    }

    fn touch(&self) {
        *lock(&self.last_used) = crate::clock::now();
    }

    /// Nobody waits, holds or watches (the map holds the one reference left).
    fn unused(self: &Arc<Self>) -> bool {
        Arc::strong_count(self) == 1 && Arc::strong_count(&self.turn) == 1
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        let mut map = lock(&self.state.keys);
        for state in self.keys.drain(..) {
            state.touch();
            let name = Arc::clone(&state.name);
            drop(state);
            // A subscribed key stays for the sweeper, which forgets it after IDLE.
            if map
                .get(&name)
                .is_some_and(|state| state.unused() && !state.subscribed.load(Ordering::SeqCst))
            {
                map.remove(&name);
            }
        }
    }
}

impl Watcher {
    fn new(waiter: Option<Arc<str>>) -> Self {
        Watcher {
            waiter,
            seen: Mutex::new(0),
            fired: AtomicBool::new(false),
            notify: Notify::new(),
        }
    }
}

impl Turn {
    /// Whether a lock of this process holds any of the keys now.
    pub(crate) fn held_here(&self) -> bool {
        self.keys.keys.iter().any(|state| *lock(&state.holders) > 0)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        // Leave the line before the keys are given back.
        self.guards.clear();
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        for state in &self.keys.keys {
            let mut holders = lock(&state.holders);
            *holders = holders.saturating_sub(1);
            drop(holders);
            // A local release needs no majority of messages: wake at once.
            state.wake(None, 0);
        }
    }
}

impl Watch {
    /// Sleeps `delay`, or less: until `watch` (if any) sees a release.
    pub(crate) async fn sleep_or_release(watch: Option<&Watch>, delay: Duration) {
        let released = async {
            match watch {
                Some(watch) => watch.released().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = released => {}
        }
    }

    /// Forgets the releases seen so far: call before each attempt.
    pub(crate) fn reset(&self) {
        *lock(&self.watcher.seen) = 0;
        self.watcher.fired.store(false, Ordering::SeqCst);
    }

    /// Resolves when the keys were released on a majority since the last `reset`, or by a
    /// lock of this process.
    pub(crate) async fn released(&self) {
        loop {
            let notified = self.watcher.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.watcher.fired.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }
}

/// Forgets keys idle for [`IDLE`] and unsubscribes them on every node; ends with the
/// `HandOff`.
async fn sweep(state: Weak<State>, subscribers: Vec<mpsc::UnboundedSender<Command>>) {
    let mut tick = tokio::time::interval(IDLE / 2);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(state) = state.upgrade() else {
            return;
        };
        let now = crate::clock::now();
        let mut map = lock(&state.keys);
        let idle: Vec<String> = map
            .iter()
            .filter(|(_, key)| {
                key.unused() && now.saturating_duration_since(*lock(&key.last_used)) >= IDLE
            })
            .map(|(name, _)| name.to_string())
            .collect();
        if idle.is_empty() {
            continue;
        }
        for name in &idle {
            map.remove(name.as_str());
        }
        for subscriber in &subscribers {
            let _ = subscriber.send(Command::Unsubscribe(idle.clone()));
        }
    }
}

#[cfg(test)]
mod tests;
