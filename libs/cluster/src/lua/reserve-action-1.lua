-- Reserves one user action in a sliding 60 s window.
-- KEYS[1] the user's action log (sorted set, score: ms)
-- ARGV[1] limit, ARGV[2] window ms, ARGV[3] a unique member for this action
-- Returns the member's score when reserved, or -1 when the window is full.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  return -1
end
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return now
