// Conversation jobs that Redis loses (a master killed before its replica got
// the write, a Redis restarted without persistence): Postgres says the
// conversation is live, no queue has its job, and only the workers'
// reconciler (`LostJobReconciler`) starts it again. Every acknowledged
// message is still answered, once (docs/design.md "Leases, routing and limits": lost jobs).
import { Queue } from 'bullmq';
import { afterEach, describe, expect, it, onTestFailed } from 'vitest';
import { CONVERSATION_QUEUE, conversationJobId } from '@cs/cluster';
import type { StoredEvent } from '@cs/protocol';
import { api, isAgentReply } from '../support/clients.js';
import { metricTotals } from '../support/metrics.js';
import {
  holderOf,
  readAllEvents,
  startCluster,
  until,
  type TestCluster,
} from '../support/cluster.js';
import { openTestRedis, useTestRedis } from '../support/test-redis.js';
import { createConversation, sendMessage, userMessages } from '../support/cluster-conversations.js';
import { SLACK_MS } from '../support/bounds.js';

const LEASE_TTL_MS = 2000;
/**
 * A lost job is found once its conversation has been idle for a lease TTL, by
 * the next pass (every 2 × LEASE_TTL_MS ± 25 %), then picked up at once.
 */
const REPAIR_BOUND_MS = LEASE_TTL_MS + 2.5 * LEASE_TTL_MS + 2 * SLACK_MS;

useTestRedis();

let cluster: TestCluster | undefined;

afterEach(async () => {
  await cluster?.close();
  cluster = undefined;
});

async function cluster_(workers: number): Promise<TestCluster> {
  cluster = await startCluster({
    workers,
    // Nobody is attached in these tests: the idle close must not end a run first.
    env: { LEASE_TTL_MS: String(LEASE_TTL_MS), IDLE_TIMEOUT_MS: '600000' },
  });
  const started = cluster;
  onTestFailed(() => {
    process.stderr.write(`\n===== process output of the failed test\n${started.outputs()}\n`);
  });
  return started;
}

/** Waits until every user message has an answer; then each must have exactly one. */
async function expectAnsweredOnce(
  c: TestCluster,
  token: string,
  conversationId: string,
  timeoutMs: number,
): Promise<StoredEvent[]> {
  const baseUrl = c.gateways[0]!.url;
  let events: StoredEvent[] = [];
  await until(
    async () => {
      events = await readAllEvents(baseUrl, token, conversationId);
      return userMessages(events).every((u) => events.some((e) => isAgentReply(e, u.id)));
    },
    `an answer to every user message of ${conversationId}`,
    timeoutMs,
    100,
  );
  for (const user of userMessages(events)) {
    const answers = events.filter((e) => isAgentReply(e, user.id));
    expect(answers.length, `answers to event ${user.id}`).toBe(1);
  }
  return events;
}

async function conversationRow(
  c: TestCluster,
  conversationId: string,
): Promise<{ status: string; epoch: number }> {
  const { rows } = await c.sql.query<{ status: string; lease_epoch: string }>(
    'SELECT status, lease_epoch FROM conversations WHERE id = $1',
    [conversationId],
  );
  return { status: rows[0]!.status, epoch: Number(rows[0]!.lease_epoch) };
}

/**
 * Waits for RUNNING to be stored: a run writes it once its session has
 * started, which may be after the session's first answer.
 */
async function untilRunning(c: TestCluster, conversationId: string): Promise<void> {
  await until(
    async () => (await conversationRow(c, conversationId)).status === 'RUNNING',
    `${conversationId} RUNNING`,
    5_000,
    50,
  );
}

/** The conversation's job, as BullMQ sees it (`unknown`: none). */
async function jobState(c: TestCluster, conversationId: string): Promise<string> {
  const redis = openTestRedis();
  const queue = new Queue(CONVERSATION_QUEUE, { connection: redis, prefix: c.prefix });
  try {
    return await queue.getJobState(conversationJobId(conversationId));
  } finally {
    await queue.close();
    redis.disconnect();
  }
}

/** Removes a queued job through BullMQ, as a Redis that lost the write would leave it. */
async function removeQueuedJob(c: TestCluster, conversationId: string): Promise<void> {
  const redis = openTestRedis();
  const queue = new Queue(CONVERSATION_QUEUE, { connection: redis, prefix: c.prefix });
  try {
    expect(await queue.getJobState(conversationJobId(conversationId))).toBe('waiting');
    await queue.remove(conversationJobId(conversationId));
  } finally {
    await queue.close();
    redis.disconnect();
  }
}

/**
 * Deletes an active job's keys behind its holder's back (BullMQ refuses to
 * remove a locked job): what a failed-over master that never got the job leaves.
 */
async function deleteActiveJob(c: TestCluster, conversationId: string): Promise<void> {
  const redis = openTestRedis();
  const base = `${c.prefix}:${CONVERSATION_QUEUE}`;
  const jobId = conversationJobId(conversationId);
  try {
    await redis.lrem(`${base}:active`, 0, jobId);
    await redis.del(`${base}:${jobId}`, `${base}:${jobId}:lock`);
  } finally {
    redis.disconnect();
  }
}

/** Summed over the workers still running (the last `running` started). */
async function reconciledTotal(c: TestCluster, running = c.workers.length): Promise<number> {
  const totals = await metricTotals(
    c.workers.slice(-running).map((w) => w.url),
    ['cs_conversations_reconciled_total'],
  );
  return totals.cs_conversations_reconciled_total;
}

describe('conversations whose job Redis lost', () => {
  it('answers a stored message whose queued job was lost, with nobody connected', async () => {
    const c = await cluster_(0);
    const gateway = c.gateways[0]!;
    const token = await c.token('rhea');
    const id = await createConversation(gateway.url, token);
    await sendMessage(gateway.url, token, id, 'lost in a failover');
    await removeQueuedJob(c, id);
    expect(await jobState(c, id)).toBe('unknown');
    expect((await conversationRow(c, id)).status).toBe('STARTING');

    const started = Date.now();
    await c.startWorker();
    await expectAnsweredOnce(c, token, id, REPAIR_BOUND_MS);
    expect(Date.now() - started).toBeLessThan(REPAIR_BOUND_MS);
    expect(await reconciledTotal(c)).toBe(1);
  });

  it('takes over a running conversation whose held job vanished, and answers its next message', async () => {
    const c = await cluster_(1);
    const gateway = c.gateways[0]!;
    const token = await c.token('soren');
    const id = await createConversation(gateway.url, token);
    await sendMessage(gateway.url, token, id, 'first');
    await expectAnsweredOnce(c, token, id, 15_000);
    await holderOf(c.workers, id);
    await untilRunning(c, id);
    const before = await conversationRow(c, id);

    await deleteActiveJob(c, id);
    expect(await jobState(c, id)).toBe('unknown');
    // Started again: a new holder's lease (a higher epoch fences the old one out).
    await until(
      async () =>
        (await conversationRow(c, id)).epoch > before.epoch && (await jobState(c, id)) === 'active',
      'the conversation taken over under a new job',
      REPAIR_BOUND_MS,
      100,
    );
    expect(await reconciledTotal(c)).toBe(1);

    await sendMessage(gateway.url, token, id, 'second');
    const events = await expectAnsweredOnce(c, token, id, 15_000);
    expect(userMessages(events)).toHaveLength(2);
    await untilRunning(c, id);
  });

  it('starts nothing for a stopped conversation, and answers nothing twice', async () => {
    const c = await cluster_(1);
    const gateway = c.gateways[0]!;
    const token = await c.token('tove');
    const stopped = await createConversation(gateway.url, token);
    await sendMessage(gateway.url, token, stopped, 'answered, then stopped');
    await expectAnsweredOnce(c, token, stopped, 15_000);
    const stop = await api<{ conversation_status: string }>(
      gateway.url,
      'POST',
      `/api/conversations/${stopped}/stop`,
      { token, body: {} },
    );
    expect(stop.status, JSON.stringify(stop.body)).toBe(200);
    expect(stop.body.conversation_status).toBe('STOPPED');
    const stoppedBefore = await conversationRow(c, stopped);

    // A conversation whose job is lost while no worker runs: once it is answered,
    // a reconciler pass has run since the stopped one went idle.
    c.workers[0]!.signal('SIGKILL');
    await c.workers[0]!.exited;
    const lost = await createConversation(gateway.url, token);
    await sendMessage(gateway.url, token, lost, 'lost while no worker ran');
    await removeQueuedJob(c, lost);
    await c.startWorker();
    await expectAnsweredOnce(c, token, lost, REPAIR_BOUND_MS);

    expect(await conversationRow(c, stopped)).toEqual(stoppedBefore);
    expect(await jobState(c, stopped)).toBe('unknown');
    const events = await expectAnsweredOnce(c, token, stopped, 1_000);
    expect(userMessages(events)).toHaveLength(1);
    expect(await reconciledTotal(c, 1)).toBe(1);
  });
});
