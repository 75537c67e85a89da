// A worker host on several conversation queues (CONVERSATION_QUEUES): real
// Redis, BullMQ and Postgres in this process. It consumes every queue, and
// hosts at most its concurrency over all of them together.
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { AgentRegistry } from '@cs/agents';
import {
  ClusteredConversationManager,
  ConnectionRegistry,
  ConversationHost,
  ConversationInbox,
  ConversationJobs,
  ConversationStops,
  RedisRoomBroadcaster,
  ScopedStateChannel,
  UserConcurrencyLimiter,
  conversationQueueIndex,
  conversationQueueNames,
  leaseTiming,
} from '@cs/cluster';
import type { ConversationRef } from '@cs/core';
import { openScratchBackends, type ScratchBackends } from '../support/scratch-backends.js';
import { createEchoConversation, uniqueName } from '../support/services.js';

const LEASE_TTL_MS = 2_000;
const QUEUES = 4;
const CONCURRENCY = 2;

describe(`${ConversationHost.name} on ${QUEUES} queues`, () => {
  let backends: ScratchBackends;
  let host: ConversationHost;
  let jobs: ConversationJobs;
  let manager: ClusteredConversationManager;

  beforeAll(async () => {
    backends = await openScratchBackends('cs_host_queues', 'host-queues-test');
    const { opened, redis, keys } = backends;
    const subscriber = backends.connect('inbox');
    const timing = leaseTiming(LEASE_TTL_MS);
    const limiter = new UserConcurrencyLimiter(redis, keys, {
      limit: 3,
      policy: 'reject',
      slotTtlMs: timing.slotTtlMs,
    });
    const broadcaster = new RedisRoomBroadcaster(redis, keys);
    const connections = new ConnectionRegistry(redis, keys, 'gateway-test', 15_000);
    host = new ConversationHost({
      store: opened.store,
      agents: new AgentRegistry(),
      broadcaster,
      inbox: new ConversationInbox(redis, subscriber, keys),
      scopedState: new ScopedStateChannel(redis, subscriber, keys),
      limiter,
      connections,
      redis,
      keys,
      bullConnection: backends.connect('queue'),
      options: {
        workerId: 'host-queues-worker',
        concurrency: CONCURRENCY,
        queueCount: QUEUES,
        timing,
        idleTimeoutMs: 3_600_000,
        maxIterations: 10,
        maxFailovers: 2,
        failoverWindowMs: 60_000,
      },
      log: () => undefined,
    });
    host.start();
    jobs = new ConversationJobs(redis, keys, { queueCount: QUEUES });
    manager = new ClusteredConversationManager({
      store: opened.store,
      broadcaster,
      jobs,
      inbox: new ConversationInbox(redis, null, keys),
      stops: new ConversationStops(redis, keys),
      limiter,
      connections,
      limit: 3,
      stopTimeoutMs: LEASE_TTL_MS + 2_000,
    });
  });

  afterAll(async () => {
    await host?.drain();
    await jobs?.close();
    await backends?.close();
  });

  /** A new echo conversation of a user of its own, whose id falls in queue `queue`. */
  async function conversationIn(queue: number): Promise<ConversationRef> {
    for (;;) {
      const owner = { tenantId: uniqueName('tenant'), userId: 'user' };
      const ref = await createEchoConversation(backends.opened.store, owner);
      if (conversationQueueIndex(ref.conversationId, QUEUES) === queue) return ref;
      await backends.opened.store.deleteConversation(ref.tenantId, ref.conversationId);
    }
  }

  it('consumes every queue, and hosts at most its concurrency over all of them; a stop makes room for one waiting', async () => {
    expect(host.queueNames).toEqual(conversationQueueNames(QUEUES));
    // One conversation in each queue: more than the host may hold.
    const refs = await Promise.all(
      Array.from({ length: QUEUES }, (_, queue) => conversationIn(queue)),
    );
    for (const ref of refs) await manager.ensureRunning(ref);
    await vi.waitFor(() => expect(host.conversations.length).toBe(CONCURRENCY), {
      timeout: 10_000,
      interval: 50,
    });
    const states = async () => Promise.all(refs.map((ref) => jobs.state(ref.conversationId)));
    // The others wait in their own queues, and stay there while the host is full.
    for (let check = 0; check < 10; check += 1) {
      expect(host.conversations.length).toBe(CONCURRENCY);
      const now = await states();
      expect(now.filter((state) => state === 'active').length).toBe(CONCURRENCY);
      expect(now.filter((state) => state === 'waiting').length).toBe(QUEUES - CONCURRENCY);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }

    const held = refs.filter((ref) => host.conversations.includes(ref.conversationId));
    await manager.stop(held[0]!);
    // A waiting one, of another queue, takes its place.
    await vi.waitFor(
      async () => {
        expect(host.conversations.length).toBe(CONCURRENCY);
        expect(host.conversations).not.toContain(held[0]!.conversationId);
        expect((await states()).filter((state) => state === 'waiting').length).toBe(
          QUEUES - CONCURRENCY - 1,
        );
      },
      { timeout: 10_000, interval: 50 },
    );
  });
});
