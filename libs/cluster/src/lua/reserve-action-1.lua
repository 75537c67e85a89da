-- Reserves user actions in a sliding 60 s window: all of them or none.
-- KEYS[1] the user's action log (sorted set, score: ms)
-- ARGV[1] limit, ARGV[2] window ms, ARGV[3] a unique member for this reservation,
-- ARGV[4] how many actions (optional, default 1): members ARGV[3], ARGV[3]#2, …
-- Returns the members' score when reserved; when the window has no room,
-- -1 - the ms until it has (until enough of its oldest have left), or -1 when
-- it never will (more actions than the limit).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local count = tonumber(ARGV[4] or '1')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local held = redis.call('ZCARD', KEYS[1])
if held + count > limit then
  if count > limit then
    return -1
  end
  local leaving = redis.call('ZRANGE', KEYS[1], held + count - limit - 1, held + count - limit - 1, 'WITHSCORES')
  local wait = 0
  if leaving[2] then
    wait = math.max(0, tonumber(leaving[2]) + window - now)
  end
  return -1 - wait
end
redis.call('ZADD', KEYS[1], now, ARGV[3])
for i = 2, count do
  redis.call('ZADD', KEYS[1], now, ARGV[3] .. '#' .. i)
end
redis.call('PEXPIRE', KEYS[1], window)
return now
