//! A counting semaphore: eight workers share three permits; never more than three run.
//!
//! ```sh
//! scripts/demo.sh                        # starts five local Redis masters if none are up
//! REDFENCE_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run --example semaphore      # against nodes of your own
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redfence::{Error, Redlock};

const PERMITS: u32 = 3;
const TTL: Duration = Duration::from_secs(5);

fn nodes() -> Vec<String> {
    match std::env::var("REDFENCE_NODES") {
        Ok(list) => list.split(',').map(|s| s.trim().to_owned()).collect(),
        Err(_) => (7001..=7005)
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let redlock = Redlock::builder()
        .nodes(nodes())
        .retry_count(1_000)
        .retry_delay(Duration::from_millis(50))
        .build()?;
    let jobs = redlock.semaphore("example:jobs", PERMITS)?;
    let running = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));

    let workers: Vec<_> = (0..8)
        .map(|worker| {
            let (jobs, running, most) = (jobs.clone(), running.clone(), most.clone());
            tokio::spawn(async move {
                jobs.using(TTL, |signal| async move {
                    let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    println!(
                        "worker {worker}: running in {} ({now} running)",
                        signal.resources()[0]
                    );
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    signal.check()?; // stop before an irreversible step if the permit is gone
                    running.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, Error>(())
                })
                .await
            })
        })
        .collect();
    for worker in workers {
        match worker.await {
            Ok(result) => result?,
            Err(panic) => eprintln!("a worker panicked: {panic}"),
        }
    }
    println!(
        "at most {} of 8 workers ran at once (permits: {PERMITS})",
        most.load(Ordering::SeqCst)
    );
    redlock.close().await;
    Ok(())
}
