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

/// Marks a pending batch, whole (one script: no other call runs in between).
///
/// With a place in its gate's row (ARGV[3], empty: none), the row's last place marked is
/// KEYS[2], and the batch's place becomes it when this call set every one of its keys (a
/// key found stored may be dead, and re-marked by the caller after the script: the batch
/// after it then waits for its turn instead of marking before those keys). Asked ahead of
/// its turn (ARGV[4] `1`), the batch is marked only when the row's last place is the one
/// just before its own and none of its keys is stored; otherwise the script leaves
/// everything as it found it and answers nil.
///
/// It sets the batch's key KEYS[1] to ARGV[1] (`P<deadline>:<longest px>`, living PX
/// ARGV[2]) unless it is set already (the batch asked again), first (a script that fails
/// midway leaves no key naming a batch not stored), then each key KEYS[i] (i ≥ 3), when
/// absent, to its value with its expiry. ARGV[5] says how those are laid out: the `PX` of
/// every key (a number; empty: none), each key's value ARGV[i + 3]; or `*`, each key's
/// value ARGV[2i] followed by its own `PX` ARGV[2i + 1] (empty: none). A gate's keys share
/// one expiry, so a batch sends it once (a fifth less of Redis's time in the script than a
/// `PX` per key, with the short answer below: issue 36 item 8).
///
/// Answers the keys found stored only, as a flat array of their positions (1-based, in
/// KEYS[3..]) each followed by the value stored: empty when this call set every key.
pub(super) const MARK_BATCH: &str = r"
local ahead = ARGV[4] == '1'
local place, last = tonumber(ARGV[3]), -1
local call = redis.call
if place then
  last = tonumber(call('GET', KEYS[2]) or '-1')
  if ahead and last ~= place - 1 then
    return false
  end
end
local own = call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX')
local mode = ARGV[5]
local out, n = {}, 0
for i = 3, #KEYS do
  local got
  if mode == '*' then
    local px = ARGV[2 * i + 1]
    if px == '' then
      got = call('SET', KEYS[i], ARGV[2 * i], 'NX', 'GET')
    else
      got = call('SET', KEYS[i], ARGV[2 * i], 'NX', 'PX', px, 'GET')
    end
  elseif mode == '' then
    got = call('SET', KEYS[i], ARGV[i + 3], 'NX', 'GET')
  else
    got = call('SET', KEYS[i], ARGV[i + 3], 'NX', 'PX', mode, 'GET')
  end
  if got then
    if ahead then
      for j = 3, i - 1 do
        call('DEL', KEYS[j])
      end
      if own then
        call('DEL', KEYS[1])
      end
      return false
    end
    out[n + 1] = i - 2
    out[n + 2] = got
    n = n + 2
  end
end
if place and n == 0 and place > last then
  call('SET', KEYS[2], ARGV[3], 'PX', ARGV[2])
end
return out
";

/// Re-marks keys whose stored values expired by the caller's clock, all in one script
/// (two gates taking over the same dead keys never split them): for each KEYS[i], sets
/// ARGV[3i-1] (with PX ARGV[3i] unless empty) when the key is gone or still holds
/// ARGV[3i-2], answering nil; otherwise answers the value someone else stored meanwhile.
pub(super) const REMARK_EXPIRED: &str = r"
local out = {}
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v and v ~= ARGV[3 * i - 2] then
    out[i] = v
  else
    local px = ARGV[3 * i]
    if px == '' then
      redis.call('SET', KEYS[i], ARGV[3 * i - 1])
    else
      redis.call('SET', KEYS[i], ARGV[3 * i - 1], 'PX', px)
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
