"""The Lua scripts of the Redis job store (:class:`gateway.jobs.store_redis.RedisJobStore`), by name.

Every change to a job is one of these, so it is atomic; see :mod:`gateway.jobs.store_redis` for the
keys they work on. Each script's comment names its ``KEYS`` and ``ARGV``, in the order the store sends them.
"""

from __future__ import annotations

__all__ = ["SCRIPTS"]

# end_job(prefix, id, status, error, now (text, as sent), ttl): the one way a job finishes, in every script.
_END = """
local function end_job(prefix, id, status, err, now_text, ttl)
  local now = tonumber(now_text)
  local key = prefix .. 'jobs:' .. id
  local owner, callback = unpack(redis.call('HMGET', key, 'owner', 'callback_url'))
  local expires = now + ttl
  redis.call('HSET', key, 'status', status, 'finished_at', now_text,
             'expires_at', string.format('%.6f', expires), 'error', err)
  if callback and callback ~= '' then
    redis.call('HSET', key, 'callback_state', 'pending')
    -- the time as sent, not reformatted: rounding it up would keep it from a claim at the same instant
    redis.call('ZADD', prefix .. 'jobs:callbacks', now_text, id)
  end
  local at = math.floor(expires * 1000)
  redis.call('PEXPIREAT', key, at)
  redis.call('PEXPIREAT', key .. ':images', at)
  redis.call('ZREM', prefix .. 'jobs:due', id)
  redis.call('ZADD', prefix .. 'jobs:owner:' .. owner, string.format('%.6f', expires), id)
  redis.call('ZADD', prefix .. 'jobs:all', string.format('%.6f', expires), id)
end
"""

# KEYS: job, owner index, all, created, due. ARGV: now, max_active, max_kept, id, created_at, fields...
_SUBMIT = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)
for _, id in ipairs(gone) do
  redis.call('ZREM', KEYS[3], id)
  redis.call('ZREM', KEYS[4], id)
end
local active = redis.call('ZCOUNT', KEYS[2], '+inf', '+inf')
if active >= tonumber(ARGV[2]) then return {'active', active} end
local kept = redis.call('ZCARD', KEYS[2])
if kept >= tonumber(ARGV[3]) then return {'kept', kept} end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
redis.call('ZADD', KEYS[2], '+inf', ARGV[4])
redis.call('ZADD', KEYS[3], '+inf', ARGV[4])
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[4])
redis.call('ZADD', KEYS[5], ARGV[5], ARGV[4])
return {'ok', 0}
"""

# KEYS: due. ARGV: prefix, now, lease_s, worker, max_attempts, ttl_s, the error of a lost job.
_CLAIM = (
    _END
    + """
local prefix, now, lease, worker = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
for _ = 1, 20 do
  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 1)
  if #ids == 0 then return false end
  local id = ids[1]
  local key = prefix .. 'jobs:' .. id
  local status, attempts, started = unpack(redis.call('HMGET', key, 'status', 'attempts', 'started_at'))
  if status ~= 'queued' and status ~= 'running' then
    redis.call('ZREM', KEYS[1], id)
  elseif tonumber(attempts) >= tonumber(ARGV[5]) then
    end_job(prefix, id, 'failed', ARGV[7], ARGV[2], tonumber(ARGV[6]))
  else
    redis.call('HSET', key, 'status', 'running', 'worker', worker, 'attempts', tonumber(attempts) + 1)
    if not started or started == '' then redis.call('HSET', key, 'started_at', ARGV[2]) end
    redis.call('ZADD', KEYS[1], string.format('%.6f', now + lease), id)
    return redis.call('HGETALL', key)
  end
end
return false
"""
)

# KEYS: job, due. ARGV: id, worker, lease end.
_RENEW = """
local status, worker = unpack(redis.call('HMGET', KEYS[1], 'status', 'worker'))
if not status or worker ~= ARGV[2] then return false end
if status == 'running' then redis.call('ZADD', KEYS[2], 'XX', ARGV[3], ARGV[1]) end
return status
"""

# KEYS: job, due. ARGV: id, worker, due.
_RELEASE = """
local status, worker, attempts = unpack(redis.call('HMGET', KEYS[1], 'status', 'worker', 'attempts'))
if status ~= 'running' or worker ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'status', 'queued', 'attempts', math.max(0, tonumber(attempts) - 1))
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 1
"""

# KEYS: job, images. ARGV: prefix, id, worker, now, ttl, status, error, media_type, images...
_FINISH = (
    _END
    + """
local status, worker = unpack(redis.call('HMGET', KEYS[1], 'status', 'worker'))
if status ~= 'running' or worker ~= ARGV[3] then return 0 end
local count = #ARGV - 8
if count > 0 then redis.call('RPUSH', KEYS[2], unpack(ARGV, 9)) end
redis.call('HSET', KEYS[1], 'images', count, 'media_type', ARGV[8])
end_job(ARGV[1], ARGV[2], ARGV[6], ARGV[7], ARGV[4], tonumber(ARGV[5]))
return 1
"""
)

# KEYS: job. ARGV: prefix, id, now, ttl.
_CANCEL = (
    _END
    + """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return false end
if status == 'queued' or status == 'running' then
  end_job(ARGV[1], ARGV[2], 'cancelled', '', ARGV[3], tonumber(ARGV[4]))
end
return redis.call('HGETALL', KEYS[1])
"""
)

# KEYS: job, images, owner index, all, created, callbacks. ARGV: id.
_DELETE = """
local status = redis.call('HGET', KEYS[1], 'status')
if status ~= 'succeeded' and status ~= 'failed' and status ~= 'cancelled' then return 0 end
redis.call('DEL', KEYS[1], KEYS[2])
for i = 3, 6 do redis.call('ZREM', KEYS[i], ARGV[1]) end
return 1
"""

# KEYS: callbacks. ARGV: prefix, now, lease end.
_CLAIM_CALLBACK = """
for _ = 1, 20 do
  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, 1)
  if #ids == 0 then return false end
  local key = ARGV[1] .. 'jobs:' .. ids[1]
  if redis.call('EXISTS', key) == 0 then
    redis.call('ZREM', KEYS[1], ids[1])
  else
    redis.call('ZADD', KEYS[1], ARGV[3], ids[1])
    redis.call('HINCRBY', key, 'callback_attempts', 1)
    return redis.call('HGETALL', key)
  end
end
return false
"""

# KEYS: job, callbacks. ARGV: id, state, error, next attempt ('' for none).
_CALLBACK_DONE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 0
end
redis.call('HSET', KEYS[1], 'callback_state', ARGV[2], 'callback_error', ARGV[3])
if ARGV[4] ~= '' then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
else
  redis.call('ZREM', KEYS[2], ARGV[1])
end
return 1
"""


#: every script, by the name the store calls it by
SCRIPTS = {
    "submit": _SUBMIT,
    "claim": _CLAIM,
    "renew": _RENEW,
    "release": _RELEASE,
    "finish": _FINISH,
    "cancel": _CANCEL,
    "delete": _DELETE,
    "claim_callback": _CLAIM_CALLBACK,
    "callback_done": _CALLBACK_DONE,
}
