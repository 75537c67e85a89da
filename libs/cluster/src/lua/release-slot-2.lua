-- Frees a user's slot held by a conversation.
-- KEYS[1] running set, KEYS[2] expiry hash; ARGV[1] conversation id
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
