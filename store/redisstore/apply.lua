-- apply.lua: ratelimit.Evaluate, ported to run inside Redis in one call.
--
-- The arithmetic follows state.go operation for operation (multiply before
-- dividing, left to right), so that Lua's doubles give the Go function's
-- results to the last bit; the differential tests of store/storetest
-- check that they do.
--
-- KEYS: the op's records, in the order of ratelimit.Op.AppendRecordIDs.
-- ARGV: mode (0 limit, 1 check, 2 refund), now (Unix ms; empty: take the
-- server's TIME), reserve (1 or 0), expiry margin (ms), item count, then
-- per item: count, shard count, then per shard: kind (1 fixed window,
-- 2 token bucket), rate, period, capacity, max reserved, phase.
-- A record is the string "<value> <ts>". The reply holds five strings per
-- item: ok (1 or 0), retry-after, remaining, charged to the first and to
-- the second shard.

local NOISE = 1e-9
local MAX_RETRY = 9223372036854 -- ratelimit.MaxRetryAfter
local FIXED = 1
local MODE_LIMIT, MODE_CHECK, MODE_REFUND = 0, 1, 2
local FMT = '%.17g' -- round-trips every double

-- floor division of integers held in doubles, exact below 2^53: the
-- quotient of a float division, corrected by exact products.
local function idiv(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

local function window_start(p, t)
  local d = t - p.phase
  return t - (d - idiv(d, p.period) * p.period)
end

local function fresh(p, now)
  if p.kind == FIXED then
    return { value = p.capacity, ts = window_start(p, now) }
  end
  return { value = p.capacity, ts = now }
end

local function refresh(p, s, now)
  local t = math.max(now, s.ts)
  if p.kind == FIXED then
    local k = idiv(t - s.ts, p.period)
    if k > 0 then
      s.value = math.min(s.value + p.rate * k, p.capacity)
      s.ts = s.ts + k * p.period
    end
  else
    s.value = math.min(s.value + (t - s.ts) * p.rate / p.period, p.capacity)
    s.ts = t
  end
  return s
end

local function load(p, rec, now)
  if rec then
    return refresh(p, { value = rec.value, ts = rec.ts }, now)
  end
  return fresh(p, now)
end

local function wait(p, s, now, d)
  if p.kind == FIXED then
    return p.period * math.ceil(d / p.rate) + (s.ts - now)
  end
  return (math.max(now, s.ts) - now) + d * p.period / p.rate
end

local function retry_ms(w)
  w = math.ceil(w)
  if not (w > 0) then
    return 0
  end
  if w >= MAX_RETRY then
    return MAX_RETRY
  end
  return w
end

local function denoise(v)
  if v < 0 and v > -NOISE then
    return 0
  end
  return v
end

local function fits_debt(p, v)
  return p.maxr == 0 or -v <= p.maxr
end

local function decision()
  return { ok = false, retry = 0, rem = 0, c0 = 0, c1 = 0 }
end

local function single(p, rec, now, count, reserve)
  local s = load(p, rec, now)
  local v = denoise(s.value - count)
  local d = decision()
  if v >= 0 then
    d.ok = true
  elseif reserve and fits_debt(p, v) then
    d.ok = true
    d.retry = retry_ms(wait(p, s, now, -v))
  else
    local deficit = -v
    if reserve then
      deficit = deficit - p.maxr
    end
    d.retry = retry_ms(wait(p, s, now, deficit))
    d.rem = s.value
    return d, { s = s, write = false }
  end
  d.rem = v
  d.c0 = count
  s.value = v
  return d, { s = s, write = d.ok and count > 0 }
end

local function refund(p, rec, now, count)
  local d = decision()
  d.ok = true
  if not rec then
    d.rem = p.capacity
    return d, { write = false }
  end
  local s = refresh(p, { value = rec.value, ts = rec.ts }, now)
  s.value = math.min(s.value + count, p.capacity)
  d.rem = s.value
  return d, { s = s, write = true }
end

local function pair(pa, pb, ra, rb, now, count, reserve)
  local sa, sb = load(pa, ra, now), load(pb, rb, now)
  local va, vb = denoise(sa.value - count), denoise(sb.value - count)
  local d = decision()
  local ua = { s = { value = sa.value, ts = sa.ts }, write = false }
  local ub = { s = { value = sb.value, ts = sb.ts }, write = false }
  if va >= 0 or vb >= 0 then
    d.ok = true
    if va >= vb then
      ua.s.value, ua.write, d.c0 = va, count > 0, count
      d.rem = va + sb.value
    else
      ub.s.value, ub.write, d.c1 = vb, count > 0, count
      d.rem = sa.value + vb
    end
    return d, ua, ub
  end
  local na, nb = sa.value, sb.value
  local x = denoise((sa.value + sb.value - count) / 2)
  if x <= sa.value and x <= sb.value then
    na, nb = x, x
  elseif sa.value >= sb.value then
    na = va
  else
    nb = vb
  end
  local ok = na >= 0 and nb >= 0
  if not ok and reserve then
    ok = fits_debt(pa, na) and fits_debt(pb, nb)
  end
  if not ok then
    local da, db = count - sa.value, count - sb.value
    if reserve then
      da = da - pa.maxr
      db = db - pb.maxr
    end
    d.retry = retry_ms(math.max(wait(pa, sa, now, da), wait(pb, sb, now, db)))
    d.rem = sa.value + sb.value
    return d, ua, ub
  end
  d.ok = true
  d.c0, d.c1 = sa.value - na, sb.value - nb
  local w = 0
  if na < 0 then
    w = wait(pa, sa, now, -na)
  end
  if nb < 0 then
    w = math.max(w, wait(pb, sb, now, -nb))
  end
  d.retry = retry_ms(w)
  d.rem = na + nb
  ua.s.value, ua.write = na, d.c0 > 0
  ub.s.value, ub.write = nb, d.c1 > 0
  return d, ua, ub
end

-- full_at is ratelimit.FullAt: the first ms at which the record is a full
-- bucket again; nil for never.
local function full_at(p, s)
  if s.value >= p.capacity then
    return s.ts
  end
  local short = p.capacity - s.value
  if p.kind == FIXED then
    local k = math.ceil(short / p.rate)
    for _ = 1, 3 do
      if s.value + p.rate * k >= p.capacity then
        return s.ts + p.period * k
      end
      k = k + 1
    end
    return nil
  end
  local dt = math.ceil(short * p.period / p.rate)
  for _ = 1, 3 do
    if s.value + dt * p.rate / p.period >= p.capacity then
      return s.ts + dt
    end
    dt = dt + 1
  end
  return nil
end

local mode = tonumber(ARGV[1])
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
end
local reserve = ARGV[3] == '1'
local margin = tonumber(ARGV[4])
local nitems = tonumber(ARGV[5])

local function get(key)
  local raw = redis.call('GET', key)
  if not raw then
    return nil
  end
  local v, ts = string.match(raw, '^(%S+) (%S+)$')
  return { value = tonumber(v), ts = tonumber(ts) }
end

local a, r = 6, 1 -- next ARGV, next KEYS
local replies, writes = {}, {}
local all = true
for _ = 1, nitems do
  local count = tonumber(ARGV[a])
  local n = tonumber(ARGV[a + 1])
  a = a + 2
  local ps = {}
  for j = 1, n do
    ps[j] = {
      kind = tonumber(ARGV[a]), rate = tonumber(ARGV[a + 1]), period = tonumber(ARGV[a + 2]),
      capacity = tonumber(ARGV[a + 3]), maxr = tonumber(ARGV[a + 4]), phase = tonumber(ARGV[a + 5]),
    }
    a = a + 6
  end
  local d, ua, ub
  if mode == MODE_REFUND then
    d, ua = refund(ps[1], get(KEYS[r]), now, count)
  elseif n == 1 then
    d, ua = single(ps[1], get(KEYS[r]), now, count, reserve)
  else
    d, ua, ub = pair(ps[1], ps[2], get(KEYS[r]), get(KEYS[r + 1]), now, count, reserve)
  end
  writes[#writes + 1] = { key = KEYS[r], p = ps[1], u = ua }
  if ub then
    writes[#writes + 1] = { key = KEYS[r + 1], p = ps[2], u = ub }
  end
  r = r + n
  all = all and d.ok
  local ok = '0'
  if d.ok then
    ok = '1'
  end
  replies[#replies + 1] = ok
  replies[#replies + 1] = string.format(FMT, d.retry)
  replies[#replies + 1] = string.format(FMT, d.rem)
  replies[#replies + 1] = string.format(FMT, d.c0)
  replies[#replies + 1] = string.format(FMT, d.c1)
end

if mode == MODE_REFUND or (mode == MODE_LIMIT and all) then
  for _, w in ipairs(writes) do
    if w.u.write then
      local val = string.format(FMT, w.u.s.value) .. ' ' .. string.format(FMT, w.u.s.ts)
      local full = full_at(w.p, w.u.s)
      -- Kept until full again by the op's clock, plus the margin for the
      -- server's clock disagreeing with it; far futures are kept for good.
      if full and full - now < 1e15 then
        redis.call('SET', w.key, val, 'PX', math.max(full - now + margin, 1))
      else
        redis.call('SET', w.key, val)
      end
    end
  end
end
return replies
