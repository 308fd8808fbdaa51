//! How a read-write lock's operation is written into a batch call of `scripts/batch.lua`:
//! its kind (two letters), then the four arguments of every operation, then the writer's
//! waiter id and waiting-mark time.

use redis::Cmd;

use super::{Op, Request, RwMode, RwOp};

/// Writes `req`, a read-write lock's operation (`rw`), as the batch script's arguments.
pub(super) fn write(script: &mut Cmd, req: &Request, rw: &RwOp) {
    script
        .arg(rw_kind(req.op, rw.mode))
        .arg(&*req.token)
        .arg(req.ttl_ms)
        .arg(req.keys.len())
        .arg(&*rw.waiter)
        .arg(rw.wait_ms);
}

/// The batch script's kind for a read-write lock's operation: the side (`r` reader, `w`
/// writer), then the operation (`a` acquire, `e` extend, `r` release, `l` leave: a writer's
/// waiting mark taken away). Never repaired after a restart (see `scripts/batch.lua`).
fn rw_kind(op: Op, mode: RwMode) -> &'static str {
    match (mode, op) {
        (RwMode::Read, Op::Acquire) => "ra",
        (RwMode::Read, Op::Extend) => "re",
        (RwMode::Read, Op::Release | Op::Leave) => "rr",
        (RwMode::Write, Op::Acquire) => "wa",
        (RwMode::Write, Op::Extend) => "we",
        (RwMode::Write, Op::Release) => "wr",
        (RwMode::Write, Op::Leave) => "wl",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::batch::{Run, Touch, write_call};

    #[test]
    fn a_read_write_locks_operation_is_written_with_its_kind_waiter_and_mark() {
        let rw = |op, mode| {
            Run::unanswered(Request {
                op,
                keys: vec!["w".to_owned(), "r".to_owned(), "x".to_owned()].into(),
                token: "tok".into(),
                ttl_ms: 1_000,
                queue: None,
                rw: Some(std::sync::Arc::new(crate::node::RwOp {
                    mode,
                    waiter: "waiter".into(),
                    wait_ms: 700,
                })),
            })
        };
        let runs = [rw(Op::Acquire, RwMode::Read), rw(Op::Leave, RwMode::Write)];
        let mut cmd = Cmd::new();
        // The repair flag does not touch them.
        write_call(
            runs.iter(),
            Touch::WithHelpers,
            &mut cmd,
            ("EVAL", "body"),
            true,
            None,
        );
        let args: Vec<String> = cmd
            .args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => String::new(),
            })
            .collect();
        let expected = [
            "EVAL", "body", "6", "w", "r", "x", "w", "r", "x", "ra", "tok", "1000", "3", "waiter",
            "700", "wl", "tok", "1000", "3", "waiter", "700",
        ];
        assert_eq!(args, expected);
        assert_eq!(rw_kind(Op::Extend, RwMode::Write), "we");
        assert_eq!(rw_kind(Op::Release, RwMode::Read), "rr");
    }
}
