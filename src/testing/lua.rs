//! The simulated server's Lua 5.1, set up as Redis 7.0 sets up its scripts: `KEYS`, `ARGV`,
//! `redis.call` / `redis.pcall` (a shim over the server's commands), `redis.error_reply`,
//! `redis.status_reply`, the replies converted both ways as Redis documents, and an uncaught
//! error answered as Redis answers it (`<error> script: <sha>, on @user_script:<line>.`).

use std::collections::HashMap;

use mlua::{Function, Lua, LuaOptions, MultiValue, StdLib, Table};
use redis::Value;

use super::commands;
use super::keyspace::{self, Keyspace};
use super::profile::{Profile, ScriptError};
use super::reply;
use super::tail;

/// The name of every script's chunk, as Redis 7.0 names it.
const SCRIPT_NAME: &str = "@user_script";

/// The name of the shim's chunk: its frames are skipped when an error's line is looked up.
const SHIM_NAME: &str = "=redis_shim";

/// The shim, in Lua: `redis.*` over `raw` (which runs a command and says whether its reply is
/// an error), and the runner that calls a script under the error handler.
const SHIM: &str = r##"
local raw, where = ...
local error, type, select, tostring = error, type, select, tostring
local sub, find, gsub = string.sub, string.find, string.gsub
-- luaPushErrorBuff: "-CODE msg" or "msg" (code ERR), line breaks trimmed.
local function push_error(buf)
  local code, msg = "ERR", buf
  if sub(buf, 1, 1) == "-" then
    local space = find(buf, " ", 1, true)
    if space then
      code, msg = sub(buf, 2, space - 1), sub(buf, space + 1)
    else
      msg = sub(buf, 2)
    end
  end
  msg = gsub(gsub(msg, "^[\r\n]+", ""), "[\r\n]+$", "")
  return {err = code .. " " .. msg}
end
redis = {}
function redis.call(...)
  local reply, failed = raw(...)
  if failed then
    error(reply, 0)
  end
  return reply
end
function redis.pcall(...)
  local reply = raw(...)
  return reply
end
-- A reply helper of one string argument, `reply`, answering an error for any other arguments.
local function of_one_string(reply)
  return function(...)
    local s = ...
    if select("#", ...) ~= 1 or type(s) ~= "string" then
      return push_error("wrong number or type of arguments")
    end
    return reply(s)
  end
end
redis.error_reply = of_one_string(function(e)
  if sub(e, 1, 1) ~= "-" then
    e = "-" .. e
  end
  return push_error(e)
end)
redis.status_reply = of_one_string(function(s)
  return {ok = s}
end)
function redis.sha1hex(s)
  return raw("__sha1hex", s)
end
function redis.log() end
redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING = 0, 1, 2, 3
function redis.replicate_commands() return true end
local function handler(err)
  local source, line = where()
  if type(err) ~= "table" then
    err = {err = "ERR " .. tostring(err)}
  end
  if source then
    err["source"] = source
    err["line"] = line
  end
  return err
end
-- The scripts' globals: Redis's read-only table, whose missing names are errors.
local G = _G
local env = {}
setmetatable(env, {
  __index = function(_, name)
    if name == "_G" then
      return env
    end
    local value = rawget(G, name)
    if value == nil then
      error("Script attempted to access nonexistent global variable '" .. tostring(name) .. "'", 2)
    end
    return value
  end,
  __newindex = function()
    error("Attempt to modify a readonly table", 2)
  end,
})
for _, name in ipairs({"print", "setfenv", "getfenv", "newproxy", "dofile", "loadfile"}) do
  G[name] = nil
end
return function(f)
  return xpcall(f, handler)
end, env
"##;

/// Commands a script may not call (`This Redis command is not allowed from script`).
const NOT_FROM_SCRIPTS: &[&str] = &["eval", "evalsha", "script", "multi", "exec", "watch"];

/// One server's Lua state and the scripts it compiled, by sha1.
#[derive(Debug)]
pub(super) struct Scripts {
    lua: Lua,
    /// Calls a compiled script under the error handler: `(ok, reply or error table)`.
    runner: Function,
    /// The scripts' globals (see the shim).
    env: Table,
    compiled: HashMap<String, Function>,
}

/// The bytecode of every script compiled in this process, by sha1.
fn compiled_once() -> std::sync::MutexGuard<'static, HashMap<String, Vec<u8>>> {
    static BYTECODE: std::sync::LazyLock<std::sync::Mutex<HashMap<String, Vec<u8>>>> =
        std::sync::LazyLock::new(Default::default);
    BYTECODE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The sha1 of a script's source, in lower-case hex (as `SCRIPT LOAD` and redis-rs make it).
pub(super) fn sha1_hex(source: &[u8]) -> String {
    sha1_smol::Sha1::from(source).digest().to_string()
}

impl Scripts {
    /// A fresh Lua state with Redis's libraries (base, table, string, math) and the shim.
    pub(super) fn new() -> mlua::Result<Scripts> {
        let lua = Lua::new_with(
            StdLib::TABLE | StdLib::STRING | StdLib::MATH,
            LuaOptions::new(),
        )?;
        let raw = lua.create_function(|lua, args: MultiValue| raw_call(lua, args))?;
        let where_ = lua.create_function(|lua, ()| Ok(user_frame(lua).unwrap_or((None, None))))?;
        let (runner, env): (Function, Table) = lua
            .load(SHIM)
            .set_name(SHIM_NAME)
            .set_mode(mlua::chunk::ChunkMode::Text)
            .call((raw, where_))?;
        Ok(Scripts {
            lua,
            runner,
            env,
            compiled: HashMap::new(),
        })
    }

    /// Compiles `source` (unless it is already) and returns its sha1, or the compile error as
    /// Redis answers it.
    pub(super) fn load(&mut self, source: &[u8]) -> Result<String, Value> {
        let sha = sha1_hex(source);
        if !self.compiled.contains_key(&sha) {
            // Compiled once per process: the other servers load its bytecode (every unit
            // test's fake node is a server of its own, and parsing the batch script each time
            // cost half a millisecond), in their own scripts' globals (without them, a second
            // server ran a script that sets a global as if it were allowed).
            let cached = compiled_once().get(&sha).cloned();
            if let Some(bytecode) = cached {
                let function = self
                    .lua
                    .load(&bytecode[..])
                    .set_name(SCRIPT_NAME)
                    .set_environment(self.env.clone())
                    .set_mode(mlua::chunk::ChunkMode::Binary)
                    .into_function()
                    .map_err(|e| reply::error(&format!("ERR Error loading script: {e}")))?;
                self.compiled.insert(sha.clone(), function);
                return Ok(sha);
            }
            let function = self
                .lua
                .load(tail::guard(source))
                .set_name(SCRIPT_NAME)
                .set_environment(self.env.clone())
                .set_mode(mlua::chunk::ChunkMode::Text)
                .into_function()
                .map_err(|e| {
                    let message = match e {
                        mlua::Error::SyntaxError { message, .. } => message,
                        other => other.to_string(),
                    };
                    reply::error(&format!(
                        "ERR Error compiling script (new function): {message}"
                    ))
                })?;
            compiled_once().insert(sha.clone(), function.dump(false));
            self.compiled.insert(sha.clone(), function);
        }
        Ok(sha)
    }

    /// Whether the script of `sha` (lower case) is loaded.
    pub(super) fn exists(&self, sha: &str) -> bool {
        self.compiled.contains_key(sha)
    }

    /// Forgets every loaded script.
    pub(super) fn flush(&mut self) {
        self.compiled.clear();
    }

    /// Runs the loaded script `sha` with `keys` and `argv` over `space`, atomically: its reply
    /// as Redis answers it, or `None` when no such script is loaded.
    pub(super) fn run(
        &self,
        sha: &str,
        keys: &[Vec<u8>],
        argv: &[Vec<u8>],
        space: &mut Keyspace,
    ) -> Option<Value> {
        let function = self.compiled.get(sha)?;
        self.lua.set_app_data(std::mem::take(space));
        let outcome = self.call(function, keys, argv);
        if let Some(back) = self.lua.remove_app_data::<Keyspace>() {
            *space = back;
        }
        let profile = space.profile;
        Some(match outcome {
            Ok((true, value)) => from_lua(&value, 0),
            Ok((false, value)) => uncaught(&value, sha, profile),
            Err(e) => reply::error(&format!("ERR the simulated server's Lua failed: {e}")),
        })
    }

    /// Sets `KEYS` and `ARGV`, and calls `function` under the handler.
    fn call(
        &self,
        function: &Function,
        keys: &[Vec<u8>],
        argv: &[Vec<u8>],
    ) -> mlua::Result<(bool, mlua::Value)> {
        let globals = self.lua.globals();
        for (name, values) in [("KEYS", keys), ("ARGV", argv)] {
            let table = self.lua.create_table_with_capacity(values.len(), 0)?;
            for (i, value) in values.iter().enumerate() {
                table.raw_set(i + 1, self.lua.create_string(value)?)?;
            }
            globals.raw_set(name, table)?;
        }
        self.runner.call(function)
    }
}

/// The reply of an uncaught error (`err` from the handler, a table): `<err> script: <sha>, on
/// <source>:<line>.`, as Redis 7.0's `luaCallFunction` (`<err> script: on <source>:<line>.`
/// on Valkey 9: see [`Profile::names_script_in_errors`]).
fn uncaught(err: &mlua::Value, sha: &str, profile: Profile) -> Value {
    let mlua::Value::Table(table) = err else {
        return reply::error("ERR Error running script: execution failure");
    };
    let field = |name: &str| match table.raw_get::<mlua::Value>(name) {
        Ok(mlua::Value::String(s)) => Some(s.as_bytes().to_vec()),
        Ok(mlua::Value::Number(n)) => Some(lua_number(n).into_bytes()),
        Ok(mlua::Value::Integer(n)) => Some(n.to_string().into_bytes()),
        _ => None,
    };
    let mut message = field("err").unwrap_or_default();
    if let (Some(line), Some(source)) = (field("line"), field("source")) {
        if profile.names_script_in_errors() {
            message.extend_from_slice(format!(" script: {sha}, on ").as_bytes());
        } else {
            message.extend_from_slice(b" script: on ");
        }
        message.extend_from_slice(&source);
        message.push(b':');
        message.extend_from_slice(&line);
        message.push(b'.');
    }
    reply::error_exact(&message)
}

/// A Lua number as Lua 5.1 writes it (`%.14g`) for the integers a line number is.
fn lua_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e14 {
        format!("{n:.0}")
    } else {
        n.to_string()
    }
}

/// The innermost frame of a script (neither C nor the shim): its source and current line.
fn user_frame(lua: &Lua) -> Option<(Option<String>, Option<i64>)> {
    for level in 0..64 {
        let frame = lua.inspect_stack(level, |debug| {
            let source = debug.source();
            let ours =
                matches!(source.what, "C" | "tail") || source.source.as_deref() == Some(SHIM_NAME);
            (!ours).then(|| {
                let line = debug.current_line().and_then(|l| i64::try_from(l).ok());
                (source.source.map(|s| s.into_owned()), line)
            })
        });
        match frame {
            None => break,
            Some(None) => continue,
            Some(Some(found)) => return Some(found),
        }
    }
    None
}

/// `redis.call`'s and `redis.pcall`'s work: runs the command and returns its reply converted
/// to Lua, and whether it is an error (then an `{err=...}` table).
fn raw_call(lua: &Lua, args: MultiValue) -> mlua::Result<(mlua::Value, bool)> {
    let profile = lua
        .app_data_ref::<Keyspace>()
        .map(|space| space.profile)
        .unwrap_or_default();
    let own = |error| reply::error(profile.script_error(error));
    let mut argv = Vec::with_capacity(args.len());
    for arg in args {
        match arg {
            mlua::Value::String(s) => argv.push(s.as_bytes().to_vec()),
            mlua::Value::Integer(n) => argv.push(profile.double(n as f64).into_bytes()),
            mlua::Value::Number(n) => argv.push(profile.double(n).into_bytes()),
            _ => return to_lua(lua, &own(ScriptError::ArgumentType)),
        }
    }
    let Some(first) = argv.first() else {
        return to_lua(lua, &own(ScriptError::NoArguments));
    };
    let name = String::from_utf8_lossy(first).to_ascii_lowercase();
    if name == "__sha1hex" {
        let text = argv
            .get(1)
            .map_or_else(Vec::new, |s| sha1_hex(s).into_bytes());
        return Ok((mlua::Value::String(lua.create_string(text)?), false));
    }
    let answer = if NOT_FROM_SCRIPTS.contains(&name.as_str()) {
        own(ScriptError::NotAllowed)
    } else if name == "ping" {
        reply::status("PONG")
    } else {
        match lua.app_data_mut::<Keyspace>() {
            None => reply::error("ERR the simulated server's keys are away"),
            Some(mut space) => match keyspace::spec(&name, space.profile) {
                None => own(ScriptError::Unknown),
                Some(spec) if !spec.fits(argv.len()) => own(ScriptError::Arity),
                Some(_) => commands::run(&mut space, &name, &argv),
            },
        }
    };
    to_lua(lua, &answer)
}

/// A reply as Lua sees it (Redis's RESP2 conversion), and whether it is an error.
fn to_lua(lua: &Lua, value: &Value) -> mlua::Result<(mlua::Value, bool)> {
    let converted = match value {
        Value::Int(n) => mlua::Value::Number(*n as f64),
        Value::BulkString(bytes) => mlua::Value::String(lua.create_string(bytes)?),
        Value::Nil => mlua::Value::Boolean(false),
        Value::Array(items) => {
            let table = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                table.raw_set(i + 1, to_lua(lua, item)?.0)?;
            }
            mlua::Value::Table(table)
        }
        Value::Okay => field_table(lua, "ok", b"OK")?,
        Value::SimpleString(s) => field_table(lua, "ok", s.as_bytes())?,
        Value::ServerError(e) => {
            let text = match e.details() {
                Some(details) => format!("{} {details}", e.code()),
                None => e.code().to_owned(),
            };
            let table = field_table(lua, "err", text.as_bytes())?;
            return Ok((table, true));
        }
        _ => mlua::Value::Boolean(false),
    };
    Ok((converted, false))
}

/// `{name = text}`.
fn field_table(lua: &Lua, name: &str, text: &[u8]) -> mlua::Result<mlua::Value> {
    let table = lua.create_table()?;
    table.raw_set(name, lua.create_string(text)?)?;
    Ok(mlua::Value::Table(table))
}

/// A script's return value as Redis replies it: a number as an integer (truncated), a string
/// as a bulk string, a table as `{err=}` (error), `{ok=}` (status) or an array up to its first
/// nil, `true` as 1, `false` and nil as a nil bulk.
fn from_lua(value: &mlua::Value, depth: usize) -> Value {
    match value {
        mlua::Value::Boolean(true) => Value::Int(1),
        mlua::Value::Integer(n) => Value::Int(*n),
        mlua::Value::Number(n) => Value::Int(*n as i64),
        mlua::Value::String(s) => Value::BulkString(s.as_bytes().to_vec()),
        mlua::Value::Table(table) if depth < 1000 => from_table(table, depth),
        _ => Value::Nil,
    }
}

/// A table as Redis replies it (see [`from_lua`]).
fn from_table(table: &Table, depth: usize) -> Value {
    if let Ok(mlua::Value::String(err)) = table.raw_get::<mlua::Value>("err") {
        return reply::error_exact(&err.as_bytes());
    }
    if let Ok(mlua::Value::String(ok)) = table.raw_get::<mlua::Value>("ok") {
        return reply::status(&String::from_utf8_lossy(&ok.as_bytes()));
    }
    let mut items = Vec::new();
    for i in 1.. {
        match table.raw_get::<mlua::Value>(i) {
            Ok(mlua::Value::Nil) | Err(_) => break,
            Ok(item) => items.push(from_lua(&item, depth + 1)),
        }
    }
    Value::Array(items)
}
