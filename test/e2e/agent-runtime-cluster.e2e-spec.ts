// The agent runtime on a cluster of two gateways and two workers: streaming
// reaches both gateways, a stop sent through one gateway reaches the worker
// behind the other, and tool calls and approvals survive kill -9 of their
// worker (idempotent tools run again, others are in doubt); a user: key one
// worker's conversation sets reaches the user's conversation on another.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { StoredEvent } from '@cs/protocol';
import { ConversationClient, api } from '../support/clients.js';
import { MID_STEP_DELAY_MS, PROMPTLY_MS } from '../support/bounds.js';
import { holderOf, startCluster, until, type TestCluster } from '../support/cluster.js';
import { uniqueName } from '../support/services.js';
import {
  AGENT_MODULE,
  assemble,
  deltasOf,
  expectSignalAbortedOnlyWhenCut,
  watchSse,
} from '../support/agent-runtime.js';
import { useTestRedis } from '../support/test-redis.js';

// One Redis, or a Redis Cluster with TEST_REDIS=cluster (npm run test:redis-cluster).
useTestRedis();

const LEASE_TTL_MS = 3000;

describe('agent runtime (cluster)', () => {
  let cluster: TestCluster;
  let dir: string;
  let toolLog: string;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'cs-runtime-cluster-'));
    toolLog = join(dir, 'tools.log');
    writeFileSync(toolLog, '');
    cluster = await startCluster({
      gateways: 2,
      workers: 2,
      env: {
        AGENT_MODULES: AGENT_MODULE,
        CS_TEST_TOOL_LOG: toolLog,
        LEASE_TTL_MS: String(LEASE_TTL_MS),
        MAX_CONCURRENT_CONVERSATIONS: '20',
      },
    });
  });

  afterAll(async () => {
    await cluster?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  async function conversation(token: string, body: Record<string, unknown>): Promise<string> {
    const created = await api(cluster.gateways[0]!.url, 'POST', '/api/conversations', {
      token,
      body,
    });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    return created.body.conversation_id as string;
  }

  async function eventsOf(token: string, id: string): Promise<StoredEvent[]> {
    const page = await api(
      cluster.gateways[1]!.url,
      'GET',
      `/api/conversations/${id}/events?limit=100`,
      { token },
    );
    return page.body.events as StoredEvent[];
  }

  it('delivers deltas to clients on both gateways in order, and a late joiner on either gets the text so far first', async () => {
    const [a, b] = cluster.gateways as [(typeof cluster.gateways)[0], (typeof cluster.gateways)[0]];
    const token = await cluster.token(uniqueName('streamer'));
    const text = 'Two gateways, one stream: every client sees each piece once and in order.';
    const id = await conversation(token, {
      agent: 'streamer',
      agent_config: { text, chunks: 15, delay_ms: MID_STEP_DELAY_MS },
    });
    const onA = await ConversationClient.connect(a.url, token, { conversation_id: id });
    const onB = await ConversationClient.connect(b.url, token, {
      conversation_id: id,
      start: 'false',
    });
    const cause = ((await onA.message('go')) as { event_id: number }).event_id;
    await onB.waitFor((events) => deltasOf(events, cause).length >= 4);
    const lateOnB = await ConversationClient.connect(b.url, token, {
      conversation_id: id,
      start: 'false',
    });
    for (const client of [onA, onB, lateOnB]) await client.waitForReply(cause);
    for (const client of [onA, onB]) {
      const deltas = deltasOf(client.events, cause);
      let offset = 0;
      for (const delta of deltas) {
        expect(delta.offset).toBe(offset);
        offset += delta.delta.length;
      }
      expect(assemble(deltas)).toBe(text);
    }
    const late = deltasOf(lateOnB.events, cause);
    expect(late[0]?.offset).toBe(0);
    expect(assemble(late)).toBe(text);
    for (const client of [onA, onB, lateOnB]) client.close();
  });

  it("gives a client (socket or SSE) that opens the room on a gateway with nobody in it, mid-step, the holder's text so far first", async () => {
    const [a, b] = cluster.gateways as [(typeof cluster.gateways)[0], (typeof cluster.gateways)[0]];
    const token = await cluster.token(uniqueName('late-gateway'));
    const text = 'Nobody was here: the holder tells this gateway what the step has said so far.';
    const id = await conversation(token, {
      agent: 'streamer',
      agent_config: { text, chunks: 15, delay_ms: MID_STEP_DELAY_MS },
    });
    const onA = await ConversationClient.connect(a.url, token, { conversation_id: id });
    const cause = ((await onA.message('go')) as { event_id: number }).event_id;
    await onA.waitFor((events) => deltasOf(events, cause).length >= 4);
    // Gateway B opens the room now, for an SSE stream: no copy of the text is
    // kept in Redis, its holder sends it. A socket joins B's room after it.
    const sseOnB = await watchSse(b.url, id, token, cause);
    const lateOnB = await ConversationClient.connect(b.url, token, {
      conversation_id: id,
      start: 'false',
    });
    await lateOnB.waitForReply(cause);
    const sseDeltas = (await sseOnB.deltasUntilAnswer()).filter((d) => d.cause === cause);
    for (const late of [deltasOf(lateOnB.events, cause), sseDeltas]) {
      expect(late[0]?.offset).toBe(0);
      expect(late[0]!.delta.length).toBeGreaterThan(0);
      // Then each delta follows on from the one before: nothing missed, nothing twice.
      for (let i = 1; i < late.length; i += 1)
        expect(late[i]!.offset).toBe(late[i - 1]!.offset + late[i - 1]!.delta.length);
      expect(assemble(late)).toBe(text);
    }
    for (const client of [onA, lateOnB]) client.close();
  });

  it("aborts an agent module's signal only when its turn is cut, on a worker behind the other gateway: not when it answers under enqueue or reject; an interrupt aborts it at once", async () => {
    const token = await cluster.token(uniqueName('rollback'));
    await expectSignalAbortedOnlyWhenCut(cluster.gateways[1]!.url, token, toolLog, (body) =>
      conversation(token, body),
    );
  });

  it('stops, through gateway A, the step running on the worker behind gateway B at once', async () => {
    const [a, b] = cluster.gateways as [(typeof cluster.gateways)[0], (typeof cluster.gateways)[0]];
    const token = await cluster.token(uniqueName('stopper'));
    const id = await conversation(token, { agent: 'waiter' });
    const onB = await ConversationClient.connect(b.url, token, { conversation_id: id });
    const slow = ((await onB.message('take your time')) as { event_id: number }).event_id;
    await onB.waitFor((events) => deltasOf(events, slow).length >= 2);
    const onA = await ConversationClient.connect(a.url, token, {
      conversation_id: id,
      start: 'false',
    });
    const sentAt = Date.now();
    expect(
      await onA.send({ action: 'change_agent_state', args: { agent_state: 'stopped' } }),
    ).toMatchObject({ ok: true });
    await onB.waitFor((events) =>
      events.some((e) => 'observation' in e && e.extras?.['agent_state'] === 'stopped'),
    );
    const aborted = readFileSync(toolLog, 'utf8')
      .split('\n')
      .filter((line) => line.startsWith('aborted'))
      .map((line) => Number(line.split(' ')[1]));
    expect(aborted.some((at) => at >= sentAt && at - sentAt < PROMPTLY_MS)).toBe(true);
    const partial = onB.stored.find(
      (e) => e.source === 'agent' && 'action' in e && e.action === 'message' && e.cause === slow,
    );
    expect(partial).toMatchObject({ args: { interrupted: true } });
    onA.close();
    onB.close();
  });

  for (const [tool, idempotent] of [
    ['slow_idempotent', true],
    ['slow_once', false],
  ] as const) {
    it(`after kill -9 during ${tool}: ${idempotent ? 'it runs once more and its result is stored once' : 'it is not run again and its result is in doubt'}; the answer is stored once`, async () => {
      const token = await cluster.token(uniqueName(tool));
      const callId = `call-${uniqueName(tool)}`;
      const id = await conversation(token, {
        agent: 'tool_user',
        agent_config: { tool, arguments: { ms: 2_500 }, tool_call_id: callId },
        initial_user_msg: 'use the tool',
      });
      // The key of the stored call: `<conversation_id>:<its event id>`.
      await until(
        async () => readFileSync(toolLog, 'utf8').includes(`${tool} start ${id}:`),
        'the tool started',
      );
      const call = (await eventsOf(token, id)).find(
        (e) => 'action' in e && e.action === 'tool_call' && e.args['tool_call_id'] === callId,
      );
      const key = `${id}:${call!.id}`;
      const holder = await holderOf(cluster.workers, id);
      holder.signal('SIGKILL');
      await holder.exited;
      const replacement = await cluster.startWorker();
      try {
        await until(
          async () =>
            (await eventsOf(token, id)).some(
              (e) => e.source === 'agent' && 'action' in e && e.action === 'message',
            ),
          'the answer after the failover',
          LEASE_TTL_MS + 20_000,
        );
        const events = await eventsOf(token, id);
        const results = events.filter((e) => 'observation' in e && e.observation === 'tool_result');
        expect(results).toHaveLength(1);
        const answers = events.filter(
          (e) => e.source === 'agent' && 'action' in e && e.action === 'message',
        );
        expect(answers).toHaveLength(1);
        const starts = readFileSync(toolLog, 'utf8')
          .split('\n')
          .filter((line) => line === `${tool} start ${key}`);
        if (idempotent) {
          expect(starts).toHaveLength(2); // run again with the same idempotency key
          expect(results[0]).toMatchObject({ extras: { is_error: false } });
        } else {
          expect(starts).toHaveLength(1);
          expect(results[0]).toMatchObject({ extras: { is_error: true, in_doubt: true } });
        }
      } finally {
        void replacement;
      }
    });
  }

  it('keeps a pending approval across kill -9 of its worker: the new holder waits, then runs the call once confirmed (not idempotent: it never started)', async () => {
    const token = await cluster.token(uniqueName('approver'));
    const id = await conversation(token, {
      agent: 'tool_user',
      agent_config: { tool: 'slow_once', arguments: { ms: 0 } },
      confirmation_mode: true,
      initial_user_msg: 'what time is it?',
    });
    await until(
      async () =>
        (await api(cluster.gateways[0]!.url, 'GET', `/api/conversations/${id}`, { token })).body
          .agent_state === 'awaiting_user_confirmation',
      'awaiting confirmation',
    );
    const holder = await holderOf(cluster.workers, id);
    holder.signal('SIGKILL');
    await holder.exited;
    await cluster.startWorker();
    const alive = cluster.workers.filter(
      (w) => w.child.exitCode === null && w.child.signalCode === null,
    );
    await holderOf(alive, id, LEASE_TTL_MS + 20_000);
    await until(
      async () =>
        (await api(cluster.gateways[0]!.url, 'GET', `/api/conversations/${id}`, { token })).body
          .agent_state === 'awaiting_user_confirmation',
      'awaiting confirmation again',
    );
    const client = await ConversationClient.connect(cluster.gateways[1]!.url, token, {
      conversation_id: id,
      start: 'false',
    });
    expect(
      await client.send({ action: 'change_agent_state', args: { agent_state: 'user_confirmed' } }),
    ).toMatchObject({ ok: true });
    await until(
      async () =>
        (await eventsOf(token, id)).some(
          (e) => e.source === 'agent' && 'action' in e && e.action === 'message',
        ),
      'the answer',
      20_000,
    );
    const events = await eventsOf(token, id);
    const calls = events.filter((e) => 'action' in e && e.action === 'tool_call');
    expect(calls).toHaveLength(1);
    const results = events.filter((e) => 'observation' in e && e.observation === 'tool_result');
    expect(results).toHaveLength(1);
    expect(results[0]).toMatchObject({ cause: calls[0]!.id, extras: { is_error: false } });
    const runs = readFileSync(toolLog, 'utf8')
      .split('\n')
      .filter((line) => line === `slow_once end ${id}:${calls[0]!.id}`);
    expect(runs).toHaveLength(1);
    client.close();
  });
});

describe('agent runtime (cluster): user: state across workers', () => {
  let cluster: TestCluster;

  beforeAll(async () => {
    cluster = await startCluster({
      gateways: 1,
      workers: 2,
      // One conversation per worker: the test's two conversations run on different workers.
      env: { AGENT_MODULES: AGENT_MODULE, WORKER_CONCURRENCY: '1' },
    });
  });

  afterAll(async () => {
    await cluster?.close();
  });

  it('shows a conversation running on one worker, from its next step, the user: key set by a conversation of the user on the other', async () => {
    const url = cluster.gateways[0]!.url;
    const token = await cluster.token(uniqueName('colors'));
    const start = async (body: Record<string, unknown>) => {
      const created = await api(url, 'POST', '/api/conversations', { token, body });
      expect(created.status, JSON.stringify(created.body)).toBe(201);
      return created.body.conversation_id as string;
    };
    const eventsOf = async (id: string) =>
      (await api(url, 'GET', `/api/conversations/${id}/events?limit=100`, { token })).body
        .events as StoredEvent[];
    const answersOf = async (id: string) =>
      (await eventsOf(id)).flatMap((e) =>
        e.source === 'agent' && 'action' in e && e.action === 'message' ? [e.args['content']] : [],
      );

    const teller = await start({ agent: 'state_teller', initial_user_msg: 'what is my color?' });
    await until(async () => (await answersOf(teller)).length === 1, 'the first answer');
    const setter = await start({
      agent: 'tool_user',
      agent_config: { tool: 'set_state', arguments: { key: 'user:color', value: 'teal' } },
      initial_user_msg: 'remember my color',
    });
    await until(async () => (await answersOf(setter)).length === 1, 'set_state and its answer');
    const tellerHolder = await holderOf(cluster.workers, teller);
    const setterHolder = await holderOf(cluster.workers, setter);
    expect(tellerHolder.name).not.toBe(setterHolder.name);

    const sent = await api(url, 'POST', `/api/conversations/${teller}/events`, {
      token,
      body: { action: 'message', args: { content: 'and now?' } },
    });
    expect(sent.status).toBe(201);
    await until(async () => (await answersOf(teller)).length === 2, 'the second answer');

    expect(await answersOf(teller)).toEqual(['user:color is null', 'user:color is "teal"']);
    // The same session on the same worker all along: told of the change, not started afresh.
    expect(await holderOf(cluster.workers, teller)).toBe(tellerHolder);
    const loadings = (await eventsOf(teller)).filter(
      (e) => 'observation' in e && e.extras?.['agent_state'] === 'loading',
    );
    expect(loadings).toHaveLength(1);
  });
});
