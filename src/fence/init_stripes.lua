-- Makes (or checks) the stripes of a striped counter.
-- KEYS[1]: the marker, holding the stripe count; KEYS[2..]: every stripe key.
-- ARGV[1]: the stripe count; ARGV[2]: the floor, the largest per-resource token found
-- under the counter's prefix (0 if none).
-- Refuses if the marker holds another count; raises every stripe to at least the floor
-- (a missing stripe starts at the floor), then writes the marker. Repeatable.
local marker = redis.call('GET', KEYS[1])
if marker and marker ~= ARGV[1] then
    return redis.error_reply('fence stripes: ' .. KEYS[1] .. ' says ' .. marker ..
        ' stripes, this counter has ' .. ARGV[1] .. ' (every client must use the same count)')
end
local floor = tonumber(ARGV[2])
for k = 2, #KEYS do
    local raw = redis.call('GET', KEYS[k])
    local v = 0
    if raw then
        v = tonumber(raw)
        if v == nil or v ~= math.floor(v) then
            return redis.error_reply('fence stripe ' .. KEYS[k] .. ' does not hold an integer')
        end
    end
    if not raw or v < floor then
        redis.call('SET', KEYS[k], ARGV[2])
    end
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
