// A cluster gateway while Postgres is unreachable, as a client sees it
// (PROTOCOL.md "REST", errors): a request that needs it is answered 503
// UNAVAILABLE at once, whether its connections are cut or refused.
import { afterEach, describe, expect, it, onTestFailed } from 'vitest';
import { api } from '../support/clients.js';
import { startCluster, until, type ClusterOptions, type TestCluster } from '../support/cluster.js';
import { startApp, type AppProcess } from '../support/processes.js';
import { TcpProxy } from '../support/tcp-proxy.js';

/** "Within a few seconds": a refusal must come well before a client gives up. */
const PROMPT_MS = 3_000;
/** When a request that has not been answered counts as hanging. */
const CLIENT_TIMEOUT_MS = 5_000;

let cluster: TestCluster | undefined;
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
