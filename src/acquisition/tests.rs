//! The retry loop over fake attempts on a paused clock.

use super::*;
use crate::error::FencingError;
use crate::retry::Backoff;

/// Refused `refusals` times (again, or for good), then granted; nothing to watch.
struct Fake {
    refusals: u32,
    last: fn() -> Refused,
    at: Vec<Duration>,
    start: Instant,
}

impl Attempt for Fake {
    type Granted = u32;

    async fn attempt(&mut self, tries: &mut Tries) -> Result<u32, Refused> {
        let n = count_attempt(tries);
        self.at.push(clock::since(self.start));
        if n > self.refusals {
            return Ok(n);
        }
        Err((self.last)())
    }

    fn watch(&self) -> Option<Watch> {
        None
    }
}

fn again() -> Refused {
    Refused::Again(Error::Closed)
}

fn fake(refusals: u32, last: fn() -> Refused) -> Fake {
    Fake {
        refusals,
        last,
        at: Vec::new(),
        start: clock::now(),
    }
}

/// Three retries 100 ms apart, `acquire_timeout` if any, `retry`; recheck on.
fn retries(
    timeout: Option<Duration>,
    retry: bool,
    wait_out_deadline: bool,
) -> Retries<'static, impl Iterator<Item = Duration>> {
    let started = clock::now();
    Retries {
        started,
        deadline: timeout.and_then(|t| started.checked_add(t)),
        delays: Backoff::fixed(Duration::from_millis(100), Duration::ZERO)
            .retries(3)
            .delays(),
        retry,
        watch: None,
        recheck: true,
        wait_out_deadline,
        open: None,
    }
}

const MS: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn attempts_on_the_schedule_until_granted_or_out_of_retries() {
    let mut tries = Tries::default();
    let mut granted = fake(2, again);
    let got = retries(None, true, false)
        .run(&mut tries, &mut granted)
        .await;
    assert_eq!(got.ok(), Some(3));
    // Nothing to watch: no recheck at once, the delays in full.
    assert_eq!(granted.at, [Duration::ZERO, 100 * MS, 200 * MS]);
    assert_eq!(tries.backoff, 200 * MS);

    let mut tries = Tries::default();
    let mut refused = fake(10, again);
    let got = retries(None, true, false)
        .run(&mut tries, &mut refused)
        .await;
    assert!(matches!(got, Err(Error::Closed)), "{got:?}");
    assert_eq!(tries.attempts, 4, "the first attempt and three retries");
}

#[tokio::test(start_paused = true)]
async fn no_retry_and_final_refusals_end_at_once() {
    let mut tries = Tries::default();
    let mut once = fake(10, again);
    let got = retries(None, false, false).run(&mut tries, &mut once).await;
    assert!(matches!(got, Err(Error::Closed)), "{got:?}");
    assert_eq!(once.at, [Duration::ZERO]);

    let mut tries = Tries::default();
    let mut last = fake(10, || {
        Refused::Final(Error::Fencing(FencingError::LockExpired))
    });
    let got = retries(None, true, false).run(&mut tries, &mut last).await;
    assert!(matches!(got, Err(Error::Fencing(_))), "{got:?}");
    assert_eq!(last.at, [Duration::ZERO]);
}

#[tokio::test(start_paused = true)]
async fn a_delay_past_the_deadline_times_out_at_once_or_at_the_deadline() {
    for wait_out in [false, true] {
        let mut tries = Tries::default();
        let mut refused = fake(10, again);
        let start = clock::now();
        let got = retries(Some(150 * MS), true, wait_out)
            .run(&mut tries, &mut refused)
            .await;
        let Err(Error::AcquireTimeout {
            waited,
            attempts,
            last,
        }) = got
        else {
            panic!("{got:?}");
        };
        assert_eq!(attempts, 2);
        assert!(matches!(last.as_deref(), Some(Error::Closed)));
        let ended = if wait_out { 150 * MS } else { 100 * MS };
        assert_eq!(clock::since(start), ended);
        assert_eq!(waited, ended);
    }
}
