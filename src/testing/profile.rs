//! [`Profile`]: which real server a simulated one answers as (Redis 7.0, Valkey 9.1, Redis
//! 8.6), and what tells them apart to a client: the compare-and-delete command each has, the
//! conditions its `SET` takes, `COMMAND INFO`'s entries for those commands and the `INFO
//! server` fields that name it. Each difference was read off the real servers (see the
//! differential test, which checks them against all three).

use redis::Value;

use super::reply::{g17, shortest};

/// An error a script's `redis.call` raises (or `redis.pcall` returns) of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ScriptError {
    /// A command called with the wrong number of arguments.
    Arity,
    /// A command the server does not know.
    Unknown,
    /// `redis.call()` without arguments.
    NoArguments,
    /// An argument that is neither a string nor a number.
    ArgumentType,
    /// A command scripts may not call (`EVAL`, `MULTI`, ...).
    NotAllowed,
}

/// Which real server a simulated server answers as (see [`SimServers::with_profile`](super::SimServers::with_profile)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Profile {
    /// Redis 7.0.15: no compare-and-delete, `SET` without conditions (the script does it all).
    #[default]
    Redis7,
    /// Valkey 9.1.2: `DELIFEQ key value` and `SET … IFEQ value` (not with `NX`/`XX`, once).
    Valkey9,
    /// Redis 8.6.3: `DELEX key [IFEQ|IFNE|IFDEQ|IFDNE value]` and `SET`'s conditions `IFEQ`,
    /// `IFNE`, `IFDEQ`, `IFDNE`.
    Redis8,
}

/// What a profile's `SET` takes beside `NX` and `XX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SetConditions {
    /// Nothing (Redis 7.0: `IFEQ` is a syntax error).
    None,
    /// `IFEQ value` once, never with `NX` or `XX` in either order (Valkey 9).
    Ifeq,
    /// `IFEQ`, `IFNE`, `IFDEQ`, `IFDNE`, one kind (repeated, the last value counts); refused
    /// after `NX` or `XX`, but an `NX` or `XX` after one is taken and must hold too (Redis 8.6).
    Full,
}

impl Profile {
    /// Whether the server has the command `name` (lower case) among those that come and go
    /// between versions; any other command the simulated server knows, every profile has.
    pub(super) fn has(self, name: &str) -> bool {
        match name {
            "delifeq" => self == Profile::Valkey9,
            "delex" => self == Profile::Redis8,
            _ => true,
        }
    }

    /// What this profile's `SET` takes beside `NX` and `XX`.
    pub(super) fn set_conditions(self) -> SetConditions {
        match self {
            Profile::Redis7 => SetConditions::None,
            Profile::Valkey9 => SetConditions::Ifeq,
            Profile::Redis8 => SetConditions::Full,
        }
    }

    /// The version and mode fields of `INFO server`, as the real server writes them (before
    /// `run_id` and `uptime_in_seconds`). Valkey still says `redis_version` (7.2.4, the
    /// Redis it forked from), names itself in `server_name` and `valkey_version`, and says
    /// `server_mode` where Redis says `redis_mode`.
    pub(super) fn server_fields(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Profile::Redis7 => &[("redis_version", "7.0.15"), ("redis_mode", "standalone")],
            Profile::Valkey9 => &[
                ("redis_version", "7.2.4"),
                ("server_name", "valkey"),
                ("valkey_version", "9.1.2"),
                ("server_mode", "standalone"),
            ],
            Profile::Redis8 => &[("redis_version", "8.6.3"), ("redis_mode", "standalone")],
        }
    }

    /// A double as this server writes it in a reply (a score) and passes a Lua number to a
    /// command: `%.17g` on Redis 7.0, the shortest digits on Valkey 9 and Redis 8.
    pub(super) fn double(self, x: f64) -> String {
        match self {
            Profile::Redis7 => g17(x),
            Profile::Valkey9 | Profile::Redis8 => shortest(x),
        }
    }

    /// The text of a script's error of its own (Valkey dropped "Redis" and "Lua redis lib").
    pub(super) fn script_error(self, error: ScriptError) -> &'static str {
        let valkey = self == Profile::Valkey9;
        match (error, valkey) {
            (ScriptError::Arity, false) => {
                "ERR Wrong number of args calling Redis command from script"
            }
            (ScriptError::Arity, true) => "ERR Wrong number of args calling command from script",
            (ScriptError::Unknown, false) => "ERR Unknown Redis command called from script",
            (ScriptError::Unknown, true) => "ERR Unknown command called from script",
            (ScriptError::NoArguments, false) => {
                "ERR Please specify at least one argument for this redis lib call"
            }
            (ScriptError::NoArguments, true) => {
                "ERR Please specify at least one argument for this call"
            }
            (ScriptError::ArgumentType, false) => {
                "ERR Lua redis lib command arguments must be strings or integers"
            }
            (ScriptError::ArgumentType, true) => {
                "ERR Command arguments must be strings or integers"
            }
            (ScriptError::NotAllowed, false) => "ERR This Redis command is not allowed from script",
            (ScriptError::NotAllowed, true) => "ERR This Valkey command is not allowed from script",
        }
    }

    /// The error for an `EVALSHA` of a script the server does not have (Valkey 9 no longer
    /// adds "Please use EVAL.").
    pub(super) fn noscript(self) -> &'static str {
        match self {
            Profile::Valkey9 => "NOSCRIPT No matching script.",
            Profile::Redis7 | Profile::Redis8 => "NOSCRIPT No matching script. Please use EVAL.",
        }
    }

    /// Whether an uncaught script error names the script's sha1 (`... script: <sha>, on
    /// @user_script:1.`); Valkey 9 leaves it out (`... script: on @user_script:1.`).
    pub(super) fn names_script_in_errors(self) -> bool {
        self != Profile::Valkey9
    }

    /// `COMMAND INFO`'s entry for `name` (lower case): the real server's for a compare-and-
    /// delete command this profile has, a nil for any other (the simulated server describes
    /// no other command).
    pub(super) fn command_info(self, name: &str) -> Value {
        match (name, self) {
            ("delifeq", Profile::Valkey9) => entry("delifeq", 3, &["RM", "delete"]),
            ("delex", Profile::Redis8) => entry("delex", -2, &["RW", "delete", "variable_flags"]),
            _ => Value::Nil,
        }
    }
}

/// A `COMMAND INFO` entry of a fast one-key write command on strings, as Valkey 9 and Redis 8
/// write those of `DELIFEQ` and `DELEX`: its name, arity, flags, first/last key and step, ACL
/// categories, no tips, its key spec (the key's `flags`, at index 1) and no subcommands.
fn entry(name: &str, arity: i64, key_flags: &[&str]) -> Value {
    let status = |s: &str| Value::SimpleString(s.to_owned());
    let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    let begin_search = Value::Array(vec![
        bulk("type"),
        bulk("index"),
        bulk("spec"),
        Value::Array(vec![bulk("index"), Value::Int(1)]),
    ]);
    let find_keys = Value::Array(vec![
        bulk("type"),
        bulk("range"),
        bulk("spec"),
        Value::Array(vec![
            bulk("lastkey"),
            Value::Int(0),
            bulk("keystep"),
            Value::Int(1),
            bulk("limit"),
            Value::Int(0),
        ]),
    ]);
    let key_spec = Value::Array(vec![
        bulk("flags"),
        Value::Array(key_flags.iter().map(|flag| status(flag)).collect()),
        bulk("begin_search"),
        begin_search,
        bulk("find_keys"),
        find_keys,
    ]);
    Value::Array(vec![
        bulk(name),
        Value::Int(arity),
        Value::Array(vec![status("write"), status("fast")]),
        Value::Int(1),
        Value::Int(1),
        Value::Int(1),
        Value::Array(vec![status("@write"), status("@string"), status("@fast")]),
        Value::Array(Vec::new()),
        Value::Array(vec![key_spec]),
        Value::Array(Vec::new()),
    ])
}
