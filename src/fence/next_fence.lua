-- Issues the next fencing token for a lock on one or more resources.
-- KEYS: the counter key of every resource of the lock.
-- Returns one integer greater than the value of every key, and stores it in every key.
-- Atomic: no other command runs between the reads and the writes.
if #KEYS == 1 then
    return redis.call('INCR', KEYS[1])
end
-- Lua numbers are doubles: integers are exact up to 2^53, far beyond any real counter.
local limit = 9007199254740992
local max = 0
for _, key in ipairs(KEYS) do
    local value = redis.call('GET', key)
    if value then
        local n = tonumber(value)
        if n == nil or n ~= math.floor(n) then
            return redis.error_reply('fence counter ' .. key .. ' does not hold an integer')
        end
        if n >= limit then
            return redis.error_reply('fence counter ' .. key .. ' reached 2^53')
        end
        if n > max then
            max = n
        end
    end
end
local next = string.format('%d', max + 1)
for _, key in ipairs(KEYS) do
    redis.call('SET', key, next)
end
return tonumber(next)
