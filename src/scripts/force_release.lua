-- Force release: as inspect.lua, then deletes every key that exists, whoever holds it.
-- KEYS = the keys to delete. The operator's break-glass, outside the lock protocol.
local out = {}
for i, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key)['ok']
  local value = false
  if kind == 'string' then value = redis.call('GET', key) end
  out[i] = {kind, value, redis.call('PTTL', key)}
  if kind ~= 'none' then redis.call('DEL', key) end
end
return out
