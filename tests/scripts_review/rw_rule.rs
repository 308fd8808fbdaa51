//! The phase-fair rule on one node, under a random schedule.

use std::time::{Duration, Instant};

use super::SCRIPT;
use crate::support::Servers;

// ---------------------------------------------------------------------------------------
// The phase-fair rule on one node, under a random schedule
// ---------------------------------------------------------------------------------------

/// A small deterministic generator (no dependency): xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A read-write operation of `scripts/batch.lua` on server 0's lock keys: its integer reply.
fn rw(
    conn: &mut redis::Connection,
    kind: &str,
    token: &str,
    ttl: u64,
    waiter: &str,
    wait: u64,
) -> i64 {
    let keys = [
        "l:rwlock:writer",
        "l:rwlock:readers",
        "l:rwlock:writer_waiting",
    ];
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(redis::Script::new(SCRIPT).get_hash())
        .arg(3)
        .arg(&keys[..]);
    cmd.arg(kind)
        .arg(token)
        .arg(ttl)
        .arg(3)
        .arg(waiter)
        .arg(wait);
    match cmd.query::<Vec<redis::Value>>(conn) {
        Ok(replies) => match replies.as_slice() {
            [redis::Value::Int(n)] => *n,
            other => panic!("{kind} {token}: {other:?}"),
        },
        Err(e) => panic!("{kind} {token}: {e}"),
    }
}

/// Three writers and four readers, each an acquisition after another (a waiter id each, a
/// token per attempt, attempts sometimes sent twice as after a lost connection, holds that
/// end by release or by expiry, waiters that give up), in a random order on one node, with
/// short TTLs and waits so that holds and places expire under the run. After every operation:
/// no writer key beside a live reader, no lock key without a TTL, no registration that lives
/// past its waiter's wait; and every acquisition is eventually granted (no place or mark
/// left behind blocks anyone for longer than a wait). (Passing: a regression test.)
#[test]
fn the_per_node_rule_holds_under_a_random_schedule() {
    let servers = Servers::start(1);
    let mut conn = servers.conn(0);
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SCRIPT)
        .query(&mut conn)
        .expect("load");
    const WAIT: u64 = 300;
    #[derive(Clone, Default)]
    struct Actor {
        write: bool,
        waiter: String,
        token: String,
        held: bool,
        waiting_since: Option<Instant>,
    }
    let mut actors: Vec<Actor> = (0..7)
        .map(|i| Actor {
            write: i < 3,
            ..Actor::default()
        })
        .collect();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut serial = 0u64;
    let mut longest = Duration::ZERO;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(8) {
        let i = rng.below(actors.len() as u64) as usize;
        let a = &mut actors[i];
        let (side, ttl) = (if a.write { "w" } else { "r" }, 50 + rng.below(200));
        if a.held {
            match rng.below(4) {
                0 => {
                    rw(
                        &mut conn,
                        &format!("{side}e"),
                        &a.token,
                        ttl,
                        &a.waiter,
                        WAIT,
                    );
                }
                1 | 2 => {
                    rw(
                        &mut conn,
                        &format!("{side}r"),
                        &a.token,
                        ttl,
                        &a.waiter,
                        WAIT,
                    );
                    if rng.below(3) == 0 {
                        // Resent after a lost connection.
                        rw(
                            &mut conn,
                            &format!("{side}r"),
                            &a.token,
                            ttl,
                            &a.waiter,
                            WAIT,
                        );
                    }
                    if a.write {
                        rw(&mut conn, "wl", &a.waiter, ttl, &a.waiter, WAIT);
                    }
                    a.held = false;
                }
                _ => {
                    // Holds on (or lets it expire).
                }
            }
        } else {
            if a.waiting_since.is_none() {
                serial += 1;
                a.waiter = format!("waiter-{serial}");
                a.waiting_since = Some(Instant::now());
            }
            serial += 1;
            a.token = format!("token-{serial}");
            let mut granted = rw(
                &mut conn,
                &format!("{side}a"),
                &a.token,
                ttl,
                &a.waiter,
                WAIT,
            );
            if rng.below(4) == 0 {
                granted = rw(
                    &mut conn,
                    &format!("{side}a"),
                    &a.token,
                    ttl,
                    &a.waiter,
                    WAIT,
                );
            }
            if granted == 1 {
                if a.write {
                    rw(&mut conn, "wl", &a.waiter, ttl, &a.waiter, WAIT);
                }
                let waited = a.waiting_since.take().expect("waiting").elapsed();
                longest = longest.max(waited);
                a.held = true;
            } else if rng.below(20) == 0 {
                // Gives up: its leave.
                let leave = if a.write { "wl" } else { "rr" };
                rw(&mut conn, leave, &a.waiter, ttl, &a.waiter, WAIT);
                a.waiting_since = None;
            }
        }
        // The invariants.
        let writer: Option<String> = redis::cmd("GET")
            .arg("l:rwlock:writer")
            .query(&mut conn)
            .expect("GET");
        let now: (u64, u64) = redis::cmd("TIME").query(&mut conn).expect("TIME");
        let now_ms = now.0 * 1000 + now.1 / 1000;
        let live: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg("l:rwlock:readers")
            .arg(format!("({now_ms}"))
            .arg("+inf")
            .query(&mut conn)
            .expect("ZRANGEBYSCORE");
        assert!(
            writer.is_none() || live.is_empty(),
            "writer {writer:?} beside live readers {live:?}"
        );
        for key in [
            "l:rwlock:writer",
            "l:rwlock:readers",
            "l:rwlock:writer_waiting",
        ] {
            let pttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).expect("PTTL");
            assert_ne!(pttl, -1, "{key} has no TTL");
        }
        let places: Vec<(String, f64)> = redis::cmd("ZRANGEBYSCORE")
            .arg("l:rwlock:readers")
            .arg("-inf")
            .arg("(0")
            .arg("WITHSCORES")
            .query(&mut conn)
            .expect("places");
        for (place, score) in places {
            let end = if score < -1e15 {
                -(score + 1e15)
            } else {
                -score
            };
            assert!(
                end <= (now_ms + WAIT + 5) as f64,
                "{place} lives until {end}, past now {now_ms} + the wait"
            );
        }
    }
    // Nobody's wait was unbounded: a writer's hold (under 250 ms) and a few waits at most.
    assert!(
        longest < Duration::from_secs(3),
        "an acquisition waited {longest:?}"
    );
    for (i, a) in actors.iter().enumerate() {
        if let Some(since) = a.waiting_since {
            assert!(
                since.elapsed() < Duration::from_secs(3),
                "actor {i} still waits since {:?}",
                since.elapsed()
            );
        }
    }
}
