//! [`CounterError`]: why the PostgreSQL counter could not issue a token, and the reading of
//! a token from a row.

use std::fmt;

use tokio_postgres::Row;

use crate::chain;

/// Column `column` of `row` as a token.
pub(crate) fn token(row: &Row, column: usize, step: &str) -> Result<u64, CounterError> {
    let value: i64 = row
        .try_get(column)
        .map_err(|err| CounterError::pg(step.to_owned(), err))?;
    positive(Some(value), step)
}

/// A token from a counter value: positive, or an error (`None` is an overflow).
pub(crate) fn positive(value: Option<i64>, step: &str) -> Result<u64, CounterError> {
    match value {
        Some(value) if value > 0 => Ok(value.unsigned_abs()),
        Some(value) => Err(CounterError::new(
            step.to_owned(),
            format!("the counter returned {value}, not a positive token"),
        )),
        None => Err(CounterError::new(
            step.to_owned(),
            "the counter reached the largest bigint",
        )),
    }
}

/// Why the PostgreSQL counter could not issue a token; says which step failed.
#[derive(Debug)]
pub(crate) struct CounterError {
    step: String,
    detail: String,
    pub(crate) source: Option<tokio_postgres::Error>,
}

impl CounterError {
    pub(crate) fn new(step: impl Into<String>, detail: impl Into<String>) -> Self {
        CounterError {
            step: step.into(),
            detail: detail.into(),
            source: None,
        }
    }

    /// The same error, with what to do about it.
    pub(crate) fn hint(mut self, hint: &str) -> Self {
        self.detail = format!("{}; {hint}", self.detail);
        self
    }

    pub(crate) fn pg(step: impl Into<String>, err: tokio_postgres::Error) -> Self {
        CounterError {
            step: step.into(),
            detail: chain(&err),
            source: Some(err),
        }
    }
}

impl fmt::Display for CounterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PostgreSQL fencing counter: {}: {}",
            self.step, self.detail
        )
    }
}

impl std::error::Error for CounterError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|e| e as _)
    }
}
