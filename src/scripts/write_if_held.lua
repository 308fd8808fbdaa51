-- Write beside a lock: set KEYS[2] (or delete it) only while the lock key KEYS[1] holds our token.
-- ARGV[1] = owner token, ARGV[2] = the value ('' deletes KEYS[2]), ARGV[3] = ttl in milliseconds.
-- The lock key's value is read no further than a token's length and one byte (GETRANGE):
-- never a large foreign value. An ACL user not allowed GETRANGE (the rules of earlier
-- versions) compares with GET, as before.
local head = redis.pcall("GETRANGE", KEYS[1], 0, #ARGV[1])
if type(head) == "table" and string.sub(tostring(head.err), 1, 9) ~= "WRONGTYPE" then
  head = redis.pcall("GET", KEYS[1])
end
if head ~= ARGV[1] then
  return 0
end
if ARGV[2] == "" then
  redis.call("DEL", KEYS[2])
else
  redis.call("SET", KEYS[2], ARGV[2], "PX", ARGV[3])
end
return 1
