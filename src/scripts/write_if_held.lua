-- Write beside a lock: set KEYS[2] (or delete it) only while the lock key KEYS[1] holds our token.
-- ARGV[1] = owner token, ARGV[2] = the value ('' deletes KEYS[2]), ARGV[3] = ttl in milliseconds.
if redis.pcall("GET", KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == "" then
  redis.call("DEL", KEYS[2])
else
  redis.call("SET", KEYS[2], ARGV[2], "PX", ARGV[3])
end
return 1
