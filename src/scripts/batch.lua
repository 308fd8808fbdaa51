-- Batch: many locks' operations in one call, each all-or-nothing over its own keys and
-- independent of the others, run in order. Keys and values are those of the single-lock
-- scripts (bench/scripts/: key = resource, value = owner token), so node-redlock and redsync
-- still interoperate.
-- ARGV = for each operation: kind, owner token, ttl in milliseconds, number of keys, and
--        for "f", "l" and "R" also the waiter id, its ticket and its lease in milliseconds.
--        Kinds: "a" acquire, "e" extend, "E" extend and set missing keys again (see
--        extend_repair), "r" release, "f" acquire in turn (fair mode),
--        "l" leave the fair queue, "R" release and leave the fair queue (a fair lock's
--        release), "n" announce a release made by a plain command, "m" read the server's
--        memory marker (its one key; the reply is the marker, or 0: see src/memory.rs).
--        KEYS = every operation's keys, in order.
-- Fair queue of a key K: the sorted set K..":redfence:queue" (waiter by ticket) and
-- K..":redfence:alive" (waiter by the server time, in ms, its lease ends); a waiter that
-- has not been heard from for its lease is dropped. "f" grants only the waiter at the head
-- of every key's queue, and leaves it there: its lock's release ("R") or a leave ("l") takes
-- it out of line, while an attempt that failed elsewhere releases with "r" and keeps its
-- place (the release then names it as the next waiter).
-- A release publishes on "redfence:released:<key>" for each key it deleted while someone
-- waited for it, so that waiters retry at once; the message is the waiter now at the head of
-- the key's queue ("" if none). Waiting marks the key (K..":redfence:waiting", for the
-- waiter's TTL and at least MIN_WAIT_MARK): a refused acquire and a fair waiter's every
-- attempt set the mark; a release deletes it with the key (one DEL) and, when the fair queue
-- still holds waiters, sets it again. An uncontended release is then GET and DEL, nothing
-- more; waiters woken by the message mark the key again if they are refused again.
-- Keys only: when ARGV[1] is "-" (a Cluster voter's batch), nothing but the lock keys is
-- touched: no waiting marks and no notification. A cluster refuses a helper key in another
-- hash slot, and a Cluster voter's waiters poll (fair mode is refused there).
-- Read-write locks (kinds of two letters: side "r"/"w", then "a" acquire, "e" extend,
-- "r" release, "l" leave): the operation's three keys are the lock's writer key (a string,
-- the writer's token, PX), its readers (a sorted set, see below) and its writer-waiting mark
-- (a string, the waiting writer's id, PX); two more arguments follow the four: the waiter
-- id of the acquisition ("" for none) and how long a refused waiter stays registered (ms, 0
-- for none). Phase-fair: a write is granted when there is no writer, no live reader and no
-- admitted reader (below); a refused write sets the mark. A read is granted when there is no
-- writer, and either no mark or the reader is admitted. A refused reader registers in the
-- readers set; a writer's release admits every reader registered at that moment: they get
-- in before any writer waiting then, and readers registered after the release queue behind
-- a waiting writer (its mark). So a reader waits for at most one write phase, and a writer
-- for the readers that were in line before it. The readers set holds the live readers
-- (token by the server time, in ms, their hold ends: positive scores, pruned by every
-- operation) and the registrations ("?" .. waiter id: -(end of the registration), minus
-- ADMITTED once admitted; never counted as readers, and pruned by earlier versions' every
-- operation, which then simply do without them). A grant takes the reader's registration
-- away, and so does the reader's release (its token) or leave (its waiter id). A writer's
-- release, the last reader's or an admitted reader's leave while a writer waits, and a
-- waiting writer's leave publish on the writer key's release channel (waiters retry at once;
-- a Cluster voter's keys-only batch does not). Made only inside lib(): the one-key mutex
-- path above never sees them. No repair after a restart ("E").
-- Large foreign values: no operation reads more of a lock key's value than a token's length
-- and one byte (GETRANGE, see held), so a key holding megabytes costs what any refusal costs.
-- Returns one reply per operation: acquire/extend the number of keys (0 = refused),
-- release the number of keys deleted, leave and announce 0, or "E:" and the error of that operation alone
-- (e.g. WRONGTYPE when a key holds a hash).
local QUEUE, ALIVE, WAITING = ":redfence:queue", ":redfence:alive", ":redfence:waiting"
-- How long waiting marks a key, at least (ms): well beyond a retry delay.
local MIN_WAIT_MARK = 10000
-- The server's time (ms), read once per call when needed (see now_ms).
local now = nil
-- Keys only (see the top).
local keys_only = ARGV[1] == "-"
-- Everything but the usual operations, made on the first operation that needs it: a call
-- made only of one-key acquires, extensions and releases outside fair mode (most calls)
-- creates none of these functions (each costs the server a closure per call; the whole set
-- doubled a lone release's cost).
local library = nil
local function lib()
  if library then
    return library
  end
  -- Set once GETRANGE was refused in this call (an ACL user with the rules of an earlier
  -- version): held reads with GET instead, as before.
  local whole = false

  -- What key holds, against token: true when token, false when another value, nil when there
  -- is no key, or the server's error (a table: WRONGTYPE for a key of another type). Reads at
  -- most #token + 1 bytes of the value (GETRANGE), never a large foreign value: a GET of 2 MiB
  -- cost the server 3 ms and more per call.
  local function held(key, token)
    local head
    if whole then
      head = redis.pcall("GET", key)
    else
      head = redis.pcall("GETRANGE", key, 0, #token)
    end
    if type(head) == "table" then
      if whole or string.sub(tostring(head.err), 1, 9) == "WRONGTYPE" then
        return head
      end
      whole = true
      return held(key, token)
    end
    if head == false then
      return nil
    elseif head == token and #token > 0 then
      return true
    elseif head == "" and not whole and redis.pcall("GET", key) == false then
      -- GETRANGE answers "" for no key and for an empty value alike: GET tells them apart,
      -- reading nothing more (the value is empty), and the lock's ACL rules allow it.
      return nil
    end
    return head == token
  end

  -- Marks key as waited for, for ms or MIN_WAIT_MARK (see the top): its next release
  -- publishes. Best effort.
  local function mark(key, ms)
    if keys_only then
      return
    end
    redis.pcall("SET", key .. WAITING, "1", "PX", math.max(tonumber(ms) or 0, MIN_WAIT_MARK))
  end

  local function now_ms()
    local t = redis.call("TIME")
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end

  -- Whether key's queue and lease sets are sorted sets (or absent). A name that holds another
  -- type (some other lock called "<key>:redfence:queue") makes only this operation fail, never
  -- the whole batch.
  local function queue_ok(key)
    for _, name in ipairs({key .. QUEUE, key .. ALIVE}) do
      local t = redis.call("TYPE", name)["ok"]
      if t ~= "zset" and t ~= "none" then
        return false
      end
    end
    return true
  end

  local function queues_ok(first, last)
    for j = first, last do
      if not queue_ok(KEYS[j]) then
        return false
      end
    end
    return true
  end

  -- The waiter at the head of key's queue, after dropping those whose lease ended (in chunks:
  -- unpack has a stack limit of a few thousand values). The caller checked queue_ok.
  local function head(key, now)
    local queue, alive = key .. QUEUE, key .. ALIVE
    local dead = redis.call("ZRANGEBYSCORE", alive, "-inf", now)
    for c = 1, #dead, 1000 do
      redis.call("ZREM", queue, unpack(dead, c, math.min(c + 999, #dead)))
    end
    if #dead > 0 then
      redis.call("ZREMRANGEBYSCORE", alive, "-inf", now)
    end
    return redis.call("ZRANGE", queue, 0, 0)[1]
  end

  -- Takes waiter out of key's queue. The caller checked queue_ok.
  local function leave(key, waiter)
    redis.call("ZREM", key .. QUEUE, waiter)
    redis.call("ZREM", key .. ALIVE, waiter)
  end

  -- Whether every key of the operation holds token (the repeat of a request that landed).
  local function holds(first, last, token)
    for j = first, last do
      if held(KEYS[j], token) ~= true then
        return false
      end
    end
    return true
  end

  -- Extend and repair ("E"): when every key of the operation holds token or is missing (a
  -- server restarted without persistence forgot it), re-arms the ones that hold it and sets
  -- the missing ones again (SET NX: never over another owner's key); otherwise 0, nothing
  -- changed. A repair is no confirmation: the reply is count only when every key still held
  -- token, 0 when one had to be set again (a key that vanished may have been another owner's
  -- in between, so this node's vote does not count this round; the next round's does).
  local function extend_repair(first, last, token, ttl, count)
    for j = first, last do
      local state = held(KEYS[j], token)
      if state ~= true and state ~= nil then
        return 0
      end
    end
    local reply = count
    for j = first, last do
      if redis.call("PEXPIRE", KEYS[j], ttl) == 0 then
        redis.call("SET", KEYS[j], token, "NX", "PX", ttl)
        reply = 0
      end
    end
    return reply
  end

  -- A refused acquire: marks the key it waits for.
  local function refused(key, ttl)
    mark(key, ttl)
    return 0
  end

  local function acquire(first, last, token, ttl, count)
    -- One key (the usual lock): one SET when the key is free; a look at its value only when
    -- it is taken, by another owner, by us (a repeated request), or by a key of another type
    -- (WRONGTYPE).
    if first == last then
      if redis.call("SET", KEYS[first], token, "NX", "PX", ttl) then
        return count
      end
      local state = held(KEYS[first], token)
      if type(state) == "table" then
        return "E:" .. tostring(state.err)
      end
      if state ~= true then
        return refused(KEYS[first], ttl)
      end
      redis.call("SET", KEYS[first], token, "PX", ttl)
      return count
    end
    -- Several keys: one EXISTS when they are all free (the usual case).
    local n = last - first + 1
    local taken = n <= 1000 and redis.pcall("EXISTS", unpack(KEYS, first, last))
    if taken ~= 0 then
      for j = first, last do
        local state = held(KEYS[j], token)
        if type(state) == "table" then
          return "E:" .. tostring(state.err)
        end
        if state == false then
          return refused(KEYS[j], ttl)
        end
      end
    end
    for j = first, last do
      redis.call("SET", KEYS[j], token, "PX", ttl)
    end
    return count
  end

  -- Whether key has a fair queue that can be read (see queue_ok).
  local function has_queue(key)
    return redis.pcall("EXISTS", key .. QUEUE) == 1 and queue_ok(key)
  end

  -- Announces that key was released while someone waited: publishes the waiter now at the head
  -- of its fair queue (when read_queue; "" if none) and marks the key again while fair waiters
  -- remain in line.
  local function announce(key, read_queue)
    local next = ""
    if read_queue then
      now = now or now_ms()
      next = head(key, now) or ""
    end
    if next ~= "" then
      mark(key, 0)
    end
    redis.pcall("PUBLISH", "redfence:released:" .. key, next)
  end

  -- Releases key if it holds token: 1 if deleted, else 0. waiter: a fair lock's own waiter
  -- id (its release also leaves the key's queue, when usable: see queue_ok), or nil.
  local function release(key, token, waiter)
    if keys_only then
      if held(key, token) ~= true then
        return 0
      end
      return redis.call("DEL", key)
    end
    local in_line = waiter ~= nil and queue_ok(key)
    if in_line then
      leave(key, waiter)
    end
    if held(key, token) ~= true then
      return 0
    end
    -- The key and its waiting mark: 2 deleted when someone waited. A user whose ACL key
    -- pattern does not cover the mark still releases (the key alone), and its waiters poll.
    local gone = redis.pcall("DEL", key, key .. WAITING)
    if type(gone) ~= "number" then
      gone = redis.call("DEL", key)
    end
    -- Notifying is best effort: a user without the permissions for it (an older ACL line)
    -- still releases, and its waiters poll.
    if in_line or gone > 1 then
      announce(key, in_line or (waiter == nil and has_queue(key)))
    end
    return 1
  end

  -- A score as Redis reads it: every digit (Lua writes 14 significant ones, then an
  -- exponent).
  local function score(x)
    return string.format("%.0f", x)
  end

  -- How far below the others an admitted reader's registration is scored in a read-write
  -- lock's readers set (see the top): far beyond any server time in ms, exact in a double.
  local ADMITTED = 1e15

  -- Whether the readers set holds a live reader (its hold ended after now: pruned already).
  local function live(readers)
    return #redis.call("ZRANGEBYSCORE", readers, "(0", "+inf", "LIMIT", 0, 1) > 0
  end

  -- Whether the readers set holds a live admitted registration.
  local function admitted(readers)
    local below = "(" .. score(-now - ADMITTED)
    return #redis.call("ZRANGEBYSCORE", readers, "-inf", below, "LIMIT", 0, 1) > 0
  end

  -- Registration reg's score, if live, and whether it is admitted.
  local function registration(readers, reg)
    local s = tonumber(redis.call("ZSCORE", readers, reg))
    if s == nil or (s >= -now and s < 0) or (s >= -now - ADMITTED and s < -ADMITTED) then
      return nil, false
    end
    return s, s < -ADMITTED
  end

  -- A refused reader registers (or renews its registration) for wait ms, keeping its
  -- admission; none without a waiter id or a wait (a single attempt).
  local function register(readers, reg, wait)
    if wait <= 0 or reg == "?" then
      return
    end
    local _, admission = registration(readers, reg)
    local ends = -(now + wait)
    if admission then
      ends = ends - ADMITTED
    end
    redis.call("ZADD", readers, score(ends), reg)
    if redis.call("PTTL", readers) < wait then
      redis.call("PEXPIRE", readers, score(wait))
    end
  end

  -- A writer's release: every reader registered now is admitted (goes ahead of any writer
  -- waiting now); registrations that ended are dropped.
  local function admit(readers)
    redis.call("ZREMRANGEBYSCORE", readers, score(-now), "(0")
    redis.call("ZREMRANGEBYSCORE", readers, score(-now - ADMITTED), "(" .. score(-ADMITTED))
    local rows = redis.call("ZRANGEBYSCORE", readers, "(" .. score(-ADMITTED), "(0",
      "WITHSCORES")
    for j = 1, #rows, 2 do
      redis.call("ZADD", readers, score(tonumber(rows[j + 1]) - ADMITTED), rows[j])
    end
  end

  -- A read-write lock's operation (see the top) on the keys from KEYS[first]: writer,
  -- readers, waiting mark. Raises the server's error for a key of another type, read before
  -- anything is written.
  local function rw_op(kind, first, token, ttl, waiter, wait)
    local writer, readers, waiting = KEYS[first], KEYS[first + 1], KEYS[first + 2]
    local side, what = string.sub(kind, 1, 1), string.sub(kind, 2, 2)
    -- The TTL as sent (digits) for PX and PEXPIRE: a Lua number of 1e17 or more would be
    -- written back in exponent form, which Redis refuses; as a number for the scores.
    local px = ttl
    ttl = tonumber(ttl)
    wait = tonumber(wait) or 0
    now = now or now_ms()
    -- Readers whose hold ended (registrations, scored below 0, stay).
    redis.call("ZREMRANGEBYSCORE", readers, 0, now)
    -- The writer: ours (true), another's (false) or none (nil).
    local holder = nil
    if redis.call("EXISTS", writer) == 1 then
      holder = held(writer, token)
      if type(holder) == "table" then
        error(holder)
      end
    end
    local reg = "?" .. waiter
    local function announce()
      if not keys_only then
        redis.pcall("PUBLISH", "redfence:released:" .. writer, "")
      end
    end
    if side == "r" then
      if what == "r" then
        -- A release (token), or a leave (token = the waiter id): the hold and the
        -- registration. The last of them gone while a writer waits: tell the waiters.
        local left = redis.call("ZREM", readers, token)
        local unlisted = 0
        if reg ~= "?" then
          unlisted = redis.call("ZREM", readers, reg)
        end
        if (left == 1 or unlisted == 1) and redis.call("EXISTS", waiting) == 1
            and not live(readers) and not admitted(readers) then
          announce()
        end
        return left
      end
      local ours = redis.call("ZSCORE", readers, token)
      if what == "e" and not ours then
        return 0
      elseif what == "a" and not ours then
        -- A repeat of a grant that landed is granted again (ours). A new reader queues
        -- behind a writer, and behind a waiting one unless a writer's release admitted it.
        local refused = holder ~= nil
        if not refused and redis.call("EXISTS", waiting) == 1 then
          local _, admission = registration(readers, reg)
          refused = not admission
        end
        if refused then
          register(readers, reg, wait)
          return 0
        end
      end
      redis.call("ZADD", readers, now + ttl, token)
      if redis.call("PTTL", readers) < ttl then
        redis.call("PEXPIRE", readers, px)
      end
      if what == "a" and wait > 0 and reg ~= "?" then
        redis.call("ZREM", readers, reg)
      end
      return 1
    end
    if what == "a" then
      if holder == true then
        redis.call("SET", writer, token, "PX", px)
        return 1
      end
      if holder ~= nil or live(readers) or admitted(readers) then
        if wait > 0 then
          redis.call("SET", waiting, waiter, "PX", score(wait))
        end
        return 0
      end
      redis.call("SET", writer, token, "PX", px)
      if held(waiting, waiter) == true then
        redis.call("DEL", waiting)
      end
      return 1
    elseif what == "l" then
      if held(waiting, waiter) == true then
        -- Readers queued behind this writer may go.
        redis.call("DEL", waiting)
        announce()
      end
      return 0
    elseif holder ~= true then
      return 0
    elseif what == "e" then
      redis.call("PEXPIRE", writer, px)
      return 1
    end
    redis.call("DEL", writer)
    admit(readers)
    announce()
    return 1
  end

  -- rw_op, with an error of this operation alone as its "E:" reply.
  local function rw(kind, first, token, ttl, waiter, wait)
    local ok, reply = pcall(rw_op, kind, first, token, ttl, waiter, wait)
    if ok then
      return reply
    end
    if type(reply) == "table" then
      reply = reply.err
    end
    return "E:" .. tostring(reply)
  end

  -- The operation at ARGV[i], whose keys start at KEYS[k]: its reply, and where the next
  -- operation's arguments and keys start.
  -- Where the next operation's arguments and keys start, after the one at ARGV[i], KEYS[k].
  local function after(i, k)
    local kind, count = ARGV[i], tonumber(ARGV[i + 3])
    if #kind == 2 then
      return i + 6, k + count
    elseif kind == "f" or kind == "l" or kind == "R" then
      return i + 7, k + count
    end
    return i + 4, k + count
  end

  local function operation_at(i, k)
    local kind, token, ttl, count = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
    local waiter, ticket, lease = nil, nil, nil
    if #kind == 2 then
      return rw(kind, k, token, ttl, ARGV[i + 4], ARGV[i + 5]), i + 6, k + count
    end
    if kind == "f" or kind == "l" or kind == "R" then
      waiter, ticket, lease = ARGV[i + 4], ARGV[i + 5], tonumber(ARGV[i + 6])
      i = i + 7
    else
      i = i + 4
    end
    local first, last = k, k + count - 1
    local reply
    if kind == "a" then
      reply = acquire(first, last, token, ttl, count)
    elseif kind == "f" and not queues_ok(first, last) then
      reply = "E:WRONGTYPE the fair queue of a key of this lock holds another type"
    elseif kind == "f" and holds(first, last, token) then
      -- A repeat of a grant that landed (the batch was resent after a lost connection): grant
      -- again with a fresh TTL.
      for j = first, last do
        redis.call("SET", KEYS[j], token, "PX", ttl)
      end
      reply = count
    elseif kind == "f" then
      now = now or now_ms()
      local ours = true
      for j = first, last do
        local queue, alive = KEYS[j] .. QUEUE, KEYS[j] .. ALIVE
        redis.call("ZADD", queue, "NX", ticket, waiter)
        redis.call("ZADD", alive, now + lease, waiter)
        -- The line outlives its longest lease, and no more.
        if redis.call("PTTL", queue) < lease then
          redis.call("PEXPIRE", queue, lease)
          redis.call("PEXPIRE", alive, lease)
        end
        mark(KEYS[j], math.max(tonumber(ttl) or 0, lease))
        if head(KEYS[j], now) ~= waiter then
          ours = false
        end
      end
      if ours then
        reply = acquire(first, last, token, ttl, count)
        if reply == count then
          -- Granted: the holder stays at the head until its release leaves, but no longer
          -- than its lock lasts: one that dies holding it blocks the line for its TTL, not
          -- for its waiter's lease.
          local ends = now + math.min(tonumber(ttl) or lease, lease)
          for j = first, last do
            redis.call("ZADD", KEYS[j] .. ALIVE, "XX", ends, waiter)
          end
        end
      else
        reply = 0
      end
    elseif kind == "l" then
      for j = first, last do
        if queue_ok(KEYS[j]) then
          leave(KEYS[j], waiter)
        end
      end
      reply = 0
    elseif kind == "n" then
      -- After a plain compare-and-delete found the key's waiting mark (node/plain/): the
      -- rest of a release, if the mark is still there.
      for j = first, last do
        if redis.pcall("DEL", KEYS[j] .. WAITING) == 1 then
          announce(KEYS[j], has_queue(KEYS[j]))
        end
      end
      reply = 0
    elseif kind == "E" then
      reply = extend_repair(first, last, token, ttl, count)
    elseif kind == "e" then
      reply = count
      for j = first, last do
        if held(KEYS[j], token) ~= true then
          reply = 0
          break
        end
      end
      if reply == count then
        for j = first, last do
          redis.call("PEXPIRE", KEYS[j], ttl)
        end
      end
    else
      local deleted = 0
      local fair = kind == "R" and waiter or nil
      for j = first, last do
        deleted = deleted + release(KEYS[j], token, fair)
      end
      reply = deleted
    end
    return reply, i, k + count
  end

  -- operation_at, with an error the server raised (out of memory under noeviction, say) as
  -- that operation's own "E:" reply: the rest of the batch (its releases) still runs.
  local function operation(i, k)
    local ok, reply, next_i, next_k = pcall(operation_at, i, k)
    if ok then
      return reply, next_i, next_k
    end
    if type(reply) == "table" then
      reply = reply.err
    end
    next_i, next_k = after(i, k)
    return "E:" .. tostring(reply), next_i, next_k
  end

  library = { rw = rw, operation = operation, acquire = acquire, announce = announce,
    has_queue = has_queue, mark = mark, held = held }
  return library
end

local out = {}
local k = 1
local i = keys_only and 2 or 1
local n = 0
while i <= #ARGV do
  n = n + 1
  local kind, one = ARGV[i], ARGV[i + 3] == "1"
  if kind == "m" then
    -- The memory marker, read in the batch: a client that finds it gone or replaced knows
    -- at once that the server forgot what it granted (a flush), before counting its votes.
    local marker = redis.pcall("GET", KEYS[k])
    out[n] = type(marker) == "string" and marker or 0
    i = i + 4
    k = k + 1
  elseif one and (kind == "r" or kind == "a" or kind == "e") then
    -- The usual operations (one key, not fair), with nothing else to decode: release as
    -- release() does, acquire when the key is free, extend as the "e" branch does.
    local key, token, ttl = KEYS[k], ARGV[i + 1], ARGV[i + 2]
    -- At most a token's length of the value (see held): ours or not; lib() looks closer only
    -- at an error (GETRANGE refused by an ACL: held reads with GET).
    local ours = false
    if kind ~= "a" then
      local head = redis.pcall("GETRANGE", key, 0, #token)
      if type(head) == "table" then
        ours = lib().held(key, token) == true
      else
        ours = #token > 0 and head == token
      end
    end
    if kind == "r" then
      if not ours then
        out[n] = 0
      elseif keys_only then
        out[n] = redis.call("DEL", key)
      else
        -- The key and its waiting mark (see release()).
        local gone = redis.pcall("DEL", key, key .. WAITING)
        if type(gone) ~= "number" then
          gone = redis.call("DEL", key)
        end
        if gone > 1 then
          local l = lib()
          l.announce(key, l.has_queue(key))
        end
        out[n] = 1
      end
    elseif kind == "a" then
      local set = redis.pcall("SET", key, token, "NX", "PX", ttl)
      if type(set) == "table" and set.err then
        -- Refused by the server (out of memory): this acquire's error, not the batch's.
        out[n] = "E:" .. set.err
      elseif set then
        out[n] = 1
      else
        -- Taken: by another owner (the usual refusal, without lib()), by us (a repeat of a
        -- request that landed), or by a key of another type.
        local head = redis.pcall("GETRANGE", key, 0, #token)
        if type(head) == "string" and head ~= "" and head ~= token then
          -- Another owner's: marked as waited for (as mark() does).
          if not keys_only then
            redis.pcall("SET", key .. WAITING, "1", "PX",
              math.max(tonumber(ttl) or 0, MIN_WAIT_MARK))
          end
          out[n] = 0
        else
          out[n] = lib().operation(i, k)
        end
      end
    elseif ours then
      redis.call("PEXPIRE", key, ttl)
      out[n] = 1
    else
      out[n] = 0
    end
    i = i + 4
    k = k + 1
  else
    out[n], i, k = lib().operation(i, k)
  end
end
return out
