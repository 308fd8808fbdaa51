//! What the differential test runs on (see `differential.rs`): redfence's scripts, the keys a
//! step may touch, and the ad hoc scripts that probe Redis's Lua conversions.

/// redfence's scripts, by name.
pub(super) const SCRIPTS: &[(&str, &[u8])] = &[
    ("batch", include_bytes!("../scripts/batch.lua")),
    ("claim", include_bytes!("../scripts/claim.lua")),
    ("inspect", include_bytes!("../scripts/inspect.lua")),
    ("memory", include_bytes!("../scripts/memory.lua")),
    (
        "rwlock_inspect",
        include_bytes!("../scripts/rwlock_inspect.lua"),
    ),
    (
        "write_if_held",
        include_bytes!("../scripts/write_if_held.lua"),
    ),
    ("init_stripes", include_bytes!("../fence/init_stripes.lua")),
    ("next_fences", include_bytes!("../fence/next_fences.lua")),
    ("next_ranges", include_bytes!("../fence/next_ranges.lua")),
];

/// Lock keys (strings; `z` and `q` are also made sorted sets).
pub(super) const LOCKS: &[&str] = &["a", "b", "z"];
/// A read-write lock's three keys.
pub(super) const RW: [&str; 3] = ["rw", "rw:readers", "rw:waiting"];

/// Every key a step may touch, for the state check.
pub(super) fn universe() -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for lock in LOCKS {
        keys.push((*lock).to_owned());
        for helper in [":redfence:waiting", ":redfence:queue", ":redfence:alive"] {
            keys.push(format!("{lock}{helper}"));
        }
    }
    keys.extend(RW.iter().map(|k| (*k).to_owned()));
    keys.extend(["q", "n", "m", "r:b", "s", "s:0", "s:1", "f:1", "f:2"].map(str::to_owned));
    keys
}

/// Ad hoc scripts: Redis's conversions both ways, errors raised and returned, numbers as
/// arguments. Each runs with `KEYS[1]` and `ARGV[1]`.
pub(super) const AD_HOC: &[&str] = &[
    "return redis.call('GET', KEYS[1])",
    "return redis.pcall('GET', KEYS[1])",
    "return redis.call('INCR', KEYS[1])",
    "local r = redis.pcall('INCR', KEYS[1])\nreturn {type(r), r.err or r}",
    "return {1, 2.7, -2.7, 'x', false, true, {3, {4}}, {ok='fine'}}",
    "return {1, nil, 3}",
    "return {err='My Error'}",
    "return {err='boom'}",
    "return redis.error_reply('My Error')",
    "return redis.error_reply('boom')",
    "return redis.status_reply('FINE')",
    "return redis.error_reply()",
    "return redis.error_reply('a', 'b')",
    "return redis.status_reply()",
    "return redis.call('TYPE', KEYS[1])",
    "return redis.call('TYPE', KEYS[1])['ok']",
    "return redis.call('SET', KEYS[1], 1.5, 'PX', 60000)",
    "redis.call('SET', KEYS[1], 1e20)\nreturn redis.call('GET', KEYS[1])",
    "redis.call('SET', KEYS[1], 0.1)\nreturn redis.call('GET', KEYS[1])",
    "redis.call('SET', KEYS[1], 'v', 'PX', 60000.7)\nreturn 1",
    "return redis.call('ZADD', KEYS[1], 1.25, ARGV[1])",
    "return redis.call('ZADD', KEYS[1], 'x', 'm')",
    "local x = 1\nreturn redis.call('GET', KEYS[1], 'extra')",
    "return redis.call('NOSUCH', KEYS[1])",
    "return redis.pcall('NOSUCH', KEYS[1])",
    "error('boom')",
    "error({err='TABLE raised'})",
    "local t = nil\nreturn t.x",
    "return redis.call('EXISTS', KEYS[1], KEYS[1])",
    "return redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')",
    "return redis.call('ZSCORE', KEYS[1], ARGV[1])",
    "return tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]))",
    "return #redis.call('TIME')",
    "return redis.sha1hex(ARGV[1])",
    "return 3.99",
    "return -3.99",
    "return nil",
    "return redis.call('PING')",
    "return redis.call",
    "return 'line\\r\\nbreak'",
    "x = 1\nreturn 1",
    "return y",
    "local function g() z = 2 end\ng()\nreturn 1",
    "redis = nil\nreturn 1",
    "KEYS = 5",
    "return _G.q",
    "return {type(print), type(loadstring), type(unpack), type(getmetatable(_G))}",
    "return redis.call()",
    "return redis.call({})",
    "return redis.call('EVAL', 'return 1', '0')",
    "return tostring(1e15) .. tostring(0.1) .. tostring(-0)",
    "return redis.pcall('DELIFEQ', KEYS[1], ARGV[1])",
    "return redis.pcall('DELEX', KEYS[1], 'IFEQ', ARGV[1])",
    "return redis.pcall('SET', KEYS[1], ARGV[1], 'IFEQ', ARGV[1])",
];
