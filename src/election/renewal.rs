//! The renewal task of a term: extends the lock every retry period (client-go's timing),
//! re-arms the leader record, and steps down — record deleted, lock released — when the
//! term ends.

use std::sync::Arc;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant as TokioInstant;

use super::leadership::{Deadline, TermState};
use super::record;
use super::timing::Timing;
use crate::clock;
use crate::error::LossReason;
use crate::events::Event;
use crate::guard::DropGuard;
use crate::inner::Shared;
use crate::lock::Lock;

/// What the renewal task needs besides the lock and the term.
pub(super) struct Renewal {
    pub(super) shared: Arc<Shared>,
    pub(super) timing: Timing,
    pub(super) resource: String,
    pub(super) lock_key: Arc<str>,
    pub(super) record_key: Arc<str>,
}

impl Renewal {
    /// The deadline a lock's validity gives: the start of its last successful round plus
    /// the renew deadline, which is `margin` before the validity ends.
    pub(super) fn deadline(&self, lock: &Lock) -> Deadline {
        let expires_at = lock.expires_at();
        Deadline {
            deadline: expires_at
                .checked_sub(self.timing.margin)
                .unwrap_or_else(clock::now),
            expires_at,
        }
    }

    /// Renews `lock` every retry period until told to stop (`stop` resolves or is dropped),
    /// until the term resigns, or until leadership is lost; then steps down.
    pub(super) async fn run(
        self,
        mut lock: Lock,
        state: Arc<TermState>,
        mut stop: oneshot::Receiver<()>,
    ) {
        // However this task ends (even dropped with its runtime), `resign()` stops waiting.
        let _stepped_down = DropGuard::new(Arc::clone(&state), |s| s.mark_stepped_down());
        let mut resign = state.resign.subscribe();
        let Timing {
            lease,
            retry_period,
            ..
        } = self.timing;
        let value = record::encode(&state.leader, lock.token());
        // The lease counts from the start of the winning round, `renew_deadline` before the
        // current deadline.
        let elected = state.deadline.borrow().deadline;
        let mut next = elected
            .checked_sub(self.timing.renew_deadline)
            .unwrap_or_else(clock::now)
            + retry_period;
        loop {
            if state.error().is_some() {
                break;
            }
            let wake = next.min(state.deadline.borrow().deadline);
            tokio::select! {
                biased;
                _ = &mut stop => break,
                () = resigned(&mut resign) => break,
                () = tokio::time::sleep_until(TokioInstant::from_std(wake)) => {}
            }
            if state.error().is_some() {
                break;
            }
            let started = clock::now();
            next = started + retry_period;
            // A round still running at the deadline is too late to matter.
            let deadline = TokioInstant::from_std(state.deadline.borrow().deadline);
            let outcome = tokio::select! {
                biased;
                _ = &mut stop => break,
                () = resigned(&mut resign) => break,
                outcome = tokio::time::timeout_at(deadline, lock.extend(lease)) => outcome,
            };
            match outcome {
                Ok(Ok(())) => {
                    state.renewed(self.deadline(&lock));
                    let write = self.record(lock.token(), Some(value.clone()));
                    // The record is advisory: a slow node must not hold up a resignation, a
                    // stop or the next renewal (with a node timeout near the retry period it
                    // could push that renewal past the deadline).
                    tokio::select! {
                        biased;
                        _ = &mut stop => break,
                        () = resigned(&mut resign) => break,
                        _ = tokio::time::timeout_at(
                            TokioInstant::from_std(next),
                            record::write_everywhere(&self.shared, write),
                        ) => {}
                    }
                }
                Ok(Err(error)) if error.is_lock_lost() => {
                    state.abort(error);
                    break;
                }
                Ok(Err(error)) => {
                    tracing::warn!(leader = %state.leader, %error, remaining = ?lock.remaining(), "renewal failed; retrying");
                }
                // The deadline passed mid-round: the next look at the state ends leadership.
                Err(_) => {}
            }
        }
        self.step_down(lock, &state).await;
    }

    /// Ends the term: the signal fires (if it had not), the record is deleted while the lock
    /// is still ours, and the lock is released.
    async fn step_down(&self, lock: Lock, state: &TermState) {
        state.abort(state.lost(LossReason::Resigned));
        if !lock.is_expired() {
            let delete = self.record(lock.token(), None);
            record::write_everywhere(&self.shared, delete).await;
        }
        if let Err(error) = lock.release().await {
            tracing::warn!(leader = %state.leader, %error, "stepping down: release failed; the lock expires at the end of its lease");
            self.shared.config.events.emit(Event::ReleaseFailed {
                resources: vec![self.resource.clone()],
                error,
            });
        }
    }

    /// A write of the leader record (`None`: its deletion) guarded by the lock's token.
    pub(super) fn record(&self, token: &str, value: Option<String>) -> crate::node::GuardedWrite {
        record::guarded(
            &self.lock_key,
            &self.record_key,
            token,
            value,
            self.timing.lease,
        )
    }
}

/// Resolves once `resign()` was called.
async fn resigned(resign: &mut watch::Receiver<bool>) {
    // Err only if the sender is gone, which it never is while the term's state lives.
    let _ = resign.wait_for(|resigned| *resigned).await;
}
