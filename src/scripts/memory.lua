-- A voter's memory, read and kept up by every client beside its identity check (see
-- src/memory.rs): the marker, an id and the server time it was made ("id|ms", no TTL), and the
-- roster, what clients saw of the other voters' markers, one key per voter as clients name it
-- ("id|first-seen-ms|replaced").
--
-- KEYS[1]: the marker; KEYS[2..]: the roster entries of the other voters.
-- ARGV[1]: the id of a new marker, made when there is none (a new voter, or one that lost it);
-- ARGV[2]: the id of a marker to replace, or "": a loss a client saw that the marker survived
--          (evicted keys, a clock step, a failover, a restart that reloaded a snapshot);
-- ARGV[3..]: per roster entry, the marker id the client last read on that voter, or "";
--           "!AGE|id" when the client knows that marker replaced another, AGE ms ago.
-- An entry is set when missing (replaced "0": first seen, or "1" when the client knows) and
-- when its id differs (replaced "1": that voter lost its memory); an entry of the same id
-- first seen is marked replaced when the client knows (its roster was itself new, and the
-- others that remembered the loss may lose their memory in turn); kept otherwise.
-- Returns {marker, now-ms, entry...}, an entry nil when there is none.
-- Only GET, SET and TIME: an ACL user with the lock's rules and +time can run it.
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local marker = redis.call("GET", KEYS[1])
if marker and ARGV[2] ~= "" and string.sub(marker, 1, #ARGV[2] + 1) == ARGV[2] .. "|" then
  marker = false
end
if not marker then
  marker = ARGV[1] .. "|" .. string.format("%d", now)
  redis.call("SET", KEYS[1], marker)
end
local reply = {marker, now}
for i = 2, #KEYS do
  local seen, known, age = ARGV[i + 1], "0", 0
  if string.sub(seen, 1, 1) == "!" then
    local bar = string.find(seen, "|", 2, true)
    age = tonumber(string.sub(seen, 2, bar - 1)) or 0
    seen, known = string.sub(seen, bar + 1), "1"
  end
  local entry = redis.call("GET", KEYS[i])
  if seen ~= "" then
    local stamp = string.format("%d", now)
    if not entry then
      entry = seen .. "|" .. string.format("%d", now - age) .. "|" .. known
      redis.call("SET", KEYS[i], entry)
    elseif string.sub(entry, 1, #seen + 1) ~= seen .. "|" then
      entry = seen .. "|" .. stamp .. "|1"
      redis.call("SET", KEYS[i], entry)
    elseif known == "1" and string.sub(entry, -2) == "|0" then
      entry = seen .. "|" .. string.format("%d", now - age) .. "|1"
      redis.call("SET", KEYS[i], entry)
    end
  end
  reply[i + 1] = entry
end
return reply
