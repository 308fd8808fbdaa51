//! The PostgreSQL counter's durability and its stripes' rows against configuration changes
//! (from an adversarial review of fencing: each test failed before its fix).
//!
//! Real servers only: PostgreSQL clusters and redis-server processes of the testkit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redfence::fence::Stripes;
use redfence::{Error, FencingCounter, InvalidInput, Redlock};
use redfence_postgres::PostgresCounter;
use redfence_postgres::tokio_postgres::{Client, SimpleQueryMessage};
use redfence_testkit::postgres::Postgres;
use redfence_testkit::{DEADLINE, Servers};

fn names(r: &[&str]) -> Vec<String> {
    r.iter().map(|s| s.to_string()).collect()
}

async fn show(client: &Client, setting: &str) -> String {
    let messages = client
        .simple_query(&format!("SHOW {setting}"))
        .await
        .expect("SHOW");
    messages
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .expect("a row")
}

/// The testkit starts PostgreSQL with `-c synchronous_commit=on` on the command line, which
/// outranks `ALTER SYSTEM`; a production server has it in its config files. So this test takes
/// the testkit's cluster over: stops it, and starts the same data dir and port again without
/// that command-line option (the way a packaged server runs), and stops it when done.
struct Restarted<'a> {
    pg: &'a Postgres,
    bin: std::path::PathBuf,
}

fn pg_command(bin: &std::path::Path, program: &str) -> std::process::Command {
    let path = bin.join(program);
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if root {
        let mut cmd = std::process::Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(path);
        cmd
    } else {
        std::process::Command::new(path)
    }
}

impl<'a> Restarted<'a> {
    fn take_over(pg: &'a mut Postgres) -> Restarted<'a> {
        let bin = match std::env::var("PG_BIN") {
            Ok(dir) => std::path::PathBuf::from(dir),
            Err(_) => {
                let out = std::process::Command::new("pg_config")
                    .arg("--bindir")
                    .output()
                    .expect("pg_config");
                std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            }
        };
        pg.stop_immediate();
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=60 \
             -c shared_buffers=16MB",
            pg.port(),
            pg.dir().display()
        );
        let status = pg_command(&bin, "pg_ctl")
            .arg("-D")
            .arg(pg.dir().join("data"))
            .arg("-l")
            .arg(pg.dir().join("review.log"))
            .args(["-w", "-t", "60", "-o", &options, "start"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("pg_ctl start");
        assert!(status.success(), "restart without the command-line setting");
        Restarted { pg, bin }
    }
}

impl Drop for Restarted<'_> {
    fn drop(&mut self) {
        let _ = pg_command(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(self.pg.dir().join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// `durable_commits` (issuer.rs) checked `synchronous_commit` once, when the counter's own
/// connection was made. A server-wide `ALTER SYSTEM SET synchronous_commit = off` followed by a
/// reload turns it off in every existing session that did not SET it itself: the counter then
/// went on issuing tokens whose commits were acknowledged before they were durable, although a
/// new connection would be refused. The counter now pins the setting to its session: a trigger
/// on the counter's table records the setting its statements run with.
#[tokio::test]
async fn a_reload_turning_synchronous_commit_off_does_not_reach_the_counter() {
    let mut pg = Postgres::start();
    let restarted = Restarted::take_over(&mut pg);
    let pg = restarted.pg;
    let counter = PostgresCounter::connect(&pg.url())
        .expect("config")
        .timeout(Duration::from_secs(5));
    let first = counter.next_fence(&names(&["a"])).await.expect("token");
    assert_eq!(first, 1);

    // An existing session, like the counter's, to watch the reload land.
    let watcher = pg.client().await;
    assert_eq!(show(&watcher, "synchronous_commit").await, "on");
    let admin = pg.client().await;
    admin
        .batch_execute("ALTER SYSTEM SET synchronous_commit = off")
        .await
        .expect("alter system");
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .expect("reload");
    let deadline = Instant::now() + DEADLINE;
    while show(&watcher, "synchronous_commit").await != "off" {
        assert!(
            Instant::now() < deadline,
            "the reload never reached an existing session"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A fresh counter is refused: the documented check works at connect time.
    let fresh = PostgresCounter::connect(&pg.url())
        .expect("config")
        .timeout(Duration::from_secs(5));
    let err = fresh
        .next_fence(&names(&["a"]))
        .await
        .expect_err("a new session with synchronous_commit=off is refused");
    assert!(
        err.to_string().contains("synchronous_commit is off"),
        "{err}"
    );

    // The counter's own session keeps its commits durable: what its statement runs with.
    admin
        .batch_execute(
            "CREATE TABLE seen (setting text);
             CREATE FUNCTION record_setting() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO seen VALUES (current_setting('synchronous_commit')); RETURN NEW; END $$;
             CREATE TRIGGER record_setting BEFORE INSERT OR UPDATE ON redfence_fences
               FOR EACH ROW EXECUTE FUNCTION record_setting();",
        )
        .await
        .expect("trigger");
    let again = counter.next_fence(&names(&["a"])).await.expect("token");
    assert!(again > first);
    let seen: Vec<String> = admin
        .query("SELECT setting FROM seen", &[])
        .await
        .expect("seen")
        .iter()
        .map(|row| row.get(0))
        .collect();
    // (An upsert: its BEFORE INSERT and BEFORE UPDATE triggers both fire.)
    assert!(
        !seen.is_empty() && seen.iter().all(|setting| setting == "on"),
        "the counter's statement ran with synchronous_commit {seen:?} after the reload"
    );
    drop(restarted);
}

/// On a striped table the per-resource mode fails closed through `CHECK (resource LIKE
/// 'redfence:stripe:%/S') NOT VALID` (stripes.rs), except for a resource whose name matches
/// that pattern: its per-resource row IS a stripe's row (`redfence:stripe:J/16`), while the
/// striped clients take that resource's tokens from stripe `Stripes::of(name)` ≠ J, so during
/// the documented switch an old client's stale owner could hold a larger token than the newer
/// owner's. (Found by an adversarial review.) A per-resource counter refuses such names before
/// any traffic; a striped one takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_resource_counter_refuses_names_of_stripe_rows() {
    let pg = Postgres::start();
    let servers = Servers::start(3);
    let stripes = Stripes::DEFAULT;
    let resource = format!("redfence:stripe:0/{}", stripes.count());
    let striped = Arc::new(
        PostgresCounter::connect(&pg.url())
            .expect("config")
            .striped(stripes)
            .timeout(Duration::from_secs(5)),
    );
    let per_resource = Arc::new(
        PostgresCounter::connect(&pg.url())
            .expect("config")
            .timeout(Duration::from_secs(5)),
    );
    let builder = |counter: Arc<PostgresCounter>| {
        Redlock::builder()
            .nodes(servers.urls())
            .retry_count(0)
            .fencing(counter)
            .build()
            .expect("config")
    };
    let old = builder(per_resource);
    match old
        .acquire(&[resource.as_str()], Duration::from_secs(5))
        .await
    {
        Err(Error::InvalidInput(InvalidInput::ResourceNotFenceable { index: 0, reason })) => {
            assert!(reason.contains("redfence:stripe:"), "{reason}");
        }
        other => panic!("expected ResourceNotFenceable, got {other:?}"),
    }
    // Refused before any traffic: nothing locked, no counter row written.
    assert!(servers.on_every_node(&resource, Option::is_none));
    let rows: i64 = pg
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'redfence_fences'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 0, "the per-resource counter made its table");
    // The striped counter fences the same name (from its stripe).
    let new = builder(striped);
    let lock = new
        .acquire(&[resource.as_str()], Duration::from_secs(5))
        .await
        .expect("the striped client takes it");
    assert!(lock.fence().is_some_and(|fence| fence > 0));
    lock.release().await.expect("release");
}
