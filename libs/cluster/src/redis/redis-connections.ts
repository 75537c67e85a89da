import { Redis, type RedisOptions } from 'ioredis';

/**
 * Opens an ioredis connection to `REDIS_URL` (its database number honoured).
 * BullMQ needs `maxRetriesPerRequest: null`; RESP2 keeps replies in the shapes
 * the Socket.IO adapter and BullMQ were written for. No auto-pipelining: it
 * defers every command to the next turn of the event loop, and fails
 * commands defined with `defineCommand` (our Lua scripts).
 */
export function openRedis(url: string, name: string, options: RedisOptions = {}): Redis {
  const redis = new Redis(url, {
    connectionName: name,
    maxRetriesPerRequest: null,
    enableReadyCheck: true,
    protocol: 2,
    retryStrategy: (attempt) => Math.min(50 * 2 ** attempt, 2000),
    ...options,
  });
  // ioredis reconnects by itself; say so once per outage rather than on every attempt.
  let reported = false;
  redis.on('error', (error: Error) => {
    if (reported) return;
    reported = true;
    process.stderr.write(`redis (${name}): ${error.message}; reconnecting\n`);
  });
  redis.on('ready', () => {
    if (reported) process.stderr.write(`redis (${name}): connected again\n`);
    reported = false;
  });
  return redis;
}

/**
 * A connection for PUBLISH only (events to the rooms, wake-ups to holders):
 * the publishes of one turn of the event loop leave in one write
 * (auto-pipelining), which under load saves a system call and a Redis wake-up
 * per message. Measured with 5,000 deltas/s (APPEND + PUBLISH) from one
 * process: Redis used 4 % of a core, against 12 % for the same commands each
 * written at once and 16 % for one Lua script per delta; the idle stream's
 * price is the deferral to the next turn (about 0.2 ms on the streaming
 * bench's floor). Not for commands defined with `defineCommand` (our Lua
 * scripts), which auto-pipelining cannot send.
 */
export function openPublisher(url: string, name: string): Redis {
  return openRedis(url, name, { enableAutoPipelining: true });
}

/**
 * Redis must not evict keys (BullMQ's and ours would vanish): returns a warning
 * when `maxmemory-policy` is anything but `noeviction`, or null.
 */
export async function checkEvictionPolicy(redis: Redis): Promise<string | null> {
  try {
    const reply = (await redis.config('GET', 'maxmemory-policy')) as unknown;
    const values = Array.isArray(reply)
      ? (reply as string[])
      : Object.values(reply as Record<string, string>);
    const policy = values[values.length - 1];
    if (policy && policy !== 'noeviction') {
      return `Redis maxmemory-policy is "${policy}": set it to "noeviction", or queued conversations and limits may be lost`;
    }
    return null;
  } catch {
    return 'could not read Redis maxmemory-policy (CONFIG GET refused): make sure it is "noeviction"';
  }
}
