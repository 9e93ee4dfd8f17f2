"""The Lua scripts RedisState (redis.py) runs inside Redis, where a read and the write that depends
on it cannot be split by another replica's command.

- `CLAIM`: the chat's owner, this replica becoming it if nobody alive is; refuses another user's
  or another agent's chat, and claims of unknown chats while the replicas restore a Redis that lost its data.
- `OWNER_SET`: a write to a chat record that only its owner may make.
- `NEW_EPOCH`: the dataset's epoch, created if missing (Redis started, or restarted empty).

Redis Cluster is not supported: CLAIM touches a heartbeat key it is not given.
"""

__all__ = ["CLAIM", "NEW_EPOCH", "OWNER_SET"]

# ARGV: user, me, ttl_ms, replica key prefix, my epoch, settle_ms, create (1/0), agent, default
# agent (whose a record without an agent is: written before agents existed).  KEYS: chat, epoch.
CLAIM = """
local epoch = redis.call('GET', KEYS[2])
if epoch ~= ARGV[5] then return {'reset'} end
local rec = redis.call('HMGET', KEYS[1], 'user', 'owner', 'run', 'agent')
local ttl = tonumber(ARGV[3])
if rec[1] then
  if rec[1] ~= ARGV[1] then return {'foreign'} end
  if (rec[4] or ARGV[9]) ~= ARGV[8] then return {'foreign'} end
  redis.call('PEXPIRE', KEYS[1], ttl)
  if rec[2] == ARGV[2] then return {'local'} end
  if redis.call('EXISTS', ARGV[4] .. rec[2]) == 1 then return {'remote', rec[2]} end
  redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'run', '')
  return {'took_over', rec[2], rec[3] or ''}
end
local sep = string.find(epoch, '|', 1, true)
local reset_ms = tonumber(string.sub(epoch, sep + 1))
if reset_ms > 0 then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - reset_ms < tonumber(ARGV[6]) then
    return {'settling'}
  end
end
if ARGV[7] ~= '1' then return {'local'} end
redis.call('HSET', KEYS[1], 'user', ARGV[1], 'owner', ARGV[2], 'run', '', 'agent', ARGV[8])
redis.call('PEXPIRE', KEYS[1], ttl)
return {'local'}
"""

# Only the owner writes its chat's fields. ARGV: user, me, field, value.  KEYS: chat.
OWNER_SET = """
local rec = redis.call('HMGET', KEYS[1], 'user', 'owner')
if rec[1] == ARGV[1] and rec[2] == ARGV[2] then
  if ARGV[3] == '' then return redis.call('DEL', KEYS[1]) end
  return redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
end
return 0
"""

# A new epoch when none exists; reset_ms is Redis's clock when the dataset was lost (0 at first start).
NEW_EPOCH = """
local t = redis.call('TIME')
local ms = 0
if ARGV[1] == '1' then ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) end
redis.call('SET', KEYS[1], ARGV[2] .. '|' .. ms, 'NX')
return redis.call('GET', KEYS[1])
"""
