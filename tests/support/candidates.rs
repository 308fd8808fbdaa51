//! Candidates in the election "jobs" for the election tests, with the test timing: through
//! proxies when their network is to be broken.

use std::sync::Arc;
use std::time::Duration;

use redfence::{Election, FencingCounter};

use super::Servers;
use super::proxy::{Mode, Proxy};

pub const LEASE: Duration = Duration::from_secs(3);
pub const RENEW_DEADLINE: Duration = Duration::from_millis(1_500);
pub const RETRY_PERIOD: Duration = Duration::from_millis(400);

/// One candidate: its election and, when its network can be broken, its proxies.
pub struct Candidate {
    pub election: Election,
    pub proxies: Vec<Proxy>,
}

impl Candidate {
    pub fn set(&self, mode: Mode) {
        assert!(!self.proxies.is_empty(), "this candidate has no proxies");
        for proxy in &self.proxies {
            proxy.set(mode);
        }
    }
}

/// Candidate `id` in the election "jobs", with the test timing and terms from `counter`;
/// through proxies when `proxied`.
pub async fn candidate(
    servers: &Servers,
    counter: &Arc<dyn FencingCounter>,
    id: usize,
    proxied: bool,
    rejoin: bool,
) -> Candidate {
    let mut proxies = Vec::new();
    let urls = if proxied {
        for i in 0..servers.len() {
            proxies.push(Proxy::start(servers.port(i)).await);
        }
        proxies.iter().map(Proxy::url).collect()
    } else {
        servers.urls()
    };
    let redlock = redfence::Redlock::builder()
        .nodes(urls)
        .node_timeout(Duration::from_millis(200))
        .fencing(Arc::clone(counter))
        .build()
        .expect("config");
    let election = redlock
        .election("jobs", Some(&format!("candidate-{id}")))
        .lease(LEASE)
        .renew_deadline(RENEW_DEADLINE)
        .retry_period(RETRY_PERIOD)
        .rejoin(rejoin)
        .build()
        .expect("election config");
    Candidate { election, proxies }
}
