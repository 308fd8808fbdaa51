//! `using()`: automatic extension, the abort signal, bounded renewal and release on every
//! exit path, against real redis-server processes.
//!
//! By concern: the lock kept alive by extension (`extension.rs`), the signal aborting when a
//! majority is lost (`abort.rs`), bounded renewal (`limits.rs`), release on every exit path
//! (`release.rs`), and what comes back to the caller (`results.rs`). The helpers shared by
//! them are here.

mod abort;
mod extension;
mod limits;
mod release;
mod results;
#[path = "../support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redfence::{Error, Event, Redlock, RedlockBuilder, Signal};
use support::{DEADLINE, PATIENT, Servers, eventually};

const MS: Duration = Duration::from_millis(1);

/// Every event the hook received.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<Event>>>);

impl Events {
    fn all(&self) -> Vec<Event> {
        self.0.lock().expect("events").clone()
    }

    fn count(&self, pred: impl Fn(&Event) -> bool) -> usize {
        self.all().iter().filter(|e| pred(e)).count()
    }

    fn extended(&self) -> usize {
        self.count(|e| matches!(e, Event::Extended { .. }))
    }

    fn aborted(&self) -> usize {
        self.count(|e| matches!(e, Event::Aborted { .. }))
    }
}

/// Builds `builder` with a hook that records every event.
fn recorded(builder: RedlockBuilder) -> (Events, Redlock) {
    let events = Events::default();
    let sink = events.clone();
    let redlock = builder
        .on_event(move |e: &Event| sink.0.lock().expect("events").push(e.clone()))
        .build()
        .expect("config");
    (events, redlock)
}

/// Waits for the signal to abort (bounded), and returns why with the validity left then.
async fn abort_of(signal: &Signal) -> (Error, Duration) {
    let err = tokio::time::timeout(DEADLINE, signal.aborted())
        .await
        .expect("the signal aborts");
    (err, signal.remaining())
}

/// Waits until every node holds the token. A scope that ends within milliseconds of its
/// acquisition can otherwise race the acquire calls still in flight on the slowest nodes
/// (see `a_scope_that_ends_at_once_leaves_no_key`); tests of other things start from here.
async fn held_everywhere(servers: &Servers, signal: &Signal) {
    let all = 0..servers.len();
    let everywhere =
        eventually(|| servers.holders("job", signal.token(), all.clone()).len() == servers.len())
            .await;
    assert!(
        everywhere,
        "the token reached only nodes {:?}",
        servers.holders("job", signal.token(), all)
    );
}
