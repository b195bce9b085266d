-- ratelimit.lua: ratelimit.Evaluate, ported to run inside Redis, deciding a
-- whole batch of ops in one call.
--
-- The arithmetic follows state.go operation for operation (multiply before
-- dividing, left to right), so that Lua's doubles give the Go function's
-- results to the last bit; the differential tests of store/storetest
-- check that they do. Numbers travel and rest as IEEE 754 doubles packed
-- with Redis's struct library, so no decimal conversion can round them.
--
-- The store loads this file as a Redis Function library (FUNCTION LOAD,
-- then FCALL) or, on servers without Functions, runs it as a script
-- (EVALSHA); either way the entry point is apply(keys, args), which the
-- store registers or calls in a line it appends.
--
-- keys: the records of the batch's ops, op by op, item by item, shard by
-- shard (ratelimit.Op.AppendRecordIDs); a record may appear several times.
-- args[1]: the batch, little-endian:
--   header  B flags (1: judge every op at the server's TIME), d expiry
--           margin (ms), I4 number of limits, I4 number of ops
--   limits  B kind (1 fixed window, 2 token bucket), d rate, d period,
--           d capacity, d max reserved; one per limit of the batch
--   ops     B mode (0 limit, 1 check, 2 refund), B reserve, I4 items,
--           d now (Unix ms); then per item: d count, B shards; then per
--           shard: I4 limit (1-based, into limits), d phase
-- The reply is one string: per item of every op, in order, B ok, d retry
-- after (ms), d remaining, d charged to the first and to the second shard.
--
-- A record is the string "\1" followed by two doubles, value and ts; the
-- text "<value> <ts>" of earlier versions is still read. Every record the
-- batch touches is read once and, if an op changed it, written once at the
-- end, with the expiry of its last write: the same outcome as the ops run
-- one after another.

-- Set by apply: the code that loads a library may not read globals.
local floor, ceil, min, unpack, pack, call

local NOISE = 1e-9
local MAX_RETRY = 9223372036854 -- ratelimit.MaxRetryAfter
local FIXED = 1
local MODE_LIMIT, MODE_REFUND = 0, 2

-- floor division of integers held in doubles, exact below 2^53: the
-- quotient of a float division, corrected by exact products.
local function idiv(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

-- A limit p is a table {kind, rate, period, capacity, maxr}; a state is
-- the pair (v, ts) of ratelimit.State; a record's phase travels apart.

local function window_start(p, phase, t)
  local d = t - phase
  return t - (d - idiv(d, p[3]) * p[3])
end

-- Refresh
local function refresh(p, v, ts, now)
  local t = now
  if ts > t then
    t = ts
  end
  if p[1] == FIXED then
    local k = idiv(t - ts, p[3])
    if k > 0 then
      v = min(v + p[2] * k, p[4])
      ts = ts + k * p[3]
    end
    return v, ts
  end
  return min(v + (t - ts) * p[2] / p[3], p[4]), t
end

-- load: refreshed if found, Fresh if missing
local function load(p, phase, r, now)
  if r.found then
    return refresh(p, r.v, r.ts, now)
  end
  if p[1] == FIXED then
    return p[4], window_start(p, phase, now)
  end
  return p[4], now
end

-- Wait
local function wait(p, ts, now, d)
  if p[1] == FIXED then
    return p[3] * ceil(d / p[2]) + (ts - now)
  end
  local t = now
  if ts > t then
    t = ts
  end
  return (t - now) + d * p[3] / p[2]
end

-- retryMillis
local function retry_ms(w)
  w = ceil(w)
  if not (w > 0) then
    return 0
  end
  if w >= MAX_RETRY then
    return MAX_RETRY
  end
  return w
end

-- Go's max: NaN if either is.
local function max(a, b)
  if a ~= a or b ~= b then
    return a + b
  end
  if b > a then
    return b
  end
  return a
end

local function denoise(v)
  if v < 0 and v > -NOISE then
    return 0
  end
  return v
end

local function fits_debt(p, v)
  return p[5] == 0 or -v <= p[5]
end

-- single (Transition): returns ok, retry, remaining, charged, and the
-- state to write (nil: no write).
local function single(p, phase, r, now, count, reserve)
  local v0, ts = load(p, phase, r, now)
  local v = denoise(v0 - count)
  local retry = 0
  if v >= 0 then
    -- allowed
  elseif reserve and fits_debt(p, v) then
    retry = retry_ms(wait(p, ts, now, -v))
  else
    local deficit = -v
    if reserve then
      deficit = deficit - p[5]
    end
    return false, retry_ms(wait(p, ts, now, deficit)), v0, 0, nil, ts
  end
  if count > 0 then
    return true, retry, v, count, v, ts
  end
  return true, retry, v, count, nil, ts
end

-- pair: returns ok, retry, remaining, charged a, charged b, and the states
-- to write (nil: no write).
local function pair(pa, pb, pha, phb, ra, rb, now, count, reserve)
  local sa, tsa = load(pa, pha, ra, now)
  local sb, tsb = load(pb, phb, rb, now)
  local va, vb = denoise(sa - count), denoise(sb - count)
  if va >= 0 or vb >= 0 then
    local w = nil
    if count > 0 then
      w = true
    end
    if va >= vb then
      return true, 0, va + sb, count, 0, w and va, tsa, nil, tsb
    end
    return true, 0, sa + vb, 0, count, nil, tsa, w and vb, tsb
  end
  local na, nb = sa, sb
  local x = denoise((sa + sb - count) / 2)
  if x <= sa and x <= sb then
    na, nb = x, x
  elseif sa >= sb then
    na = va
  else
    nb = vb
  end
  local ok = na >= 0 and nb >= 0
  if not ok and reserve then
    ok = fits_debt(pa, na) and fits_debt(pb, nb)
  end
  if not ok then
    local da, db = count - sa, count - sb
    if reserve then
      da = da - pa[5]
      db = db - pb[5]
    end
    return false, retry_ms(max(wait(pa, tsa, now, da), wait(pb, tsb, now, db))), sa + sb, 0, 0, nil, tsa, nil, tsb
  end
  local ca, cb = sa - na, sb - nb
  local w = 0
  if na < 0 then
    w = wait(pa, tsa, now, -na)
  end
  if nb < 0 then
    w = max(w, wait(pb, tsb, now, -nb))
  end
  local wa, wb = nil, nil
  if ca > 0 then
    wa = na
  end
  if cb > 0 then
    wb = nb
  end
  return true, retry_ms(w), na + nb, ca, cb, wa, tsa, wb, tsb
end

-- FullAt: the first ms at which the record is a full bucket again; nil for
-- never.
local function full_at(p, v, ts)
  if v >= p[4] then
    return ts
  end
  local short = p[4] - v
  if p[1] == FIXED then
    local k = ceil(short / p[2])
    for _ = 1, 3 do
      if v + p[2] * k >= p[4] then
        return ts + p[3] * k
      end
      k = k + 1
    end
    return nil
  end
  local dt = ceil(short * p[3] / p[2])
  for _ = 1, 3 do
    if v + dt * p[2] / p[3] >= p[4] then
      return ts + dt
    end
    dt = dt + 1
  end
  return nil
end

-- read returns the record of key, reading it from Redis on first use in
-- the batch.
local function read(recs, key)
  local r = recs[key]
  if r then
    return r
  end
  local raw = call('GET', key)
  if not raw then
    r = { found = false, key = key }
  elseif string.byte(raw, 1) == 1 then
    local _, v, ts = unpack('<Bdd', raw)
    r = { found = true, v = v, ts = ts, key = key }
  else
    local v, ts = string.match(raw, '^(%S+) (%S+)$')
    r = { found = true, v = tonumber(v), ts = tonumber(ts), key = key }
  end
  recs[key] = r
  return r
end

local function apply(keys, args)
  floor, ceil, min = math.floor, math.ceil, math.min
  unpack, pack, call = struct.unpack, struct.pack, redis.call
  local b = args[1]
  local flags, margin, nlimits, nops, pos = unpack('<Bdi4i4', b)
  local limits = {}
  for i = 1, nlimits do
    local kind, rate, period, capacity, maxr
    kind, rate, period, capacity, maxr, pos = unpack('<Bdddd', b, pos)
    limits[i] = { kind, rate, period, capacity, maxr }
  end
  local tnow
  if flags % 2 == 1 then
    local t = call('TIME')
    tnow = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
  end

  local recs = {}   -- key -> {key, found, v, ts; once written: p, now, dirty}
  local dirty = {}  -- the records to write at the end, in order
  local reply = {}
  local k = 1       -- next key
  -- the updates of the current op, applied when it commits
  local wr, wv, wts, wp = {}, {}, {}, {}

  for _ = 1, nops do
    local mode, reserve, nitems, now
    mode, reserve, nitems, now, pos = unpack('<BBi4d', b, pos)
    if tnow then
      now = tnow
    end
    reserve = reserve == 1
    local nw = 0
    local all = true
    for _ = 1, nitems do
      local count, nshards, li, phase
      count, nshards, li, phase, pos = unpack('<dBi4d', b, pos)
      local p = limits[li]
      local r = read(recs, keys[k])
      local ok, retry, rem, c0, c1 = true, 0, 0, 0, 0
      if mode == MODE_REFUND then
        -- refund
        if r.found then
          local v, ts = refresh(p, r.v, r.ts, now)
          v = min(v + count, p[4])
          rem = v
          nw = nw + 1
          wr[nw], wv[nw], wts[nw], wp[nw] = r, v, ts, p
        else
          rem = p[4]
        end
        k = k + 1
      elseif nshards == 1 then
        local v, ts
        ok, retry, rem, c0, v, ts = single(p, phase, r, now, count, reserve)
        if v then
          nw = nw + 1
          wr[nw], wv[nw], wts[nw], wp[nw] = r, v, ts, p
        end
        k = k + 1
      else
        local lb, phb
        lb, phb, pos = unpack('<i4d', b, pos)
        local pb = limits[lb]
        local rb = read(recs, keys[k + 1])
        local va, tsa, vb, tsb
        ok, retry, rem, c0, c1, va, tsa, vb, tsb = pair(p, pb, phase, phb, r, rb, now, count, reserve)
        if va then
          nw = nw + 1
          wr[nw], wv[nw], wts[nw], wp[nw] = r, va, tsa, p
        end
        if vb then
          nw = nw + 1
          wr[nw], wv[nw], wts[nw], wp[nw] = rb, vb, tsb, pb
        end
        k = k + 2
      end
      all = all and ok
      reply[#reply + 1] = pack('<Bdddd', ok and 1 or 0, retry, rem, c0, c1)
    end
    if mode == MODE_REFUND or (mode == MODE_LIMIT and all) then
      for i = 1, nw do
        local r = wr[i]
        r.found, r.v, r.ts, r.p, r.now = true, wv[i], wts[i], wp[i], now
        if not r.dirty then
          r.dirty = true
          dirty[#dirty + 1] = r
        end
      end
    end
  end

  for i = 1, #dirty do
    local r = dirty[i]
    local val = pack('<Bdd', 1, r.v, r.ts)
    local full = full_at(r.p, r.v, r.ts)
    -- Kept until full again by the clock of the op that wrote it last,
    -- plus the margin for the server's clock disagreeing with it; far
    -- futures are kept for good.
    if full and full - r.now < 1e15 then
      local px = full - r.now + margin
      if px < 1 then
        px = 1
      end
      call('SET', r.key, val, 'PX', px)
    else
      call('SET', r.key, val)
    end
  end
  return table.concat(reply)
end
