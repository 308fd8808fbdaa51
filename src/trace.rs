//! `tracing` spans around every lock operation, with the same fields everywhere:
//!
//! | span | fields |
//! |---|---|
//! | `redfence.acquire` | `resources` (count), `names` (debug level only), `attempts`, `quorum`, `granted`, `refused`, `failed` (of the last round), `outcome`, `fence`, `duration_ms` |
//! | `redfence.extend` | `resources`, `names`, `quorum`, `granted`, `refused`, `failed`, `outcome`, `duration_ms` |
//! | `redfence.release` | the same |
//! | `redfence.using` | `resources`, `names`, `quorum`, `fence`, `outcome`, `duration_ms`: the whole scope, acquisition included |
//!
//! `outcome` is `acquired`, `extended`, `released`, `done` or the error's label
//! (`contended`, `unreachable`, ...). Resource names are recorded only when the span's
//! subscriber wants debug-level detail: names can be sensitive and unbounded.

use std::time::Instant;

use tracing::Span;
use tracing::field::Empty;

use crate::clock;
use crate::error::Error;

/// The span of one operation on `resources` over nodes of majority `quorum`.
macro_rules! op_span {
    ($name:literal, $resources:expr, $quorum:expr) => {{
        let span = tracing::info_span!(
            $name,
            resources = $resources.len(),
            names = Empty,
            attempts = Empty,
            quorum = $quorum,
            granted = Empty,
            refused = Empty,
            failed = Empty,
            outcome = Empty,
            fence = Empty,
            duration_ms = Empty,
        );
        if tracing::enabled!(tracing::Level::DEBUG) {
            let names: Vec<&str> = $resources.iter().map(|r| r.as_ref()).collect();
            span.record("names", tracing::field::debug(&names));
        }
        span
    }};
}

pub(crate) fn acquire_span(resources: &[impl AsRef<str>], quorum: usize) -> Span {
    op_span!("redfence.acquire", resources, quorum)
}

pub(crate) fn extend_span(resources: &[String], quorum: usize) -> Span {
    op_span!("redfence.extend", resources, quorum)
}

pub(crate) fn release_span(resources: &[String], quorum: usize) -> Span {
    op_span!("redfence.release", resources, quorum)
}

pub(crate) fn using_span(resources: &[impl AsRef<str>], quorum: usize) -> Span {
    op_span!("redfence.using", resources, quorum)
}

/// Records the votes of a round in the current span.
pub(crate) fn votes(granted: usize, refused: usize, failed: usize) {
    let span = Span::current();
    span.record("granted", granted);
    span.record("refused", refused);
    span.record("failed", failed);
}

/// Records the attempt count so far in the current span.
pub(crate) fn attempts(attempts: u32) {
    Span::current().record("attempts", attempts);
}

/// Records the fence in `span`.
pub(crate) fn fence(span: &Span, fence: Option<u64>) {
    if let Some(fence) = fence {
        span.record("fence", fence);
    }
}

/// Records how an operation ended and how long it took, in `span`.
pub(crate) fn outcome(span: &Span, result: Result<&'static str, &Error>, started: Instant) {
    span.record("outcome", result.unwrap_or_else(Error::label));
    span.record("duration_ms", clock::since(started).as_secs_f64() * 1_000.0);
}
