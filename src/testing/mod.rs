//! Simulated servers for the unit tests (crate-private for now, feature `testing`): a Redis
//! 7.0 server ([`SimServer`]) that keeps its keys on a clock the caller drives and runs
//! redfence's real Lua scripts (`src/scripts/`, `src/fence/`) in an embedded Lua 5.1, so that
//! fakes run the scripts a server runs instead of a second implementation of them.
// Built with feature `testing` alone (no test using it yet), the server is unused.
#![cfg_attr(not(test), allow(dead_code, unused_imports))]

mod commands;
mod compare_delete;
mod keyspace;
mod lua;
pub(crate) mod profile;
mod reply;
mod scan;
pub(crate) mod server;
mod set;
mod sorted_set;
mod tail;
mod zset;

#[cfg(test)]
mod differential;
#[cfg(test)]
mod differential_data;
#[cfg(test)]
mod differential_gen;
#[cfg(test)]
mod differential_plain;
#[cfg(test)]
mod differential_real;
#[cfg(test)]
mod profile_tests;
#[cfg(test)]
mod script_tests;
#[cfg(test)]
mod tests;

pub(crate) use server::SimServer;
