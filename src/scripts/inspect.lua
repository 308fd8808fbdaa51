-- Inspect, and with ARGV[1] = "release" force release: for each key, its type, its value if
-- it is a string of at most MAX bytes, and its PTTL, atomically. KEYS = the keys to read.
-- Outside the lock protocol (advisory).
-- A longer string is no lock's token (nor a leader's record): it is never read (a GET of
-- megabytes stalls the server), and its value reads as none, which the report shows as a
-- value that is not a lock. An ACL user not allowed GETRANGE (the rules of earlier
-- versions) reads the value with GET, as before.
-- Without it (no ARGV[1], or any other value) the script writes nothing.
-- With "release", the operator's break-glass: after reading a key it deletes it if it
-- exists, whoever holds it (a string longer than MAX bytes is deleted without being read).
-- Also deletes each key's fair queue and waiting mark (a fair holder stays at the head of its
-- queue until its own release, which a forced release stands in for) and announces the
-- release to every waiter; waiters take their places again on their next attempt (the first
-- to retry heads the queue on this node). Best effort: a user whose ACL does not cover those
-- keys, or a Cluster (they may lie in other slots), still deletes the key.
local QUEUE, ALIVE, WAITING = ":redfence:queue", ":redfence:alive", ":redfence:waiting"
local MAX = 4096
local release = ARGV[1] == 'release'
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
  if release then
    if kind ~= 'none' then redis.call('DEL', key) end
    local helpers = redis.pcall('DEL', key .. QUEUE, key .. ALIVE, key .. WAITING)
    if type(helpers) == 'number' and helpers > 0 then
      redis.pcall('PUBLISH', "redfence:released:" .. key, '')
    end
  end
end
return out
