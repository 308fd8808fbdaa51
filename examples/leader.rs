//! Three replicas of a scheduler elect one leader. The leader "schedules" a job every half
//! second, stamping each with its term; after a few jobs it resigns, and another replica
//! takes over at once with a greater term. An observer prints every change of leader.
//!
//! Start five local Redis nodes and run it:
//!
//! ```text
//! docker/nodes.sh up
//! cargo run --example leader
//! ```
//!
//! `REDFENCE_NODES` names other nodes, as comma-separated URLs of independent masters.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use redfence::{Election, Error, MemoryCounter, Redlock};

const DEFAULT_NODES: [&str; 5] = [
    "redis://127.0.0.1:7001",
    "redis://127.0.0.1:7002",
    "redis://127.0.0.1:7003",
    "redis://127.0.0.1:7004",
    "redis://127.0.0.1:7005",
];

/// One replica: campaigns, and while it leads schedules three jobs, then resigns.
async fn replica(election: Election) -> Result<(), Error> {
    let name = election.identity().to_owned();
    election
        .run(|leadership| {
            let name = name.clone();
            async move {
                println!("{name}: elected, term {}", leadership.term());
                for job in 1..=3 {
                    tokio::select! {
                        lost = leadership.lost() => return Err(lost), // stop writing at once
                        () = tokio::time::sleep(Duration::from_millis(500)) => {}
                    }
                    // A real job writes with the term as its fence, to storage that rejects
                    // smaller ones (see redfence-postgres/examples/fenced_postgres.rs).
                    println!(
                        "{name}: job {job} scheduled with fence {}",
                        leadership.term()
                    );
                }
                println!("{name}: resigning");
                leadership.resign().await;
                Err(leadership.lost().await) // with rejoin(true): campaign again
            }
        })
        .await
}

#[tokio::main]
async fn main() -> ExitCode {
    let nodes: Vec<String> = match std::env::var("REDFENCE_NODES") {
        Ok(list) if !list.trim().is_empty() => {
            list.split(',').map(|url| url.trim().to_owned()).collect()
        }
        _ => DEFAULT_NODES.iter().map(|s| s.to_string()).collect(),
    };
    // One counter shared by the replicas of this demo; real replicas share a durable one
    // (redfence-postgres's PostgresCounter, or RedisCounter).
    let counter = Arc::new(MemoryCounter::new());
    let mut replicas = Vec::new();
    let mut observer = None;
    for i in 1..=3 {
        let built = Redlock::builder()
            .nodes(nodes.clone())
            .fencing(Arc::clone(&counter))
            .build()
            .map_err(Error::from)
            .and_then(|redlock| {
                redlock
                    .election("scheduler", Some(&format!("replica-{i}")))
                    .lease(Duration::from_secs(5))
                    .renew_deadline(Duration::from_secs(3))
                    .retry_period(Duration::from_millis(500))
                    .rejoin(true)
                    .on_stopped_leading(|leader| println!("{leader}: stepped down"))
                    .build()
            });
        let election = match built {
            Ok(election) => election,
            Err(err) => {
                eprintln!("configuration: {err}");
                return ExitCode::FAILURE;
            }
        };
        observer.get_or_insert_with(|| election.clone());
        replicas.push(tokio::spawn(replica(election)));
    }
    if let Some(observer) = observer {
        let mut changes = std::pin::pin!(observer.observe().take(6));
        while let Some(change) = changes.next().await {
            match change {
                Some(leader) => println!("observer: the leader is {leader}"),
                None => println!("observer: nobody leads"),
            }
        }
    }
    for replica in &replicas {
        replica.abort();
    }
    ExitCode::SUCCESS
}
