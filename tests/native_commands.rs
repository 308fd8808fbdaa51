//! Plain commands on servers with compare-and-delete, on real servers of both kinds (Valkey 9,
//! `DELIFEQ`; Redis 8.4 and later, `DELEX … IFEQ`): the exact commands a single-key lock
//! sends, a release or extension of a key that holds another token changing nothing on every
//! path, an ACL user without the compare-and-delete command that still releases, the
//! hand-off's mark and message around plain commands, and the knob that turns them off.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use redfence::{Error, Redlock, RedlockBuilder};
use support::{DEADLINE, Launch, Servers, TestRedlock, eventually, redis8, valkey9};

const TTL: Duration = Duration::from_secs(10);

/// The node timeout of these tests, longer than `support::PATIENT`: they count the commands
/// each node ran, and a call that a loaded machine timed out would be resent (and counted
/// twice).
const NODE_TIMEOUT: Duration = Duration::from_secs(5);

/// A server with compare-and-delete, and its command.
#[derive(Clone, Copy)]
struct Kind {
    name: &'static str,
    launch: fn() -> Launch,
    /// The compare-and-delete command, as `INFO commandstats` and ACL rules name it.
    command: &'static str,
}

/// Every kind of server with compare-and-delete; each test runs on each.
const KINDS: [Kind; 2] = [
    Kind {
        name: "Valkey 9",
        launch: valkey9,
        command: "delifeq",
    },
    Kind {
        name: "Redis 8",
        launch: redis8,
        command: "delex",
    },
];

impl Kind {
    fn start(self, n: usize) -> Servers {
        Servers::start_launched(n, &[], |_| (self.launch)())
    }

    /// The plain release of `key` held with `token`, as `MONITOR` shows it.
    fn release(self, key: &str, token: &str) -> Vec<String> {
        match self.command {
            "delifeq" => args(&["DELIFEQ", key, token]),
            _ => args(&["DELEX", key, "IFEQ", token]),
        }
    }
}

/// A builder over `servers`, with one attempt per acquisition and [`NODE_TIMEOUT`].
fn builder(servers: &Servers) -> RedlockBuilder {
    servers.builder().retry_count(0).node_timeout(NODE_TIMEOUT)
}

/// Takes and releases a lock on a key of its own: the first plain release turns acquires to
/// plain commands too (until then they go in the script).
async fn prime(redlock: &Redlock) {
    // Through using(), whose release waits for every node (a plain release returns once a
    // majority answered, and a node that had not released yet would still take the script).
    redlock
        .using(&["prime"], TTL, |_| async { Ok::<_, Error>(()) })
        .await
        .expect("prime");
}

/// Every command server `port` runs from now on, as its arguments, until the returned
/// receiver is dropped (a `MONITOR` connection read on a thread).
fn monitor(port: u16) -> mpsc::Receiver<Vec<String>> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.write_all(b"MONITOR\r\n").expect("MONITOR");
    let mut reader = BufReader::new(stream);
    let mut ok = String::new();
    reader.read_line(&mut ok).expect("+OK");
    assert_eq!(ok.trim_end(), "+OK");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in reader.lines() {
            let Ok(line) = line else { return };
            if tx.send(monitored_args(&line)).is_err() {
                return;
            }
        }
    });
    rx
}

/// The arguments of one `MONITOR` line: `+1733… [0 127.0.0.1:5678] "SET" "k" …` (names and
/// tokens here need no escapes).
fn monitored_args(line: &str) -> Vec<String> {
    let Some(start) = line.find("] ") else {
        return Vec::new();
    };
    line[start + 2..]
        .split("\" \"")
        .map(|a| a.trim_matches('"').to_owned())
        .collect()
}

/// What `commands` received until `last` (the command that ends the wait) or the deadline.
fn commands_until(
    commands: &mpsc::Receiver<Vec<String>>,
    last: impl Fn(&[String]) -> bool,
) -> Vec<Vec<String>> {
    let deadline = Instant::now() + DEADLINE;
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match commands.recv_timeout(left) {
            Ok(args) => {
                let done = last(&args);
                seen.push(args);
                if done {
                    return seen;
                }
            }
            Err(_) => break,
        }
    }
    panic!("the awaited command never came; seen: {seen:?}");
}

fn args(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| (*w).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_key_lock_is_plain_set_and_compare_and_delete_byte_for_byte() {
    for kind in KINDS {
        single_key_lock_byte_for_byte(kind).await;
    }
}

async fn single_key_lock_byte_for_byte(kind: Kind) {
    let servers = kind.start(3);
    let redlock = builder(&servers).build().expect("config");
    prime(&redlock).await;

    let commands = monitor(servers.port(0));
    let mut lock = redlock.acquire(&["invoice:7"], TTL).await.expect("acquire");
    let token = lock.token().to_owned();
    lock.extend(Duration::from_secs(20)).await.expect("extend");
    lock.release().await.expect("release");
    // (The priming release may still be running on this node: a release returns once a
    // majority answered.)
    let seen = commands_until(&commands, |a| {
        a.first().is_some_and(|c| c == "EXISTS")
            && a.get(1).is_some_and(|k| k.starts_with("invoice:7"))
    });
    let ours: Vec<Vec<String>> = seen
        .into_iter()
        .filter(|a| a.iter().any(|w| w.starts_with("invoice:7")))
        .collect();
    assert_eq!(
        ours,
        vec![
            args(&["SET", "invoice:7", &token, "NX", "PX", "10000"]),
            args(&["SET", "invoice:7", &token, "IFEQ", &token, "PX", "20000"]),
            kind.release("invoice:7", &token),
            args(&["EXISTS", "invoice:7:redfence:waiting"]),
        ],
        "{}: no script call, nothing else",
        kind.name
    );
    // The other nodes' releases may still be on their way (see above).
    for i in 0..3 {
        assert!(
            support::eventually(|| servers.get(i, "invoice:7").is_none()).await,
            "{}: node {i}",
            kind.name
        );
    }
}

/// With `native_commands(false)` (and for what plain commands cannot do: several keys) every
/// call is the script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turned_off_or_on_several_keys_every_call_is_the_script() {
    for kind in KINDS {
        every_call_is_the_script(kind).await;
    }
}

async fn every_call_is_the_script(kind: Kind) {
    let servers = kind.start(3);
    let off = builder(&servers)
        .native_commands(false)
        .build()
        .expect("config");
    for _ in 0..3 {
        prime(&off).await;
    }
    let on = builder(&servers).build().expect("config");
    prime(&on).await;
    let delete_before = servers.command_stat(0, kind.command, "calls");
    let lock = on.acquire(&["a", "b"], TTL).await.expect("two keys");
    lock.release().await.expect("release");
    for _ in 0..3 {
        prime(&off).await;
    }
    assert_eq!(
        servers.command_stat(0, kind.command, "calls"),
        delete_before,
        "{}: no {} but the one lock of `on` that had a single key",
        kind.name,
        kind.command
    );
    assert_eq!(
        delete_before, 1,
        "{}: the priming release of `on`",
        kind.name
    );
}

/// A key that holds another token (its TTL passed and someone else took it) is neither
/// deleted nor extended by our release or extension: plain commands (Valkey 9), and the
/// script with them turned off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_holding_another_token_is_untouched_on_every_path() {
    for kind in KINDS {
        another_token_untouched(kind).await;
    }
}

async fn another_token_untouched(kind: Kind) {
    let servers = kind.start(3);
    for native in [true, false] {
        let redlock = builder(&servers)
            .native_commands(native)
            .build()
            .expect("config");
        prime(&redlock).await;
        let key = format!("taken:{native}");
        let mut lock = redlock
            .acquire(&[key.as_str()], TTL)
            .await
            .expect("acquire");
        for i in 0..3 {
            let _: () = servers.cmd(i, &["SET", &key, "someone-else", "PX", "60000"]);
        }
        let err = lock
            .extend(Duration::from_secs(30))
            .await
            .expect_err("not ours any more");
        assert!(
            matches!(err, Error::LockLost { .. }),
            "{}, native {native}: {err}",
            kind.name
        );
        let _ = lock.release().await;
        for i in 0..3 {
            assert_eq!(
                servers.get(i, &key).as_deref(),
                Some("someone-else"),
                "{}, native {native}, node {i}",
                kind.name
            );
            assert!(
                servers.pttl(i, &key) > 50_000,
                "{}, native {native}, node {i}: the TTL is theirs",
                kind.name
            );
        }
    }
}

/// A user allowed everything but the compare-and-delete command (and so refused the plain
/// release) still releases: the refused release runs again in the script, and that
/// connection keeps to the script from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_without_compare_and_delete_still_releases() {
    for kind in KINDS {
        without_compare_and_delete(kind).await;
    }
}

async fn without_compare_and_delete(kind: Kind) {
    let servers = kind.start(3);
    let mut urls = Vec::new();
    let refused = format!("-{}", kind.command);
    for i in 0..3 {
        let rules = [
            "SETUSER", "nodel", "on", ">pw", "~*", "&*", "+@all", &refused,
        ];
        let mut cmd = vec!["ACL"];
        cmd.extend(rules);
        servers.cmd::<()>(i, &cmd);
        urls.push(format!("redis://nodel:pw@127.0.0.1:{}", servers.port(i)));
    }
    let redlock = Redlock::builder()
        .nodes(urls)
        .retry_count(0)
        .node_timeout(NODE_TIMEOUT)
        .build()
        .expect("config");
    for round in 0..3 {
        // Through using(), whose release waits for every node: a plain release() returns once
        // a majority answered, and a straggling node could then take this round's release and
        // the next round's in one batch, both plain (two refusals, rightly).
        redlock
            .using(&["job"], TTL, |_| async { Ok::<_, Error>(()) })
            .await
            .expect("acquire and release");
        for i in 0..3 {
            assert!(
                eventually(|| servers.get(i, "job").is_none()).await,
                "{}, round {round}, node {i}: still held",
                kind.name
            );
        }
    }
    for i in 0..3 {
        assert_eq!(
            servers.command_stat(i, kind.command, "rejected_calls")
                + servers.command_stat(i, kind.command, "failed_calls"),
            1,
            "{}, node {i}: refused once, then the script only",
            kind.name
        );
    }
}

/// Around plain commands the hand-off still works between processes: a refused plain acquire
/// marks the key, and the holder's plain release announces it, so that the waiter (here with a
/// retry delay far longer than the wait) takes the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_process_hears_a_plain_release() {
    for kind in KINDS {
        waiter_hears_a_plain_release(kind).await;
    }
}

async fn waiter_hears_a_plain_release(kind: Kind) {
    let servers = kind.start(3);
    let holder = builder(&servers).build().expect("config");
    let waiter = servers
        .builder()
        .node_timeout(NODE_TIMEOUT)
        .retry_count(3)
        .retry_delay(Duration::from_secs(20))
        .retry_jitter(Duration::from_millis(1))
        .build()
        .expect("config");
    prime(&holder).await;
    prime(&waiter).await;
    let held = holder.acquire(&["hot"], TTL).await.expect("holder");
    // acquire() returns once a majority granted: the waiter must find the key on every node
    // (a node where the holder's acquire was still on its way would grant the waiter there,
    // and set no mark; a CI run on Redis 8.6 saw it).
    assert!(
        eventually(|| (0..3).all(|i| servers.get(i, "hot").as_deref() == Some(held.token()))).await,
        "the holder's key on every node"
    );
    let waiting = tokio::spawn(async move {
        let lock = waiter.acquire(&["hot"], TTL).await;
        (lock, Instant::now())
    });
    assert!(
        eventually(|| (0..3).all(|i| servers.get(i, "hot:redfence:waiting").is_some())).await,
        "the refused plain acquires marked the key"
    );
    // The waiter listens on every node before the release (a message sent earlier is missed,
    // and the waiter would poll: here after its 20 s retry delay).
    let listening = || (0..3).all(|i| servers.release_subscribers(i, "hot") > 0);
    assert!(eventually(listening).await, "the waiter subscribed");
    let released = Instant::now();
    held.release().await.expect("release");
    let (lock, got) = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the waiter was not told (it would wait its 20 s retry delay)")
        .expect("task");
    let lock = lock.expect("the waiter's lock");
    assert!(
        got.duration_since(released) < Duration::from_secs(5),
        "told of the release: {:?}",
        got.duration_since(released)
    );
    lock.release().await.expect("release");
}
