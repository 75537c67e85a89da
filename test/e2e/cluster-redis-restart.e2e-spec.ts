// A cluster on a Redis of its own, restarted under a connected client
// (one Redis only: on a Redis Cluster, master kills and failovers are
// redis-cluster.e2e-spec.ts's).
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { ConversationClient } from '../support/clients.js';
import { holderOf, readAllEvents, until, type ClusterOptions } from '../support/cluster.js';
import { type AppProcess } from '../support/processes.js';
import { startPrivateRedis } from '../support/redis-server.js';
import {
  LEASE_TTL_MS,
  clusterPerTest,
  createConversation,
  expectEveryEventOnce,
  expectExactlyOnce,
  isReady,
  keptThrough,
  leaseOf,
  sendMessage,
  waitForAnswers,
  workerEpochs,
  workerIdOf,
} from '../support/cluster-conversations.js';

const fixture = clusterPerTest();
const cluster_ = (options: ClusterOptions) => fixture.start(options);

describe('a cluster across a Redis restart', () => {
  it.each([
    { outage: 'a quick restart', downMs: 0, workers: 2, leaseMoves: false },
    // Long enough for the job's lock to lapse: BullMQ hands the job out again
    // once Redis is back, here necessarily to the worker that held it. A timed
    // outage: with Redis down, nothing shows when the lock would have lapsed.
    {
      outage: 'an outage longer than the lease',
      downMs: LEASE_TTL_MS + 1000,
      workers: 1,
      leaseMoves: true,
    },
  ])(
    'keeps a connected client whole across a Redis restart ($outage)',
    async ({ downMs, workers, leaseMoves }) => {
      const ownRedis = await startPrivateRedis();
      fixture.redis = ownRedis;
      const c = await cluster_({ gateways: 2, workers, redisUrl: ownRedis.url });
      const [g1, g2] = c.gateways as [AppProcess, AppProcess];
      const token = await c.token('frank');
      const id = await createConversation(g1.url, token);
      const client = await ConversationClient.connect(g1.url, token, { conversation_id: id });
      try {
        await client.waitFor(isReady, 10_000, 'agent ready');
        const sent: string[] = [];
        for (let n = 0; n < 3; n += 1) {
          const ack = await client.message(`before ${n}`);
          sent.push(`before ${n}`);
          await client.waitForReply(ack.ok ? ack.event_id : -1);
        }

        const epochBefore = (await leaseOf(c, id)).epoch;
        await ownRedis.restart(downMs);
        // Back when every process reaches Redis again.
        await until(
          async () => {
            const ready = await Promise.all(
              [...c.gateways, ...c.workers].map((p) =>
                fetch(`${p.url}/readyz`).then(
                  (r) => r.ok,
                  () => false,
                ),
              ),
            );
            return ready.every(Boolean);
          },
          'every process ready again',
          20_000,
          100,
        );
        expect(client.socket.connected).toBe(true);
        for (let n = 0; n < 5; n += 1) {
          const ack = await client.message(`after socket ${n}`);
          expect(ack.ok).toBe(true);
          sent.push(`after socket ${n}`);
          await sendMessage(g2.url, token, id, `after rest ${n}`);
          sent.push(`after rest ${n}`);
        }
        expectExactlyOnce(await waitForAnswers(g1.url, token, id, 20_000), sent);
        if (leaseMoves) {
          await until(
            async () => (await leaseOf(c, id)).epoch > epochBefore,
            'the lapsed lease to be taken again',
            10_000,
          );
        }
        // Settled once the current holder has started (written under the current epoch).
        await until(
          async () => (await workerEpochs(c, id)).at(-1) === (await leaseOf(c, id)).epoch,
          'the current holder to start',
          10_000,
        );
        // It goes on, hosted by one worker under the lease Postgres records.
        await sendMessage(g2.url, token, id, 'once settled');
        sent.push('once settled');
        await waitForAnswers(g1.url, token, id);
        const holder = await holderOf(c.workers, id);
        const lease = await leaseOf(c, id);
        expect(lease.owner).toBe(await workerIdOf(holder));
        // And it stays there: the job is not handed out again and again.
        await keptThrough(
          c,
          () => new Redis(ownRedis.url, { maxRetriesPerRequest: 1 }),
          [id],
          LEASE_TTL_MS + 1000,
        );
        expect(await leaseOf(c, id)).toEqual(lease);
        expect(await holderOf(c.workers, id)).toBe(holder);
        await expectEveryEventOnce(client, g1.url, token, id);
        expectExactlyOnce(await readAllEvents(g1.url, token, id), sent);

        // The queue works again too: a new conversation starts and answers.
        const fresh = await createConversation(g2.url, token);
        await sendMessage(g2.url, token, fresh, 'a new conversation');
        expectExactlyOnce(await waitForAnswers(g2.url, token, fresh), ['a new conversation']);
      } finally {
        client.close();
      }
    },
  );
});
