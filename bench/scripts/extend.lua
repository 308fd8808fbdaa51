-- Extend: compare-and-PEXPIRE, all-or-nothing over every key of the lock.
-- KEYS = the lock's keys, ARGV[1] = owner token, ARGV[2] = new ttl in milliseconds.
for _, key in ipairs(KEYS) do
  if redis.pcall("GET", key) ~= ARGV[1] then
    return 0
  end
end
for _, key in ipairs(KEYS) do
  redis.call("PEXPIRE", key, ARGV[2])
end
return #KEYS
