import { UnavailableError } from '@cs/core';
import { Redis, type RedisOptions } from 'ioredis';

/**
 * Opens an ioredis connection to `REDIS_URL` (its database number honoured).
 * Its commands wait out an outage (BullMQ's Worker needs
 * `maxRetriesPerRequest: null`): for those a client's request waits on, see
 * `openRequestRedis`. RESP2 keeps replies in the shapes
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
 * The longest a command on a request's path waits for its reply while the
 * connection looks up (Redis hung, or the network dropped without a reset).
 * Far above any answer a working Redis gives (well under a millisecond for
 * these commands, a few with a fork or an AOF rewrite); short enough that the
 * client hears `UNAVAILABLE` instead of giving up first.
 */
export const REQUEST_COMMAND_TIMEOUT_MS = 2_000;

/**
 * A connection for the commands a client's request waits on (a gateway's
 * limits, stop marks, queue adds, wake-ups): while Redis is unreachable they
 * fail at once instead of waiting in the offline queue for as long as the
 * outage lasts, so that the request is answered `UNAVAILABLE` and what it
 * asked for is not carried out later, once the client has given up (and maybe
 * sent it again). A command in flight when the connection drops fails with it
 * and is never sent again after the reconnect; one unanswered for
 * `REQUEST_COMMAND_TIMEOUT_MS` fails. BullMQ takes such a connection for a
 * Queue (a producer); never for a Worker, whose blocking connection needs
 * `maxRetriesPerRequest: null`, nor for subscriptions. It refuses commands
 * until it is first connected: see `connected`.
 */
export function openRequestRedis(url: string, name: string, options: RedisOptions = {}): Redis {
  return openRedis(url, name, {
    enableOfflineQueue: false,
    maxRetriesPerRequest: 0,
    autoResendUnfulfilledCommands: false,
    commandTimeout: REQUEST_COMMAND_TIMEOUT_MS,
    ...options,
  });
}

/** `openPublisher`'s auto-pipelined PUBLISH, failing fast as `openRequestRedis`: a gateway's wake-ups. */
export function openRequestPublisher(url: string, name: string): Redis {
  return openRequestRedis(url, name, { enableAutoPipelining: true });
}

/** Resolves once the connection is up (at start, before it takes requests). */
export function connected(redis: Redis): Promise<void> {
  if (redis.status === 'ready') return Promise.resolve();
  return new Promise((resolve) => redis.once('ready', () => resolve()));
}

/**
 * Refuses (`UNAVAILABLE`) unless the connection is up: checked before
 * anything is stored that Redis must hand on, so that an outage refuses the
 * request whole instead of leaving it stored and not handed on. No round
 * trip: a Redis that stopped or restarts closes the connection at once (one
 * that hangs is caught by the commands' timeout).
 */
export function assertConnected(redis: Pick<Redis, 'status'>): void {
  if (redis.status !== 'ready') {
    throw new UnavailableError('the service cannot reach Redis; try again shortly');
  }
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
