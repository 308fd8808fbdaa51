//! One timer for the extension tasks of every `using()` lock of a `Redlock`.
//!
//! Between rounds an extension task waits until its next round is due, an instant aligned to a
//! 25 ms grid so that many locks' rounds start together and share each node's batched call.
//! With a Tokio timer per task, 10,000 held locks keep 10,000 entries in the timer wheel. Here
//! they share one: the instants waited for are kept in order, each with the waiters of that
//! instant (a [`Notify`], whose waiter list needs no allocation per waiter), and one driver task
//! sleeps until the earliest instant and wakes its waiters together.
//!
//! A round in flight keeps a Tokio timer of its own for its deadline: deadlines are exact
//! instants, not on the grid, and the timer lives only while the round does.
//!
//! The driver runs on the runtime of the first wait, and only tasks of that runtime wait on it:
//! a task of another runtime gets a timer of its own, so that no wait depends on a runtime that
//! may be idle (a current-thread runtime outside `block_on`) or gone. If the driver's runtime
//! shuts down, its waiters are woken and finish their waits on timers of their own.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use tokio::runtime;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use crate::guard::DropGuard;

/// The shared timer of one `Redlock` (and its clones). The driver task starts on first use,
/// inside the runtime of the first `using()` scope, and ends when the `Redlock` is dropped.
#[derive(Default)]
pub(crate) struct Alarms {
    driver: OnceLock<Driver>,
}

/// The registering side of a running driver task.
struct Driver {
    /// The runtime the driver task runs on: only waits from tasks of that runtime use it.
    runtime: runtime::Id,
    /// Held by the driver task; gone when that task is (its runtime shut down).
    schedule: Weak<Mutex<Schedule>>,
    /// Tells the driver that a wait earlier than the one it sleeps for was added. Capacity 1:
    /// a full channel means a wake-up is already pending.
    earlier: mpsc::Sender<()>,
}

/// The instants waited for, in order, each with the waiters of that instant. Rounds aligned
/// to the grid share an instant, so there are few of them.
#[derive(Default)]
struct Schedule {
    slots: BTreeMap<Instant, Arc<Slot>>,
    /// Set when the driver ends: no slot is added after its last wake-up.
    closed: bool,
}

/// The waiters of one instant.
#[derive(Default)]
struct Slot {
    notify: Notify,
    /// Set (before `notify` wakes the waiters) once the instant is reached.
    fired: AtomicBool,
}

impl Alarms {
    /// Resolves at `at` (or at once, if `at` has passed), never before. Cancel-safe.
    pub(crate) async fn at(&self, at: Instant) {
        let slot = self.slot(at);
        let Some(slot) = slot else {
            return tokio::time::sleep_until(at).await;
        };
        let notified = slot.notify.notified();
        tokio::pin!(notified);
        // Registered before looking at `fired`: a slot fired in between is then seen.
        notified.as_mut().enable();
        if !slot.fired.load(Ordering::Acquire) {
            notified.await;
        }
        if Instant::now() < at {
            // Woken early: the driver ended (its runtime shut down) and dropped its slots.
            tokio::time::sleep_until(at).await;
        }
    }

    /// The slot of `at` on the running driver's schedule, added if new; `None` without a
    /// driver.
    fn slot(&self, at: Instant) -> Option<Arc<Slot>> {
        let driver = self.driver()?;
        let schedule = driver.schedule.upgrade()?;
        let (slot, first) = {
            let mut schedule = locked(&schedule);
            if schedule.closed {
                return None;
            }
            let new = !schedule.slots.contains_key(&at);
            let slot = Arc::clone(schedule.slots.entry(at).or_default());
            // Only a new instant can be earlier than the one the driver sleeps for: joining
            // an existing one (most waits, on the grid) wakes nobody.
            let first = new && schedule.slots.first_key_value().map(|(k, _)| *k) == Some(at);
            (slot, first)
        };
        if first {
            // Full: a wake-up is already pending. Closed: the driver is ending.
            let _ = driver.earlier.try_send(());
        }
        Some(slot)
    }

    /// The running driver, started now if there is none, when the caller runs on the
    /// driver's runtime. A task of another runtime gets `None` (and a timer of its own): that
    /// runtime may be idle, or gone, while the caller's runs.
    fn driver(&self) -> Option<&Driver> {
        let runtime = tokio::runtime::Handle::try_current().ok()?.id();
        if let Some(driver) = self.driver.get() {
            return (driver.runtime == runtime).then_some(driver);
        }
        Some(self.driver.get_or_init(|| {
            let schedule = Arc::new(Mutex::new(Schedule::default()));
            let (earlier, wakes) = mpsc::channel(1);
            let driver = Driver {
                runtime,
                schedule: Arc::downgrade(&schedule),
                earlier,
            };
            // The guard is made here, not inside the task: a task dropped before it first ran
            // (its runtime shut down) still wakes its waiters.
            tokio::spawn(drive(DropGuard::new(schedule, wake_all), wakes));
            driver
        }))
    }
}

/// Ends every wait on `schedule` now: its waiters wait out the rest on their own timers.
fn wake_all(schedule: &mut Arc<Mutex<Schedule>>) {
    let mut schedule = locked(schedule);
    schedule.closed = true;
    for (_, slot) in std::mem::take(&mut schedule.slots) {
        slot.fired.store(true, Ordering::Release);
        slot.notify.notify_waiters();
    }
}

/// The schedule, also after a panic elsewhere while it was locked (its map stays valid: every
/// change is one insert or remove).
fn locked(schedule: &Mutex<Schedule>) -> MutexGuard<'_, Schedule> {
    schedule.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sleeps until the earliest instant, wakes its waiters, and again, until the `Alarms` is
/// dropped. On the way out (the `Alarms` dropped, or the runtime shut down) it wakes every
/// waiter left, and they wait out the rest on their own timers.
async fn drive(schedule: DropGuard<Arc<Mutex<Schedule>>>, mut earlier: mpsc::Receiver<()>) {
    // One timer, reset to each new earliest instant.
    let sleep = tokio::time::sleep_until(Instant::now());
    tokio::pin!(sleep);
    loop {
        let next = {
            let mut schedule = locked(&schedule);
            let now = Instant::now();
            while let Some(entry) = schedule.slots.first_entry() {
                if *entry.key() > now {
                    break;
                }
                let slot = entry.remove();
                slot.fired.store(true, Ordering::Release);
                slot.notify.notify_waiters();
            }
            schedule.slots.first_key_value().map(|(at, _)| *at)
        };
        match next {
            Some(at) => {
                sleep.as_mut().reset(at);
                tokio::select! {
                    biased;
                    wake = earlier.recv() => if wake.is_none() { return },
                    () = &mut sleep => {}
                }
            }
            None => {
                if earlier.recv().await.is_none() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A runtime of its own, for the tests of waits from more than one runtime.
    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime")
    }

    #[tokio::test(start_paused = true)]
    async fn alarms_fire_in_order_at_their_instants() {
        let alarms = Arc::new(Alarms::default());
        let start = Instant::now();
        let (tx, mut rx) = mpsc::unbounded_channel();
        for ms in [30_u32, 10, 20, 10] {
            let (alarms, tx) = (Arc::clone(&alarms), tx.clone());
            tokio::spawn(async move {
                alarms.at(start + MS * ms).await;
                let _ = tx.send((ms, Instant::now() - start));
            });
        }
        drop(tx);
        let mut fired = Vec::new();
        while let Some(f) = rx.recv().await {
            fired.push(f);
        }
        fired.sort();
        let expected: Vec<_> = [10_u32, 10, 20, 30].iter().map(|&m| (m, MS * m)).collect();
        assert_eq!(
            fired, expected,
            "each alarm fires at its own instant, not before"
        );
        let schedule = alarms.driver.get().and_then(|d| d.schedule.upgrade());
        let left = schedule.map(|s| locked(&s).slots.len());
        assert_eq!(left, Some(0), "fired instants leave the schedule");
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_alarm_added_while_the_driver_sleeps_is_not_late() {
        let alarms = Arc::new(Alarms::default());
        let start = Instant::now();
        let late = tokio::spawn({
            let alarms = Arc::clone(&alarms);
            async move { alarms.at(start + MS * 1_000).await }
        });
        tokio::task::yield_now().await; // the driver now sleeps for the late one
        alarms.at(start + MS * 5).await;
        assert_eq!(Instant::now() - start, MS * 5);
        late.abort();
    }

    #[test]
    fn without_the_driver_an_alarm_has_a_timer_of_its_own() {
        let alarms = Arc::new(Alarms::default());
        // The driver starts in a runtime that then shuts down, with an alarm waiting on it.
        let first = runtime();
        let start = first.block_on(async { Instant::now() });
        let waiting = {
            let alarms = Arc::clone(&alarms);
            Box::pin(async move { alarms.at(start + MS * 20).await })
        };
        let mut waiting = Some(waiting);
        first.block_on(async {
            // Poll it once: it registers with the driver and waits.
            let pending = futures::poll!(waiting.as_mut().expect("waiting").as_mut());
            assert!(pending.is_pending());
        });
        drop(first);
        let second = runtime();
        let (waited, new) = second.block_on(async {
            let waiting = waiting.take().expect("waiting");
            let waited = tokio::time::timeout(Duration::from_secs(5), waiting).await;
            let waited = waited.map(|()| start.elapsed());
            let from = Instant::now();
            let new = tokio::time::timeout(Duration::from_secs(5), alarms.at(from + MS * 20));
            (waited, new.await.map(|()| from.elapsed()))
        });
        let waited = waited.expect("the waiting alarm fires without its driver");
        assert!(waited >= MS * 20, "not before its instant: {waited:?}");
        let new = new.expect("a new alarm fires without the first runtime's driver");
        assert!(new >= MS * 20, "not before its instant: {new:?}");
    }

    #[test]
    fn a_wait_from_another_runtime_does_not_depend_on_the_drivers() {
        let alarms = Arc::new(Alarms::default());
        // The driver starts in a runtime that stays alive but idle (nothing drives it).
        let first = runtime();
        first.block_on(alarms.at(Instant::now()));
        let second = runtime();
        let waited = second.block_on(async {
            let from = Instant::now();
            let wait = tokio::time::timeout(Duration::from_secs(5), alarms.at(from + MS * 20));
            wait.await.map(|()| from.elapsed())
        });
        let waited = waited.expect("the wait ends though the driver's runtime is idle");
        assert!(waited >= MS * 20, "not before its instant: {waited:?}");
        drop(first);
    }
}
