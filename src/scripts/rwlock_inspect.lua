-- Inspect a read-write lock: KEYS = its writer key, readers (sorted set: token by the server
-- time, in ms, its hold ends; waiting readers' registrations are scored below 0 and left out)
-- and writer-waiting mark. Returns, atomically and without writing: the writer's token (or
-- false) and its PTTL, the live readers as {token, ms left} pairs, the waiting writer's id
-- (or false) and its PTTL. Outside the lock protocol. A writer key or mark longer than MAX
-- bytes is no token: it is not read, and reads as "<N bytes>".
local MAX = 64
local function value(key, pttl)
  if pttl == -2 then
    return false
  end
  local head = redis.pcall("GETRANGE", key, 0, MAX)
  if type(head) == "table" then
    return redis.call("GET", key)
  end
  if #head > MAX then
    local length = redis.pcall("STRLEN", key)
    if type(length) ~= "number" then
      return "<more than " .. MAX .. " bytes>"
    end
    return "<" .. length .. " bytes>"
  end
  return head
end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local readers = {}
local rows = redis.call("ZRANGEBYSCORE", KEYS[2], "(" .. now, "+inf", "WITHSCORES")
for j = 1, #rows, 2 do
  readers[#readers + 1] = {rows[j], math.floor(tonumber(rows[j + 1]) - now)}
end
local writer_ttl, waiting_ttl = redis.call("PTTL", KEYS[1]), redis.call("PTTL", KEYS[3])
return {value(KEYS[1], writer_ttl), writer_ttl, readers, value(KEYS[3], waiting_ttl), waiting_ttl}
