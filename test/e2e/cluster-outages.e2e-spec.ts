// A cluster gateway while Redis or Postgres is unreachable, as a client sees
// it (docs/protocol.md "REST", errors): a request that needs the missing one is
// answered 503 UNAVAILABLE at once, never held until it is back, and what was
// refused is not carried out later, when a client may have sent it again.
import { Redis } from 'ioredis';
import { afterEach, describe, expect, it, onTestFailed } from 'vitest';
import { REQUEST_COMMAND_TIMEOUT_MS } from '@cs/cluster';
import type { StoredEvent } from '@cs/protocol';
import { ConversationClient, api, isAgentReply } from '../support/clients.js';
import {
  readAllEvents,
  startCluster,
  until,
  type ClusterOptions,
  type TestCluster,
} from '../support/cluster.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { startPrivateRedis, type PrivateRedis } from '../support/redis-server.js';
import { TcpProxy } from '../support/tcp-proxy.js';
import { PROMPTLY_MS } from '../support/bounds.js';

/** "At once": a refusal must come well before a client gives up (test/support/bounds.ts). */
const PROMPT_MS = PROMPTLY_MS;
/** When a request that has not been answered counts as hanging. */
const CLIENT_TIMEOUT_MS = 2 * PROMPTLY_MS;

let cluster: TestCluster | undefined;
let redis: PrivateRedis | undefined;
let proxy: TcpProxy | undefined;
const extraProcesses: AppProcess[] = [];

async function cluster_(options: ClusterOptions): Promise<TestCluster> {
  cluster = await startCluster({ ...options, env: { LEASE_TTL_MS: '3000', ...options.env } });
  const started = cluster;
  onTestFailed(() => {
    const extra = extraProcesses.map((p) => `----- ${p.name}\n${p.output().slice(-6000)}`);
    process.stderr.write(
      `\n===== process output of the failed test\n${started.outputs()}\n${extra.join('\n')}\n`,
    );
  });
  return started;
}

/** Another gateway of the cluster, with its own environment on top of the cluster's. */
async function extraGateway(
  c: TestCluster,
  name: string,
  env: Record<string, string>,
): Promise<AppProcess> {
  const gateway = await startApp('gateway', { ...c.env, ...env }, { name });
  extraProcesses.push(gateway);
  return gateway;
}

afterEach(async () => {
  for (const proc of extraProcesses.splice(0)) {
    proc.signal('SIGKILL');
    await proc.exited;
  }
  await cluster?.close();
  cluster = undefined;
  await proxy?.close();
  proxy = undefined;
  await redis?.stop();
  redis = undefined;
});

interface TimedAnswer {
  /** The HTTP status, or 'no answer' after `CLIENT_TIMEOUT_MS`. */
  status: number | 'no answer';
  body: { error?: { code?: string; message?: string } } | undefined;
  ms: number;
}

/** A REST call as a client with a timeout makes it. */
async function timedCall(
  baseUrl: string,
  method: string,
  path: string,
  token: string,
  body?: unknown,
): Promise<TimedAnswer> {
  const started = Date.now();
  try {
    const response = await fetch(baseUrl + path, {
      method,
      headers: {
        authorization: `Bearer ${token}`,
        ...(body === undefined ? {} : { 'content-type': 'application/json' }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(CLIENT_TIMEOUT_MS),
    });
    const text = await response.text();
    return {
      status: response.status,
      body: text ? (JSON.parse(text) as TimedAnswer['body']) : undefined,
      ms: Date.now() - started,
    };
  } catch {
    return { status: 'no answer', body: undefined, ms: Date.now() - started };
  }
}

function expectPromptUnavailable(answer: TimedAnswer, what: string): void {
  expect(answer.status, `${what}: ${JSON.stringify(answer.body)}`).toBe(503);
  expect(answer.body?.error?.code, what).toBe('UNAVAILABLE');
  expect(answer.ms, `${what}: answered after ${answer.ms} ms`).toBeLessThan(PROMPT_MS);
}

async function readyStatus(proc: AppProcess): Promise<number> {
  try {
    const response = await fetch(`${proc.url}/readyz`, { signal: AbortSignal.timeout(2_500) });
    return response.status;
  } catch {
    return 0;
  }
}

async function createConversation(
  baseUrl: string,
  token: string,
  body: Record<string, unknown>,
): Promise<string> {
  const response = await api<{ conversation_id: string }>(baseUrl, 'POST', '/api/conversations', {
    token,
    body,
  });
  expect(response.status, JSON.stringify(response.body)).toBe(201);
  return response.body.conversation_id;
}

async function listConversationIds(baseUrl: string, token: string): Promise<string[]> {
  const response = await api<{ results: Array<{ conversation_id: string }> }>(
    baseUrl,
    'GET',
    '/api/conversations?limit=100',
    { token },
  );
  expect(response.status, JSON.stringify(response.body)).toBe(200);
  return response.body.results.map((info) => info.conversation_id).sort();
}

function messageContents(events: readonly StoredEvent[], source: 'user' | 'agent'): string[] {
  return events.flatMap((e) =>
    e.source === source && 'action' in e && e.action === 'message' ? [String(e.args.content)] : [],
  );
}

/** Waits until every user message of the conversation has an agent answer stored. */
async function answered(baseUrl: string, token: string, id: string): Promise<StoredEvent[]> {
  let events: StoredEvent[] = [];
  await until(
    async () => {
      events = await readAllEvents(baseUrl, token, id);
      const users = events.filter((e) => e.source === 'user' && 'action' in e);
      return users.every((u) => events.some((e) => isAgentReply(e, u.id)));
    },
    `an answer to every message of ${id}`,
    15_000,
    100,
  );
  return events;
}

/** The pid of the redis-server at `url`, to stop it without closing its connections. */
async function redisPid(url: string): Promise<number> {
  const redis = new Redis(url, { maxRetriesPerRequest: 1 });
  try {
    const info = await redis.info('server');
    return Number(/process_id:(\d+)/.exec(info)?.[1]);
  } finally {
    redis.disconnect();
  }
}

describe('a cluster gateway while Redis is down', () => {
  it('refuses creates and messages with 503 UNAVAILABLE at once, and carries none of them out once Redis is back', async () => {
    redis = await startPrivateRedis();
    const c = await cluster_({ gateways: 1, workers: 1, redisUrl: redis.url });
    // The rate limit is on in the cluster (a Redis call before anything is
    // stored); the second gateway has it off, so that nothing but the
    // hand-off itself needs Redis there.
    const limited = c.gateways[0]!;
    const unlimited = await extraGateway(c, 'gateway-unlimited', { RATE_LIMIT_PER_MINUTE: '0' });
    const gateways = [limited, unlimited];
    const token = await c.token('olga');

    // One conversation running (held by the worker), one nobody holds.
    const running = await createConversation(limited.url, token, { initial_user_msg: 'hello' });
    await answered(limited.url, token, running);
    const idle = await createConversation(limited.url, token, { title: 'idle' });
    const socket = await ConversationClient.connect(limited.url, token, {
      conversation_id: running,
    });
    try {
      // Redis stays down until every refused request has been answered (on a
      // failure, for good: the test's clean-up stops it).
      let outageOver!: () => void;
      const over = new Promise<void>((resolve) => (outageOver = resolve));
      const back = redis.restart(() => over);
      await until(
        async () => (await Promise.all(gateways.map(readyStatus))).every((s) => s === 503),
        'both gateways to say they are not ready',
        5_000,
        50,
      );

      const refusals = await Promise.all([
        timedCall(limited.url, 'POST', '/api/conversations', token, { title: 'refused' }).then(
          (answer) => ['create', answer] as const,
        ),
        ...gateways.flatMap((gateway) => [
          timedCall(gateway.url, 'POST', '/api/conversations', token, {
            initial_user_msg: `refused first message (${gateway.name})`,
          }).then((answer) => [`create with a message on ${gateway.name}`, answer] as const),
          timedCall(gateway.url, 'POST', `/api/conversations/${running}/events`, token, {
            action: 'message',
            args: { content: `refused while running (${gateway.name})` },
          }).then((answer) => [`message to a held one on ${gateway.name}`, answer] as const),
          timedCall(gateway.url, 'POST', `/api/conversations/${idle}/events`, token, {
            action: 'message',
            args: { content: `refused while idle (${gateway.name})` },
          }).then((answer) => [`message to an idle one on ${gateway.name}`, answer] as const),
          // Presence asks every gateway through the Socket.IO adapter, over Redis.
          timedCall(gateway.url, 'GET', `/api/conversations/${running}/presence`, token).then(
            (answer) => [`presence on ${gateway.name}`, answer] as const,
          ),
        ]),
      ]);
      const started = Date.now();
      const ack = await Promise.race([
        socket.message('refused on the socket'),
        new Promise<null>((resolve) => setTimeout(() => resolve(null), CLIENT_TIMEOUT_MS)),
      ]);
      const ackMs = Date.now() - started;
      for (const [what, answer] of refusals) expectPromptUnavailable(answer, what);
      expect(ack, 'the socket ack').toMatchObject({ ok: false, error: { code: 'UNAVAILABLE' } });
      expect(ackMs).toBeLessThan(PROMPT_MS);
      // Reads that need Postgres only still work.
      expect((await api(limited.url, 'GET', `/api/conversations/${idle}`, { token })).status).toBe(
        200,
      );

      outageOver();
      await back;
      await until(
        async () =>
          (await Promise.all([...gateways, ...c.workers].map(readyStatus))).every((s) => s === 200),
        'every process ready again',
        20_000,
        100,
      );
      // The conversation goes on: an answer to this one comes after anything queued before it.
      const after = await api<{ event_id: number }>(
        unlimited.url,
        'POST',
        `/api/conversations/${running}/events`,
        { token, body: { action: 'message', args: { content: 'after the outage' } } },
      );
      expect(after.status, JSON.stringify(after.body)).toBe(201);
      const events = await answered(limited.url, token, running);

      // Nothing refused was stored, started or answered.
      expect(await listConversationIds(limited.url, token)).toEqual([running, idle].sort());
      expect(messageContents(events, 'user')).toEqual(['hello', 'after the outage']);
      expect(messageContents(events, 'agent')).toEqual(['echo: hello', 'echo: after the outage']);
      expect(await readAllEvents(limited.url, token, idle)).toEqual([]);
      const idleInfo = await api<{ status: string }>(
        limited.url,
        'GET',
        `/api/conversations/${idle}`,
        { token },
      );
      expect(idleInfo.body.status).toBe('STOPPED');
      // The adapter is back on both gateways: the socket on one is counted from the other.
      await until(
        async () =>
          (await api(unlimited.url, 'GET', `/api/conversations/${running}/presence`, { token }))
            .body?.sockets === 1,
        'the socket counted again through the adapter',
      );

      // Redis hangs (stopped, its connections open): the create is stored
      // before the first command that goes unanswered. It fails once that
      // command's time is up, and the conversation goes with it.
      const pid = await redisPid(redis.url);
      process.kill(pid, 'SIGSTOP');
      let hung: TimedAnswer;
      let presence: TimedAnswer;
      try {
        hung = await timedCall(unlimited.url, 'POST', '/api/conversations', token, {
          initial_user_msg: 'refused while Redis hangs',
        });
        // The other gateway cannot be asked: presence gives up (503) rather than hang.
        presence = await timedCall(
          limited.url,
          'GET',
          `/api/conversations/${running}/presence`,
          token,
        );
      } finally {
        process.kill(pid, 'SIGCONT');
      }
      expect(hung.status, JSON.stringify(hung.body)).toBe(503);
      expect(hung.body?.error?.code).toBe('UNAVAILABLE');
      expect(hung.ms).toBeLessThan(REQUEST_COMMAND_TIMEOUT_MS + PROMPT_MS);
      expect(presence.status, JSON.stringify(presence.body)).toBe(503);
      expect(presence.body?.error?.code).toBe('UNAVAILABLE');
      expect(await listConversationIds(limited.url, token)).toEqual([running, idle].sort());
    } finally {
      socket.close();
    }
  });
});

describe('a cluster gateway while Postgres is unreachable', () => {
  it('answers 503 UNAVAILABLE, whether connections are cut or refused, and works again once it is back', async () => {
    const c = await cluster_({ gateways: 1, workers: 0 });
    const database = new URL(c.db.url);
    proxy = await TcpProxy.start([Number(database.port || 5432)]);
    const proxied = new URL(c.db.url);
    proxied.hostname = '127.0.0.1';
    proxied.port = String(proxy.port);
    const gateway = await extraGateway(c, 'gateway-proxied-db', {
      DATABASE_URL: proxied.toString(),
    });
    const token = await c.token('piotr');
    const kept = await createConversation(gateway.url, token, { title: 'before' });

    const requests = [
      ['list', 'GET', '/api/conversations'],
      ['read', 'GET', `/api/conversations/${kept}`],
      ['events', 'GET', `/api/conversations/${kept}/events`],
      ['create', 'POST', '/api/conversations', { title: 'refused' }],
      [
        'message',
        'POST',
        `/api/conversations/${kept}/events`,
        { action: 'message', args: { content: 'refused' } },
      ],
    ] as const;
    const expectAllUnavailable = async (outage: string) => {
      const answers = await Promise.all(
        requests.map(([, method, path, body]) => timedCall(gateway.url, method, path, token, body)),
      );
      answers.forEach((answer, index) => {
        expectPromptUnavailable(answer, `${requests[index]![0]} (${outage})`);
        expect(JSON.stringify(answer.body)).not.toMatch(/select|insert|postgres|127\.0\.0\.1/i);
      });
    };

    // Every connection cut, and new ones closed as soon as they open.
    proxy.refusing = true;
    proxy.cut();
    await expectAllUnavailable('connections cut');

    proxy.refusing = false;
    await until(
      async () => (await timedCall(gateway.url, 'GET', '/api/conversations', token)).status === 200,
      'the gateway to read again',
      10_000,
      100,
    );
    expect(await listConversationIds(gateway.url, token)).toEqual([kept]);

    // Nothing listens any more: connections are refused.
    await proxy.close();
    proxy = undefined;
    await expectAllUnavailable('connections refused');
  });
});
