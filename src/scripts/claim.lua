-- A value every client of a name must agree on (a semaphore's number of permits): set
-- KEYS[1] to ARGV[1] with a TTL of ARGV[2] ms if it does not exist; refresh the TTL if it
-- holds ARGV[1]; leave it alone otherwise. Returns the value stored (ours, or the other one).
-- A key of another type is a per-node error (GET fails), never overwritten.
local stored = redis.call("GET", KEYS[1])
if not stored then
  redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
  return ARGV[1]
end
if stored == ARGV[1] then
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
end
return stored
