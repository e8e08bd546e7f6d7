//! The Lua scripts of the Redis store: each runs atomically on the key(s) it names.

/// Replaces the decision part of a value, keeping the key's TTL: 1 when the key exists.
pub(super) const RECORD_DECISION: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local i = string.find(v, '\n', 1, true)
if not i then return redis.error_reply('value of ' .. KEYS[1] .. ' was not written by idem') end
redis.call('SET', KEYS[1], string.sub(v, 1, i) .. ARGV[1], 'KEEPTTL')
return 1
";

/// Begins a pending batch's transaction (`MULTI`, this script, one native
/// `SET key value NX [PX ms] GET` per key, then [`BATCH_END`] when the batch has a place in
/// its gate's row, `EXEC`: no other client's command runs in between, so two gates'
/// batches of the same keys never split them).
///
/// With a place (ARGV[3], empty: none), the row's last place marked is KEYS[2], and this
/// keeps in it the number of keys in the database, the number of keys Redis has expired
/// so far (`INFO stats`; `-` when the user may not run `INFO`) and that last place
/// (`~SIZE:EXPIRED:LAST`) for `BATCH_END`. Asked ahead of its turn (ARGV[4] `1`), the
/// batch goes on only when the row's last place is the one just before its own;
/// otherwise this answers 0 and sets nothing. Going on, it answers 1; ahead, it leaves the
/// batch's key to `BATCH_END`, which sets it only when every key was new: until then, and
/// for good when refused, the keys the transaction sets name a batch that does not exist,
/// dead to every reader (the caller deletes them, `UNMARK_EXACT`, before it asks again in
/// its turn).
///
/// In its turn, it sets the batch's key KEYS[1] to ARGV[1] (`P<deadline>:<longest px>`,
/// living PX ARGV[2]) unless it is set already (the batch asked again) before any of its
/// keys (a key never names a batch not stored).
pub(super) const BATCH_BEGIN: &str = r"
local call = redis.call
local place = tonumber(ARGV[3])
local ahead = ARGV[4] == '1'
local last = -1
if place then
  last = tonumber(call('GET', KEYS[2]) or '-1') or -1
  if ahead and last ~= place - 1 then
    return 0
  end
end
if not ahead then
  call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX')
end
if place then
  call('SET', KEYS[2], '~', 'PX', ARGV[2])
  local stats = redis.pcall('INFO', 'stats')
  local expired = type(stats) == 'string' and string.match(stats, 'expired_keys:(%d+)') or '-'
  call('SET', KEYS[2], '~' .. call('DBSIZE') .. ':' .. expired .. ':' .. last, 'PX', ARGV[2])
end
return 1
";

/// Ends a pending batch's transaction begun by [`BATCH_BEGIN`] with a place (KEYS[1], the
/// row's last place, holds `~SIZE:EXPIRED:LAST`): when each of the batch's ARGV[1]
/// distinct keys was absent and set by it — the database holds exactly that many keys
/// more, counting those Redis expired meanwhile (a `SET` that finds its key expired but
/// not yet removed removes one key, counted as expired, and adds one; nothing else runs
/// inside the transaction) — the row's last place becomes ARGV[2] (when after the last
/// one), and a batch asked ahead gets its key KEYS[2] (ARGV[4], PX ARGV[3]; empty: the
/// batch's key was set by `BATCH_BEGIN`); otherwise the row's last place goes back to what
/// it was. Answers 1 when every key was new, else 0 (also when `BATCH_BEGIN` refused the
/// batch). A key evicted meanwhile (`maxmemory`), or expired when the user may not run
/// `INFO`, makes the count fall short: that batch is then refused ahead, or the next one
/// waits for its turn; never the other way.
pub(super) const BATCH_END: &str = r"
local call = redis.call
local size, expired, last = string.match(call('GET', KEYS[1]) or '', '^~(%d+):([%d-]+):(%-?%d+)$')
if not size then
  return 0
end
local place = tonumber(ARGV[2])
last = tonumber(last)
local grown = call('DBSIZE') - tonumber(size)
if grown ~= tonumber(ARGV[1]) and tonumber(expired) then
  local stats = redis.pcall('INFO', 'stats')
  local now = type(stats) == 'string' and tonumber(string.match(stats, 'expired_keys:(%d+)'))
  if now then
    grown = grown + now - tonumber(expired)
  end
end
if grown == tonumber(ARGV[1]) then
  call('SET', KEYS[1], tostring(math.max(place, last)), 'PX', ARGV[3])
  if ARGV[4] ~= '' then
    call('SET', KEYS[2], ARGV[4], 'PX', ARGV[3], 'NX')
  end
  return 1
end
if last >= 0 then
  call('SET', KEYS[1], tostring(last), 'PX', ARGV[3])
else
  call('DEL', KEYS[1])
end
return 0
";

/// Undoes a pending batch's marking that was refused (asked ahead of its turn, which had
/// not come, or with a key not new): deletes each KEYS[i] that still holds ARGV[i]
/// exactly. Answers how many it deleted.
pub(super) const UNMARK_EXACT: &str = r"
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i] then
    n = n + redis.call('DEL', KEYS[i])
  end
end
return n
";

/// Re-marks keys whose stored values are dead by the caller's clock, all in one script
/// (two gates taking over the same dead keys never split them): for each KEYS[2i-1], sets
/// ARGV[3i-1] (with PX ARGV[3i] unless empty) when the key is gone or still holds
/// ARGV[3i-2] and that value is still dead, answering nil; otherwise answers the value
/// stored. A value dead for the batch it names (not for its own expiry) has that batch's
/// key as KEYS[2i] (else KEYS[2i] is KEYS[2i-1]), read again here: confirmed (`C`), or
/// pending with a deadline after the caller's `now` (ARGV[#ARGV], microseconds), the batch
/// is alive after all (a batch's key is set after its keys when it is marked ahead of its
/// turn) and the value is answered, not replaced.
pub(super) const REMARK_EXPIRED: &str = r"
local call = redis.call
local now = tonumber(ARGV[#ARGV])
local out = {}
for i = 1, #KEYS / 2 do
  local key, batch, was = KEYS[2 * i - 1], KEYS[2 * i], ARGV[3 * i - 2]
  local v = call('GET', key)
  local alive = false
  if v and v == was and batch ~= key then
    local b = call('GET', batch)
    if b == 'C' then
      alive = true
    elseif b then
      local deadline = tonumber(string.match(b, '^P(%-?%d+):'))
      alive = deadline ~= nil and deadline > now
    end
  end
  if (v and v ~= was) or alive then
    out[i] = v
  else
    local px = ARGV[3 * i]
    if px == '' then
      call('SET', key, ARGV[3 * i - 1])
    else
      call('SET', key, ARGV[3 * i - 1], 'PX', px)
    end
    out[i] = false
  end
end
return out
";

/// Deletes a key whose stored value begins with ARGV[1] (`FIRST_SEEN:`): 1 when deleted.
pub(super) const UNMARK: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, string.len(ARGV[1])) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Confirms pending marks, one call for a batch's keys (one namespace: one hash slot):
/// for each KEYS[i] whose stored value's decision part is exactly ARGV[1] (the pending
/// marker), rewrites its header's TTL field for the expiry ARGV[2i] (microseconds since
/// the epoch; empty: never), clears the decision, and sets the key's expiry to PX
/// ARGV[2i+1] (empty: none). Answers how many were confirmed.
pub(super) const CONFIRM: &str = r"
local n = 0
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  local nl = v and string.find(v, '\n', 1, true)
  if nl and string.sub(v, nl + 1) == ARGV[1] then
    local c1 = string.find(v, ':', 1, true)
    local c2 = c1 and string.find(v, ':', c1 + 1, true)
    if c2 and c2 < nl then
      local at, px = ARGV[2 * i], ARGV[2 * i + 1]
      local ttl = ''
      if at ~= '' then
        ttl = string.format('%d', tonumber(at) - tonumber(string.sub(v, 1, c1 - 1)))
      end
      local nv = string.sub(v, 1, c1) .. ttl .. string.sub(v, c2, nl)
      if px == '' then
        redis.call('SET', KEYS[i], nv)
      else
        redis.call('SET', KEYS[i], nv, 'PX', px)
      end
      n = n + 1
    end
  end
end
return n
";

/// Rounds of re-marking keys expired by the caller's clock before the last value read
/// stands as stored.
pub(super) const REMARK_ROUNDS: usize = 3;

/// Moves a cursor (value `POSITION\nJSON`) to ARGV[1] (value ARGV[2]) when ARGV[1] is
/// after its stored position; positions are lowercase hex, so Lua's string order is
/// their byte order.
pub(super) const ADVANCE_CURSOR: &str = r"
local v = redis.call('GET', KEYS[1])
if v then
  local p = string.match(v, '^[^\n]*')
  if not (p < ARGV[1]) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1] .. '\n' .. ARGV[2])
return 1
";

/// Confirms a pending batch whole: its key (KEYS[1], see `value::batch_key`) still pending
/// becomes `C`, living as long as the batch's longest key (the `PX` its pending value
/// carries; none: no expiry), which confirms every key naming it at once. 1 when
/// confirmed, 0 when the batch is gone (died unconfirmed) or was confirmed already.
pub(super) const CONFIRM_BATCH: &str = r"
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 1) ~= 'P' then return 0 end
local px = string.match(v, ':(%d*)$')
if px == nil or px == '' then
  redis.call('SET', KEYS[1], 'C')
else
  redis.call('SET', KEYS[1], 'C', 'PX', px)
end
return 1
";

/// Confirms some keys of a pending batch: each KEYS[i] whose decision part is exactly
/// ARGV[1] (`@` and the batch's marker) stops naming it (its decision part emptied, its
/// expiry kept: it was marked with its real one). Answers how many were confirmed.
pub(super) const CONFIRM_KEYS: &str = r"
local n = 0
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  local nl = v and string.find(v, '\n', 1, true)
  if nl and string.sub(v, nl + 1) == ARGV[1] then
    redis.call('SET', KEYS[i], string.sub(v, 1, nl), 'KEEPTTL')
    n = n + 1
  end
end
return n
";
