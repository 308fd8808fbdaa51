-- A value every client of a name must agree on (a semaphore's number of permits): set
-- KEYS[1] to ARGV[1] with a TTL of ARGV[2] ms if it does not exist; refresh the TTL if it
-- holds ARGV[1]; leave it alone otherwise. Returns the value stored (ours, or the other one;
-- one longer than MAX bytes is not read, and is returned as "<N bytes>").
-- A key of another type is a per-node error (GETRANGE fails), never overwritten. An ACL
-- user not allowed GETRANGE (the rules of earlier versions) reads the value with GET.
local MAX = 64
if redis.call("SET", KEYS[1], ARGV[1], "NX", "PX", ARGV[2]) then
  return ARGV[1]
end
local stored = redis.pcall("GETRANGE", KEYS[1], 0, MAX)
if type(stored) == "table" then
  if string.sub(tostring(stored.err), 1, 9) == "WRONGTYPE" then
    return stored
  end
  stored = redis.call("GET", KEYS[1])
end
if stored == ARGV[1] then
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
elseif #stored > MAX then
  local length = redis.pcall("STRLEN", KEYS[1])
  if type(length) ~= "number" then
    return "<more than " .. MAX .. " bytes>"
  end
  return "<" .. length .. " bytes>"
end
return stored
