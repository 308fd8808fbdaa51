//! A simulated server as a node address names it ([`SimEndpoint`]), and a connection to it
//! ([`Wire`], what the server voter's connection holds in place of redis-rs's).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use redis::{RedisError, Value};

use super::network::{Network, lock, reset};
use super::server::args_of;

/// One simulated server, as a node address names it.
#[derive(Clone)]
pub(crate) struct SimEndpoint {
    pub(super) net: Arc<Network>,
    pub(super) index: usize,
}

impl SimEndpoint {
    /// How the server is named in messages and rosters.
    pub(crate) fn name(&self) -> String {
        format!("sim:{}", self.index)
    }

    /// A connection to the server (as redis-rs's connection manager: after a lost
    /// connection, the next call reconnects).
    pub(crate) fn connect(&self) -> Wire {
        let wire = Wire {
            net: Arc::clone(&self.net),
            index: self.index,
            line: Arc::new(Mutex::new((0, 0))),
        };
        wire.reconnect();
        wire
    }
}

impl std::fmt::Debug for SimEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// A connection to a simulated server, shared by its clones (a multiplexed connection).
#[derive(Clone)]
pub(crate) struct Wire {
    net: Arc<Network>,
    index: usize,
    /// The server incarnation it is connected to, and the connection's number: a reset or a
    /// restart breaks it once, then the next call is on a new connection.
    line: Arc<Mutex<(u64, u64)>>,
}

impl Wire {
    /// Connects again: to the server's current incarnation, as a new connection.
    fn reconnect(&self) {
        let incarnation = self
            .net
            .nodes
            .get(self.index)
            .map_or(0, |node| lock(node).incarnation);
        let number = self.net.connections.fetch_add(1, Ordering::Relaxed);
        *lock(&self.line) = (incarnation, number);
    }

    /// Sends `commands`; a lost connection fails this call, and the next reconnects.
    async fn call(&self, commands: Vec<Vec<Vec<u8>>>) -> Result<Vec<Value>, RedisError> {
        let line = *lock(&self.line);
        let result = self.net.send(self.index, line, commands).await;
        if result.is_err() && *lock(&self.line) == line {
            self.reconnect();
        }
        result
    }
}

impl redis::aio::ConnectionLike for Wire {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut replies = self.call(vec![args_of(cmd)]).await?;
            match replies.pop() {
                Some(Value::ServerError(err)) => Err(err.into()),
                Some(value) => Ok(value),
                None => Err(reset()),
            }
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let commands = pipeline.cmd_iter().map(args_of).collect();
            let replies = self.call(commands).await?;
            Ok(replies.into_iter().skip(offset).take(count).collect())
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
