use std::sync::Arc;
use std::time::Duration;

use super::*;

fn hand_off() -> HandOff {
    HandOff::new(vec![None, None, None])
}

fn keys(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[tokio::test(start_paused = true)]
async fn turns_are_served_in_arrival_order() {
    let hand_off = Arc::new(hand_off());
    let first = hand_off.turn(&keys(&["a"])).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..5 {
        let (hand_off, order) = (Arc::clone(&hand_off), Arc::clone(&order));
        waiters.push(tokio::spawn(async move {
            let _turn = hand_off.turn(&keys(&["a"])).await;
            lock(&order).push(i);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }));
        // Let each waiter queue up before the next one.
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(first);
    for waiter in waiters {
        waiter.await.expect("waiter");
    }
    assert_eq!(*lock(&order), vec![0, 1, 2, 3, 4]);
}

#[tokio::test(start_paused = true)]
async fn multi_key_turns_do_not_deadlock_whatever_the_order_given() {
    let hand_off = Arc::new(hand_off());
    let mut tasks = Vec::new();
    for i in 0..20 {
        let hand_off = Arc::clone(&hand_off);
        let names = if i % 2 == 0 { ["a", "b"] } else { ["b", "a"] };
        tasks.push(tokio::spawn(async move {
            let _turn = hand_off.turn(&keys(&names)).await;
            tokio::task::yield_now().await;
        }));
    }
    let all = futures::future::join_all(tasks);
    tokio::time::timeout(Duration::from_secs(5), all)
        .await
        .expect("every multi-key waiter got its turn");
}

#[tokio::test(start_paused = true)]
async fn a_local_release_wakes_the_watcher_and_unused_keys_are_forgotten() {
    let hand_off = hand_off();
    let hold = hand_off.hold(&keys(&["a"]));
    let turn = hand_off.turn(&keys(&["a"])).await;
    assert!(turn.held_here());
    let watch = hand_off.watch(&turn, None);
    let woken = tokio::spawn({
        let watcher = Arc::clone(&watch.watcher);
        async move {
            let watch = Watch {
                watcher,
                _keys: Users {
                    state: Arc::new(State {
                        keys: Mutex::default(),
                        quorum: 2,
                    }),
                    keys: Vec::new(),
                },
            };
            watch.released().await;
        }
    });
    tokio::task::yield_now().await;
    assert!(!woken.is_finished());
    drop(hold);
    tokio::time::timeout(Duration::from_secs(1), woken)
        .await
        .expect("the release woke the watcher")
        .expect("watcher task");
    assert!(!turn.held_here());
    drop(watch);
    drop(turn);
    // Watched (subscribed) keys are forgotten by the sweeper after IDLE.
    tokio::time::sleep(IDLE * 3).await;
    assert!(lock(&hand_off.state.keys).is_empty());
    // A key that was never watched is forgotten as soon as its last user leaves.
    drop(hand_off.turn(&keys(&["b"])).await);
    drop(hand_off.hold(&keys(&["c"])));
    assert!(lock(&hand_off.state.keys).is_empty());
}

/// A state with one key "a" (quorum 2), watched by one watcher.
/// Whether `watcher` was woken.
fn fired(watcher: &Watcher) -> bool {
    watcher.fired.load(Ordering::SeqCst)
}

fn one_watched_key(waiter: Option<Arc<str>>) -> (State, Arc<KeyState>, Arc<Watcher>) {
    let state = State {
        keys: Mutex::default(),
        quorum: 2,
    };
    let key = Arc::new(KeyState::new("a".into()));
    lock(&state.keys).insert("a".into(), Arc::clone(&key));
    let watcher = Arc::new(Watcher::new(waiter));
    lock(&key.watchers).push(Arc::downgrade(&watcher));
    (state, key, watcher)
}

#[test]
fn messages_wake_a_watcher_only_from_a_majority_of_nodes() {
    let (state, _key, watcher) = one_watched_key(None);
    state.released("a", 1, "");
    state.released("a", 1, "");
    assert!(!fired(&watcher), "one node twice is not a majority");
    state.released("other", 0, "");
    assert!(!fired(&watcher));
    state.released("a", 2, "");
    assert!(fired(&watcher));
}

#[test]
fn a_fair_waiter_counts_only_messages_that_name_it_or_nobody() {
    let (state, key, watcher) = one_watched_key(Some(Arc::from("me")));
    key.wake(None, 2);
    assert!(!fired(&watcher), "a local release names nobody's turn");
    for node in 0..3 {
        state.released("a", node, "someone-else");
    }
    assert!(!fired(&watcher), "another waiter's turn");
    state.released("a", 0, "me");
    assert!(!fired(&watcher));
    state.released("a", 1, "");
    assert!(fired(&watcher), "its turn on a majority");
}

/// A head watches from its first attempt only where the keys are subscribed already (nothing
/// to send), and then a release during that attempt counts once the attempt is refused.
#[tokio::test(start_paused = true)]
async fn a_subscribed_key_is_watched_before_the_first_attempt() {
    let hand_off = hand_off();
    let turn = hand_off.turn(&keys(&["a"])).await;
    assert!(
        hand_off.watch_subscribed(&turn, None).is_none(),
        "a key nobody watched is not subscribed: watching it would send a command"
    );
    // Another waiter's watch subscribed the key (it stays subscribed for IDLE).
    let other = hand_off.watch(&turn, None);
    drop(other);
    let watch = hand_off
        .watch_subscribed(&turn, None)
        .expect("a subscribed key is watched at once");
    watch.reset();
    // The release arrives while the attempt is in flight, on a majority of the three nodes.
    hand_off.state.released("a", 0, "");
    hand_off.state.released("a", 1, "");
    tokio::time::timeout(Duration::from_secs(1), watch.released())
        .await
        .expect("the release during the attempt is not missed");
}
