//! `redfence run`: wait for the lock, run the command under `using()`, stop it if the lock
//! is lost, keep the lock for `--min-hold`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use redfence::{Backoff, Error, FencingError, Redlock, RwLock, Semaphore, Signal};

/// How long the fencing counter may take to issue a token (the library's default).
const FENCING_TIMEOUT: Duration = Duration::from_secs(1);
use tokio::time::Instant;

use crate::args::{Common, RunArgs};
use crate::child::{self, Job, LockEnv, Orphans, Spec};
use crate::exit::{self, Failure};
use crate::setup;
use crate::signals::{self, Signals};
use crate::waiting::Waiting;

/// How many attempts a lock gets when nodes failed (rather than refused), whatever `--wait`.
const MIN_ATTEMPTS: u32 = 3;

/// How long a fencing counter that keeps failing (not only timing out) is retried within
/// `--wait`: long enough for a counter's server to restart, short enough that a lasting error
/// (bad credentials, a missing table) does not take and drop the lock for the whole wait.
const COUNTER_PATIENCE: Duration = Duration::from_secs(30);

/// Why a `using()` scope ended without the command's exit code.
enum Stop {
    /// The lock was not acquired.
    Lock(Error),
    /// Anything else (the command could not start, the lock was lost, ...).
    Failure(Failure),
}

impl From<Error> for Stop {
    fn from(error: Error) -> Self {
        Stop::Lock(error)
    }
}

impl From<Failure> for Stop {
    fn from(failure: Failure) -> Self {
        Stop::Failure(failure)
    }
}

/// Runs the command under the lock; returns its exit code (or 128+N).
///
/// Waiting is our own loop, so that it can show progress: one `using()` attempt at a time
/// (`retry_count(0)`), then the default retry delay (200 ms ± 100 ms), until `--wait` runs
/// out; failed nodes get [`MIN_ATTEMPTS`] attempts even without `--wait`. A signal while
/// waiting ends the wait: the command never runs.
pub async fn run(common: &Common, args: &RunArgs) -> Result<u8, Failure> {
    // The lock is given up when its next extension would end past --max-hold: up to one TTL
    // before it. A --min-hold within that TTL could not be kept.
    if let (Some(min), Some(max)) = (args.min_hold, args.max_hold)
        && min.saturating_add(args.ttl) > max
    {
        return Err(Failure::usage(format!(
            "--min-hold ({}) plus --ttl ({}) exceeds --max-hold ({}): the lock may be given up \
             one TTL before --max-hold, so --min-hold could not be kept",
            humantime::format_duration(min),
            humantime::format_duration(args.ttl),
            humantime::format_duration(max)
        )));
    }
    let resources = if args.resources.is_empty() {
        vec![default_resource(&args.command)]
    } else {
        args.resources.clone()
    };
    // REDFENCE_RESOURCES joins them with commas: a comma in one would make it ambiguous.
    if let Some(resource) = resources.iter().find(|r| r.contains(',')) {
        return Err(Failure::usage(format!(
            "resource {resource:?} contains a comma (pass several resources as -r a -r b)"
        )));
    }
    let redlock = redlock(common, args)?;
    let outcome = run_with(&redlock, args, &resources, common.quiet).await;
    // Whatever the outcome: what the attempts wrote and left to the background is undone
    // before the process exits.
    setup::close(&redlock, common.node_timeout).await;
    outcome
}

/// [`run`] with its lock manager built: acquire (waiting as `--wait` says), run, release.
async fn run_with(
    redlock: &Redlock,
    args: &RunArgs,
    resources: &[String],
    quiet: bool,
) -> Result<u8, Failure> {
    let held = Held::new(redlock, args, resources)?;
    let mut signals = Signals::catch()?;
    child::adopt_orphans();
    let wait = match (args.no_wait, args.wait) {
        (false, Some(wait)) => wait,
        _ => Duration::ZERO,
    };
    let deadline = Instant::now() + wait;
    // The default delays, for as long as `--wait` lasts (the deadline ends the loop).
    let mut delays = Backoff::DEFAULT.retries(u32::MAX).delays();
    let mut waiting = Waiting::new(resources, wait, quiet);
    let spec = Spec {
        argv: args.command.clone(),
        shell: args.shell,
    };
    let mut attempts: u32 = 0;
    // Since when every attempt has failed on the fencing counter, if the last one did.
    let mut counter_failing_since: Option<Instant> = None;
    loop {
        let scope = Scope {
            spec: &spec,
            args,
            resources,
            signals: &mut signals,
            waiting: &mut waiting,
        };
        let outcome = match &held {
            Held::Lock => {
                redlock
                    .using(resources, args.ttl, |signal| scope.supervise(signal))
                    .await
            }
            Held::Permit(semaphore) => {
                semaphore
                    .using(args.ttl, |signal| scope.supervise(signal))
                    .await
            }
            Held::Read(rwlock) => {
                rwlock
                    .using_read(args.ttl, |signal| scope.supervise(signal))
                    .await
            }
            Held::Write(rwlock) => {
                rwlock
                    .using_write(args.ttl, |signal| scope.supervise(signal))
                    .await
            }
        };
        let error = match outcome {
            Ok(code) => return Ok(code),
            Err(Stop::Failure(failure)) => return Err(failure),
            Err(Stop::Lock(error)) => error,
        };
        // A signal that came during the attempt ends the wait, as one that comes after it.
        if let Some(received) = signals.pending() {
            waiting.finish();
            tracing::info!(signal = ?received, "signal while waiting for the lock: the command did not run");
            return Ok(signals::exit_code(received));
        }
        attempts += 1;
        let delay = delays.next().unwrap_or(Duration::from_millis(200));
        let in_time = Instant::now() + delay <= deadline;
        // A cold connection (the first call of a fresh process) can miss a short node
        // timeout: give failed nodes a few attempts even without --wait. Contention obeys
        // --wait alone.
        let unreachable = !exit::held_elsewhere(&error);
        let few = unreachable && attempts < MIN_ATTEMPTS;
        // A counter that could not issue a token (the lock was released: fail closed) is
        // retried within --wait, as an unreachable node is: a slow batch, or a counter that
        // restarts. One that has failed for COUNTER_PATIENCE in a row (bad credentials, a
        // missing table) ends the run.
        if matches!(error, Error::Fencing(_)) {
            counter_failing_since.get_or_insert_with(Instant::now);
        } else {
            counter_failing_since = None;
        }
        let patience_spent =
            counter_failing_since.is_some_and(|since| since.elapsed() >= COUNTER_PATIENCE);
        let retry = match &error {
            Error::Fencing(FencingError::Counter(_)) if patience_spent => false,
            Error::Fencing(_) => in_time || few,
            _ if error.is_retryable() => in_time || few,
            _ => false,
        };
        if !retry {
            waiting.finish();
            return Err(not_acquired(&error, args.busy_exit_code));
        }
        waiting.update(&error);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            signal = signals.recv() => {
                waiting.finish();
                tracing::info!(?signal, "signal while waiting for the lock: the command did not run");
                return Ok(signals::exit_code(signal));
            }
        }
    }
}

/// What a run holds while its command runs.
enum Held {
    /// A lock on the resources.
    Lock,
    /// A permit of the semaphore `-n N -r NAME`.
    Permit(Semaphore),
    /// The read side of the read-write lock `--shared -r NAME`.
    Read(RwLock),
    /// The write side of the read-write lock `--exclusive -r NAME`.
    Write(RwLock),
}

impl Held {
    /// From the arguments: `-n`, `--shared` and `--exclusive` need exactly one resource, the
    /// name (usage error otherwise); a bad name or size is refused before any traffic.
    fn new(redlock: &Redlock, args: &RunArgs, resources: &[String]) -> Result<Held, Failure> {
        let flag = match (args.permits, args.shared, args.exclusive) {
            (None, false, false) => return Ok(Held::Lock),
            (Some(_), _, _) => "-n/--permits",
            (None, true, _) => "--shared",
            (None, false, true) => "--exclusive",
        };
        // Given with -r: the default resource (named after the command) is a mutex's only.
        let ([name], [_]) = (resources, args.resources.as_slice()) else {
            return Err(Failure::usage(format!(
                "{flag} needs exactly one -r, the name it holds"
            )));
        };
        let refused = |error: Error| Failure::from_lock_error(&error, args.busy_exit_code);
        Ok(match args.permits {
            Some(permits) => Held::Permit(setup::semaphore(redlock, name, permits)?),
            None if args.shared => Held::Read(redlock.rwlock(name).map_err(refused)?),
            None => Held::Write(redlock.rwlock(name).map_err(refused)?),
        })
    }
}

/// The library's default restart quarantine, before the lock-delay.
const DEFAULT_RESTART_QUARANTINE: Duration = Duration::from_secs(60);

/// The lock manager for `run`: one attempt per `using()` call, `--max-hold`, `--fencing`.
fn redlock(common: &Common, args: &RunArgs) -> Result<Redlock, Failure> {
    let mut builder = setup::builder(common)?.retry_count(0);
    // The library's default quarantine (60 s plus the lock-delay) must cover this run's TTL
    // too, whatever other runs use.
    if common.restart_quarantine.is_none() {
        builder = builder
            .restart_quarantine(DEFAULT_RESTART_QUARANTINE.max(args.ttl) + common.lock_delay);
    }
    // A writer waits inside one `using_write()` call, for all of --wait: its waiting mark
    // then stays on the nodes and holds new readers back (retried call by call, each call's
    // mark would be taken away at its end, and a stream of readers could keep it out).
    if args.exclusive
        && !args.no_wait
        && let Some(wait) = args.wait.filter(|wait| !wait.is_zero())
    {
        builder = builder
            .backoff(Backoff::DEFAULT.retries(u32::MAX))
            .acquire_timeout(wait);
    }
    if let Some(max) = args.max_hold {
        builder = builder.max_hold(max);
    }
    if let Some(url) = &args.fencing {
        builder = setup::with_fencing(builder, url, FENCING_TIMEOUT)?;
    }
    setup::build(builder)
}

/// The failure for a lock that was not acquired. Busy is expected (cron on many machines):
/// it is logged at info level, so `-q` keeps it silent.
fn not_acquired(error: &Error, busy: u8) -> Failure {
    let failure = Failure::from_lock_error(error, busy);
    if failure.code == busy && exit::held_elsewhere(error) {
        tracing::info!("busy, the command did not run: {error}");
        return Failure::new(failure.code, String::new());
    }
    failure
}

/// What one `using()` scope needs.
struct Scope<'a> {
    spec: &'a Spec,
    args: &'a RunArgs,
    resources: &'a [String],
    signals: &'a mut Signals,
    waiting: &'a mut Waiting,
}

impl Scope<'_> {
    /// The routine run under the lock: the command, signal forwarding, loss, `--min-hold`.
    async fn supervise(self, signal: Signal) -> Result<u8, Stop> {
        let acquired = Instant::now();
        self.waiting.finish();
        tracing::info!(fence = ?signal.fence(), resources = ?self.resources, "lock acquired");
        let env = LockEnv {
            fence: signal.fence(),
            resources: self.resources,
            ttl_ms: self.args.ttl.as_millis(),
            slot: self.args.permits.and_then(|_| slot_of(&signal)),
            pass_env: self.args.pass_env,
        };
        // A signal that came while the lock was being acquired: the command does not start.
        if let Some(received) = self.signals.pending() {
            tracing::info!(signal = ?received, "signal while acquiring the lock: the command did not run");
            return Ok(signals::exit_code(received));
        }
        let mut orphans = Orphans::listen();
        let mut job = Job::spawn(self.spec, &env)?;
        let status = loop {
            tokio::select! {
                // A command that has exited is done, whatever else is ready.
                biased;
                status = job.wait() => break status?,
                error = signal.aborted() => {
                    // A command that exited just before (its exit not seen yet) ended
                    // normally: its exit code, not "stopped".
                    if let Some(status) = job.exited() {
                        break status;
                    }
                    // Nothing of the command may run past the lease: the grace ends
                    // `kill_margin` before it, when that is sooner than --kill-after; there is
                    // none at all when the nodes said the lock is no longer ours (another
                    // holder may run: the signal then reports no validity left).
                    let grace = self.args.kill_after.min(before_the_end(&signal, self.args.ttl));
                    tracing::error!(
                        "{error}: stopping the command (SIGTERM, SIGKILL after {})",
                        humantime::format_duration(grace)
                    );
                    let status = job.terminate(grace).await?;
                    return Err(Failure::new(
                        exit::LOST,
                        format!(
                            "the lock was lost while the command ran ({error}); it was stopped and exited with {}",
                            child::exit_code(status)
                        ),
                    )
                    .into());
                }
                received = self.signals.recv() => job.forward(received),
                () = orphans.exited() => job.reap_orphans(),
            }
        };
        // What the command started and left running must not outlive the lock.
        job.stop_the_rest(
            self.args
                .kill_after
                .min(before_the_end(&signal, self.args.ttl)),
        )
        .await;
        drop(job);
        let code = child::exit_code(status);
        if let Some(min_hold) = self.args.min_hold {
            hold_until(acquired + min_hold, &signal, self.signals).await;
        }
        Ok(code)
    }
}

/// Keeps the lock (stays in the scope) until `until`, unless a signal comes. When renewal
/// stops first (lost, or a renewal limit), the scope stays open while the keys last, so that
/// leaving it does not delete them early; a hold cut short is an error in the log (shown with
/// `-q`): a twin may run the same slot.
async fn hold_until(until: Instant, signal: &Signal, signals: &mut Signals) {
    if Instant::now() >= until {
        return;
    }
    tracing::debug!("keeping the lock for --min-hold");
    tokio::select! {
        () = tokio::time::sleep_until(until) => {}
        received = signals.recv() => {
            tracing::info!(signal = ?received, "ending --min-hold early");
        }
        error = signal.aborted() => {
            let held_until = until.min(Instant::now() + signal.remaining());
            tracing::error!(
                "during --min-hold: {error}; the lock ends {} before --min-hold does",
                humantime::format_duration(round_to_ms(until.saturating_duration_since(held_until)))
            );
            tokio::select! {
                () = tokio::time::sleep_until(held_until) => {}
                received = signals.recv() => {
                    tracing::info!(signal = ?received, "ending --min-hold early");
                }
            }
        }
    }
}

/// The drift factor of redfence's locks: the library's default, which `redfence` keeps.
const DRIFT_FACTOR: f64 = 0.01;

/// How long SIGKILL may take to land once it is due, beyond the drift: the stop sequence's
/// timer firing late on a loaded machine, its walk of `/proc`, the kernel tearing the
/// processes down.
const SIGKILL_LEAD: Duration = Duration::from_millis(20);

/// How long before the lock's validity ends the job gets SIGKILL (when the lock was lost or
/// the hold ended): the drift bound of a lock of `ttl` (`ttl` x 1 % + 2 ms, as the validity's
/// own) and [`SIGKILL_LEAD`]. The validity already leaves the drift out once; this keeps the
/// kill clear of its end even when the local clock runs that much slow again and the kill is
/// late: 122 ms for a 10 s TTL, 322 ms for the default 30 s.
fn kill_margin(ttl: Duration) -> Duration {
    ttl.mul_f64(DRIFT_FACTOR) + Duration::from_millis(2) + SIGKILL_LEAD
}

/// The longest grace the job may have now: until [`kill_margin`] before the lease ends (none
/// once less is left).
fn before_the_end(signal: &Signal, ttl: Duration) -> Duration {
    signal.remaining().saturating_sub(kill_margin(ttl))
}

/// The semaphore slot a permit's signal holds: the number at the end of its one resource,
/// `<name>:semaphore:slot:<i>`.
fn slot_of(signal: &Signal) -> Option<u32> {
    let resource = signal.resources().first()?;
    let (_, slot) = resource.rsplit_once(":semaphore:slot:")?;
    slot.parse().ok()
}

/// `duration` in whole milliseconds, for a log line.
fn round_to_ms(duration: Duration) -> Duration {
    Duration::from_millis(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
}

/// The resource for a command line: `redfence:run:` and the 64-bit FNV-1a hash of its words,
/// each followed by a NUL byte, in 16 hex digits. Stable across builds and machines.
pub fn default_resource(words: &[impl AsRef<OsStr>]) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for word in words {
        for &byte in word.as_ref().as_bytes().iter().chain(&[0u8]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(PRIME);
        }
    }
    format!("redfence:run:{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigkill_comes_the_drift_and_a_lead_before_the_validity_ends() {
        assert_eq!(
            kill_margin(Duration::from_secs(10)),
            Duration::from_millis(122)
        );
        assert_eq!(
            kill_margin(Duration::from_secs(30)),
            Duration::from_millis(322)
        );
    }

    #[test]
    fn the_default_resource_is_fnv1a_of_the_words() {
        // FNV-1a 64 of the empty input is its offset basis; of "a\0" computed by hand.
        assert_eq!(
            default_resource(&[] as &[&str]),
            "redfence:run:cbf29ce484222325"
        );
        assert_eq!(default_resource(&["a"]), default_resource(&["a"]));
        assert_ne!(default_resource(&["a", "b"]), default_resource(&["ab"]));
        assert_ne!(default_resource(&["ab"]), default_resource(&["a b"]));
    }
}
