-- Inspect: for each key, its type, its value if it is a string of at most MAX bytes, and its
-- PTTL, atomically. KEYS = the keys to read. Outside the lock protocol (advisory).
-- A longer string is no lock's token (nor a leader's record): it is never read (a GET of
-- megabytes stalls the server), and its value reads as none, which the report shows as a
-- value that is not a lock. An ACL user not allowed GETRANGE (the rules of earlier
-- versions) reads the value with GET, as before.
local MAX = 4096
local out = {}
for i, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key)['ok']
  local value = false
  if kind == 'string' then
    value = redis.pcall('GETRANGE', key, 0, MAX)
    if type(value) == 'table' then value = redis.call('GET', key) end
    if #value > MAX then value = false end
  end
  out[i] = {kind, value, redis.call('PTTL', key)}
end
return out
