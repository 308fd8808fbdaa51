//! The Redlock quorum: pure vote counting ([`tally`]) and the fan-out that sends one request
//! to every node under the node timeout ([`fan_out`]).

mod fan_out;
mod tally;

pub(crate) use fan_out::{Round, Settled, acquire_round, fan_out, release_everywhere};
pub(crate) use tally::{Failed, Until, drift, quorum, validity};
