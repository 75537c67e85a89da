// Webhooks end to end on a cluster: two gateways, two workers (which send
// the deliveries), real receivers verifying signatures with `standardwebhooks`.
// A worker killed with SIGKILL in the middle of an attempt loses nothing and
// reorders nothing: the delivery is sent again, with the same webhook-id,
// once its claim lapses, and the conversation's next delivery waits for it.
import { execFileSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { api } from '../support/clients.js';
import { startCluster, until, type TestCluster } from '../support/cluster.js';
import { metricSample } from '../support/metrics.js';
import { startWebhookReceiver, type WebhookReceiver } from '../support/webhook-receiver.js';

const WEBHOOK_TIMEOUT_MS = 2_000;
/** A claim lapses after the timeout and the dispatcher's 5 s margin. */
const CLAIM_LAPSE_MS = WEBHOOK_TIMEOUT_MS + 5_000;

/** Pids of the processes holding a TCP connection to `port` on this host. */
function pidsConnectedTo(port: number): number[] {
  const out = execFileSync('ss', ['-Htnp', 'state', 'established', `( dport = :${port} )`], {
    encoding: 'utf8',
  });
  return [...out.matchAll(/pid=(\d+)/g)].map((match) => Number(match[1]));
}

function story(receiver: WebhookReceiver, conversationId: string) {
  return receiver
    .deduped()
    .filter((webhook) => webhook.body.data.conversation_id === conversationId);
}

describe('webhooks on a cluster (2 gateways, 2 workers)', () => {
  let cluster: TestCluster;
  let receiver: WebhookReceiver;
  let token: string;
  let admin: string;

  beforeAll(async () => {
    receiver = await startWebhookReceiver({ seed: 'cluster' });
    cluster = await startCluster({
      gateways: 2,
      workers: 2,
      env: {
        LEASE_TTL_MS: '3000',
        WEBHOOK_TIMEOUT_MS: String(WEBHOOK_TIMEOUT_MS),
        WEBHOOKS: JSON.stringify([{ url: receiver.url, secret: receiver.secret }]),
      },
    });
    token = await cluster.token('alice');
    admin = await api(cluster.gateways[0]!.url, 'POST', '/api/dev/token', {
      body: { user_id: 'boss', tenant_id: cluster.tenant, roles: ['admin'] },
    }).then((response) => response.body.token as string);
  }, 120_000);

  afterAll(async () => {
    await cluster?.close();
    await receiver?.close();
  });

  it('delivers every conversation’s messages in order, whichever gateway and worker wrote them', async () => {
    const ids: string[] = [];
    // One user each: a user's fourth running conversation would evict its first.
    const tokens = await Promise.all([0, 1, 2, 3, 4, 5, 6, 7].map((i) => cluster.token(`u${i}`)));
    for (let i = 0; i < 8; i += 1) {
      const gateway = cluster.gateways[i % 2]!;
      const created = await api(gateway.url, 'POST', '/api/conversations', {
        token: tokens[i],
        body: { initial_user_msg: `first ${i}` },
      });
      expect(created.status).toBe(201);
      ids.push(created.body.conversation_id);
    }
    const turns = (id: string) =>
      story(receiver, id).filter((webhook) => webhook.body.type === 'turn.completed');
    await until(() => ids.every((id) => turns(id).length === 1), 'the first turns', 20_000);
    for (const [i, id] of ids.entries()) {
      const sent = await api(
        cluster.gateways[(i + 1) % 2]!.url,
        'POST',
        `/api/conversations/${id}/events`,
        {
          token: tokens[i],
          body: { action: 'message', args: { content: `second ${i}` } },
        },
      );
      expect(sent.status).toBe(201);
    }
    await until(() => ids.every((id) => turns(id).length === 2), 'the second turns', 20_000);
    for (const id of ids) {
      const told = story(receiver, id);
      expect(told[0]!.body.type).toBe('conversation.created');
      const causes = turns(id).map((webhook) => webhook.body.data.event_id as number);
      expect(causes).toEqual([...causes].sort((a, b) => a - b));
      expect(turns(id).map((webhook) => String(webhook.body.data.content))).toEqual([
        expect.stringContaining('first'),
        expect.stringContaining('second'),
      ]);
    }
    expect(receiver.rejected).toBe(0);

    // Both gateways serve the admin routes from the one outbox.
    for (const gateway of cluster.gateways) {
      const page = await api(gateway.url, 'GET', '/api/webhook-deliveries?limit=100', {
        token: admin,
      });
      expect(page.status).toBe(200);
      expect(page.body.results.length).toBeGreaterThanOrEqual(8 * 4);
    }
  }, 60_000);

  it('loses and reorders nothing when the worker sending a delivery is killed', async () => {
    let hungId: string | null = null;
    const port = Number(new URL(receiver.url).port);
    // Hold the first attempt of the next turn.completed: its worker is killed mid-attempt.
    receiver.answer = (webhook) => {
      if (hungId === null && webhook.body.type === 'turn.completed') {
        hungId = webhook.id;
        return 'hang';
      }
      return 204;
    };
    const created = await api(cluster.gateways[0]!.url, 'POST', '/api/conversations', {
      token,
      body: { initial_user_msg: 'hold me' },
    });
    const id: string = created.body.conversation_id;
    await until(() => hungId !== null, 'an attempt held', 20_000);
    const heldConversation = receiver.received.find((webhook) => webhook.id === hungId)!.body.data
      .conversation_id;
    // The next turn of the same conversation waits behind the held delivery.
    const sent = await api(
      cluster.gateways[1]!.url,
      'POST',
      `/api/conversations/${heldConversation}/events`,
      {
        token,
        body: { action: 'message', args: { content: 'after the held one' } },
      },
    );
    expect(sent.status).toBe(201);

    const senders = pidsConnectedTo(port);
    const victim = cluster.workers.find((worker) => senders.includes(worker.child.pid!));
    expect(victim, `a worker connected to the receiver (pids ${senders.join(',')})`).toBeDefined();
    const killedAt = Date.now();
    victim!.signal('SIGKILL');
    await victim!.exited;

    const turns = () =>
      receiver.received.filter(
        (webhook) =>
          webhook.body.data.conversation_id === heldConversation &&
          webhook.body.type === 'turn.completed',
      );
    await until(
      () => new Set(turns().map((webhook) => webhook.id)).size === 2,
      () =>
        `both turns of the held conversation, got ${JSON.stringify(turns().map((w) => w.body.data))}`,
      CLAIM_LAPSE_MS + 15_000,
    );
    const [first, second, third] = turns();
    // The held delivery again, with the same webhook-id and body, after its claim lapsed; then the next.
    expect(first!.id).toBe(hungId);
    expect(second!.id).toBe(hungId);
    expect(second!.body).toEqual(first!.body);
    expect(second!.at - killedAt).toBeGreaterThanOrEqual(CLAIM_LAPSE_MS - 3_000);
    expect(third!.body.data.event_id as number).toBeGreaterThan(
      first!.body.data.event_id as number,
    );
    expect(story(receiver, heldConversation).map((webhook) => webhook.body.type)[0]).toBe(
      'conversation.created',
    );
    expect(id).toBe(heldConversation);

    const survivor = cluster.workers.find((worker) => worker !== victim)!;
    const metrics = await (await fetch(`${survivor.url}/metrics`)).text();
    expect(metricSample(metrics, 'cs_webhook_deliveries_total')).toBeGreaterThan(0);
    await until(
      async () =>
        metricSample(
          await (await fetch(`${survivor.url}/metrics`)).text(),
          'cs_webhook_pending',
        ) === 0,
      'nothing pending',
    );
  }, 90_000);
});
