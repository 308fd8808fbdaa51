//! The simulated server of each [`Profile`] against its real server (Redis 7.0, Valkey 9.1,
//! Redis 8.6; each test skipped, with a notice, when that server is not installed): first the
//! identity a client reads (`INFO server`, `COMMAND INFO DELIFEQ DELEX`), then seeded random
//! sequences of the command forms redfence uses, of ad hoc scripts
//! (conversions, errors) and of redfence's scripts (`batch.lua` with random mixes of every
//! kind of operation, the advisory and fencing scripts), sent to both; after each step the
//! replies and every key's state (`TYPE`, `GET`, `ZRANGE 0 -1 WITHSCORES`, `PTTL`) must match.
//!
//! Time: the simulated clock follows the wall clock, every TTL outlives a case, and values
//! made from the server's time (13 digits and more: scores, markers) are masked; `PTTL` and
//! the scripts that report time left match within 100 ms.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Value;

use super::SimServer;
use super::differential_data::{SCRIPTS, universe};
use super::differential_gen::{Compare, Gen};
use super::differential_real::{Real, binary, info_fields, major_minor};
use super::profile::Profile;

/// The wall clock in ms (the real server's clock).
fn wall_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

/// `value` with what the server's time makes masked: runs of 12 digits and more in strings
/// (not after a `.`: the digits of a fraction are compared), integers of 12 digits and more.
fn masked(value: &Value) -> Value {
    match value {
        Value::BulkString(bytes) => {
            let mut out = Vec::with_capacity(bytes.len());
            let mut run = Vec::new();
            let mut fraction = false;
            for &b in bytes.iter().chain([0u8].iter()) {
                if b.is_ascii_digit() {
                    run.push(b);
                    continue;
                }
                if run.len() >= 12 && !fraction {
                    out.extend_from_slice(b"<T>");
                } else {
                    out.append(&mut run);
                }
                run.clear();
                fraction = b == b'.';
                out.push(b);
            }
            out.pop();
            Value::BulkString(out)
        }
        Value::Int(n) if n.unsigned_abs() >= 100_000_000_000 => Value::Int(0),
        Value::Array(items) => Value::Array(items.iter().map(masked).collect()),
        other => other.clone(),
    }
}

/// Whether `sim` and `real` agree as `compare` asks (both masked first).
fn agree(sim: &Value, real: &Value, compare: Compare) -> bool {
    match (compare, masked(sim), masked(real)) {
        (Compare::Exact, a, b) => a == b,
        (Compare::Near, a, b) => near(&a, &b),
        (Compare::Scan, a, b) => sorted_scan(a) == sorted_scan(b),
        (Compare::Pairs, a, b) => ties_sorted(a) == ties_sorted(b),
    }
}

/// A masked `ZRANGE … WITHSCORES` reply with each run of members of equal (masked) scores
/// sorted by member.
fn ties_sorted(reply: Value) -> Value {
    let Value::Array(items) = reply else {
        return reply;
    };
    let mut pairs: Vec<(Value, Value)> = Vec::new();
    let mut items = items.into_iter();
    while let (Some(member), Some(score)) = (items.next(), items.next()) {
        pairs.push((member, score));
    }
    let mut out = Vec::with_capacity(pairs.len() * 2);
    for run in pairs.chunk_by_mut(|x, y| x.1 == y.1) {
        run.sort_by(|x, y| format!("{:?}", x.0).cmp(&format!("{:?}", y.0)));
        for (member, score) in run.iter().cloned() {
            out.push(member);
            out.push(score);
        }
    }
    Value::Array(out)
}

/// A `SCAN` reply with its keys sorted.
fn sorted_scan(reply: Value) -> Value {
    match reply {
        Value::Array(mut parts) => {
            if let Some(Value::Array(keys)) = parts.get_mut(1) {
                keys.sort_by(|x, y| format!("{x:?}").cmp(&format!("{y:?}")));
            }
            Value::Array(parts)
        }
        other => other,
    }
}

/// Equal, but integers within 100 of each other.
fn near(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => x.abs_diff(*y) <= 100,
        (Value::Array(xs), Value::Array(ys)) => {
            xs.len() == ys.len() && xs.iter().zip(ys).all(|(x, y)| near(x, y))
        }
        _ => a == b,
    }
}

/// The state of every key of the universe: for each, `TYPE`, `GET`, `ZRANGE 0 -1 WITHSCORES`
/// (errors included: they tell the type) and `PTTL` (compared within 100 ms).
fn state_commands() -> Vec<(Vec<Vec<u8>>, Compare)> {
    let mut out = Vec::new();
    for key in universe() {
        let k = key.as_bytes().to_vec();
        for (words, compare) in [
            (&["TYPE"][..], Compare::Exact),
            (&["GET"], Compare::Exact),
            (&["ZRANGE", "0", "-1", "WITHSCORES"], Compare::Pairs),
            (&["PTTL"], Compare::Near),
        ] {
            let mut args = vec![words[0].as_bytes().to_vec(), k.clone()];
            args.extend(words[1..].iter().map(|w| w.as_bytes().to_vec()));
            out.push((args, compare));
        }
    }
    out
}

/// The milliseconds of a `TIME` reply.
fn server_ms(time: &Value) -> Option<u64> {
    let Value::Array(parts) = time else {
        return None;
    };
    let number = |part: &Value| match part {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse::<u64>().ok(),
        _ => None,
    };
    Some(number(parts.first()?)? * 1000 + number(parts.get(1)?)? / 1000)
}

/// Shows a command for a failure message.
fn show(args: &[Vec<u8>]) -> String {
    args.iter()
        .map(|a| format!("{:?}", String::from_utf8_lossy(a)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `INFO server` fields that name a server and its mode.
const IDENTITY: &[&str] = &[
    "redis_version",
    "server_name",
    "valkey_version",
    "redis_mode",
    "server_mode",
];

/// Checks that `sim` tells the client what `real` tells it: the `INFO server` fields that name
/// the server (versions to the minor one), a run id and an uptime, and `COMMAND INFO DELIFEQ
/// DELEX` (how a link detects compare-and-delete). `Err`: the real server is another version
/// than the profile's (the test is skipped).
fn same_identity(real: &mut Real, sim: &mut SimServer) -> Result<(), String> {
    let info = ["INFO", "server"];
    let real_fields = info_fields(&real.one(&info));
    let sim_fields = info_fields(&sim.command(&info.map(|a| a.as_bytes().to_vec())));
    let field = |fields: &[(String, String)], name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    for name in ["redis_version", "valkey_version"] {
        let (Some(sim_version), real_version) =
            (field(&sim_fields, name), field(&real_fields, name))
        else {
            continue;
        };
        let real_version = real_version.unwrap_or_default();
        if major_minor(&sim_version) != major_minor(&real_version) {
            return Err(format!(
                "its {name} is {real_version:?}, the {:?} profile's {sim_version}",
                sim.profile()
            ));
        }
    }
    for name in IDENTITY {
        let (sim_value, real_value) = (field(&sim_fields, name), field(&real_fields, name));
        let same = match (&sim_value, &real_value) {
            (Some(a), Some(b)) if name.ends_with("_version") => major_minor(a) == major_minor(b),
            _ => sim_value == real_value,
        };
        assert!(
            same,
            "INFO server {name}: simulated {sim_value:?}, real {real_value:?}"
        );
    }
    for fields in [&sim_fields, &real_fields] {
        let run_id = field(fields, "run_id").unwrap_or_default();
        assert!(run_id.len() == 40 && run_id.bytes().all(|b| b.is_ascii_hexdigit()));
        let uptime = field(fields, "uptime_in_seconds").unwrap_or_default();
        assert!(uptime.parse::<u64>().is_ok(), "uptime {uptime:?}");
    }
    let detection = ["COMMAND", "INFO", "DELIFEQ", "DELEX"];
    let real_reply = real.one(&detection);
    let sim_reply = sim.command(&detection.map(|a| a.as_bytes().to_vec()));
    assert_eq!(sim_reply, real_reply, "COMMAND INFO DELIFEQ DELEX");
    Ok(())
}

/// The differential test of `profile` against its real server (skipped, with a notice, when
/// that server is not installed or is another version): the identity, the sweep of ad hoc
/// scripts, then random cases for about 3 s (at least 50, at most 400), or for as many
/// seconds as `REDFENCE_DIFFERENTIAL_SECS` says (without the cap: a longer exploration).
fn differential(profile: Profile) {
    let binary = binary(profile);
    let Some(mut real) = Real::start(&binary) else {
        eprintln!("differential test of {profile:?} skipped: no server at {binary}");
        return;
    };
    let started = Instant::now();
    let mut sim = SimServer::with_profile(profile, wall_ms());
    if let Err(why) = same_identity(&mut real, &mut sim) {
        eprintln!("differential test of {profile:?} skipped: {binary}: {why}");
        return;
    }
    let state = state_commands();
    let state_args: Vec<Vec<Vec<u8>>> = state.iter().map(|(args, _)| args.clone()).collect();
    sim.set_time(wall_ms());
    for args in Gen::sweep() {
        let real_reply = real.send(std::slice::from_ref(&args)).remove(0);
        let sim_reply = sim.command(&args);
        assert!(
            agree(&sim_reply, &real_reply, Compare::Exact),
            "{profile:?} sweep: {}\n  simulated: {sim_reply:?}\n  real:      {real_reply:?}",
            show(&args),
        );
    }
    let (mut steps, mut cases) = (0, 0);
    let asked = std::env::var("REDFENCE_DIFFERENTIAL_SECS")
        .ok()
        .and_then(|secs| secs.parse::<u64>().ok());
    let (budget, cap) = asked.map_or((3, 400), |secs| (secs, u64::MAX));
    for case in 0..cap {
        if started.elapsed() > Duration::from_secs(budget) && case >= 50 {
            break;
        }
        cases += 1;
        let mut generator = Gen::new(case, profile);
        let mut history: Vec<String> = Vec::new();
        let mut setup = vec![vec![b"FLUSHALL".to_vec()]];
        setup.extend(
            SCRIPTS
                .iter()
                .map(|(_, source)| vec![b"SCRIPT".to_vec(), b"LOAD".to_vec(), source.to_vec()]),
        );
        sim.set_time(wall_ms());
        for (args, real_reply) in setup.iter().zip(real.send(&setup)) {
            assert_eq!(sim.command(args), real_reply, "setup {}", show(args));
        }
        for step in 0..generator.steps() {
            steps += 1;
            let (args, compare) = generator.step();
            history.push(show(&args));
            // The real server's time, the step and the state check after it, in one round
            // trip: the simulated server runs the step at the real one's millisecond.
            let mut pipeline = vec![vec![b"TIME".to_vec()], args.clone()];
            pipeline.extend(state_args.iter().cloned());
            let mut real_replies = real.send(&pipeline).into_iter();
            let now = real_replies.next().and_then(|time| server_ms(&time));
            let real_reply = real_replies.next().expect("a reply per command");
            sim.set_time(now.unwrap_or_else(wall_ms));
            let sim_reply = sim.command(&args);
            assert!(
                agree(&sim_reply, &real_reply, compare),
                "{profile:?} case {case} step {step}: {}\n  simulated: {sim_reply:?}\n  real:      {real_reply:?}\n  history:\n    {}",
                show(&args),
                history.join("\n    "),
            );
            for ((args, compare), real_reply) in state.iter().zip(real_replies) {
                let sim_reply = sim.command(args);
                assert!(
                    agree(&sim_reply, &real_reply, *compare),
                    "{profile:?} case {case} after step {step}: {}\n  simulated: {sim_reply:?}\n  real:      {real_reply:?}\n  history:\n    {}",
                    show(args),
                    history.join("\n    "),
                );
            }
        }
    }
    eprintln!(
        "differential {profile:?}: {cases} cases, {steps} steps in {:?}",
        started.elapsed()
    );
}

#[test]
fn the_simulated_server_answers_as_redis_7() {
    differential(Profile::Redis7);
}

#[test]
fn the_simulated_server_answers_as_valkey_9() {
    differential(Profile::Valkey9);
}

#[test]
fn the_simulated_server_answers_as_redis_8() {
    differential(Profile::Redis8);
}
