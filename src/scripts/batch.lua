-- Batch: many locks' operations in one call, each all-or-nothing over its own keys and
-- independent of the others, run in order. Keys and values are those of acquire.lua,
-- extend.lua and release.lua (key = resource, value = owner token), so node-redlock and
-- redsync still interoperate.
-- ARGV = for each operation: kind ("a" acquire, "e" extend, "r" release), owner token,
--        ttl in milliseconds, number of keys. KEYS = every operation's keys, in order.
-- A release publishes on "redfence:released:<key>" for each key it deleted, so that waiters
-- retry at once.
-- Returns one reply per operation: acquire/extend the number of keys (0 = refused),
-- release the number of keys deleted, or "E:" and the error of that operation alone
-- (e.g. WRONGTYPE when a key holds a hash).
local out = {}
local k = 1
local i = 1
local n = 0
while i <= #ARGV do
  local kind, token, ttl, count = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  i = i + 4
  n = n + 1
  local first, last = k, k + count - 1
  k = k + count
  if kind == "a" then
    local reply = count
    for j = first, last do
      local value = redis.pcall("GET", KEYS[j])
      if type(value) == "table" and value.err then
        reply = "E:" .. value.err
        break
      end
      if value and value ~= token then
        reply = 0
        break
      end
    end
    if reply == count then
      for j = first, last do
        redis.call("SET", KEYS[j], token, "PX", ttl)
      end
    end
    out[n] = reply
  elseif kind == "e" then
    local reply = count
    for j = first, last do
      if redis.pcall("GET", KEYS[j]) ~= token then
        reply = 0
        break
      end
    end
    if reply == count then
      for j = first, last do
        redis.call("PEXPIRE", KEYS[j], ttl)
      end
    end
    out[n] = reply
  else
    local deleted = 0
    for j = first, last do
      if redis.pcall("GET", KEYS[j]) == token then
        redis.call("DEL", KEYS[j])
        redis.call("PUBLISH", "redfence:released:" .. KEYS[j], "")
        deleted = deleted + 1
      end
    end
    out[n] = deleted
  end
end
return out
