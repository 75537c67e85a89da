-- Ends a hold and counts what its request cost as spent.
-- KEYS[1] the period's hash (see hold-budget-1.lua)
-- ARGV[1] hold id, ARGV[2] USD spent
-- A hash without a spent base (Redis lost it since the hold) is left so: the
-- next hold reads the base from the usage table, which has this request's
-- usage once its step is stored.
redis.call('HDEL', KEYS[1], 'h:' .. ARGV[1])
if redis.call('HEXISTS', KEYS[1], 'spent') == 1 then
  redis.call('HINCRBYFLOAT', KEYS[1], 'spent', ARGV[2])
end
return 1
