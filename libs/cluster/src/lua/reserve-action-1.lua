-- Reserves user actions in a sliding 60 s window: all of them or none.
-- KEYS[1] the user's action log (sorted set, score: ms)
-- ARGV[1] limit, ARGV[2] window ms, ARGV[3] a unique member for this reservation,
-- ARGV[4] how many actions (optional, default 1): members ARGV[3], ARGV[3]#2, …
-- Returns the members' score when reserved, or -1 when the window has no room for them.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local count = tonumber(ARGV[4] or '1')
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
if redis.call('ZCARD', KEYS[1]) + count > tonumber(ARGV[1]) then
  return -1
end
redis.call('ZADD', KEYS[1], now, ARGV[3])
for i = 2, count do
  redis.call('ZADD', KEYS[1], now, ARGV[3] .. '#' .. i)
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return now
