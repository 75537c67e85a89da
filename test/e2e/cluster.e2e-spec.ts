// The cluster's failover, fencing, hand-off and drain as clients and operators
// see them, each within a bound that tells it from its fallback: real gateway
// and worker processes from dist/, workers killed, paused and drained, a
// gateway drained mid-conversation. The figures are the bench's (failover.mjs).
import { describe, expect, it } from 'vitest';
import { ClusterKeys } from '@cs/cluster';
import { CLIENT_DRAIN_TIMEOUT_MS } from '@cs/process';
import { ConversationClient, api, ids } from '../support/clients.js';
import { openFrozenSocket } from '../support/frozen-socket.js';
import {
  holderOf,
  readAllEvents,
  until,
  workerHealth,
  type ClusterOptions,
} from '../support/cluster.js';
import { type AppProcess } from '../support/processes.js';
import { openTestRedis } from '../support/test-redis.js';
import { SLACK_MS } from '../support/bounds.js';
import {
  LEASE_TTL_MS,
  QUEUE_COUNTS,
  clusterPerTest,
  queues,
  createConversation,
  expectEveryEventOnce,
  expectExactlyOnce,
  firstAnswerFrom,
  isReady,
  leaseOf,
  sendMessage,
  sleep,
  waitForAnswers,
  workerEpochs,
  workerIdOf,
} from '../support/cluster-conversations.js';

const fixture = clusterPerTest();
/** The hand-off test's lease: three times what the hand-off may take with its slack. */
const HAND_OFF_LEASE_TTL_MS = 3 * (2000 + SLACK_MS);
const cluster_ = (options: ClusterOptions) => fixture.start(options);

describe('a cluster failing over and draining', () => {
  it.each(
    [
      { clients: 'a client connected', connected: true },
      { clients: 'no client connected', connected: false },
    ].flatMap((clients) => QUEUE_COUNTS.map((queueCount) => ({ ...clients, queueCount }))),
  )(
    'answers every message exactly once when the holder is killed mid-stream ($clients, $queueCount queues)',
    async ({ connected, queueCount }) => {
      const c = await cluster_({ gateways: 1, workers: 2, env: queues(queueCount) });
      const gateway = c.gateways[0]!;
      const token = await c.token('carol');
      const id = await createConversation(gateway.url, token);
      const client = connected
        ? await ConversationClient.connect(gateway.url, token, { conversation_id: id })
        : undefined;
      try {
        if (!connected) {
          const start = await api(gateway.url, 'POST', `/api/conversations/${id}/start`, {
            token,
          });
          expect(start.status).toBe(200);
        }
        const holder = await holderOf(c.workers, id);
        const other = c.workers.find((w) => w !== holder)!;

        const sent: string[] = [];
        let killedAt = 0;
        let killedEpoch = 0;
        let firstAnswerAfterKill: Promise<number> | undefined;
        for (let n = 0; n < 30; n += 1) {
          if (n === 15) {
            killedEpoch = (await leaseOf(c, id)).epoch;
            killedAt = Date.now();
            holder.signal('SIGKILL');
            firstAnswerAfterKill = firstAnswerFrom(c, id, killedEpoch, killedAt);
          }
          const text = `message ${n}`;
          await sendMessage(gateway.url, token, id, text);
          sent.push(text);
          await sleep(30);
        }
        const failoverMs = await firstAnswerAfterKill!;
        process.stdout.write(
          `failover after SIGKILL (${connected ? 'with' : 'no'} client): ${failoverMs} ms\n`,
        );
        expect(failoverMs).toBeLessThanOrEqual(LEASE_TTL_MS + 2000 + SLACK_MS);

        const stored = await waitForAnswers(gateway.url, token, id);
        expectExactlyOnce(stored, sent);
        expect(await holderOf([other], id)).toBe(other);
        expect((await leaseOf(c, id)).owner).toBe(await workerIdOf(other));
        if (client) await expectEveryEventOnce(client, gateway.url, token, id);
      } finally {
        client?.close();
      }
    },
  );

  it("resumes a killed holder's conversation on a worker that starts after its slot lapsed", async () => {
    const c = await cluster_({ gateways: 1, workers: 1 });
    const gateway = c.gateways[0]!;
    const token = await c.token('heidi');
    const id = await createConversation(gateway.url, token);
    await sendMessage(gateway.url, token, id, 'before the crash');
    await waitForAnswers(gateway.url, token, id);
    c.workers[0]!.signal('SIGKILL');
    await c.workers[0]!.exited;
    await sendMessage(gateway.url, token, id, 'while no worker runs');
    // No worker renews the slot: it lapses (2 × LEASE_TTL_MS), and the next
    // start of the same user sweeps it away.
    const slots = openTestRedis();
    try {
      const expiry = new ClusterKeys(c.prefix).userSlotExpiry(c.tenant, 'heidi');
      expect(Object.keys(await slots.hgetall(expiry))).toContain(id);
      // Lapsed by Redis' clock, the one the slot scripts read.
      await until(
        async () => {
          const [seconds, micros] = await slots.time();
          const now = Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
          return Object.values(await slots.hgetall(expiry)).every((at) => Number(at) < now);
        },
        'the slot to lapse',
        2 * LEASE_TTL_MS + 10_000,
        100,
      );
    } finally {
      slots.disconnect();
    }
    const other = await createConversation(gateway.url, token);
    expect(
      (await api(gateway.url, 'POST', `/api/conversations/${other}/start`, { token })).status,
    ).toBe(200);

    const worker = await c.startWorker();
    const stored = await waitForAnswers(gateway.url, token, id);
    expectExactlyOnce(stored, ['before the crash', 'while no worker runs']);
    expect(await holderOf([worker], id)).toBe(worker);
  });

  it('fences out a holder paused past its lease (SIGSTOP, SIGCONT)', async () => {
    const c = await cluster_({ gateways: 1, workers: 2 });
    const gateway = c.gateways[0]!;
    const token = await c.token('dave');
    const id = await createConversation(gateway.url, token);
    const sent: string[] = [];
    const send = async (text: string) => {
      await sendMessage(gateway.url, token, id, text);
      sent.push(text);
    };
    await send('before the pause');
    const paused = await holderOf(c.workers, id);
    const other = c.workers.find((w) => w !== paused)!;
    await waitForAnswers(gateway.url, token, id);

    paused.signal('SIGSTOP');
    try {
      await send('while paused');
      // Answered by the other worker once the paused one's lease expired.
      await waitForAnswers(gateway.url, token, id, LEASE_TTL_MS + 10_000);
      expect((await workerHealth(other))?.conversations).toContain(id);
      expect((await leaseOf(c, id)).owner).toBe(await workerIdOf(other));
    } finally {
      paused.signal('SIGCONT');
    }
    const resumedAt = Date.now();
    // Messages right after the resume race with the stale holder's wake-ups.
    const more = (async () => {
      for (let n = 0; n < 10; n += 1) {
        await send(`after the resume ${n}`);
        await sleep(50);
      }
    })();
    await until(
      async () => {
        const health = await workerHealth(paused);
        return health !== null && !health.conversations.includes(id);
      },
      'the resumed worker to drop the conversation',
      LEASE_TTL_MS + 2000 + SLACK_MS,
      25,
    );
    const droppedMs = Date.now() - resumedAt;
    process.stdout.write(`resumed worker dropped the conversation after ${droppedMs} ms\n`);
    expect(droppedMs).toBeLessThanOrEqual(LEASE_TTL_MS + 2000 + SLACK_MS);
    await more;

    const stored = await waitForAnswers(gateway.url, token, id);
    await sleep(500); // a late write of the stale holder would be stored by now
    const final = await readAllEvents(gateway.url, token, id);
    expect(final).toEqual(stored);
    expectExactlyOnce(final, sent);
    const epochs = await workerEpochs(c, id);
    for (let n = 1; n < epochs.length; n += 1) {
      expect(epochs[n], `epoch of the ${n}th worker event`).toBeGreaterThanOrEqual(epochs[n - 1]!);
    }
    expect(new Set(epochs).size).toBeGreaterThan(1);
    expect((await workerHealth(other))?.conversations).toContain(id);
    expect((await workerHealth(paused))?.conversations).not.toContain(id);
  });

  it.each(QUEUE_COUNTS)(
    'hands conversations over on SIGTERM and exits, ignoring a second SIGTERM (%i queues)',
    async (queueCount) => {
      // A lease that would take far longer to lapse than a hand-off may take:
      // an answer within the bound came through the hand-off.
      const c = await cluster_({
        gateways: 1,
        workers: 2,
        env: { ...queues(queueCount), LEASE_TTL_MS: String(HAND_OFF_LEASE_TTL_MS) },
      });
      const gateway = c.gateways[0]!;
      const token = await c.token('erin');
      const id = await createConversation(gateway.url, token);
      const client = await ConversationClient.connect(gateway.url, token, { conversation_id: id });
      try {
        await client.waitFor(isReady, 10_000, 'agent ready');
        const first = await client.message('before the drain');
        await client.waitForReply(first.ok ? first.event_id : -1);
        const draining = await holderOf(c.workers, id);
        const other = c.workers.find((w) => w !== draining)!;

        const signalledAt = Date.now();
        draining.signal('SIGTERM');
        // As soon as it acts on the signal (not ready, or gone already).
        await until(
          async () =>
            (await fetch(`${draining.url}/readyz`).then(
              (r) => r.status,
              () => 'gone',
            )) !== 200,
          'the worker to start draining',
          5000,
          10,
        );
        // A supervisor repeating the signal while the drain runs must not cut it short.
        draining.signal('SIGTERM');
        const sentAt = Date.now();
        const eventId = await sendMessage(gateway.url, token, id, 'right after SIGTERM');
        await client.waitForReply(eventId, 10_000);
        const handOffMs = Date.now() - sentAt;
        process.stdout.write(`message after SIGTERM answered in ${handOffMs} ms\n`);
        expect(handOffMs).toBeLessThanOrEqual(2000 + SLACK_MS);

        // The answer came from the other worker, under its lease.
        const lease = await leaseOf(c, id);
        expect(lease.owner).toBe(await workerIdOf(other));
        const { rows } = await c.sql.query<{ lease_epoch: string }>(
          `SELECT lease_epoch FROM events
          WHERE conversation_id = $1 AND source = 'agent' AND type = 'message' AND cause = $2`,
          [id, eventId],
        );
        expect(rows.map((row) => Number(row.lease_epoch))).toEqual([lease.epoch]);
        expect((await workerHealth(other))?.conversations).toContain(id);

        const code = await Promise.race([
          draining.exited,
          sleep(30_000).then(() => 'still running'),
        ]);
        const exitMs = Date.now() - signalledAt;
        process.stdout.write(`drained worker exited after ${exitMs} ms\n`);
        expect(code).toBe(0);
        expect(exitMs).toBeLessThanOrEqual(30_000);

        const more = await client.message('after the drain');
        await client.waitForReply(more.ok ? more.event_id : -1);
        expectExactlyOnce(await readAllEvents(gateway.url, token, id), [
          'before the drain',
          'right after SIGTERM',
          'after the drain',
        ]);
      } finally {
        client.close();
      }
    },
  );

  it('drains a gateway on SIGTERM; its clients resume on the other with no gap', async () => {
    const c = await cluster_({ gateways: 2, workers: 1 });
    const [g1, g2] = c.gateways as [AppProcess, AppProcess];
    const token = await c.token('grace');
    const id = await createConversation(g1.url, token);
    const leaving = await ConversationClient.connect(g1.url, token, { conversation_id: id });
    // A client of the other gateway, which must not notice anything.
    const staying = await ConversationClient.connect(g2.url, token, { conversation_id: id });
    const stayingDisconnects: string[] = [];
    staying.socket.on('disconnect', (reason) => stayingDisconnects.push(reason));
    let resumed: ConversationClient | undefined;
    try {
      await leaving.waitFor(isReady, 10_000, 'agent ready');
      const sent: string[] = [];
      for (let n = 0; n < 3; n += 1) {
        const ack = await leaving.message(`before ${n}`);
        sent.push(`before ${n}`);
        await leaving.waitForReply(ack.ok ? ack.event_id : -1);
      }
      const disconnected = new Promise<string>((resolve) =>
        leaving.socket.once('disconnect', (reason) => resolve(reason)),
      );

      const signalledAt = Date.now();
      g1.signal('SIGTERM');
      // Not ready from the signal on (503), until it is gone.
      let readiness: number | string = 200;
      await until(
        async () => {
          readiness = await fetch(`${g1.url}/readyz`).then(
            (r) => r.status,
            () => 'gone',
          );
          return readiness !== 200;
        },
        'the draining gateway to report not ready',
        5000,
        20,
      );
      expect([503, 'gone']).toContain(readiness);
      // Its sockets are closed (by the server, or with the process).
      const reason = await Promise.race([
        disconnected,
        sleep(10_000).then(() => 'still connected'),
      ]);
      expect(['io server disconnect', 'transport close']).toContain(reason);
      // Meanwhile the conversation goes on through the other gateway.
      for (let n = 0; n < 3; n += 1) {
        await sendMessage(g2.url, token, id, `while away ${n}`);
        sent.push(`while away ${n}`);
      }
      await waitForAnswers(g2.url, token, id);
      const code = await Promise.race([g1.exited, sleep(10_000).then(() => 'still running')]);
      expect(code).toBe(0);
      process.stdout.write(`gateway exited after ${Date.now() - signalledAt} ms\n`);
      // Only the draining gateway's sockets were closed.
      expect(stayingDisconnects).toEqual([]);

      const seen = ids(leaving.events);
      resumed = await ConversationClient.connect(g2.url, token, {
        conversation_id: id,
        latest_event_id: String(seen[seen.length - 1]),
      });
      const ack = await resumed.message('after the resume');
      sent.push('after the resume');
      await resumed.waitForReply(ack.ok ? ack.event_id : -1);
      const stored = await waitForAnswers(g2.url, token, id);
      expectExactlyOnce(stored, sent);
      const last = stored[stored.length - 1]!.id;
      for (const client of [resumed, staying]) {
        await client.waitFor((events) => ids(events).includes(last), 10_000, `event ${last}`);
      }
      await sleep(200);
      expect([...seen, ...ids(resumed.events)]).toEqual(stored.map((e) => e.id));
      expect(staying.socket.connected).toBe(true);
      expect(ids(staying.events)).toEqual(stored.map((e) => e.id));
    } finally {
      leaving.close();
      staying.close();
      resumed?.close();
    }
  });

  it('drains a gateway promptly although one of its socket clients stopped answering', async () => {
    const c = await cluster_({ gateways: 1, workers: 1 });
    const [gateway] = c.gateways as [AppProcess];
    const token = await c.token('frozen');
    const id = await createConversation(gateway.url, token);
    const frozen = await openFrozenSocket(gateway.url, token, { conversation_id: id });
    try {
      const signalledAt = Date.now();
      gateway.signal('SIGTERM');
      // Before the drain's deadline, which it would have waited out for the frozen client.
      const code = await Promise.race([
        gateway.exited,
        sleep(CLIENT_DRAIN_TIMEOUT_MS + 1_000).then(() => 'still running'),
      ]);
      expect(code, gateway.output()).toBe(0);
      expect(Date.now() - signalledAt).toBeLessThan(CLIENT_DRAIN_TIMEOUT_MS - 1_000);
      expect(gateway.output()).not.toMatch(/drain timed out/);
    } finally {
      frozen.destroy();
    }
  });
});
