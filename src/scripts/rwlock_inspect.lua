-- Inspect a read-write lock: KEYS = its writer key, readers (sorted set: token by the server
-- time, in ms, its hold ends) and writer-waiting mark. Returns, atomically and without
-- writing: the writer's token (or false) and its PTTL, the live readers as {token, ms left}
-- pairs, the waiting writer's id (or false) and its PTTL. Outside the lock protocol.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local readers = {}
local rows = redis.call("ZRANGEBYSCORE", KEYS[2], "(" .. now, "+inf", "WITHSCORES")
for j = 1, #rows, 2 do
  readers[#readers + 1] = {rows[j], math.floor(tonumber(rows[j + 1]) - now)}
end
return {redis.call("GET", KEYS[1]), redis.call("PTTL", KEYS[1]), readers,
  redis.call("GET", KEYS[3]), redis.call("PTTL", KEYS[3])}
