-- Force release: as inspect.lua, then deletes every key that exists, whoever holds it.
-- KEYS = the keys to delete. The operator's break-glass, outside the lock protocol.
-- Also deletes each key's fair queue and waiting mark (a fair holder stays at the head of its
-- queue until its own release, which a forced release stands in for) and announces the
-- release to every waiter; waiters take their places again on their next attempt (the first
-- to retry heads the queue on this node). Best effort: a user whose ACL does not cover those
-- keys, or a Cluster (they may lie in other slots), still deletes the key.
-- A string longer than MAX bytes is deleted without being read (see inspect.lua).
local QUEUE, ALIVE, WAITING = ":redfence:queue", ":redfence:alive", ":redfence:waiting"
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
  if kind ~= 'none' then redis.call('DEL', key) end
  local helpers = redis.pcall('DEL', key .. QUEUE, key .. ALIVE, key .. WAITING)
  if type(helpers) == 'number' and helpers > 0 then
    redis.pcall('PUBLISH', "redfence:released:" .. key, '')
  end
end
return out
