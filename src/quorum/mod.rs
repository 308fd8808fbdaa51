//! The Redlock quorum: pure vote counting ([`tally`]) and the fan-out that sends one request
//! to every node, each of which bounds its own call ([`fan_out`]).

mod fan_out;
mod tally;

pub(crate) use fan_out::{Round, acquire_round, fan_out, release_everywhere};
pub(crate) use tally::{Failed, Until, drift, quorum, validity};
