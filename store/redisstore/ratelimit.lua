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
-- store registers or calls in a line it appends. The library registers a
-- second function beside it, which answers TIME (the store's RecordNow);
-- without Functions, a script of its own does.
--
-- keys: the records of the batch's ops, op by op, item by item, shard by
-- shard (ratelimit.Op.AppendRecordIDs); a record may appear several times.
-- args[1]: the batch, as little-endian doubles:
--   header  flags (+1: judge every op at the server's TIME; +2: the keys
--           lie in several slots of this node, and follow in args[2],
--           args[3], ...: keys holds only the first, which routes the
--           call, and a key of its slot no one writes), expiry margin (ms),
--           number of limits, number of ops
--   limits  kind (1 fixed window, 2 token bucket), rate, period, capacity,
--           max reserved; one per limit of the batch
--   ops     mode (0 limit, 1 check, 2 refund), reserve (1 or 0; for a
--           refund, its settlement: 0 none, 1 cancel, 2 use), items
--           (at least one), now (Unix ms); then per item: count, at (for a
--           refund: when the tokens were charged), shards; then per shard:
--           its limit (1-based), phase; for a refund, then run (when the
--           job of the charge may run); then, for a settlement, the time
--           (Unix ms, the op's clock) until which its mark is kept, less
--           the margin, and its settler: 16 bytes, not a double (all zero:
--           none). The settlement's mark is the key after the op's
--           records, in the slot of its records.
-- The reply is one string: per item of every op, in order, a byte ok (+2
-- times the kind of the settlement found, which did nothing; +8 when that
-- mark names the op's settler, not none) and
-- the doubles retry after (ms), remaining, charged to the first and to the
-- second shard, now (the time the op was judged at) and the first
-- record's time after the op (ratelimit.Decision).
--
-- A settlement's mark is the string "\2" followed by a byte, its kind (1
-- cancel, 2 use), and, for a settlement of a settler, the settler's 16
-- bytes (never all zero: a settlement of none writes the two bytes alone,
-- as releases that kept no settler write and read every mark); Redis
-- expires it. An op that finds its settlement's mark does nothing; one that
-- finds anything else at the mark's key fails (BADMARK): its token may have
-- been settled.
--
-- A record is the string "\1" followed by three doubles: value and ts (the
-- ratelimit.State), and the server time (ms) at which Redis expires the
-- key (at most: 0 when not known, after a lone op's write; infinity for
-- never). The text "<value> <ts>" of earlier versions is still read. A
-- value that is NaN or infinite, or a ts beyond the times of any op
-- (driver.CheckState), fails the call (BADRECORD), as Load fails. Every
-- record the batch touches is read once and, if an op changed it, written
-- once at the end: the same outcome as the ops run one after another.
--
-- Nothing is written before every op of the call is decided: the records
-- and the settlements' marks are written at the end, by SETs that cannot
-- fail (Redis refuses a write for its state, OOM, READONLY, MISCONF, only
-- before a call's first write, and each expiry set is a whole number of
-- ms). So a call that fails, for whatever record or op, has changed
-- nothing, and the store may send its ops again, each alone (apply.go).

-- Set by apply: the code that loads a library may not read globals.
local floor, ceil, min, sunpack, pack, call, rpcall, lunpack, typeof

-- The constants of package driver, written in by the store when it loads
-- this file (apply.go), so that the port cannot drift from Go.
local NOISE = {{NOISE}}
local MAX_RETRY = {{MAX_RETRY}}
local GRACE = {{GRACE}}
local FIXED = {{FIXED}}
local MODE_LIMIT, MODE_REFUND = {{MODE_LIMIT}}, {{MODE_REFUND}}
local PAIR_TRIES = {{PAIR_TRIES}}
local WAIT_TRIES = {{WAIT_TRIES}}
-- The times of a record that a release writes (driver.CheckState).
local MIN_TS, MAX_TS = {{MIN_TS}}, {{MAX_TS}}
local INF = 1 / 0
-- The bytes of a batch of one op of one item on one shard, and one limit:
-- a header, a limit and the op, 4 + 5 + 9 doubles.
local ONE_OP_BYTES = 18 * 8

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

-- windows returns the whole periods from ts to t (t >= ts), floor((t -
-- ts) / period), and ts advanced by as many: exact, as Go's int64
-- arithmetic is, for times within 2^53 of zero, though t - ts is not: a
-- record near the earliest time a record holds read near the latest time
-- of an op lies 2^53 ms and more behind, where the double t - ts is
-- rounded to an even number, which may cross a window's end. Then t and
-- ts are each divided by the period, which stays exact.
local function windows(period, ts, t)
  local d = t - ts
  if d < 2 ^ 52 then
    local k = idiv(d, period)
    return k, ts + k * period
  end
  local qt, qs = idiv(t, period), idiv(ts, period)
  local rs = ts - qs * period
  if t - qt * period < rs then
    qt = qt - 1
  end
  return qt - qs, qt * period + rs
end

-- A limit p is a table {kind, rate, period, capacity, maxr}; a state is
-- the pair (v, ts) of ratelimit.State; a record's phase travels apart.

local function window_start(p, phase, t)
  local d = t - phase
  return t - (d - idiv(d, p[3]) * p[3])
end

-- refresh (state.go)
local function refresh(p, v, ts, now)
  local t = now
  if ts > t then
    t = ts
  end
  if p[1] == FIXED then
    if t - ts >= p[3] then
      local k, nts = windows(p[3], ts, t)
      v = v + p[2] * k
      ts = nts
    end
    return min(v, p[4]), ts
  end
  return min(v + (t - ts) * p[2] / p[3], p[4]), t
end

-- StateAt: refreshed if found, fresh if missing
local function load(p, phase, found, v, ts, now)
  if found then
    return refresh(p, v, ts, now)
  end
  if p[1] == FIXED then
    return p[4], window_start(p, phase, now)
  end
  return p[4], now
end

-- grants: whether a record holding v grants a call of count that may
-- leave a debt of allow (the transition's comparison, noise included)
local function grants(v, count, allow)
  return (v - count) + allow > -NOISE
end

-- wait: the ms from now until a call of count that may leave a debt of
-- allow is granted on the record (bv, bts) as stored, whose state at now
-- is (v, ts) (the same for a record missing, or written at now): the first
-- whole number of windows or ms from ts at which the record refreshed as
-- refresh refreshes it passes grants, tried from an estimate a step less
-- or a few more
local function wait(p, bv, bts, v, ts, now, count, allow)
  local d = -((v - count) + allow)
  if p[1] == FIXED then
    local k0 = windows(p[3], bts, ts)
    local j = ceil((d - NOISE) / p[2])
    if j < 0 then
      j = 0
    end
    if j > 0 and grants(min(bv + p[2] * (k0 + j - 1), p[4]), count, allow) then
      j = j - 1
    else
      for _ = 1, WAIT_TRIES do
        if grants(min(bv + p[2] * (k0 + j), p[4]), count, allow) then
          break
        end
        j = j + 1
      end
    end
    return p[3] * j + (ts - now)
  end
  local e0 = ts - bts
  local dt = ceil((d - NOISE) * p[3] / p[2])
  if dt < 0 then
    dt = 0
  end
  if dt > 0 and grants(min(bv + (e0 + dt - 1) * p[2] / p[3], p[4]), count, allow) then
    dt = dt - 1
  else
    for _ = 1, WAIT_TRIES do
      if grants(min(bv + (e0 + dt) * p[2] / p[3], p[4]), count, allow) then
        break
      end
      dt = dt + 1
    end
  end
  local t = now
  if ts > t then
    t = ts
  end
  return (t - now) + dt
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

-- fitsDebt: a debt within max reserved, with the tolerance of denoise
local function fits_debt(p, v)
  return p[5] == 0 or v + p[5] > -NOISE
end

-- single (TransitionInto): returns ok, retry, remaining, charged, and the
-- state to write (nil: no write).
local function single(p, phase, found, bv, bts, now, count, reserve)
  local v0, ts = load(p, phase, found, bv, bts, now)
  if not found then
    bv, bts = v0, ts
  end
  local v = denoise(v0 - count)
  local retry = 0
  if v >= 0 and reserve then
    -- a reservation's time is when its tokens were granted
    retry = retry_ms(ts - now)
  elseif v >= 0 then
    -- allowed
  elseif reserve and fits_debt(p, v) then
    retry = retry_ms(wait(p, v, ts, v, ts, now, 0, 0))
  else
    -- until the call would fit: a reservation, until its debt would fit
    local allow = 0
    if reserve then
      allow = p[5]
    end
    return false, retry_ms(wait(p, bv, bts, v0, ts, now, count, allow)), v0, 0, nil, ts
  end
  if count > 0 then
    return true, retry, v, count, v, ts
  end
  return true, retry, v, count, nil, ts
end

-- split: the values of two refreshed shards after a call, the tokens
-- charged to each, and whether the call is OK.
local function split(pa, pb, sa, tsa, sb, tsb, now, count, reserve)
  local va, vb = denoise(sa - count), denoise(sb - count)
  if va >= 0 or vb >= 0 then
    if va >= vb then
      return va, sb, count, 0, true
    end
    return sa, vb, 0, count, true
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
  if na >= 0 and nb >= 0 then
    return na, nb, sa - na, sb - nb, true
  end
  if not reserve then
    return na, nb, 0, 0, false
  end
  local fa, fb = fits_debt(pa, va), fits_debt(pb, vb)
  if fa and (not fb or wait(pa, va, tsa, va, tsa, now, 0, 0) <= wait(pb, vb, tsb, vb, tsb, now, 0, 0)) then
    return va, sb, count, 0, true
  end
  if fb then
    return sa, vb, 0, count, true
  end
  if count > pa[4] + pa[5] or count > pb[4] + pb[5] then
    if fits_debt(pa, na) and fits_debt(pb, nb) then
      return na, nb, sa - na, sb - nb, true
    end
  end
  return na, nb, 0, 0, false
end

-- sumWait: ms from now until two shards hold need tokens, counting the
-- shortfall in full (it may be late by the tolerance of split).
local function sum_wait(pa, pb, sa, tsa, sb, tsb, now, need)
  local short = need - sa - sb
  if short <= 0 then
    return 0
  end
  if pa[1] == FIXED then
    local r = pa[2]
    if pb[2] > r then
      r = pb[2]
    end
    local fa, fb = tsa + pa[3], tsb + pb[3]
    local first, second = fa, fb
    if fb < fa then
      first, second = fb, fa
    end
    local j = ceil(short / r - NOISE)
    if j < 1 then
      j = 1
    end
    local at = second + pa[3] * (j / 2 - 1)
    if j % 2 == 1 then
      at = first + pa[3] * ((j - 1) / 2)
    end
    local ka, kb = ceil(j / 2), floor(j / 2)
    if fb < fa then
      ka, kb = kb, ka
    end
    if sa + pa[2] * ka > pa[4] then
      local k = ceil((need - pa[4] - sb) / pb[2] - NOISE)
      if k >= 1 then
        at = max(at, fb + pb[3] * (k - 1))
      end
    elseif sb + pb[2] * kb > pb[4] then
      local k = ceil((need - pb[4] - sa) / pa[2] - NOISE)
      if k >= 1 then
        at = max(at, fa + pa[3] * (k - 1))
      end
    end
    return at - now
  end
  local from = tsa
  if tsb > from then
    from = tsb
  end
  local at = (from - now) + short * pa[3] / (pa[2] + pb[2])
  local full_a = (tsa - now) + (pa[4] - sa) * pa[3] / pa[2]
  local full_b = (tsb - now) + (pb[4] - sb) * pb[3] / pb[2]
  if full_a < at then
    at = max(at, (tsb - now) + (need - pa[4] - sb) * pb[3] / pb[2])
  elseif full_b < at then
    at = max(at, (tsa - now) + (need - pb[4] - sa) * pa[3] / pa[2])
  end
  at = floor(at)
  if at < 0 then
    at = 0
  end
  return at
end

-- pairWait: the least wait after which a refused call on two shards would
-- succeed on them (fa, sa0, tsa0 and fb, sb0, tsb0: the records as read):
-- the estimates tried forward, then the earliest found searched back; if
-- none was found, the whole range to MAX_RETRY bisected, should the call
-- succeed by then.
local function pair_wait(pa, pb, pha, phb, fa, sa0, tsa0, fb, sb0, tsb0, sa, tsa, sb, tsb, now, count, reserve)
  local function ok_at(t)
    local a, ta = load(pa, pha, fa, sa0, tsa0, t)
    local b, tb = load(pb, phb, fb, sb0, tsb0, t)
    local _, _, _, _, ok = split(pa, pb, a, ta, b, tb, t, count, reserve)
    return ok
  end
  local function next_at(t)
    if pa[1] == FIXED then
      local a = window_start(pa, pha, t) + pa[3]
      local b = window_start(pb, phb, t) + pb[3]
      if b < a then
        return b
      end
      return a
    end
    return t + 1
  end
  local best = MAX_RETRY
  local found = false -- whether the call succeeds at now + best
  local function try(est)
    if not (est < best) then
      return
    end
    local t = now + ceil(est)
    for _ = 1, PAIR_TRIES do
      if not (t - now < best) then
        return
      end
      if ok_at(t) then
        best, found = t - now, true
        return
      end
      t = next_at(t)
    end
  end
  local function single_at(p, f, v0, ts0, v, ts)
    local allow = 0
    if reserve then
      allow = p[5]
    end
    if grants(p[4], count, allow) then
      if not f then
        v0, ts0 = v, ts
      end
      try(wait(p, v0, ts0, v, ts, now, count, allow))
    end
  end
  single_at(pa, fa, sa0, tsa0, sa, tsa)
  single_at(pb, fb, sb0, tsb0, sb, tsb)
  local need = count
  if reserve and (count > pa[4] + pa[5] or count > pb[4] + pb[5]) then
    need = need - 2 * min(pa[5], pb[5])
  end
  if need <= pa[4] + pb[4] then
    try(sum_wait(pa, pb, sa, tsa, sb, tsb, now, need))
  end
  local step = 1 -- searchBack's first step back, from a time found
  if not found then -- best is MAX_RETRY: is the call granted by then?
    step, found = 0, ok_at(now + MAX_RETRY)
  end
  if found then
    -- searchBack: the first ms in (now, now + best] at which the call
    -- succeeds, stepping back doubling from now + best (from a time
    -- found), then halving.
    local lo, hi, d = now, now + best, step
    while hi - lo > 1 do
      local t = hi - d
      if d == 0 or t <= lo then
        d, t = 0, lo + floor((hi - lo) / 2)
      end
      if ok_at(t) then
        hi, d = t, d * 2
      else
        lo, d = t, 0
      end
    end
    best = hi - now
  end
  return best
end

-- zero_wait: state.go's zeroWait, the ms from now until the job of a
-- reservation of 0 on a shard refreshed to now (v, ts) may run: the
-- record's time, or when its debt is granted; INF for a debt beyond max
-- reserved.
local function zero_wait(p, v, ts, now)
  v = denoise(v)
  if v >= 0 then
    return ts - now
  elseif fits_debt(p, v) then
    return wait(p, v, ts, v, ts, now, 0, 0)
  end
  return INF
end

-- pair: returns ok, retry, remaining, charged a, charged b, and the states
-- to write (nil: no write).
local function pair(pa, pb, pha, phb, fa, sa0, tsa0, fb, sb0, tsb0, now, count, reserve)
  local sa, tsa = load(pa, pha, fa, sa0, tsa0, now)
  local sb, tsb = load(pb, phb, fb, sb0, tsb0, now)
  local na, nb, ca, cb, ok = split(pa, pb, sa, tsa, sb, tsb, now, count, reserve)
  if not ok then
    local w = pair_wait(pa, pb, pha, phb, fa, sa0, tsa0, fb, sb0, tsb0, sa, tsa, sb, tsb, now, count, reserve)
    return false, retry_ms(w), sa + sb, 0, 0, nil, tsa, nil, tsb
  end
  local w = 0
  if ca > 0 then
    if na < 0 then
      w = max(w, wait(pa, na, tsa, na, tsa, now, 0, 0))
    elseif reserve then
      w = max(w, tsa - now)
    end
  end
  if cb > 0 then
    if nb < 0 then
      w = max(w, wait(pb, nb, tsb, nb, tsb, now, 0, 0))
    elseif reserve then
      w = max(w, tsb - now)
    end
  end
  if count == 0 and reserve then
    -- A reservation of 0 charged neither shard: its job waits for the
    -- debt before it, on the shard where it comes first.
    w = min(zero_wait(pa, sa, tsa, now), zero_wait(pb, sb, tsb, now))
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

-- queued: whether the record stored as (bv, bts), whose value refreshed
-- to the refund's now is v, owes tokens (beyond the noise) that are
-- granted after run: its debt's tail, timed from the record as stored,
-- as the reservation that left it was timed (state.go's queued).
local function queued(p, bv, bts, v, run)
  if not (denoise(v) < 0) then
    return false
  end
  return bts + retry_ms(wait(p, bv, bts, bv, bts, bts, 0, 0)) > run
end

-- granted: the tokens a refreshed record (v, ts) has been granted since
-- from, before its capacity cut them.
local function granted(p, ts, from)
  if ts <= from then
    return 0
  end
  if p[1] == FIXED then
    return p[2] * windows(p[3], from, ts + p[3] - 1)
  end
  return (ts - from) * p[2] / p[3]
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

-- The tables below live as long as the library and are reused by every
-- call, so that a call leaves little garbage for Lua's collector.

-- The records of the batch, numbered in order of first use: the key, the
-- state read (or written by an earlier op of the batch), the expiry read
-- (false: none known), and, once written, the limit and now of the last
-- write (false: not written).
local slot, rkey, rfound, rv, rts, rdl, rp, rnow = {}, {}, {}, {}, {}, {}, {}, {}
local rmark, rsettler = {}, {} -- a mark's kind (false: not a mark) and settler ('': none)
local mkey, mkind, mdl, msettler = {}, {}, {}, {} -- the marks to write at the end: key, kind, expiry, settler
local NONE -- the settler of a settlement of none: 16 zero bytes (set by apply)
local nrec = 0

-- shown returns s for an error's text: at most n bytes (then "..."),
-- each byte that is not printable ASCII, a quote or a backslash written
-- \xNN.
local function shown(s, n)
  local t = string.gsub(string.sub(s, 1, n), '[%z\1-\31"\\\127-\255]', function(c)
    return string.format('\\x%02x', string.byte(c))
  end)
  if #s > n then
    t = t .. '...'
  end
  return t
end

-- is_mark reports whether key is a settlement's mark's: it has "s:" after
-- its hash tag, where a record's has a digit (the prefix holds no brace).
local function is_mark(key)
  return string.byte(key, string.find(key, '}', 1, true) + 1) == 115
end

-- fail fails the call for key, which holds what (a quoted string, or a
-- key's type): BADMARK at a mark's key, BADRECORD at a record's, which the
-- store (apply.go) reports as redisstore.ErrBadRecord, each with what to
-- do.
local function fail(key, what)
  local code = 'BADRECORD'
  if is_mark(key) then
    code = 'BADMARK'
  end
  error({err = code .. ' key "' .. shown(key, 1000) .. '" holds ' .. what})
end

-- bad fails the call for the string raw at key, which is neither a record
-- nor, at a mark's key, a mark of a cancel or a use, as Load fails for a
-- string parseState refuses.
local function bad(key, raw)
  fail(key, '"' .. shown(raw, 40) .. '"')
end

-- sound reports whether a record of v tokens at ts is one a release
-- writes (driver.CheckState): v finite (v - v is NaN for NaN and the
-- infinities), ts within [MIN_TS, MAX_TS].
local function sound(v, ts)
  return v - v == 0 and ts >= MIN_TS and ts <= MAX_TS
end

-- unsound fails the call for the record of v tokens at ts, which sound
-- refuses, at key.
local function unsound(key, v, ts)
  fail(key, string.format('a record of %.17g tokens at %.17g ms from 1970, which no release writes: '
    .. 'a record holds a finite number of tokens at a time from %.0f to %.0f ms', v, ts, MIN_TS, MAX_TS))
end

-- wrong fails the call for the error e that GET answered (redis.pcall's
-- table) for key: a key of another type than a string fails as a string
-- that is no record does (with the key's type); any other error (a key not
-- on this node) is raised as it came.
local function wrong(key, e)
  if string.sub(e.err, 1, 9) ~= 'WRONGTYPE' then
    error(e)
  end
  local t = call('TYPE', key)
  fail(key, 'a ' .. tostring(t.ok or t) .. ', not a string')
end

-- underscores_ok is strconv's underscoreOK for s, lower case, a number
-- gonum found well formed: every '_' lies between two digits, or between
-- the base prefix and a digit.
local function underscores_ok(s)
  local saw = '^' -- the last class seen: ^ start, 0 digit or prefix, _, ! other
  local i = 1
  local c = string.sub(s, 1, 1)
  if c == '+' or c == '-' then
    i = 2
  end
  local hex = string.sub(s, i, i + 1) == '0x' -- (0b and 0o are never well formed)
  if hex then
    i, saw = i + 2, '0'
  end
  for j = i, #s do
    c = string.sub(s, j, j)
    if string.find(c, '^%d$') or (hex and string.find(c, '^[a-f]$')) then
      saw = '0'
    elseif c == '_' then
      if saw ~= '0' then
        return false
      end
      saw = '_'
    else
      if saw == '_' then
        return false
      end
      saw = '!'
    end
  end
  return saw ~= '_'
end

-- gonum reads s as Go's strconv.ParseFloat(s, 64) does (parseState reads
-- a text record with it), or returns nil where ParseFloat fails: tonumber
-- (C's strtod) reads more ("0x10" without an exponent, "-nan", "nan(1)",
-- a value beyond the doubles as infinity) and less (underscores between
-- digits). Go's grammar: a sign, then "inf" or "infinity" in any case, or
-- (unsigned) "nan"; or digits with at most one '.' and at least one digit,
-- then e, a sign and digits; or, after "0x", hex digits alike, then a p
-- exponent, which is required; '_' only between digits. Both read the
-- number correctly rounded.
local function gonum(s)
  local l = string.lower(s)
  local sign, body = string.match(l, '^([+-]?)(.*)$')
  if body == 'inf' or body == 'infinity' then
    if sign == '-' then
      return -INF
    end
    return INF
  elseif l == 'nan' then
    return 0 / 0
  end
  local m
  if #body > 2 and string.sub(body, 1, 2) == '0x' then
    m = string.match(body, '^0x([%x_%.]*)p[+-]?%d[%d_]*$')
    if not (m and string.find(m, '%x')) then
      return nil
    end
  else
    local e
    m, e = string.match(body, '^([%d_%.]*)(.*)$')
    if not (string.find(m, '%d') and (e == '' or string.find(e, '^e[+-]?%d[%d_]*$'))) then
      return nil
    end
  end
  if string.find(m, '%..*%.') or (string.find(l, '_', 1, true) and not underscores_ok(l)) then
    return nil
  end
  local x = tonumber((string.gsub(l, '_', '')))
  if not x or x == INF or x == -INF then
    return nil -- beyond the doubles: ParseFloat's range error
  end
  return x
end

-- parse reads the stored string raw (false: missing; a table: the error
-- GET answered, from redis.pcall) of key: found, value, ts, the key's
-- expiry kept in the record (false: none known), a mark's kind (false:
-- not a mark) and a mark's settler ('': none, or not a mark). It accepts what parseState (redisstore.go)
-- accepts, numbers of a text record as ParseFloat reads them (gonum),
-- and a mark of a cancel or a use at a mark's key; anything else fails
-- the call (bad), rather than reach the arithmetic as nil, or be taken
-- for a settlement of a kind no Limiter makes. (A record at a mark's key
-- is refused where the mark is looked for: apply.)
local function parse(raw, key)
  if not raw then
    return false, nil, nil, false, false, ''
  end
  if typeof(raw) == 'table' then
    wrong(key, raw)
  end
  local b1 = string.byte(raw, 1)
  if b1 == 1 and #raw == 25 then
    local _, v, ts, dl = sunpack('<Bddd', raw)
    if v - v == 0 and ts >= MIN_TS and ts <= MAX_TS then -- sound, inline
      return true, v, ts, dl, false, ''
    end
    unsound(key, v, ts)
  elseif b1 == 2 and (#raw == 2 or #raw == 18) then
    local kind = string.byte(raw, 2)
    local settler = string.sub(raw, 3)
    if (kind ~= 1 and kind ~= 2) or settler == NONE or not is_mark(key) then
      bad(key, raw)
    end
    return false, nil, nil, false, kind, settler
  elseif b1 ~= 1 and b1 ~= 2 then
    -- The text of earlier versions, read as parseState reads it: only
    -- here, not on the common path above.
    local v, ts = string.match(raw, '^(%S+) (%S+)$')
    if v then
      v, ts = gonum(v), gonum(ts)
    end
    if v and ts then
      if not sound(v, ts) then
        unsound(key, v, ts)
      end
      return true, v, ts, false, false, ''
    end
  end
  bad(key, raw)
end

-- decode sets record i from its stored string raw (false: missing).
local function decode(i, raw)
  rnow[i], rmark[i] = false, false
  if raw and #raw == 25 then
    local b1, v, ts, dl = sunpack('<Bddd', raw)
    if b1 == 1 and v - v == 0 and ts >= MIN_TS and ts <= MAX_TS then -- sound, inline
      rfound[i], rv[i], rts[i], rdl[i] = true, v, ts, dl
      return
    end
  end
  rfound[i], rv[i], rts[i], rdl[i], rmark[i], rsettler[i] = parse(raw, rkey[i])
end

local at = {} -- the record of each key of the call
local gone = {} -- the keys MGET answered nil for

-- readall reads every record of the call, each once: list[off + 1],
-- list[off + 2], ... are the keys. With MGET, or, when the keys may lie in
-- several slots (each command must keep to one), with one GET each.
-- Every read comes before any write: a call refused for a key (not on
-- this node) has changed nothing. A key of another type than a string
-- fails the call with BADRECORD, for the WRONGTYPE that GET answers,
-- rather than read as missing (and be overwritten) as MGET would have it.
local function readall(list, off, slots)
  for i = 1, nrec do
    slot[rkey[i]] = nil
  end
  nrec = 0
  for k = 1, #list - off do
    local key = list[off + k]
    local i = slot[key]
    if not i then
      nrec = nrec + 1
      i = nrec
      slot[key], rkey[i] = i, key
    end
    at[k] = i
  end
  if nrec == 1 or slots then
    for i = 1, nrec do
      decode(i, rpcall('GET', rkey[i]))
    end
    return
  end
  local done = 0
  while done < nrec do
    local m = min(nrec - done, 1000)
    local raws = call('MGET', lunpack(rkey, done + 1, done + m))
    local ng = 0
    for j = 1, m do
      local raw = raws[j]
      if not raw then
        ng = ng + 1
        gone[ng] = rkey[done + j]
      end
      decode(done + j, raw)
    end
    -- MGET answers nil for a missing key and for a key of another type:
    -- if one of those exists, GET answers WRONGTYPE for it. A record that
    -- exists costs nothing more.
    if ng > 0 and call('EXISTS', lunpack(gone, 1, ng)) > 0 then
      for j = 1, ng do
        local e = rpcall('GET', gone[j])
        if typeof(e) == 'table' then
          wrong(gone[j], e)
        end
      end
    end
    done = done + m
  end
end

local limits = {}              -- the batch's limits
local wr, wv, wts, wp = {}, {}, {}, {} -- the writes of the op being decided
local dirty = {}               -- the records to write at the end, in order
local out = {}                 -- the reply's numbers, seven per item
local formats = {}             -- n -> the pack format of n items
local tnow                     -- the server's time, once read

local function servertime()
  if not tnow then
    local t = call('TIME')
    tnow = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
  end
  return tnow
end

-- write_never stores the record (v, ts) of a bucket that is full again
-- only in a far future, or never: Redis does not expire it, and a key
-- that had no expiry (dl infinite) keeps none.
local function write_never(key, v, ts, dl)
  if dl == INF then
    call('SET', key, pack('<Bddd', 1, v, ts, INF), 'KEEPTTL')
  else
    call('SET', key, pack('<Bddd', 1, v, ts, INF))
  end
end

-- write stores the record (v, ts) of limit p at key, last written by an
-- op judged at now, whose key's expiry is kept in the record as dl (false:
-- none known).
local function write(key, p, v, ts, now, dl, margin)
  local full = full_at(p, v, ts)
  -- Redis expires the key on its own clock: past the moment the bucket
  -- is full again by the clock of the op that wrote it last, plus the
  -- margin for the clocks disagreeing (far futures: never). The
  -- deadline set is kept while it suffices, and a new one set with a
  -- margin's slack, so that most writes leave the key's expiry alone.
  if full and full - now < 1e15 then
    local need = servertime() + (full - now) + margin
    if dl and dl >= need and dl ~= INF then
      call('SET', key, pack('<Bddd', 1, v, ts, dl), 'KEEPTTL')
    else
      dl = ceil(need + margin) -- whole ms, for PXAT, whatever the record read
      if dl < tnow + 1 then
        dl = tnow + 1
      end
      call('SET', key, pack('<Bddd', 1, v, ts, dl), 'PXAT', dl)
    end
  else
    write_never(key, v, ts, dl)
  end
end

-- The text of a key's time to live in ms, by its value, for PX: a number
-- made text in a call costs about as much as the expiry itself, and few
-- values occur (see expiry).
local ttl_texts, nttl = {}, 0

-- expiry returns the text of the ms, from now, for which a key that must
-- live need ms more is kept: at least need and half the margin, less than
-- need and the margin, on a grid of half margins.
local function expiry(need, margin)
  local ms = ceil(need + margin)
  if margin >= 2 then
    local q = floor(margin / 2)
    ms = ceil((need + margin - q) / q) * q
  end
  if ms < 1 then
    ms = 1
  end
  local t = ttl_texts[ms]
  if not t then
    if nttl >= 4096 then
      ttl_texts, nttl = {}, 0
    end
    t = string.format('%.0f', ms)
    ttl_texts[ms], nttl = t, nttl + 1
  end
  return t
end

-- write_lone is write for a lone op, without reading the server's time:
-- the key's expiry is set on every write, from Redis's clock when it
-- writes (PX), and the record keeps no deadline (0: none known), so that
-- the next write of a batch sets one again.
local function write_lone(key, p, v, ts, now, dl, margin)
  local full = full_at(p, v, ts)
  if full and full - now < 1e15 then
    call('SET', key, pack('<Bddd', 1, v, ts, 0), 'PX', expiry((full - now) + margin, margin))
  else
    write_never(key, v, ts, dl)
  end
end

-- reply packs the n items of out.
local function reply(n)
  if n <= 1000 then
    local f = formats[n]
    if not f then
      f = '<' .. string.rep('Bdddddd', n)
      formats[n] = f
    end
    return pack(f, lunpack(out, 1, 7 * n))
  end
  local parts = {}
  local i = 0
  while i < n do
    local m = min(n - i, 1000)
    local f = formats[m]
    if not f then
      f = '<' .. string.rep('Bdddddd', m)
      formats[m] = f
    end
    parts[#parts + 1] = pack(f, lunpack(out, 7 * i + 1, 7 * (i + m)))
    i = i + m
  end
  return table.concat(parts)
end

-- apply_one decides a batch of one op of one item on one record, at the
-- op's clock, the common case of a lone caller, as apply would, with
-- fewer steps: the batch in one read, no tables of records.
local function apply_one(key, b)
  local flags, margin, nlimits, nops, kind, rate, period, cap, maxr, mode, reserve, nitems, now, count, since,
    nshards, li, phase = sunpack('<dddddddddddddddddd', b)
  if flags ~= 0 or nlimits ~= 1 or nops ~= 1 or mode == MODE_REFUND or nitems ~= 1 or nshards ~= 1 or li ~= 1 then
    return nil
  end
  local p = limits[1]
  if not p then
    p = {}
    limits[1] = p
  end
  p[1], p[2], p[3], p[4], p[5] = kind, rate, period, cap, maxr
  local found, v0, ts0, dl = parse(rpcall('GET', key), key)
  local ok, retry, rem, c0, v, ts = single(p, phase, found, v0, ts0, now, count, reserve == 1)
  if v and mode == MODE_LIMIT then
    write_lone(key, p, v, ts, now, dl, margin)
  end
  return pack('<Bdddddd', ok and 1 or 0, retry, rem, c0, 0, now, ts)
end

local function apply(keys, args)
  if not call then
    floor, ceil, min, lunpack = math.floor, math.ceil, math.min, unpack
    sunpack, pack, call, rpcall, typeof = struct.unpack, struct.pack, redis.call, redis.pcall, type
    NONE = string.rep('\0', 16)
  end
  tnow = nil
  local b = args[1]
  if #b == ONE_OP_BYTES and #keys == 1 then
    local r = apply_one(keys[1], b)
    if r then
      return r
    end
  end
  local flags, margin, nlimits, nops, pos = sunpack('<dddd', b)
  if flags % 4 >= 2 then
    -- The keys of several slots of this node follow the batch in args
    -- (keys holds only the first, which routes the call, and one that
    -- keeps it from running while that slot migrates: apply.go).
    readall(args, 1, true)
  else
    readall(keys, 0, false)
  end
  for i = 1, nlimits do
    local l = limits[i]
    if not l then
      l = {}
      limits[i] = l
    end
    l[1], l[2], l[3], l[4], l[5], pos = sunpack('<ddddd', b, pos)
  end
  local own = flags % 2 == 1
  if own then
    servertime()
  end

  local nd, no, nm = 0, 0, 0 -- dirty records, numbers in out, marks to write
  local k = 1         -- next key
  for _ = 1, nops do
    -- an op and its first item in one read: every op has one
    local mode, reserve, nitems, now, count, since, nshards, li, phase
    mode, reserve, nitems, now, count, since, nshards, li, phase, pos = sunpack('<ddddddddd', b, pos)
    if own then
      now = tnow
    end
    if nitems == 1 and nshards == 1 and reserve == 0 and mode ~= MODE_REFUND then
      -- The common op, a limit or a check of one item on one record that
      -- reserves nothing: single, unrolled, without the bookkeeping of
      -- several writes.
      local p, r = limits[li], at[k]
      k = k + 1
      local v0, ts = load(p, phase, rfound[r], rv[r], rts[r], now)
      local v = v0 - count
      if v < 0 and v > -NOISE then
        v = 0
      end
      if v >= 0 then
        if count > 0 and mode == MODE_LIMIT then
          if not rnow[r] then
            nd = nd + 1
            dirty[nd] = r
          end
          rfound[r], rv[r], rts[r], rp[r], rnow[r] = true, v, ts, p, now
        end
        out[no + 1], out[no + 2], out[no + 3], out[no + 4], out[no + 5], out[no + 6], out[no + 7] =
          1, 0, v, count, 0, now, ts
      else
        local bv, bts = v0, ts
        if rfound[r] then
          bv, bts = rv[r], rts[r]
        end
        out[no + 1], out[no + 2], out[no + 3], out[no + 4], out[no + 5], out[no + 6], out[no + 7] =
          0, retry_ms(wait(p, bv, bts, v0, ts, now, count, 0)), v0, 0, 0, now, ts
      end
      no = no + 7
    else
      -- a settlement: its kind, its mark, and the kind found there (false:
      -- none, the op settles it)
      local skind, mk, found, first = 0, false, false, no
      if mode == MODE_REFUND and reserve > 0 then
        skind = reserve
        mk = at[k + nitems]
        found = rmark[mk]
        if rfound[mk] then
          -- A record where the mark belongs (parse took it for one): the
          -- token may have been settled, and the mark overwritten.
          bad(rkey[mk], call('GET', rkey[mk]))
        end
      end
      reserve = reserve == 1
      local nw = 0
      local all = true
      for item = 1, nitems do
        if item > 1 then
          count, since, nshards, li, phase, pos = sunpack('<ddddd', b, pos)
        end
        local run = 0 -- a refund's: when the job of the charge may run
        if mode == MODE_REFUND then
          run, pos = sunpack('<d', b, pos)
        end
        local p = limits[li]
        local r = at[k]
        local ok, retry, rem, c0, c1, ts0 = true, 0, 0, 0, 0, 0
        if found then
          -- settled before: nothing done
          ok = false
          k = k + 1
        elseif mode == MODE_REFUND then
          -- refund: the count less what the record was granted since;
          -- nothing while reservations stand behind it
          if rfound[r] then
            local v, ts = refresh(p, rv[r], rts[r], now)
            ts0 = ts
            local back = 0
            if not queued(p, rv[r], rts[r], v, max(run, since)) then
              back = denoise(count - granted(p, ts, since))
            end
            if back > 0 then
              local nv = min(v + back, p[4])
              if nv > v then
                c0 = v - nv
                v = nv
                nw = nw + 1
                wr[nw], wv[nw], wts[nw], wp[nw] = r, v, ts, p
              end
            end
            rem = v
          else
            local _
            rem, ts0 = load(p, phase, false, 0, 0, now)
          end
          k = k + 1
        elseif nshards == 1 then
          local v, ts
          ok, retry, rem, c0, v, ts = single(p, phase, rfound[r], rv[r], rts[r], now, count, reserve)
          ts0 = ts
          if v then
            nw = nw + 1
            wr[nw], wv[nw], wts[nw], wp[nw] = r, v, ts, p
          end
          k = k + 1
        else
          local lb, phb
          lb, phb, pos = sunpack('<dd', b, pos)
          local pb = limits[lb]
          local rb = at[k + 1]
          local va, tsa, vb, tsb
          ok, retry, rem, c0, c1, va, tsa, vb, tsb = pair(p, pb, phase, phb,
            rfound[r], rv[r], rts[r], rfound[rb], rv[rb], rts[rb], now, count, reserve)
          ts0 = tsa
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
        out[no + 1], out[no + 2], out[no + 3], out[no + 4], out[no + 5] = ok and 1 or 0, retry, rem, c0, c1
        if found then
          out[no + 1] = 2 * found
        end
        out[no + 6], out[no + 7] = now, ts0
        no = no + 7
      end
      if skind > 0 then
        local keep
        keep, pos = sunpack('<d', b, pos)
        local settler = string.sub(b, pos, pos + 15)
        pos = pos + 16
        k = k + 1
        if found and settler ~= NONE and rsettler[mk] == settler then
          -- the op's own settler's mark: say so in each item's ok byte
          for o = first + 1, no, 7 do
            out[o] = out[o] + 8
          end
        end
        if settler == NONE then
          settler = ''
        end
        if not found then
          -- Mark it settled until its time, the grace and the margin, on
          -- Redis's clock: written at the end, with the records.
          local dl = servertime() + (keep - now) + GRACE + margin
          if dl < tnow + 1 then
            dl = tnow + 1
          end
          nm = nm + 1
          mkey[nm], mkind[nm], mdl[nm], msettler[nm] = rkey[mk], skind, dl, settler
          rmark[mk], rsettler[mk] = skind, settler
        end
      end
      if mode == MODE_REFUND or (mode == MODE_LIMIT and all) then
        for i = 1, nw do
          local r = wr[i]
          if not rnow[r] then
            nd = nd + 1
            dirty[nd] = r
          end
          rfound[r], rv[r], rts[r], rp[r], rnow[r] = true, wv[i], wts[i], wp[i], now
        end
      end
    end
  end

  -- write, with its common case first: the key's expiry still suffices
  for i = 1, nm do
    call('SET', mkey[i], pack('<BB', 2, mkind[i]) .. msettler[i], 'PXAT', mdl[i])
  end
  local st = tnow
  for i = 1, nd do
    local r = dirty[i]
    local p, v, ts, now, dl = rp[r], rv[r], rts[r], rnow[r], rdl[r]
    local full = full_at(p, v, ts)
    if full and full - now < 1e15 then
      if not st then
        st = servertime()
      end
      if dl and dl >= st + (full - now) + margin and dl ~= INF then
        call('SET', rkey[r], pack('<Bddd', 1, v, ts, dl), 'KEEPTTL')
      else
        write(rkey[r], p, v, ts, now, dl, margin)
      end
    else
      write(rkey[r], p, v, ts, now, dl, margin)
    end
  end
  return reply(no / 7)
end
