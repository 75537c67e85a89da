// The slot plan of a Redis Cluster (docs/design.md "Redis keys and slots"):
// every key builder puts what is used together in one slot, and every
// script, transaction and multi-key command the services send names keys of
// one slot. Slots are computed by ioredis' own CRC16 (`cluster-key-slot`).
import { readdirSync, readFileSync } from 'node:fs';
import calculateSlot from 'cluster-key-slot';
import { describe, expect, it } from 'vitest';
import { budgetPeriods, type ConversationStore } from '@cs/core';
import { ConversationStops } from '../leases/conversation-stops.js';
import { FailoverBreaker } from '../leases/failover-breaker.js';
import { RedisBudgetLedger } from '../limits/redis-budget-ledger.js';
import { RedisUserActionRateLimiter } from '../limits/redis-rate-limiter.js';
import { UserConcurrencyLimiter } from '../limits/user-concurrency.limiter.js';
import { ConnectionRegistry } from '../realtime/connection-registry.js';
import { ClusterKeys } from './cluster-keys.js';
import type { RedisConnection } from './redis-connections.js';

const keys = new ClusterKeys('cs');
const conversation = '0b7f3c1e-5a2d-4c8e-9f10-2a3b4c5d6e7f';
const other = 'f1e2d3c4-b5a6-4978-8a9b-0c1d2e3f4a5b';
/** Ids may hold any character: braces must not end the tag early. */
const owners = [
  ['tenant', 'user'],
  ['t{1}', 'u}x{'],
  ['a/b', 'c%2Fd'],
] as const;

const slotOf = (key: string) => calculateSlot(key);

describe(ClusterKeys.name, () => {
  it('puts every key and channel of a conversation in the slot of its {id}', () => {
    const slot = slotOf(`{${conversation}}`);
    for (const key of [
      keys.conversationChannel(conversation),
      keys.conversationConnections(conversation),
      keys.conversationFailovers(conversation),
      keys.conversationStops(conversation),
      keys.conversationRoom(`${conversation}.0`),
      keys.conversationRoom(`${conversation}.7`),
    ]) {
      expect(slotOf(key), key).toBe(slot);
    }
  });

  it("puts every key of a user in one slot, another user's elsewhere", () => {
    for (const [tenant, user] of owners) {
      const slot = slotOf(keys.userRunning(tenant, user));
      expect(slotOf(keys.userSlotExpiry(tenant, user))).toBe(slot);
      expect(slotOf(keys.userActions(tenant, user))).toBe(slot);
      expect(slotOf(keys.userBudget(tenant, user, '2026-12-06'))).toBe(slot);
    }
    // Users differing only where an unencoded `}` would cut the tag do not share it.
    expect(keys.userRunning('t{1}', 'u}x{')).not.toBe(keys.userRunning('t{1}', 'u}y{'));
    expect(slotOf(keys.userRunning('t', 'a'))).not.toBe(slotOf(keys.userRunning('t', 'b')));
  });

  it("puts a tenant's budgets in a slot of the tenant's, another tenant's elsewhere", () => {
    for (const [tenant] of owners) {
      expect(slotOf(keys.tenantBudget(tenant, '2026-12'))).toBe(
        slotOf(keys.tenantBudget(tenant, '2027-01')),
      );
    }
    expect(keys.tenantBudget('t}a', '2026-12')).not.toBe(keys.tenantBudget('t}b', '2026-12'));
    expect(slotOf(keys.tenantBudget('a', '2026-12'))).not.toBe(
      slotOf(keys.tenantBudget('b', '2026-12')),
    );
  });

  it("puts every gateway's liveness key in one slot, so that one MGET reads them", () => {
    const slot = slotOf(keys.gatewayAlive('gateway-a'));
    for (const id of ['gateway-b', 'gateway-host-1-abc', 'w{x}', 'worker-1'])
      expect(slotOf(keys.gatewayAlive(id))).toBe(slot);
  });

  it("tags the reconciler's lock with a slot of its own, under the prefix", () => {
    expect(keys.reconcilerLock.startsWith(`${keys.prefix}:{reconciler}:`)).toBe(true);
    expect(slotOf(keys.reconcilerLock)).toBe(slotOf('{reconciler}'));
  });

  it('spreads conversations over the slots of every master', () => {
    // A 3-master cluster splits the slots in thirds: 100 conversations land in each.
    const thirds = new Set(
      Array.from({ length: 100 }, (_, i) =>
        Math.floor((slotOf(keys.conversationChannel(`c-${i}`)) * 3) / 16_384),
      ),
    );
    expect(thirds.size).toBe(3);
  });
});

describe('Lua scripts', () => {
  const dir = new URL('../lua/', import.meta.url);
  const scripts = readdirSync(dir).filter((name) => name.endsWith('.lua'));

  it.each(scripts)('%s touches only the keys it is given', (name) => {
    const lua = readFileSync(new URL(name, dir), 'utf8');
    const declared = Number(/-(\d+)\.lua$/.exec(name)?.[1]);
    const code = lua
      .split('\n')
      .filter((line) => !line.trimStart().startsWith('--'))
      .join('\n');
    const used = [...code.matchAll(/KEYS\[(\d+)\]/g)].map((m) => Number(m[1]));
    expect(used.length).toBeGreaterThan(0);
    expect(Math.max(...used)).toBeLessThanOrEqual(declared);
    // Every redis.call names its key through KEYS (or takes none: TIME).
    for (const call of code.matchAll(/redis\.call\('(\w+)'(?:,\s*([^,)]+))?/g)) {
      if (call[1] === 'TIME') continue;
      expect(call[2], `${name}: ${call[0]}`).toMatch(/^KEYS\[\d+\]$/);
    }
  });
});

/** A command as the services send it: its name and the keys it names. */
interface Sent {
  command: string;
  keys: string[];
}

/**
 * A connection that records what it is sent and answers like an empty Redis:
 * enough for the services to run their commands through it.
 */
function recordingRedis(replies: Partial<Record<string, unknown>> = {}) {
  const sent: Sent[] = [];
  const scriptKeys = new Map<string, number>();
  const answer = (command: string) => Promise.resolve(replies[command] ?? null);
  const target: Record<string, unknown> = {
    status: 'ready',
    defineCommand(name: string, { numberOfKeys }: { numberOfKeys: number }) {
      scriptKeys.set(name, numberOfKeys);
      target[name] = (...args: unknown[]) => {
        sent.push({ command: name, keys: args.slice(0, numberOfKeys).map(String) });
        return answer(name);
      };
    },
    multi() {
      const queued: string[] = [];
      const chain: Record<string, unknown> = {
        exec: () => {
          sent.push({ command: 'MULTI', keys: queued });
          return Promise.resolve([]);
        },
      };
      for (const command of ['incr', 'pexpire', 'set', 'del', 'hset', 'zadd'])
        chain[command] = (key: string) => {
          queued.push(key);
          return chain;
        };
      return chain;
    },
    pipeline() {
      throw new Error('pipelines are not part of the slot plan');
    },
    mget(...args: unknown[]) {
      const named = args.flat().map(String);
      sent.push({ command: 'mget', keys: named });
      return Promise.resolve(named.map(() => '1'));
    },
  };
  const redis = new Proxy(target, {
    get(object, property: string) {
      if (property in object) return object[property];
      return (key: unknown) => {
        sent.push({ command: property, keys: [String(key)] });
        return answer(property);
      };
    },
  });
  return { redis: redis as unknown as RedisConnection, sent };
}

/** Every command sent names keys of one slot. */
function expectOneSlotEach(sent: readonly Sent[]): void {
  expect(sent.length).toBeGreaterThan(0);
  for (const { command, keys: named } of sent) {
    const slots = new Set(named.map(slotOf));
    expect(slots.size, `${command} ${named.join(' ')}`).toBe(1);
  }
}

describe('what the services send', () => {
  it('UserConcurrencyLimiter: each script names one user’s keys, renewals one call per user', async () => {
    const { redis, sent } = recordingRedis({
      cs_acquire_slot_2: [1],
      cs_renew_slots_2: [],
      cs_release_slot_2: 1,
    });
    const limiter = new UserConcurrencyLimiter(redis, keys, {
      limit: 3,
      policy: 'evict_oldest',
      slotTtlMs: 30_000,
    });
    for (const [tenant, user] of owners) {
      await limiter.acquire(tenant, user, conversation);
      await limiter.reclaim(tenant, user, conversation);
      await limiter.release(tenant, user, conversation);
    }
    await limiter.renew(
      owners.map(([tenantId, userId], i) => ({
        tenantId,
        userId,
        conversationId: i % 2 ? conversation : other,
        lastActivity: 0,
      })),
    );
    expect(sent.filter((s) => s.command === 'cs_renew_slots_2')).toHaveLength(owners.length);
    expectOneSlotEach(sent);
  });

  it('RedisUserActionRateLimiter: the reservation and its cancel name the user’s key', async () => {
    const { redis, sent } = recordingRedis({ cs_reserve_action_1: 1 });
    const limiter = new RedisUserActionRateLimiter(redis, keys, 10);
    const reserved = await limiter.reserve('tenant', 'user', 3);
    if (reserved.reserved) await reserved.cancel();
    expect(sent.map((s) => s.command)).toEqual(['cs_reserve_action_1', 'zrem']);
    expectOneSlotEach(sent);
  });

  it('RedisBudgetLedger: each hold, settle and release names one budget’s key', async () => {
    const { redis, sent } = recordingRedis({ cs_hold_budget_1: -1, cs_settle_budget_1: 1 });
    const ledger = new RedisBudgetLedger(redis, keys, () => Promise.resolve(0));
    for (const [tenant, user] of owners) {
      for (const period of budgetPeriods(
        { userUsdPerDay: 1, tenantUsdPerMonth: 10 },
        { tenantId: tenant, userId: user },
        Date.UTC(2026, 11, 31, 23, 59),
      )) {
        await ledger.hold(period, 'hold', 0.5, 1000);
        await ledger.settle(period, 'hold', 0.25);
        await ledger.release(period, 'other');
      }
    }
    expect(new Set(sent.map((s) => s.command))).toEqual(
      new Set(['cs_hold_budget_1', 'cs_settle_budget_1', 'hdel']),
    );
    expectOneSlotEach(sent);
  });

  it('FailoverBreaker: the crash count names the conversation’s key', async () => {
    const { redis, sent } = recordingRedis({ cs_record_failover_1: 1 });
    const record = { lastEventId: 0, answeredThrough: 0, agentState: 'loading' };
    const store = {
      getConversation: () => Promise.resolve(record),
      readEvents: () => Promise.resolve([]),
    } as unknown as ConversationStore;
    const breaker = new FailoverBreaker(redis, keys, store, { maxFailovers: 3, windowMs: 1_000 });
    await breaker.tripsOnCrash({
      tenantId: 't',
      userId: 'u',
      conversationId: conversation,
      incarnation: '0',
    });
    expect(sent.map((s) => s.command)).toEqual(['cs_record_failover_1']);
    expectOneSlotEach(sent);
  });

  it('ConversationStops: the mark is a transaction on one key', async () => {
    const { redis, sent } = recordingRedis();
    await new ConversationStops(redis, keys).mark(conversation);
    const stops = keys.conversationStops(conversation);
    expect(sent).toEqual([{ command: 'MULTI', keys: [stops, stops] }]);
    expectOneSlotEach(sent);
  });

  it('ConnectionRegistry: one MGET of the liveness keys, plain commands at stop', async () => {
    const gateways = { 'gateway-a': '1', 'gateway-b': '2', 'gateway-c': '3' };
    const { redis, sent } = recordingRedis({ hgetall: gateways });
    const registry = new ConnectionRegistry(redis, keys, 'gateway-a', 15_000);
    await registry.attach('socket-1', conversation);
    await registry.attach('socket-2', other);
    expect(await registry.count(conversation)).toBe(6);
    await registry.stop();
    expect(sent.filter((s) => s.command === 'mget')).toHaveLength(1);
    expectOneSlotEach(sent);
  });
});
