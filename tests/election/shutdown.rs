//! A leader that shuts down the documented way (drop `run`, then `Redlock::close()`, then let
//! the runtime end) steps down at once: the next candidate does not wait out the lease.

use std::time::Duration;

use redfence::{Error, MemoryCounter, Redlock};

use crate::LOCK_KEY;
use crate::support::Servers;

#[test]
fn a_leader_dropped_just_before_close_steps_down() {
    let servers = Servers::start(3);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let redlock = Redlock::builder()
            .nodes(servers.urls())
            .node_timeout(Duration::from_millis(500))
            .fencing(MemoryCounter::new())
            .build()
            .expect("config");
        let election = redlock
            .election("jobs", Some("me"))
            .lease(Duration::from_secs(20))
            .renew_deadline(Duration::from_secs(10))
            .retry_period(Duration::from_secs(2))
            .build()
            .expect("election");
        let (leading_tx, leading_rx) = tokio::sync::oneshot::channel();
        let mut leading_tx = Some(leading_tx);
        tokio::select! {
            result = election.run(|leadership| {
                let leading_tx = leading_tx.take();
                async move {
                    if let Some(tx) = leading_tx {
                        let _ = tx.send(());
                    }
                    Err::<(), Error>(leadership.lost().await)
                }
            }) => panic!("the term never ends by itself: {result:?}"),
            leading = leading_rx => leading.expect("elected"),
        }
        // `run` is dropped here, mid-term.
        redlock.close().await;
    });
    drop(runtime);
    let left: Vec<usize> = (0..3)
        .filter(|&i| servers.get(i, LOCK_KEY).is_some())
        .collect();
    assert!(
        left.is_empty(),
        "the election lock is still held on nodes {left:?}: the next leader waits out the lease"
    );
}
