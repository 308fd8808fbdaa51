//! `RedisCounter`: monotonic, hash-tagged, multi-resource tokens; coalesced script calls;
//! a paused primary.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redfence::{Error, FencingCounter, FencingError, RedisCounter};

use crate::support::{self, Servers, TestRedlock};
use crate::{TTL, names, no_key_left};

#[tokio::test]
async fn redis_counter_is_monotonic_with_hash_tagged_keys() {
    let locks = Servers::start(3);
    let store = Servers::start(1);
    let redlock = locks
        .builder()
        .fencing(RedisCounter::open(&store.url(0)).expect("url"))
        .build()
        .expect("config");
    let mut last = 0;
    for _ in 0..5 {
        let lock = redlock
            .acquire(&["invoice:4821"], TTL)
            .await
            .expect("acquire");
        let fence = lock.fence().expect("fence");
        assert!(fence > last, "{fence} after {last}");
        last = fence;
        lock.release().await.expect("release");
    }
    assert_eq!(last, 5, "INCR semantics: 1, 2, 3, ...");
    // One counter key, on the designated primary only, hash-tagged.
    assert_eq!(store.keys(0), vec!["fence:{invoice:4821}".to_string()]);
    assert_eq!(store.get(0, "fence:{invoice:4821}").as_deref(), Some("5"));
    assert!(
        no_key_left(&locks).await,
        "counter keys went to the lock nodes"
    );

    // A configurable prefix.
    let counter = RedisCounter::open(&store.url(0))
        .expect("url")
        .prefix("app:fence:");
    assert_eq!(counter.key("x"), "app:fence:{x}");
    assert_eq!(counter.next_fence(&names(&["x"])).await.ok(), Some(1));
    assert_eq!(store.get(0, "app:fence:{x}").as_deref(), Some("1"));

    // Concurrent callers never get the same token.
    let counter = Arc::new(RedisCounter::open(&store.url(0)).expect("url"));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut got = Vec::new();
                for _ in 0..25 {
                    got.push(counter.next_fence(&names(&["hot"])).await.expect("fence"));
                }
                got
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        let got = task.await.expect("task");
        assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
        all.extend(got);
    }
    all.sort_unstable();
    assert_eq!(all, (1..=100).collect::<Vec<u64>>());
}

#[tokio::test]
async fn redis_counter_multi_resource_tokens_exceed_every_resource() {
    let store = Servers::start(1);
    let counter = RedisCounter::open(&store.url(0)).expect("url");
    let next = |r: &'static [&'static str]| {
        let resources = names(r);
        let counter = &counter;
        async move { counter.next_fence(&resources).await.expect("fence") }
    };
    for expected in 1..=10 {
        assert_eq!(next(&["a"]).await, expected);
    }
    assert_eq!(next(&["b"]).await, 1);
    // max(10, 1) + 1, stored in both.
    assert_eq!(next(&["a", "b"]).await, 11);
    assert_eq!(store.get(0, "fence:{a}").as_deref(), Some("11"));
    assert_eq!(store.get(0, "fence:{b}").as_deref(), Some("11"));
    assert_eq!(next(&["b"]).await, 12);
    // A new resource in a set: from the largest of the others.
    assert_eq!(next(&["c", "a"]).await, 12);
    assert_eq!(next(&["a", "b", "c"]).await, 13);
    for key in ["fence:{a}", "fence:{b}", "fence:{c}"] {
        assert_eq!(store.get(0, key).as_deref(), Some("13"), "{key}");
    }

    // A counter key that holds garbage fails closed, with a reason.
    let _: () = store.cmd(0, &["SET", "fence:{junk}", "not-a-number"]);
    let err = counter
        .next_fence(&names(&["a", "junk"]))
        .await
        .expect_err("garbage");
    assert!(
        err.to_string().contains("does not hold an integer"),
        "{err}"
    );
    let err = counter
        .next_fence(&names(&["junk"]))
        .await
        .expect_err("garbage");
    assert!(err.to_string().contains("fencing counter"), "{err}");
    // Nothing was written by the failed calls.
    assert_eq!(store.get(0, "fence:{a}").as_deref(), Some("13"));

    // Tokens stop at 2^53, where Lua's numbers stop being exact: an error, never a repeat.
    let _: () = store.cmd(0, &["SET", "fence:{big}", "9007199254740990"]);
    assert_eq!(next(&["big"]).await, 9_007_199_254_740_991);
    for _ in 0..2 {
        let err = counter
            .next_fence(&names(&["big"]))
            .await
            .expect_err("past 2^53");
        assert!(err.to_string().contains("reached 2^53"), "{err}");
    }

    // The script survives a SCRIPT FLUSH (EVALSHA falls back to loading it).
    let _: () = store.cmd(0, &["SCRIPT", "FLUSH"]);
    assert_eq!(next(&["a", "b"]).await, 14);
}

/// Issue 15: requests that arrive while a script call is in flight go together in the next
/// one, handled in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_counter_coalesces_requests_behind_a_call_in_flight() {
    let store = Servers::start(1);
    let counter = RedisCounter::open(&store.url(0)).expect("url");
    // Connected, script loaded.
    assert_eq!(counter.next_fence(&names(&["warm"])).await.ok(), Some(1));
    let _: () = store.cmd(0, &["CONFIG", "RESETSTAT"]);

    // The server is frozen, so the first call stays in flight while the others queue.
    store.pause(0);
    let requests: Vec<Vec<String>> = (0..64).map(|j| names(&[&format!("r{}", j % 8)])).collect();
    let calls = futures::future::join_all(requests.iter().map(|r| counter.next_fence(r)));
    let resume = async { store.resume(0) };
    let (tokens, ()) = futures::join!(calls, resume);
    let tokens: Vec<u64> = tokens.into_iter().map(|t| t.expect("fence")).collect();

    // Per resource, in arrival order: 1, 2, ... 8.
    for r in 0..8 {
        let mine: Vec<u64> = tokens.iter().skip(r).step_by(8).copied().collect();
        assert_eq!(mine, (1..=8).collect::<Vec<u64>>(), "r{r}");
    }
    let (calls, _) = store.evalsha_stats(0);
    assert!(calls >= 1, "the tokens came from script calls");
    // One call in flight when the server froze, then everything queued behind it.
    assert!(calls <= 2, "64 requests took {calls} script calls");
}

#[tokio::test]
async fn redis_counter_times_out_on_a_paused_primary() {
    let locks = Servers::start(3);
    let store = Servers::start(1);
    let counter = RedisCounter::open(&store.url(0))
        .expect("url")
        .timeout(Duration::from_millis(200));
    assert_eq!(counter.next_fence(&names(&["r"])).await.ok(), Some(1));

    store.pause(0);
    let started = Instant::now();
    let err = counter
        .next_fence(&names(&["r"]))
        .await
        .expect_err("paused");
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // Through a lock: the lock manager's fencing_timeout fires first here, and the lock
    // is released.
    let slow_counter = RedisCounter::open(&store.url(0))
        .expect("url")
        .timeout(Duration::from_secs(30));
    let redlock = locks
        .builder()
        .fencing(slow_counter)
        .fencing_timeout(Duration::from_millis(300))
        .build()
        .expect("config");
    let err = redlock.acquire(&["r"], TTL).await.expect_err("paused");
    assert!(
        matches!(err, Error::Fencing(FencingError::Timeout(_))),
        "{err:?}"
    );
    assert!(no_key_left(&locks).await);

    store.resume(0);
    // The same counter recovers, and its tokens still grow (the timed-out call may or may
    // not have landed: a gap is fine).
    let deadline = Instant::now() + support::DEADLINE;
    let fence = loop {
        if let Ok(fence) = counter.next_fence(&names(&["r"])).await {
            break Some(fence);
        }
        assert!(Instant::now() < deadline, "the counter did not recover");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(fence.is_some_and(|f| f >= 2), "{fence:?}");
    let lock = redlock.acquire(&["r"], TTL).await.expect("acquire");
    assert!(lock.fence() > fence);
    lock.release().await.expect("release");
}
