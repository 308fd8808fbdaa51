-- Inspect: for each key, its type, its value if it is a string, and its PTTL, atomically.
-- KEYS = the keys to read. Outside the lock protocol (advisory).
local out = {}
for i, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key)['ok']
  local value = false
  if kind == 'string' then value = redis.call('GET', key) end
  out[i] = {kind, value, redis.call('PTTL', key)}
end
return out
