-- Issues the tokens of a batch from a striped counter: a range per stripe, in arrival order.
-- KEYS[1]: the marker, holding the stripe count; KEYS[2..]: the stripe keys the batch
-- involves, each once.
-- ARGV[1]: the stripe count. Then, per request: how many stripes it involves (n >= 1),
-- followed by n indexes into KEYS (2 or more).
-- Each stripe is read once; request by request, a token is one more than the largest
-- current value of its stripes, and becomes the value of each of them; each stripe is
-- written once at the end. So every token is greater than every token issued before for
-- any resource on its stripes, and a stripe ends at the largest token issued from it.
-- Atomic: no other command runs between the reads and the writes.
-- Lua numbers are doubles: integers are exact up to 2^53, far beyond any real counter.
local limit = 9007199254740992
local marker = redis.call('GET', KEYS[1])
if marker ~= ARGV[1] then
    if not marker then
        return redis.error_reply('NOSTRIPES ' .. KEYS[1] .. ' is missing')
    end
    return redis.error_reply('fence stripes: ' .. KEYS[1] .. ' says ' .. marker ..
        ' stripes, this counter has ' .. ARGV[1] .. ' (every client must use the same count)')
end
local value = {}
for k = 2, #KEYS do
    local raw = redis.call('GET', KEYS[k])
    if not raw then
        return redis.error_reply('NOSTRIPES ' .. KEYS[k] .. ' is missing')
    end
    local v = tonumber(raw)
    if v == nil or v ~= math.floor(v) or v < 0 then
        return redis.error_reply('fence stripe ' .. KEYS[k] .. ' does not hold an integer')
    end
    value[k] = v
end
local tokens = {}
local i = 2
while i <= #ARGV do
    local n = tonumber(ARGV[i])
    if n == nil or n < 1 or i + n > #ARGV then
        return redis.error_reply('fence batch: bad stripe count ' .. tostring(ARGV[i]))
    end
    local max = 0
    for j = i + 1, i + n do
        local k = tonumber(ARGV[j])
        if k == nil or value[k] == nil then
            return redis.error_reply('fence batch: bad stripe index ' .. tostring(ARGV[j]))
        end
        if value[k] > max then
            max = value[k]
        end
    end
    local token = max + 1
    if token >= limit then
        return redis.error_reply('fence stripes reached 2^53')
    end
    for j = i + 1, i + n do
        value[tonumber(ARGV[j])] = token
    end
    tokens[#tokens + 1] = token
    i = i + n + 1
end
for k = 2, #KEYS do
    redis.call('SET', KEYS[k], string.format('%d', value[k]))
end
return tokens
