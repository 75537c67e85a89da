// The ConversationManager contract against the ClusteredConversationManager:
// real Redis (a key prefix of its own), real BullMQ, a Postgres scratch
// database, and two ConversationHosts (workers) in this process with a short
// lease TTL. Each manager is a gateway with its own connection registry.
// Published traffic is observed as a gateway receives it: the room of each
// conversation is subscribed to as soon as the conversation is created, as a
// gateway does when a client attaches. It runs on one conversation queue
// (the default) and on eight (CONVERSATION_QUEUES), which every host consumes.
import type { Redis } from 'ioredis';
import { vi } from 'vitest';
import { AgentRegistry } from '@cs/agents';
import {
  ClusterKeys,
  ClusteredConversationManager,
  ConnectionRegistry,
  ConversationHost,
  ConversationInbox,
  ConversationJobs,
  ConversationStops,
  RedisRoomBroadcaster,
  RedisRoomSubscriber,
  ScopedStateChannel,
  UserConcurrencyLimiter,
  conversationJobId,
  leaseTiming,
  openRedis,
} from '@cs/cluster';
import { roomKey, type ConversationManager, type RoomSink } from '@cs/core';
import type { StatusUpdate, StoredEvent } from '@cs/protocol';
import { openStore, type OpenedStore } from '@cs/store';
import {
  createEchoConversation,
  createScratchDatabase,
  deleteKeys,
  testRedisUrl,
  uniqueName,
  type ScratchDatabase,
} from '../support/services.js';
import {
  conversationManagerContract,
  type ConversationManagerFixture,
} from './conversation-manager.contract.js';

const LEASE_TTL_MS = 2_000;
const GATEWAY_LIVENESS_MS = 15_000;
const WORKER_COUNT = 2;

/** Everything opened, closed in reverse order at teardown whatever failed. */
class Resources {
  private readonly closers: Array<() => Promise<unknown> | void> = [];

  add(close: () => Promise<unknown> | void): void {
    this.closers.push(close);
  }

  redis(name: string): Redis {
    const connection = openRedis(testRedisUrl(), name);
    this.add(() => connection.disconnect());
    return connection;
  }

  async closeAll(): Promise<void> {
    const failures: unknown[] = [];
    for (const close of this.closers.splice(0).reverse()) {
      try {
        await close();
      } catch (error) {
        failures.push(error);
      }
    }
    if (failures.length > 0) throw new AggregateError(failures, 'teardown failed');
  }
}

/** Resolves with `promise`, or gives up after `ms` (a stuck close must not hang the suite). */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not finish within ${ms} ms`)), ms);
  });
  try {
    await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

async function clusterFixture(queueCount: number): Promise<ConversationManagerFixture> {
  const resources = new Resources();
  const prefix = uniqueName('cs_contract');
  const keys = new ClusterKeys(prefix);
  const timing = leaseTiming(LEASE_TTL_MS);
  const agents = new AgentRegistry();
  const hostLog: string[] = [];
  let scratch: ScratchDatabase | undefined;

  try {
    scratch = await createScratchDatabase('cs_contract_cl', { migrated: true });
    const dropScratch = scratch;
    resources.add(() => dropScratch.drop());
    // Keys go last (closed first is the reverse): a connection of its own.
    const janitor = resources.redis(`${prefix}:janitor`);
    resources.add(() => deleteKeys(janitor, prefix));

    const openDatabase = async (): Promise<OpenedStore> => {
      const opened = await openStore({ databaseUrl: dropScratch.url, dataDir: '', migrate: true });
      resources.add(() => opened.close());
      return opened;
    };
    const gatewayStore = (await openDatabase()).store;

    // --- the observer: a gateway's subscriptions to the conversations' rooms
    const received = {
      events: new Map<string, StoredEvent[]>(),
      statuses: new Map<string, StatusUpdate[]>(),
    };
    // Rooms are `<conversation id>.<incarnation>`: recorded by conversation id.
    const idOf = (room: string) => room.split('.')[0]!;
    const recorder: RoomSink = {
      publishEvents: (room, events) =>
        received.events.set(idOf(room), [...(received.events.get(idOf(room)) ?? []), ...events]),
      publishStatus: (room, status) =>
        received.statuses.set(idOf(room), [...(received.statuses.get(idOf(room)) ?? []), status]),
      publishStream: () => undefined,
      catchUpStream: () => undefined,
    };
    const observer = new RedisRoomSubscriber(resources.redis(`${prefix}:rooms`), keys, () => {
      // no stream to catch up with: these tests record events and statuses
    });

    // --- the workers
    const hosts: ConversationHost[] = [];
    const workerIds: string[] = [];
    for (let n = 1; n <= WORKER_COUNT; n += 1) {
      const workerId = `${prefix}-worker-${n}`;
      const redis = resources.redis(`${workerId}:commands`);
      const subscriber = resources.redis(`${workerId}:inbox`);
      const host = new ConversationHost({
        store: (await openDatabase()).store,
        agents,
        broadcaster: new RedisRoomBroadcaster(redis, keys),
        inbox: new ConversationInbox(redis, subscriber, keys),
        scopedState: new ScopedStateChannel(redis, subscriber, keys),
        limiter: new UserConcurrencyLimiter(redis, keys, {
          limit: 2,
          policy: 'evict_oldest',
          slotTtlMs: timing.slotTtlMs,
        }),
        connections: new ConnectionRegistry(redis, keys, workerId, timing.slotTtlMs),
        redis,
        keys,
        bullConnection: resources.redis(`${workerId}:queue`),
        options: {
          workerId,
          concurrency: 50,
          queueCount,
          timing,
          idleTimeoutMs: 3_600_000,
          maxIterations: 10,
          maxFailovers: 5,
          failoverWindowMs: 600_000,
        },
        log: (level, text) => {
          hostLog.push(`${workerId} ${level}: ${text}`);
        },
      });
      hosts.push(host);
      workerIds.push(workerId);
    }
    // Drained together (before the connections close), so that no host takes
    // over what another hands back.
    resources.add(() =>
      within(Promise.all(hosts.map((host) => host.drain())), 20_000, 'draining the workers').catch(
        async (error: unknown) => {
          await Promise.all(hosts.map((host) => host.kill()));
          throw error;
        },
      ),
    );
    for (const host of hosts) host.start();

    // --- the gateways: one per manager, sharing the queue's connection
    const gatewayRedis = resources.redis(`${prefix}:gateway`);
    const jobs = new ConversationJobs(gatewayRedis, keys, { queueCount });
    resources.add(() => jobs.close());
    const broadcaster = new RedisRoomBroadcaster(gatewayRedis, keys);
    const inbox = new ConversationInbox(gatewayRedis, null, keys);
    const managers: ConversationManager[] = [];
    resources.add(() => Promise.all(managers.map((manager) => manager.shutdown())));

    return {
      agentHosts: workerIds,

      async untilUnheld(ref) {
        await vi.waitFor(
          async () => {
            const job = await jobs
              .queueOf(ref.conversationId)
              .getJob(conversationJobId(ref.conversationId));
            if (job) {
              const state = await job.getState();
              throw new Error(`the lease job of ${ref.conversationId} is still ${state}`);
            }
          },
          { timeout: 10_000, interval: 25 },
        );
      },

      async createManager(options) {
        const gatewayId = `${prefix}-gateway-${managers.length + 1}`;
        const connections = new ConnectionRegistry(
          gatewayRedis,
          keys,
          gatewayId,
          GATEWAY_LIVENESS_MS,
        );
        await connections.start();
        const manager = new ClusteredConversationManager({
          store: gatewayStore,
          broadcaster,
          jobs,
          inbox,
          stops: new ConversationStops(gatewayRedis, keys),
          limiter: new UserConcurrencyLimiter(gatewayRedis, keys, {
            limit: options.maxConcurrentConversations,
            policy: options.concurrencyPolicy,
            slotTtlMs: timing.slotTtlMs,
          }),
          connections,
          limit: options.maxConcurrentConversations,
          stopTimeoutMs: LEASE_TTL_MS + 2_000,
          metrics: options.metrics,
        });
        managers.push(manager);
        return manager;
      },

      async createConversation(owner) {
        const ref = await createEchoConversation(gatewayStore, owner);
        await observer.open(roomKey(ref), recorder);
        return ref;
      },

      storedEvents: (ref) =>
        gatewayStore.readEvents(ref.tenantId, ref.conversationId, { fromId: 0, limit: 10_000 }),
      storedConversation: (ref) => gatewayStore.getConversation(ref.tenantId, ref.conversationId),
      publishedEvents: (id) => [...(received.events.get(id) ?? [])],
      publishedStatuses: (id) => [...(received.statuses.get(id) ?? [])],

      async teardown() {
        const errors = hostLog.filter((line) => / error: /.test(line));
        await resources.closeAll();
        if (errors.length > 0) throw new Error(`the workers logged errors:\n${errors.join('\n')}`);
      },
    };
  } catch (error) {
    await resources.closeAll().catch(() => undefined);
    throw error;
  }
}

conversationManagerContract('ClusteredConversationManager', () => clusterFixture(1));
conversationManagerContract('ClusteredConversationManager on 8 queues', () => clusterFixture(8));
