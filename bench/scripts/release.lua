-- Release: compare-and-delete; only keys whose value is our token are touched.
-- KEYS = the lock's keys, ARGV[1] = owner token. Returns how many keys were deleted.
local count = 0
for _, key in ipairs(KEYS) do
  if redis.pcall("GET", key) == ARGV[1] then
    redis.call("DEL", key)
    count = count + 1
  end
end
return count
