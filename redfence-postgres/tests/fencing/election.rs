//! A deposed leader's late write rejected by PostgreSQL: the term is the fence. (The other
//! election tests are the core crate's, in `tests/election/`.)

use std::sync::Arc;

use redfence::{Error, FencingCounter};
use redfence_postgres::tokio_postgres::Client;
use redfence_postgres::{FenceGuards, FencedWriteError, PostgresCounter};
use tokio::sync::oneshot;

use crate::support::candidates::candidate;
use crate::support::postgres::Postgres;
use crate::support::proxy::Mode;
use crate::support::{DEADLINE, Servers};

use crate::support::candidates::LEASE;

/// One fenced write: claim the guard row "jobs" with `term`, then append to the job log,
/// in one transaction.
async fn write(client: &mut Client, who: &str, term: u64) -> Result<(), FencedWriteError> {
    let tx = client.transaction().await.expect("begin");
    FenceGuards::new().claim(&tx, "jobs", term).await?;
    tx.execute(
        "INSERT INTO job_log VALUES ($1, $2)",
        &[&who, &(term as i64)],
    )
    .await
    .expect("insert");
    tx.commit().await.expect("commit");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_leaders_late_write_is_rejected_by_the_guard_row() {
    let pg = Postgres::start();
    let admin = pg.client().await;
    FenceGuards::new()
        .create_table(&admin)
        .await
        .expect("guards");
    admin
        .batch_execute("CREATE TABLE job_log (writer text NOT NULL, term bigint NOT NULL)")
        .await
        .expect("schema");
    let servers = Servers::start(3);
    // The terms come from PostgreSQL too: durable and shared by both candidates.
    let counter: Arc<dyn FencingCounter> =
        Arc::new(PostgresCounter::connect(&pg.url()).expect("counter config"));
    let a = candidate(&servers, &counter, 0, true, false).await;
    let b = candidate(&servers, &counter, 1, false, false).await;

    // A leads and writes, then "pauses" (a GC pause: it does not look at its signal)
    // until woken, and writes again with its term.
    let (elected_tx, elected) = oneshot::channel::<u64>();
    let (wake_tx, wake) = oneshot::channel::<()>();
    let mut client = Some(pg.client().await);
    let (mut elected_tx, mut wake) = (Some(elected_tx), Some(wake));
    let a_election = a.election.clone();
    let a_task = tokio::spawn(async move {
        a_election
            .run(|leadership| {
                let parts = (client.take(), elected_tx.take(), wake.take());
                async move {
                    let (Some(mut client), Some(elected_tx), Some(wake)) = parts else {
                        unreachable!("one term only (no rejoin)");
                    };
                    let term = leadership.term();
                    write(&mut client, "A", term)
                        .await
                        .expect("A's first write");
                    elected_tx.send(term).expect("main waits");
                    wake.await.expect("woken");
                    let lost = leadership.is_lost();
                    Ok::<_, Error>((lost, write(&mut client, "A", term).await))
                }
            })
            .await
    });
    let term_a = tokio::time::timeout(DEADLINE, elected)
        .await
        .expect("A elected")
        .expect("A's term");
    // A is cut off from the lock nodes (it cannot renew), not from PostgreSQL. Its lease
    // runs out and B, campaigning only now so that A surely led first, takes over.
    a.set(Mode::Blackhole);
    let b_client = tokio::sync::Mutex::new(pg.client().await);
    let b_client = &b_client;
    let b_run = b.election.run(|leadership| async move {
        let term = leadership.term();
        let written = write(&mut *b_client.lock().await, "B", term).await;
        Ok::<_, Error>((term, written))
    });
    let (term_b, written) = tokio::time::timeout(LEASE + DEADLINE, b_run)
        .await
        .expect("B elected")
        .expect("B's term");
    assert!(term_b > term_a, "B {term_b} after A {term_a}");
    written.expect("B writes");

    wake_tx.send(()).expect("A waits");
    let (lost, late) = tokio::time::timeout(DEADLINE, a_task)
        .await
        .expect("A returns")
        .expect("A's task")
        .expect("A's term");
    assert!(lost, "A's signal had fired by then");
    let err = late.expect_err("A's late write must be rejected");
    assert!(err.is_ownership_lost(), "{err:?}");
    assert_eq!(
        err.stale()
            .map(|s| (s.resource.as_str(), s.offered, s.last_accepted)),
        Some(("jobs", term_a, term_b))
    );
    let rows = admin
        .query("SELECT writer, term FROM job_log ORDER BY term", &[])
        .await
        .expect("select");
    let log: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        log,
        vec![
            ("A".to_string(), term_a as i64),
            ("B".to_string(), term_b as i64)
        ]
    );
}
