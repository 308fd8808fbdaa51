use super::reading::{parse_info, parse_memory, refuses, stepped};
use super::*;

const S: Duration = Duration::from_secs(1);
const MS: Duration = Duration::from_millis(1);
const NOW_MS: u64 = 1_800_000_000_000;

fn identity(period: Duration) -> (Identity, Arc<MemoryBook>) {
    let book = Arc::new(MemoryBook::new(period));
    let rule = QuarantineRule {
        period,
        drift_factor: 0.01,
    };
    let identity = Identity::new(
        rule,
        Arc::clone(&book),
        ("A", ""),
        TaskTracker::new(),
        Duration::from_secs(1),
    );
    (identity, book)
}

fn info(run_id: &str, uptime: u64, replid: &str, evicted: u64) -> Value {
    Value::BulkString(
        format!(
            "# Server\r\nredis_version:7.0.15\r\nrun_id:{run_id}\r\nuptime_in_seconds:{uptime}\r\n\
             # Stats\r\nevicted_keys:{evicted}\r\n# Replication\r\nmaster_replid:{replid}\r\n"
        )
        .into_bytes(),
    )
}

fn memory(marker: &str, made_ms: u64, now_ms: u64) -> Value {
    Value::Array(vec![
        Value::BulkString(format!("{marker}|{made_ms}").into_bytes()),
        Value::Int(now_ms as i64),
    ])
}

/// One reading with `INFO` and the memory script's reply, taken now (a 1 ms round trip).
fn read(identity: &Identity, info: Value, memory: Value) {
    let (asked, _, _) = identity.ask().expect("checks are on");
    let mut replies = vec![info];
    if asked.load {
        replies.push(Value::BulkString(b"sha".to_vec()));
    }
    replies.push(memory);
    let sent = clock::now();
    identity.observe(&asked, replies, sent, sent + MS);
}

#[test]
fn parses_the_fields_that_tell_a_loss() {
    let Value::BulkString(text) = info("abc", 42, "r1", 3) else {
        unreachable!()
    };
    let parsed = parse_info(&String::from_utf8_lossy(&text)).expect("parses");
    assert_eq!(
        parsed,
        Info {
            run_id: "abc".into(),
            uptime: 42 * S,
            replid: Some("r1".into()),
            evicted: Some(3),
        }
    );
    assert_eq!(parse_info("run_id:abc\r\n"), None);
    assert_eq!(parse_info("uptime_in_seconds:x\r\nrun_id:a\r\n"), None);
}

#[test]
fn only_a_refusal_for_good_stops_the_checks() {
    assert!(refuses(
        Some("NOPERM"),
        Some("this user has no permissions")
    ));
    assert!(refuses(
        Some("ERR"),
        Some("unknown command 'INFO', with args beginning with: 'server'")
    ));
    assert!(refuses(Some("ERR"), Some("Unsupported command")));
    // Passing errors: the server stays suspect (quarantined until read), not trusted.
    assert!(!refuses(Some("ERR"), Some("max number of clients reached")));
    assert!(!refuses(
        Some("LOADING"),
        Some("Redis is loading the dataset")
    ));
    assert!(!refuses(Some("ERR"), None));
    assert!(!refuses(None, None));
}

#[test]
fn a_clock_that_moves_beyond_the_drift_bound_stepped() {
    let t0 = clock::now();
    let old = ClockSample {
        server_ms: NOW_MS,
        sent: t0,
        received: t0 + MS,
    };
    let (sent, received) = (t0 + S, t0 + S + MS);
    // 1 s later by both clocks, give or take the round trips and 1 % drift: no step.
    for moved in [990, 1000, 1012] {
        assert!(
            !stepped(old, NOW_MS + moved, sent, received, 0.01),
            "{moved}"
        );
    }
    // A second ahead, or standing still.
    assert!(stepped(old, NOW_MS + 2000, sent, received, 0.01));
    assert!(stepped(old, NOW_MS + 20, sent, received, 0.01));
    assert!(stepped(old, NOW_MS - 5000, sent, received, 0.01));
}

#[test]
fn memory_replies_parse_into_readings() {
    let at = clock::now();
    let reply = Value::Array(vec![
        Value::BulkString(b"m1|1000".to_vec()),
        Value::Int(5000),
        Value::Nil,
        Value::BulkString(b"x|2000|1".to_vec()),
    ]);
    let peers = ["B".to_owned(), "C".to_owned()];
    let reading = parse_memory(reply, &peers, None, at).expect("parses");
    assert_eq!(reading.marker.id, "m1");
    assert_eq!((reading.marker.made_ms, reading.now_ms), (1000, 5000));
    assert_eq!(reading.roster.len(), 1);
    assert_eq!(reading.roster[0].0, "C");
    assert!(reading.roster[0].1.replaced);
    assert!(parse_memory(Value::Int(1), &peers, None, at).is_none());
}

#[test]
fn a_restart_seen_quarantines_and_a_kept_marker_is_replaced() {
    let (identity, _book) = identity(60 * S);
    assert_eq!(identity.due(), Due::Before);
    let (asked, _, count) = identity.ask().expect("on");
    assert!(asked.info && asked.load && asked.memory && asked.replace.is_none());
    assert_eq!(count, 3);
    read(
        &identity,
        info("a", 100, "r", 0),
        memory("m", NOW_MS - 100_000, NOW_MS),
    );
    assert_eq!(identity.due(), Due::No);
    assert_eq!(identity.standing(), Standing::Counts);
    // Suspected (a lost connection): fail closed until read.
    identity.suspect();
    assert_eq!(identity.due(), Due::Before);
    assert_eq!(identity.standing(), Standing::Quarantined(RECHECK));
    // Restarted 20 s ago, the marker reloaded with it: quarantined 40 s, the marker replaced
    // by the next reading so that fresh clients see it too.
    read(
        &identity,
        info("b", 20, "r2", 0),
        memory("m", NOW_MS - 100_000, NOW_MS),
    );
    let Standing::Quarantined(left) = identity.standing() else {
        panic!("{:?}", identity.standing())
    };
    assert!(left <= 40 * S + 10 * MS && left > 39 * S, "{left:?}");
    assert!(!identity.repairs());
    assert_eq!(
        identity.due(),
        Due::Before,
        "the marker is replaced at once"
    );
    let (asked, _, _) = identity.ask().expect("on");
    assert_eq!(asked.replace.as_deref(), Some("m"));
}

#[test]
fn evictions_a_failover_and_a_vanished_marker_quarantine_for_the_period() {
    for (second_info, second_memory) in [
        (
            info("a", 100, "r", 7),
            memory("m", NOW_MS - 100_000, NOW_MS),
        ),
        (
            info("a", 100, "r2", 0),
            memory("m", NOW_MS - 100_000, NOW_MS),
        ),
        (info("a", 100, "r", 0), memory("m2", NOW_MS, NOW_MS)),
        // The clock jumped 30 s between two readings a millisecond apart.
        (
            info("a", 100, "r", 0),
            memory("m", NOW_MS - 100_000, NOW_MS + 30_000),
        ),
    ] {
        let (identity, _book) = identity(60 * S);
        read(
            &identity,
            info("a", 100, "r", 0),
            memory("m", NOW_MS - 100_000, NOW_MS),
        );
        assert_eq!(identity.standing(), Standing::Counts);
        read(&identity, second_info, second_memory);
        let Standing::Quarantined(left) = identity.standing() else {
            panic!("{:?}", identity.standing())
        };
        assert!(left > 59 * S, "{left:?}");
    }
    // The same readings with none of these: it counts.
    let (identity, _book) = identity(60 * S);
    read(
        &identity,
        info("a", 100, "r", 0),
        memory("m", NOW_MS - 100_000, NOW_MS),
    );
    read(
        &identity,
        info("a", 100, "r", 0),
        memory("m", NOW_MS - 100_000, NOW_MS),
    );
    assert_eq!(identity.standing(), Standing::Counts);
}

/// One reading whose `INFO` answers and whose memory script is refused with `refusal` (an
/// error reply, with its CRLF).
fn memory_refused(identity: &Identity, refusal: &str) {
    let refused = redis::parse_redis_value(refusal.as_bytes()).expect("an error reply");
    let (asked, _, _) = identity.ask().expect("on");
    let sent = clock::now();
    identity.observe(
        &asked,
        vec![info("a", 100, "r", 0), Value::Okay, refused],
        sent,
        sent + MS,
    );
}

#[test]
fn an_acl_without_the_memory_script_stops_its_checks_alone() {
    let (identity, _book) = identity(60 * S);
    memory_refused(
        &identity,
        "-NOPERM this user has no permissions to run the 'time' command\r\n",
    );
    assert_eq!(identity.standing(), Standing::Counts);
    let (asked, _, count) = identity.ask().expect("INFO is still read");
    assert!(asked.info && !asked.memory && !asked.load);
    assert_eq!(count, 1);
    // Quarantine off: nothing is read at all.
    let (off, _book) = super::tests::identity(Duration::ZERO);
    assert_eq!(off.due(), Due::No);
    assert!(off.ask().is_none());
}

#[test]
fn every_servers_wording_of_an_acl_refusal_in_a_script_stops_the_memory_reads() {
    for wording in [
        "-ERR The user executing the script can't run this command or subcommand script: abc\r\n",
        "-ERR ACL failure in script: User 'locker' has no permissions to run the 'time' command script: abc\r\n",
        "-NOPERM this user has no permissions to access one of the keys used as arguments\r\n",
    ] {
        let (identity, _book) = identity(60 * S);
        memory_refused(&identity, wording);
        assert_eq!(identity.standing(), Standing::Counts, "{wording}");
        let (asked, _, _) = identity.ask().expect("INFO is still read");
        assert!(!asked.memory, "{wording}");
    }
}
