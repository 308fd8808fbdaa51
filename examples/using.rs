//! Two workers race to post invoice 4821 to a ledger with `using()`: one posts it, the other
//! is refused. The lock is kept alive while the job runs and released when it ends; the
//! ledger rejects stale fencing tokens, so even a worker that lost its lock mid-job could not
//! write twice.
//!
//! Start five local Redis nodes and run it:
//!
//! ```text
//! docker/nodes.sh up
//! cargo run --example using
//! ```
//!
//! `REDFENCE_NODES` names other nodes, as comma-separated URLs of independent masters:
//! `REDFENCE_NODES=redis://10.0.0.1:6379,redis://10.0.0.2:6379,redis://10.0.0.3:6379`.

use std::fmt;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redfence::{Error, MemoryCounter, Redlock};

const DEFAULT_NODES: [&str; 5] = [
    "redis://127.0.0.1:7001",
    "redis://127.0.0.1:7002",
    "redis://127.0.0.1:7003",
    "redis://127.0.0.1:7004",
    "redis://127.0.0.1:7005",
];

struct Invoice {
    id: u32,
    amount_cents: u64,
}

/// What can go wrong in the job: the lock, or the ledger.
#[derive(Debug)]
enum JobError {
    Lock(Error),
    StaleFence { fence: u64, last: u64 },
}

impl From<Error> for JobError {
    fn from(err: Error) -> Self {
        JobError::Lock(err)
    }
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::Lock(err) => write!(f, "{err}"),
            JobError::StaleFence { fence, last } => {
                write!(f, "the ledger rejected fence {fence} (it has seen {last})")
            }
        }
    }
}

/// Stands in for the database the job writes to: it accepts a write only with a fencing
/// token greater than every token it accepted before.
#[derive(Default)]
struct Ledger {
    state: Mutex<LedgerState>,
}

#[derive(Default)]
struct LedgerState {
    last_fence: u64,
    entries: Vec<(u32, u64)>,
}

impl Ledger {
    fn post(&self, invoice: &Invoice, fence: u64) -> Result<usize, JobError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if fence <= state.last_fence {
            return Err(JobError::StaleFence {
                fence,
                last: state.last_fence,
            });
        }
        state.last_fence = fence;
        state.entries.push((invoice.id, invoice.amount_cents));
        Ok(state.entries.len())
    }
}

async fn load_invoice(id: u32) -> Result<Invoice, JobError> {
    tokio::time::sleep(Duration::from_millis(300)).await; // a slow query
    Ok(Invoice {
        id,
        amount_cents: 12_950,
    })
}

async fn post_to_ledger(
    ledger: &Ledger,
    invoice: &Invoice,
    fence: Option<u64>,
) -> Result<usize, JobError> {
    tokio::time::sleep(Duration::from_millis(100)).await;
    // This example always configures a counter; without one there is no fence.
    ledger.post(invoice, fence.unwrap_or(0))
}

/// One worker: post invoice 4821 unless another worker holds it.
async fn worker(name: &str, redlock: Redlock, ledger: Arc<Ledger>) -> Result<(), Error> {
    let outcome = redlock
        .using(&["invoice:4821"], Duration::from_secs(5), |signal| {
            let ledger = Arc::clone(&ledger);
            async move {
                let invoice = load_invoice(4821).await?;
                signal.check()?; // stop before the irreversible step if ownership is gone
                let entry = post_to_ledger(&ledger, &invoice, signal.fence()).await?;
                Ok::<_, JobError>((entry, signal.fence()))
            }
        })
        .await;
    match outcome {
        Ok((entry, fence)) => {
            let fence = fence.map_or_else(|| "none".to_owned(), |f| f.to_string());
            println!("{name}: posted invoice 4821 as ledger entry #{entry} (fence {fence})");
        }
        Err(JobError::Lock(Error::Contended { denied, nodes, .. })) => {
            println!(
                "{name}: refused: another worker holds invoice:4821 ({denied} of {nodes} nodes said so)"
            );
        }
        Err(JobError::Lock(err @ Error::QuorumUnreachable { .. })) => return Err(err),
        Err(err) => println!("{name}: gave up: {err}"),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let nodes: Vec<String> = match std::env::var("REDFENCE_NODES") {
        Ok(list) if !list.trim().is_empty() => list
            .split(',')
            .map(|url| url.trim().to_owned())
            .filter(|url| !url.is_empty())
            .collect(),
        _ => DEFAULT_NODES.iter().map(|url| url.to_string()).collect(),
    };
    let redlock = match Redlock::builder()
        .nodes(&nodes)
        // Refuse at once instead of queueing behind the other worker.
        .retry_count(0)
        .fencing(MemoryCounter::new()) // use a durable counter in production
        .build()
    {
        Ok(redlock) => redlock,
        Err(err) => {
            eprintln!("bad configuration: {err}");
            return ExitCode::FAILURE;
        }
    };
    let ledger = Arc::new(Ledger::default());

    let a = tokio::spawn(worker("worker A", redlock.clone(), Arc::clone(&ledger)));
    let b = tokio::spawn(worker("worker B", redlock, Arc::clone(&ledger)));
    let mut unreachable = None;
    for task in [a, b] {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => unreachable = Some(err),
            Err(err) => {
                eprintln!("a worker failed: {err}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(err) = unreachable {
        eprintln!(
            "Could not reach a majority of the Redis nodes {nodes:?}:\n  {err}\n\n\
             Start five local nodes with `docker/nodes.sh up` (from the repository root),\n\
             or set REDFENCE_NODES to comma-separated redis:// URLs of independent masters."
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
