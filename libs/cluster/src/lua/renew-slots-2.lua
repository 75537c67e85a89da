-- Renews a holder's slots of one user and records their last activity.
-- KEYS[1] running set, KEYS[2] expiry hash
-- ARGV[1] slot lifetime ms, then pairs: conversation id, last activity ms (0: unchanged)
-- A slot that was taken away (evicted, released) is not brought back.
-- Returns the ids that are no longer held.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local expires = now + tonumber(ARGV[1])
local lost = {}
for i = 2, #ARGV, 2 do
  local conversation = ARGV[i]
  if redis.call('ZSCORE', KEYS[1], conversation) then
    redis.call('HSET', KEYS[2], conversation, expires)
    local activity = tonumber(ARGV[i + 1])
    if activity > 0 then
      redis.call('ZADD', KEYS[1], 'XX', activity, conversation)
    end
  else
    table.insert(lost, conversation)
  end
end
return lost
