-- Records a crashed holder of a conversation and counts the crashes on the same work.
-- KEYS[1] the conversation's failovers (sorted set, member: '<work>|<ms>-<unique>', score: ms)
-- ARGV[1] window ms, ARGV[2] what the holder was doing ('message:<id>' or 'loading'),
-- ARGV[3] a unique suffix for this crash
-- Crashes older than the window are forgotten; the set expires a window after the last one.
-- Returns how many crashes on that work the window holds, this one included.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local window = tonumber(ARGV[1])
local prefix = ARGV[2] .. '|'
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('ZADD', KEYS[1], now, prefix .. now .. '-' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], window)
local crashes = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if string.sub(member, 1, #prefix) == prefix then
    crashes = crashes + 1
  end
end
return crashes
