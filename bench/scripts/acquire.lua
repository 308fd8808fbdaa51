-- Acquire: all-or-nothing over every key of the lock.
-- KEYS = the lock's keys, ARGV[1] = owner token, ARGV[2] = ttl in milliseconds.
-- GET (not EXISTS) so that a key holding another type raises WRONGTYPE instead
-- of looking like a competing owner; nothing is written in that case.
-- A key that already holds our own token counts as ours, so that repeating the
-- same request (after a dropped connection) is harmless.
for _, key in ipairs(KEYS) do
  local value = redis.call("GET", key)
  if value and value ~= ARGV[1] then
    return 0
  end
end
for _, key in ipairs(KEYS) do
  redis.call("SET", key, ARGV[1], "PX", ARGV[2])
end
return #KEYS
