//! A read-write lock: six readers share a config while two writers take turns alone; a
//! waiting writer holds new readers back, so it is never starved.
//!
//! ```sh
//! scripts/demo.sh                        # starts five local Redis masters if none are up
//! REDFENCE_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run --example rwlock         # against nodes of your own
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use redfence::{Error, MemoryCounter, Redlock};

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
        .fencing(MemoryCounter::new()) // use a durable counter in production
        .retry_count(1_000)
        .retry_delay(Duration::from_millis(50))
        .build()?;
    let config = redlock.rwlock("example:config")?;
    // Readers count up, a writer counts -1000: never a writer beside anyone.
    let inside = Arc::new(AtomicI32::new(0));

    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let (config, inside) = (config.clone(), inside.clone());
            tokio::spawn(async move {
                if task % 4 == 3 {
                    config
                        .using_write(TTL, |signal| async move {
                            let before = inside.fetch_sub(1_000, Ordering::SeqCst);
                            println!(
                                "writer {task}: fence {:?}, alone: {}",
                                signal.fence(),
                                before == 0
                            );
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            signal.check()?; // stop before writing if the lock is gone
                            inside.fetch_add(1_000, Ordering::SeqCst);
                            Ok::<_, Error>(())
                        })
                        .await
                } else {
                    config
                        .using_read(TTL, |signal| async move {
                            let readers = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            println!("reader {task}: {readers} reading");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            signal.check()?;
                            inside.fetch_sub(1, Ordering::SeqCst);
                            Ok::<_, Error>(())
                        })
                        .await
                }
            })
        })
        .collect();
    for task in tasks {
        match task.await {
            Ok(result) => result?,
            Err(panic) => eprintln!("a task panicked: {panic}"),
        }
    }
    let report = config.inspect().await?;
    println!(
        "done: writer {:?}, {} readers left",
        report.writer(),
        report.readers().len()
    );
    redlock.close().await;
    Ok(())
}
