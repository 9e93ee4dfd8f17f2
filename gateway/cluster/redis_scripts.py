"""The Lua scripts the Redis backend (redis.py and its parts) runs inside Redis, where a read and the
write that depends on it cannot be split by another replica's command.

- `CLAIM`: the chat's owner, this replica becoming it if nobody alive is; refuses another user's
  or another agent's chat, and claims of unknown chats while the replicas restore a Redis that lost
  its data (redis_directory.py).
- `OWNER_SET`: a write to a chat record that only its owner may make (redis_directory.py).
- `NEW_EPOCH`: the dataset's epoch, created if missing (Redis started, or restarted empty).
- `BEAT`: a replica's heartbeat, and the gap since the last one of any replica (an outage).
- `AUDIT_APPEND`: an audit record, once per approval id, and the audit store trimmed to its bounds
  (redis_audit.py).
- `APPROVAL_PUT`, `APPROVAL_VOTE`: a pending approval kept (its votes and decision left as they
  are) and indexed; a vote counted and the approval decided in the same step (redis_approvals.py);
  `APPROVAL_COUNT`, a requester's approvals kept, as the put counts them for its cap.
- `GRANT_TAKE`, `GRANT_GIVE_BACK`: one use of a standing grant reserved (none when it is gone or
  used up), and given back, each in one step with every replica's (redis_grants.py).

Redis Cluster is not supported: CLAIM touches a heartbeat key it is not given.
"""

__all__ = [
    "APPROVAL_COUNT", "APPROVAL_PUT", "APPROVAL_VOTE", "AUDIT_APPEND", "BEAT", "CLAIM", "GRANT_GIVE_BACK", "GRANT_TAKE",
    "NEW_EPOCH", "OWNER_SET",
]

# ARGV: user, me, ttl_ms, replica key prefix, my epoch, settle_ms, create (1/0), agent, default
# agent (whose a record without an agent is: written before agents existed).  KEYS: chat, epoch,
# beats. A chat whose owner's heartbeat is missing is taken over only once the replicas have beaten
# without a gap for settle_ms (BEAT): after an outage, a missing heartbeat may be a live replica's.
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
  local since = tonumber(redis.call('HGET', KEYS[3], 'since') or '0')
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - since < tonumber(ARGV[6]) then
    return {'settling'}
  end
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

# A replica's heartbeat (KEYS[1], for ARGV[1] ms), and `{p}:beats` (KEYS[2]): `last`, Redis's clock at
# the last beat of any replica, and `since`, when the beats last resumed after a gap longer than
# ARGV[2] ms (an outage: Redis down, or failing over); 0 when none was seen. Kept ARGV[3] ms. Returns
# the epoch (KEYS[3], '' when missing), Redis's TIME (seconds, microseconds) and `since`.
BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
local beats = redis.call('HMGET', KEYS[2], 'last', 'since')
local since = tonumber(beats[2] or '0')
if beats[1] and now - tonumber(beats[1]) > tonumber(ARGV[2]) then since = now end
redis.call('HSET', KEYS[2], 'last', string.format('%.0f', now), 'since', string.format('%.0f', since))
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {redis.call('GET', KEYS[3]) or '', t[1], t[2], string.format('%.0f', since)}
"""

# A new epoch when none exists; reset_ms is Redis's clock when the dataset was lost (0 at first start).
NEW_EPOCH = """
local t = redis.call('TIME')
local ms = 0
if ARGV[1] == '1' then ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) end
redis.call('SET', KEYS[1], ARGV[2] .. '|' .. ms, 'NX')
return redis.call('GET', KEYS[1])
"""

# An audit record, once per approval id, at the place the caller sealed it for, then the store
# trimmed to its bounds; one step, so two replicas recording the same approval cannot both append
# it. KEYS: the stream, the approval ids (a sorted set, scored by place, trimmed with the stream).
# ARGV: approval id, the entry id (`<ms>-<seq>`), keep, max_age (ms), the sealed record. Returns the
# entry's id; nil for a duplicate; or, when the place is not after the stream's newest (a stream's
# ids only grow), {the newest id ever given}: the caller seals for a place after it and asks again.
AUDIT_APPEND = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local oldest = now - tonumber(ARGV[4])
local keep = tonumber(ARGV[3])
local function trim()
  redis.call('XTRIM', KEYS[1], 'MINID', string.format('%.0f', oldest))
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. string.format('%.0f', oldest))
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -(keep + 1))
end
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  trim()
  return false
end
local id = redis.pcall('XADD', KEYS[1], 'MAXLEN', keep, ARGV[2], 's', ARGV[5])
if type(id) == 'table' and id.err then
  local info = redis.call('XINFO', 'STREAM', KEYS[1])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then return {info[i + 1]} end
  end
  return redis.error_reply('the audit stream has no last-generated-id')
end
redis.call('ZADD', KEYS[2], tonumber(string.match(id, '^(%d+)-')), ARGV[1])
trim()
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return id
"""

# A pending approval kept: its sealed record replaced, its verdict and votes created if missing
# (a second put does not undo votes), its lifetime set, its place in the indexes (its first
# position) kept, and its requester's count of approvals kept (score: when each expires, on Redis's
# clock) updated. A new approval is refused (0) while the requester has `cap` (0: no cap) unexpired
# ones. Each index and the count live as long as their longest-lived approval. KEYS: the approval's
# hash, the requester's count (a sorted set), then its indexes (sorted sets of positions, all of
# score 0, read in lexical order). ARGV: the sealed record, ttl (ms), position, approval id, cap.
APPROVAL_PUT = """
local ttl = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local place = redis.call('HGET', KEYS[1], 'pos')
if not place then
  local cap = tonumber(ARGV[5])
  if cap > 0 and redis.call('ZCARD', KEYS[2]) >= cap then return 0 end
  place = ARGV[3]
  local names = {}
  for i = 3, #KEYS do names[#names + 1] = KEYS[i] end
  redis.call('HSET', KEYS[1], 'pos', place, 'index', table.concat(names, '\\n'), 'count', KEYS[2])
end
redis.call('HSET', KEYS[1], 'sealed', ARGV[1])
redis.call('HSETNX', KEYS[1], 'state', 'pending')
redis.call('HSETNX', KEYS[1], 'votes', '[]')
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[4])
if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
for i = 3, #KEYS do
  redis.call('ZADD', KEYS[i], 0, place)
  if redis.call('PTTL', KEYS[i]) < ttl then redis.call('PEXPIRE', KEYS[i], ttl) end
end
return 1
"""

# A requester's approvals kept, as APPROVAL_PUT counts them for its cap (on Redis's clock). KEYS: the
# requester's count.
APPROVAL_COUNT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%.0f', now), '+inf')
"""

# One vote, by the rule of approvals/votes.py count_vote: on a pending approval only, once per user, one
# deny decides, `quorum` approvals of distinct users decide. The vote is stored with its tag (the voting replica's
# seal over the approval, the user and the answer: what Lua cannot check, the replica does after).
# KEYS: the approval's hash. ARGV: user, approved (1/0), quorum, tag. Returns {'gone'} when there is
# no approval, else {what the vote did, the votes (JSON), the sealed record, the verdict}.
APPROVAL_VOTE = """
local rec = redis.call('HMGET', KEYS[1], 'state', 'votes', 'sealed')
if not rec[1] or not rec[3] then return {'gone'} end
local raw = rec[2] or '[]'
if rec[1] ~= 'pending' then return {'gone', raw, rec[3], rec[1]} end
local ok, votes = pcall(cjson.decode, raw)
if not ok or type(votes) ~= 'table' then return {'gone', '[]', rec[3], rec[1]} end
for _, vote in ipairs(votes) do
  if type(vote) == 'table' and vote.user == ARGV[1] then return {'already', raw, rec[3], rec[1]} end
end
local approved = ARGV[2] == '1'
table.insert(votes, {user = ARGV[1], approved = approved, tag = ARGV[4]})
local result = 'counted'
local verdict = 'pending'
if not approved then
  result, verdict = 'decided_denied', 'denied'
else
  -- Distinct voters (approvals/votes.py approvals): a repeated copy of a vote is one person.
  local yes, seen = 0, {}
  for _, vote in ipairs(votes) do
    if type(vote) == 'table' and vote.approved == true and type(vote.user) == 'string' and not seen[vote.user] then
      seen[vote.user] = true
      yes = yes + 1
    end
  end
  if yes >= tonumber(ARGV[3]) then result, verdict = 'decided_approved', 'approved' end
end
local encoded = cjson.encode(votes)
redis.call('HSET', KEYS[1], 'votes', encoded, 'state', verdict)
return {result, encoded, rec[3], verdict}
"""

# One use of a grant reserved. KEYS: the grant's hash. `uses` is '' for a grant without a count.
# Returns {} when the grant is gone or used up, else {the sealed record} (the replica opens it and
# checks its expiry: what Lua cannot check, the replica does after).
GRANT_TAKE = """
local rec = redis.call('HMGET', KEYS[1], 'sealed', 'uses')
if not rec[1] or not rec[2] then return {} end
if rec[2] ~= '' then
  if tonumber(rec[2]) == nil or tonumber(rec[2]) <= 0 then return {} end
  redis.call('HINCRBY', KEYS[1], 'uses', -1)
end
return {rec[1]}
"""

# A reserved use given back, to a grant still kept and counted. KEYS: the grant's hash.
GRANT_GIVE_BACK = """
local uses = redis.call('HGET', KEYS[1], 'uses')
if uses and uses ~= '' and tonumber(uses) ~= nil then redis.call('HINCRBY', KEYS[1], 'uses', 1) end
return 1
"""
