// Operations as an operator sees them (docs/protocol.md "Operations"): the metrics
// of a gateway and a worker move while a conversation runs, every log line is
// one JSON object carrying the conversation's ids and no secret, /readyz says
// 503 while Redis is away and 200 once it is back, and with an OTLP endpoint
// one user message makes one trace with spans of both processes.
import { afterEach, describe, expect, it, onTestFailed } from 'vitest';
import type { StoredEvent } from '@cs/protocol';
import { api } from '../support/clients.js';
import {
  CLUSTER_SECRET,
  readAllEvents,
  startCluster,
  until,
  type ClusterOptions,
  type TestCluster,
} from '../support/cluster.js';
import {
  startOtlpReceiver,
  type OtlpReceiver,
  type ReceivedSpan,
} from '../support/otlp-receiver.js';
import type { AppProcess } from '../support/processes.js';
import { startPrivateRedis, type PrivateRedis } from '../support/redis-server.js';
import { sendMessage } from '../support/cluster-conversations.js';

/** What the start scripts run before the app (a no-op without OTEL_EXPORTER_OTLP_ENDPOINT). */
const TRACING_HOOK = ['--import', './dist/libs/observability/src/tracing/tracing.register.js'];
const MESSAGE_TEXT = 'the secret plan is 7f3c91-do-not-log';

let cluster: TestCluster | undefined;
let redis: PrivateRedis | undefined;
let receiver: OtlpReceiver | undefined;

async function cluster_(options: ClusterOptions): Promise<TestCluster> {
  cluster = await startCluster({ nodeArgs: TRACING_HOOK, ...options });
  const started = cluster;
  onTestFailed(() => {
    process.stderr.write(`\n===== process output of the failed test\n${started.outputs()}\n`);
  });
  return started;
}

afterEach(async () => {
  await cluster?.close();
  cluster = undefined;
  await redis?.stop();
  redis = undefined;
  await receiver?.close();
  receiver = undefined;
});

async function createConversation(
  baseUrl: string,
  token: string,
  message?: string,
): Promise<string> {
  const response = await api<{ conversation_id: string }>(baseUrl, 'POST', '/api/conversations', {
    token,
    body: message === undefined ? {} : { initial_user_msg: message },
  });
  expect(response.status, JSON.stringify(response.body)).toBe(201);
  return response.body.conversation_id;
}

/** Waits for the agent's stored answer to the user event `cause`. */
async function answerTo(
  baseUrl: string,
  token: string,
  conversationId: string,
  cause: number,
): Promise<StoredEvent> {
  let answer: StoredEvent | undefined;
  await until(
    async () => {
      const events = await readAllEvents(baseUrl, token, conversationId);
      answer = events.find(
        (e) => e.source === 'agent' && 'action' in e && e.action === 'message' && e.cause === cause,
      );
      return answer !== undefined;
    },
    `the answer to event ${cause}`,
    20_000,
  );
  return answer!;
}

// --- Prometheus text ----------------------------------------------------------

async function scrape(proc: AppProcess): Promise<string> {
  const response = await fetch(`${proc.url}/metrics`);
  expect(response.status).toBe(200);
  return response.text();
}

/**
 * The sum of a metric's samples over all its label sets, or undefined when it
 * has none; the per-queue samples of `cs_conversations_waiting` (label
 * `queue`) are left out, as its sample without that label is their sum.
 */
function sample(text: string, name: string): number | undefined {
  let total: number | undefined;
  for (const line of text.split('\n')) {
    const match = /^([a-zA-Z_:][\w:]*)(\{[^}]*\})? (\S+)/.exec(line);
    if (match?.[1] === name && !match[2]?.includes('queue="'))
      total = (total ?? 0) + Number(match[3]);
  }
  return total;
}

// --- log lines ------------------------------------------------------------------

type LogLine = Record<string, unknown> & { level: string; time: string; msg: string };

/** Every line of a process's output, parsed; fails on a line that is not one JSON object. */
function logLines(proc: AppProcess): LogLine[] {
  return proc
    .output()
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => {
      let parsed: unknown;
      try {
        parsed = JSON.parse(line);
      } catch {
        throw new Error(`${proc.name} wrote a line that is not JSON: ${line}`);
      }
      expect(parsed, line).toMatchObject({
        level: expect.any(String),
        time: expect.any(String),
        msg: expect.any(String),
      });
      return parsed as LogLine;
    });
}

// --- the tests ------------------------------------------------------------------

describe('metrics and logs of a cluster', () => {
  it('moves the new metrics of a gateway and a worker while a conversation runs', async () => {
    // No worker at first: the conversation waits, as the autoscaler would see it.
    const c = await cluster_({ workers: 0, env: { LOG_LEVEL: 'info' } });
    const gateway = c.gateways[0]!;
    const token = await c.token('ops-user');
    const before = await scrape(gateway);
    for (const name of ['cs_conversations_waiting', 'cs_lease_acquisitions_total']) {
      expect(sample(before, name), name).toBe(0);
    }
    const conversationId = await createConversation(gateway.url, token, 'hello');
    await until(
      async () => sample(await scrape(gateway), 'cs_conversations_waiting') === 1,
      'cs_conversations_waiting 1 on the gateway',
    );

    const worker = await c.startWorker();
    await answerTo(gateway.url, token, conversationId, 0);
    await until(
      async () => sample(await scrape(worker), 'cs_conversations_waiting') === 0,
      'cs_conversations_waiting 0 on the worker once it took the conversation',
    );
    const workerBefore = await scrape(worker);
    const id = await sendMessage(gateway.url, token, conversationId, 'again');
    await answerTo(gateway.url, token, conversationId, id);

    const gatewayAfter = await scrape(gateway);
    const workerAfter = await scrape(worker);
    expect(sample(gatewayAfter, 'cs_conversations_waiting')).toBe(0);
    expect(sample(gatewayAfter, 'cs_event_append_seconds_count')).toBeGreaterThan(
      sample(before, 'cs_event_append_seconds_count') ?? 0,
    );
    // The second message reached the holder by a wake-up, whose pickup is timed.
    expect(sample(workerAfter, 'cs_wakeup_pickup_seconds_count')).toBeGreaterThan(
      sample(workerBefore, 'cs_wakeup_pickup_seconds_count') ?? 0,
    );
    // Every metric of the contract is on both processes' /metrics.
    for (const name of [
      'cs_lease_acquisitions_total',
      'cs_failovers_total',
      'cs_handoffs_total',
      'cs_agent_step_seconds_count',
      'cs_wakeup_pickup_seconds_count',
      'cs_conversations_waiting',
      'cs_limit_evictions_total',
      'cs_limit_rejections_total',
      'cs_llm_request_seconds_count',
    ]) {
      expect(sample(gatewayAfter, name), `${name} on the gateway`).toBeDefined();
      expect(sample(workerAfter, name), `${name} on the worker`).toBeDefined();
    }
  });

  it('writes JSON lines with the ids of the conversation, and no token, secret or message', async () => {
    const c = await cluster_({ env: { LOG_LEVEL: 'info' } });
    const gateway = c.gateways[0]!;
    const worker = c.workers[0]!;
    const token = await c.token('log-user');
    const conversationId = await createConversation(gateway.url, token, MESSAGE_TEXT);
    await answerTo(gateway.url, token, conversationId, 0);
    const id = await sendMessage(gateway.url, token, conversationId, MESSAGE_TEXT);
    await answerTo(gateway.url, token, conversationId, id);
    // Lines written while stopping are lines too.
    await Promise.all([gateway.stop(), worker.stop()]);

    const gatewayLines = logLines(gateway);
    const workerLines = logLines(worker);
    for (const [proc, lines, role] of [
      [gateway, gatewayLines, 'gateway'],
      [worker, workerLines, 'worker'],
    ] as const) {
      const text = proc.output();
      expect(text, `${proc.name} logged the token`).not.toContain(token);
      expect(text, `${proc.name} logged the JWT secret`).not.toContain(CLUSTER_SECRET);
      expect(text, `${proc.name} logged a message's content`).not.toContain(MESSAGE_TEXT);
      expect(new Set(lines.map((line) => line.role))).toEqual(new Set([role]));
      // A line that names the conversation says so in its fields too.
      for (const line of lines.filter((l) => JSON.stringify(l).includes(conversationId)))
        expect(line.conversation_id, JSON.stringify(line)).toBe(conversationId);
    }
    for (const line of workerLines) expect(line.worker_id, JSON.stringify(line)).toBe(worker.name);
    expect(gatewayLines.every((line) => typeof line.gateway_id === 'string')).toBe(true);

    // The requests about the conversation carry its ids and the caller's.
    const requests = gatewayLines.filter(
      (line) => typeof line.msg === 'string' && line.msg.includes(`/${conversationId}/events`),
    );
    expect(requests.length).toBeGreaterThan(0);
    for (const line of requests) {
      expect(line).toMatchObject({
        conversation_id: conversationId,
        tenant_id: c.tenant,
        user_id: 'log-user',
      });
    }
    expect(gatewayLines.some((line) => line.msg === 'SIGTERM: draining')).toBe(true);
    expect(workerLines.some((line) => line.msg === 'SIGTERM: draining')).toBe(true);
  });
});

describe('readiness', () => {
  it('answers 503 on a gateway and a worker while their Redis is away, and 200 once it is back', async () => {
    redis = await startPrivateRedis();
    const c = await cluster_({ redisUrl: redis.url });
    const probes = [c.gateways[0]!, c.workers[0]!];
    const ready = async (proc: AppProcess) => {
      const response = await fetch(`${proc.url}/readyz`, { signal: AbortSignal.timeout(2_500) });
      return response.status;
    };
    for (const proc of probes) expect(await ready(proc), proc.name).toBe(200);

    // Down until each probe has said 503 (answering in time).
    let outageOver!: () => void;
    const over = new Promise<void>((resolve) => (outageOver = resolve));
    const restarted = redis.restart(() => over);
    await Promise.all(
      probes.map((proc) =>
        until(async () => (await ready(proc)) === 503, `${proc.name} /readyz 503`, 5_000, 100),
      ),
    );
    outageOver();
    await restarted;
    await Promise.all(
      probes.map((proc) =>
        until(async () => (await ready(proc)) === 200, `${proc.name} /readyz 200`, 15_000, 100),
      ),
    );
  });
});

describe('traces', () => {
  it('makes one trace of a user message with spans of the gateway, Postgres, Redis and the worker', async () => {
    receiver = await startOtlpReceiver();
    const c = await cluster_({ env: { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url } });
    const gateway = c.gateways[0]!;
    const token = await c.token('trace-user');
    const conversationId = await createConversation(gateway.url, token, 'first');
    await answerTo(gateway.url, token, conversationId, 0);
    const id = await sendMessage(gateway.url, token, conversationId, 'second');
    await answerTo(gateway.url, token, conversationId, id);

    const spans = receiver.spans;
    let trace: ReceivedSpan[] = [];
    await until(
      () => {
        const send = spans.find(
          (span) =>
            span.role === 'gateway' &&
            span.scope.includes('instrumentation-http') &&
            span.name.startsWith('POST') &&
            spans.some((s) => s.traceId === span.traceId && s.role === 'worker'),
        );
        trace = send ? spans.filter((span) => span.traceId === send.traceId) : [];
        return trace.length > 0;
      },
      () => `a trace with spans of both processes among ${JSON.stringify(spans.slice(-40))}`,
      15_000,
      200,
    );
    const roles = new Set(trace.map((span) => span.role));
    expect([...roles].sort()).toEqual(['gateway', 'worker']);
    expect(trace.some((span) => span.scope.includes('instrumentation-pg'))).toBe(true);
    expect(trace.some((span) => span.scope.includes('instrumentation-ioredis'))).toBe(true);
    // The worker's part continues the gateway's: its parent is a span of the gateway.
    const gatewaySpans = new Set(trace.filter((s) => s.role === 'gateway').map((s) => s.spanId));
    const workerRoots = trace.filter(
      (span) =>
        span.role === 'worker' &&
        !trace.some((s) => s.spanId === span.parentSpanId && s.role === 'worker'),
    );
    expect(workerRoots.length).toBeGreaterThan(0);
    for (const span of workerRoots) expect(gatewaySpans.has(span.parentSpanId ?? '')).toBe(true);
    // The message's turn and its step are spans of the gateway's trace, on the worker.
    await until(
      () =>
        spans.some(
          (span) =>
            span.role === 'worker' &&
            span.name === 'agent turn' &&
            spans.some((s) => s.traceId === span.traceId && s.role === 'gateway'),
        ),
      () => `an agent turn in a gateway's trace among ${JSON.stringify(spans.slice(-40))}`,
      15_000,
      200,
    );
    const turn = spans.find(
      (span) =>
        span.name === 'agent turn' &&
        spans.some((s) => s.traceId === span.traceId && s.role === 'gateway'),
    )!;
    expect(
      spans.some(
        (span) =>
          span.traceId === turn.traceId && span.name === 'agent step' && span.role === 'worker',
      ),
    ).toBe(true);
    // Probes and scrapes make no spans.
    expect(spans.some((span) => /healthz|readyz|metrics/.test(span.name))).toBe(false);
    // Every process exports as the service it is.
    for (const span of spans) expect(span.service, span.role).toBe('conversation-service');
  });
});
