//! The main demo: two replicas race for the same invoice job; only one posts it.
//!
//! ```sh
//! scripts/demo.sh                        # starts five local Redis masters if none are up
//! REDFENCE_NODES=redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003 \
//!     cargo run --example quickstart     # against nodes of your own
//! ```

use std::sync::atomic::{AtomicU32, Ordering};
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

/// The "ledger": how many times invoice 4821 was posted. It must end at exactly one.
static POSTED: AtomicU32 = AtomicU32::new(0);

async fn replica(name: &'static str, redlock: Redlock) -> Result<(), Error> {
    let resource = ["invoice:4821"];
    match redlock.try_acquire(&resource, TTL).await {
        Ok(lock) => {
            println!(
                "{name}: acquired {:?} on a majority (fence {:?}, valid for {:?})",
                lock.resources(),
                lock.fence(),
                lock.remaining()
            );
            if POSTED.load(Ordering::SeqCst) == 0 {
                tokio::time::sleep(Duration::from_millis(100)).await; // "posting to the ledger"
                POSTED.fetch_add(1, Ordering::SeqCst);
                println!("{name}: posted invoice 4821");
            } else {
                println!("{name}: invoice 4821 is already posted; nothing to do");
            }
            lock.release().await?;
            println!("{name}: released");
            Ok(())
        }
        Err(err @ Error::Contended { .. }) => {
            println!("{name}: skipped, another replica holds the job ({err})");
            Ok(())
        }
        Err(err) => Err(err),
    }
}

#[tokio::main]
async fn main() {
    let nodes = nodes();
    let redlock = match Redlock::builder()
        .nodes(nodes.clone())
        .fencing(MemoryCounter::new()) // a durable counter (PostgresCounter) in production
        .build()
    {
        Ok(redlock) => redlock,
        Err(err) => {
            eprintln!("bad configuration: {err}");
            std::process::exit(2);
        }
    };
    println!(
        "{} nodes, a quorum is {}: {}",
        redlock.node_count(),
        redlock.quorum(),
        nodes.join(", ")
    );

    let (a, b) = tokio::join!(
        replica("replica-a", redlock.clone()),
        replica("replica-b", redlock.clone())
    );
    for result in [a, b] {
        if let Err(err) = result {
            eprintln!("\nthe demo could not reach a majority of nodes: {err}");
            eprintln!("start five local nodes with `scripts/demo.sh`, or the docker harness with");
            eprintln!("`docker/nodes.sh up`, or set REDFENCE_NODES to your own redis URLs");
            std::process::exit(1);
        }
    }
    println!(
        "invoice 4821 was posted {} time(s)",
        POSTED.load(Ordering::SeqCst)
    );

    // Bad input is rejected before any traffic, with a typed error.
    let err = redlock.acquire(&["invoice:4821", ""], TTL).await;
    if let Err(err) = err {
        println!("bad input: {err}");
    }
}
