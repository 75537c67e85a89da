-- Takes one of a user's running-conversation slots, atomically.
-- KEYS[1] running set (member: conversation id, score: last activity ms)
-- KEYS[2] expiry hash (conversation id -> ms after which the slot is free)
-- ARGV[1] conversation id, ARGV[2] limit, ARGV[3] policy ('evict_oldest'|'reject'),
-- ARGV[4] slot lifetime ms (renewed by the holder)
-- Returns {1} taken, {3} held already, {0} refused, {2, victim} taken by evicting victim.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local conversation = ARGV[1]
local limit = tonumber(ARGV[2])
local expires = now + tonumber(ARGV[4])

-- Slots whose holder stopped renewing them (a crashed process) are free again.
local expiry = redis.call('HGETALL', KEYS[2])
for i = 1, #expiry, 2 do
  if tonumber(expiry[i + 1]) < now then
    redis.call('HDEL', KEYS[2], expiry[i])
    redis.call('ZREM', KEYS[1], expiry[i])
  end
end

if redis.call('ZSCORE', KEYS[1], conversation) then
  redis.call('HSET', KEYS[2], conversation, expires)
  return {3}
end

if redis.call('ZCARD', KEYS[1]) < limit then
  redis.call('ZADD', KEYS[1], now, conversation)
  redis.call('HSET', KEYS[2], conversation, expires)
  return {1}
end

if ARGV[3] ~= 'evict_oldest' then
  return {0}
end

local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)
local victim = oldest[1]
redis.call('ZREM', KEYS[1], victim)
redis.call('HDEL', KEYS[2], victim)
redis.call('ZADD', KEYS[1], now, conversation)
redis.call('HSET', KEYS[2], conversation, expires)
return {2, victim}
