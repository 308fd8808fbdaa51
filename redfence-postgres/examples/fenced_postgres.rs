//! A stale owner, stopped by PostgreSQL: the fencing story end to end.
//!
//! Worker A acquires a lock and stalls past its lease; worker B acquires the lock, gets a
//! greater fence and writes, twice (the owner's own fence is accepted again); A wakes up and
//! writes with its old, smaller fence. PostgreSQL refuses A's write (`StaleFence`), and B's
//! data is intact.
//!
//! ```sh
//! # five independent Redis masters (or any odd number) and one PostgreSQL:
//! for p in 7001 7002 7003 7004 7005; do redis-server --port $p --daemonize yes --save ''; done
//! docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16
//!
//! REDFENCE_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//! REDFENCE_PG="host=127.0.0.1 user=postgres" \
//!     cargo run -p redfence-postgres --example fenced_postgres
//! ```
//!
//! `REDFENCE_NODES` defaults to `redis://127.0.0.1:7001` .. `:7005`, `REDFENCE_PG` (a
//! tokio-postgres connect string) to `host=127.0.0.1 user=postgres dbname=postgres`.

use std::process::ExitCode;
use std::time::Duration;

use redfence::{Error, Redlock};
use redfence_postgres::tokio_postgres::{self, Client, NoTls};
use redfence_postgres::{FencedUpdate, FencedWriteError, PostgresCounter};

const RESOURCE: &str = "account:1";
const LEASE: Duration = Duration::from_secs(1);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), BoxError> {
    let nodes: Vec<String> = std::env::var("REDFENCE_NODES")
        .unwrap_or_else(|_| {
            (7001..=7005)
                .map(|p| format!("redis://127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    let pg = std::env::var("REDFENCE_PG")
        .unwrap_or_else(|_| "host=127.0.0.1 user=postgres dbname=postgres".to_owned());

    // PostgreSQL: the storage the work writes to, and the fencing counter.
    let db = match connect(&pg).await {
        Ok(db) => db,
        Err(err) => {
            return Err(format!(
                "cannot connect to PostgreSQL with REDFENCE_PG={pg:?}: {}\n\
                 Start one, e.g. `docker run -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust postgres:16`,\n\
                 and point REDFENCE_PG at it (a tokio-postgres connect string, e.g. \"host=127.0.0.1 user=postgres\").",
                with_causes(&err)
            )
            .into());
        }
    };
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS redfence_example_accounts (\
             id bigint PRIMARY KEY, owner text NOT NULL, balance bigint NOT NULL, \
             last_fence bigint NOT NULL DEFAULT 0);\
         INSERT INTO redfence_example_accounts (id, owner, balance) VALUES (1, 'nobody', 100) \
             ON CONFLICT (id) DO NOTHING;",
    )
    .await?;

    let redlock = Redlock::builder()
        .nodes(&nodes)
        .fencing(PostgresCounter::connect(&pg)?) // table `redfence_fences`, created on demand
        .build()?;
    println!(
        "{} Redis nodes (a quorum is {}), PostgreSQL at {pg:?}\n",
        redlock.node_count(),
        redlock.quorum()
    );

    // A acquires, with a short lease.
    let lock_a = match redlock.acquire(&[RESOURCE], LEASE).await {
        Ok(lock) => lock,
        Err(err @ (Error::QuorumUnreachable { .. } | Error::AcquireTimeout { .. })) => {
            return Err(format!(
                "cannot lock on a majority of the Redis nodes {nodes:?}: {err}\n\
                 Start them, e.g. `for p in 7001 7002 7003 7004 7005; do redis-server --port $p --daemonize yes --save ''; done`,\n\
                 or point REDFENCE_NODES at yours (comma-separated redis:// URLs)."
            )
            .into());
        }
        Err(err) => return Err(err.into()),
    };
    let fence_a = lock_a
        .fence()
        .ok_or("no fence: fencing is not configured")?;
    println!(
        "A: acquired {RESOURCE:?} with fence {fence_a}, valid for {:?}",
        lock_a.remaining()
    );

    // A stalls (a GC pause, a stalled VM, a slow call) past its lease. It does not know.
    println!(
        "A: ... stalls for {:?} ...",
        LEASE + Duration::from_millis(200)
    );
    tokio::time::sleep(LEASE + Duration::from_millis(200)).await;

    // B acquires the now free lock and writes.
    let lock_b = redlock.acquire(&[RESOURCE], Duration::from_secs(5)).await?;
    let fence_b = lock_b.fence().ok_or("no fence")?;
    println!("B: acquired {RESOURCE:?} with fence {fence_b}");
    write(&db, "B", 150, fence_b).await?;
    println!("B: wrote owner = B, balance = 150 with fence {fence_b}: accepted");
    write(&db, "B", 175, fence_b).await?;
    println!("B: wrote balance = 175 with the same fence {fence_b}: accepted (its own fence)");
    lock_b.release().await?;
    println!("B: released");

    // A wakes up and writes with its old fence.
    println!(
        "A: wakes up (lock expired: {}) and writes with fence {fence_a}",
        lock_a.is_expired()
    );
    let outcome = match write(&db, "A", 0, fence_a).await {
        Err(FencedWriteError::Stale(stale)) => {
            println!("A: REJECTED by PostgreSQL: {stale}");
            println!("A: treats it as ownership lost and stops.");
            Ok(())
        }
        Ok(_) => Err("A's stale write was accepted: fencing did not work".into()),
        Err(other) => Err(other.into()),
    };
    drop(lock_a);

    let row = db
        .query_one(
            "SELECT owner, balance, last_fence FROM redfence_example_accounts WHERE id = 1",
            &[],
        )
        .await?;
    println!(
        "\nrow now: owner = {}, balance = {}, last_fence = {} (B's data is intact)",
        row.get::<_, String>(0),
        row.get::<_, i64>(1),
        row.get::<_, i64>(2)
    );
    outcome
}

/// The error and its causes, e.g. "error connecting to server: Connection refused".
fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Connects and drives the connection on a task of its own.
async fn connect(config: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(config, NoTls).await?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            eprintln!("PostgreSQL connection ended: {err}");
        }
    });
    Ok(client)
}

/// The fenced write: one UPDATE that applies only if `fence` is not smaller than the row's.
async fn write(
    db: &Client,
    owner: &str,
    balance: i64,
    fence: u64,
) -> Result<u64, FencedWriteError> {
    FencedUpdate::new("redfence_example_accounts", "id", &1_i64)
        .set("owner", &owner)
        .set("balance", &balance)
        .execute(db, fence)
        .await
}
