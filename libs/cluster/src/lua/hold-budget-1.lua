-- Holds a model request's worst case in one budget's period, if it fits.
-- KEYS[1] the period's hash: field `spent` (USD settled), and one field
--   `h:<hold id>` per hold: "<USD> <expiry ms>"
-- ARGV[1] hold id, ARGV[2] USD to hold, ARGV[3] the budget's limit (USD),
-- ARGV[4] hold TTL ms (a worker that dies holding it), ARGV[5] key TTL ms
-- (past the period's end), ARGV[6] the spent base read from Postgres, or ''
-- Returns 1 held, 0 refused (spent, held and this would pass the limit), or
-- -1 when the hash has no spent base and none was given: the caller reads
-- it from the usage table and calls again with it.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local spent = redis.call('HGET', KEYS[1], 'spent')
if not spent then
  if ARGV[6] == '' then
    return -1
  end
  spent = ARGV[6]
  redis.call('HSET', KEYS[1], 'spent', spent)
end
spent = tonumber(spent)
local held = 0
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local name = fields[i]
  if string.sub(name, 1, 2) == 'h:' then
    local amount, expires = string.match(fields[i + 1], '^(%S+) (%S+)$')
    if tonumber(expires) <= now then
      redis.call('HDEL', KEYS[1], name)
    else
      held = held + tonumber(amount)
    end
  end
end
local amount = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
if spent >= limit or spent + held + amount > limit then
  return 0
end
redis.call('HSET', KEYS[1], 'h:' .. ARGV[1], ARGV[2] .. ' ' .. (now + tonumber(ARGV[4])))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
