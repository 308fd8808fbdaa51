-- Issues the next fencing token of every request of a batch, in arrival order.
-- KEYS: the counter keys of every request, request after request.
-- ARGV: how many keys each request has (at least one each), in the same order.
-- Returns one integer per request, greater than the value of each of its keys, and stores
-- it in each of them; a later request on a key sees the earlier one's token.
-- Atomic: no other command runs between the reads and the writes.
-- Lua numbers are doubles: integers are exact up to 2^53, far beyond any real counter.
local limit = 9007199254740992
local tokens = {}
local first = 1
for i, count in ipairs(ARGV) do
    local n = tonumber(count)
    if n == nil or n < 1 or first + n - 1 > #KEYS then
        return redis.error_reply('fence batch: bad key count ' .. tostring(count))
    end
    local last = first + n - 1
    if n == 1 then
        -- INCR stores the exact integer; past 2^53 its reply would reach Lua rounded, and
        -- round to a token already handed out.
        local token = redis.call('INCR', KEYS[first])
        if token >= limit then
            return redis.error_reply('fence counter ' .. KEYS[first] .. ' reached 2^53')
        end
        tokens[i] = token
    else
        local max = 0
        for k = first, last do
            local value = redis.call('GET', KEYS[k])
            if value then
                local v = tonumber(value)
                if v == nil or v ~= math.floor(v) then
                    return redis.error_reply('fence counter ' .. KEYS[k] .. ' does not hold an integer')
                end
                if v >= limit then
                    return redis.error_reply('fence counter ' .. KEYS[k] .. ' reached 2^53')
                end
                if v > max then
                    max = v
                end
            end
        end
        local next = string.format('%d', max + 1)
        for k = first, last do
            redis.call('SET', KEYS[k], next)
        end
        tokens[i] = tonumber(next)
    end
    first = last + 1
end
return tokens
