//! Concurrent clients of a fencing counter, checked as they go: a request that starts after
//! another on a resource returned must get a greater token, and no two requests on a
//! resource get the same one.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redfence::FencingCounter;

#[derive(Default)]
struct Seen {
    /// The largest token returned so far, per resource.
    last: HashMap<String, u64>,
    /// Every (resource, token) returned.
    issued: HashSet<(String, u64)>,
    violations: Vec<String>,
}

#[derive(Default)]
struct Shared {
    seen: Mutex<Seen>,
    issued: AtomicUsize,
    failed: AtomicUsize,
    stop: AtomicBool,
}

/// Clients running until [`Clients::stop`].
pub struct Clients {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Clients {
    /// One task per counter, each asking for tokens for `sets` in turn (client `c` starts at
    /// set `c`), as fast as answers come; a failed request is counted and the next one
    /// follows 5 ms later.
    pub fn start(counters: Vec<Arc<dyn FencingCounter>>, sets: Vec<Vec<String>>) -> Clients {
        let shared = Arc::new(Shared::default());
        let sets = Arc::new(sets);
        let tasks = counters
            .into_iter()
            .enumerate()
            .map(|(c, counter)| {
                let (shared, sets) = (Arc::clone(&shared), Arc::clone(&sets));
                tokio::spawn(async move {
                    let mut k = c;
                    while !shared.stop.load(Ordering::SeqCst) {
                        let set = &sets[k % sets.len()];
                        k += 1;
                        let floors: Vec<u64> = {
                            let seen = shared.seen.lock().expect("seen");
                            set.iter()
                                .map(|r| seen.last.get(r).copied().unwrap_or(0))
                                .collect()
                        };
                        match counter.next_fence(set).await {
                            Ok(token) => {
                                let mut seen = shared.seen.lock().expect("seen");
                                for (r, floor) in set.iter().zip(floors) {
                                    if token <= floor {
                                        seen.violations.push(format!(
                                            "{r}: {token} after {floor} was returned"
                                        ));
                                    }
                                    if !seen.issued.insert((r.clone(), token)) {
                                        seen.violations.push(format!("{r}: {token} twice"));
                                    }
                                    let last = seen.last.entry(r.clone()).or_insert(0);
                                    *last = (*last).max(token);
                                }
                                shared.issued.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(_) => {
                                shared.failed.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                        }
                    }
                })
            })
            .collect();
        Clients { shared, tasks }
    }

    /// Tokens returned so far.
    pub fn issued(&self) -> usize {
        self.shared.issued.load(Ordering::SeqCst)
    }

    /// Requests failed so far.
    pub fn failed(&self) -> usize {
        self.shared.failed.load(Ordering::SeqCst)
    }

    /// The largest token returned so far for `resource`.
    pub fn last(&self, resource: &str) -> u64 {
        let seen = self.shared.seen.lock().expect("seen");
        seen.last.get(resource).copied().unwrap_or(0)
    }

    /// Stops every client (each finishes its request) and returns the violations seen.
    pub async fn stop(self) -> Vec<String> {
        self.shared.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.expect("client task");
        }
        let seen = self.shared.seen.lock().expect("seen");
        seen.violations.clone()
    }
}
