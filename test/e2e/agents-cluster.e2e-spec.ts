// The llm and http agents on a cluster of two gateways and two workers built
// in dist/, against servers the test starts: an OpenAI-compatible model
// server, an MCP server, a remote HTTP agent and an OTLP receiver. Deltas
// cross gateways before the final message, tool calls are stored linked, a
// request to the remote agent repeated after kill -9 of its worker carries
// the same idempotency-key and its answer is stored once, and each model
// request is a span of its message's trace that holds no key and no text.
import { afterAll, beforeAll, describe, expect, it, onTestFailed } from 'vitest';
import type { StoredEvent } from '@cs/protocol';
import { FakeModelServer, openAiCompletion, openAiStream } from '../fakes/fake-model-server.js';
import { FakeMcpServer } from '../fakes/fake-mcp-server.js';
import {
  FakeRemoteAgent,
  type RemoteAgentRequest,
  type RemoteAnswer,
} from '../fakes/fake-remote-agent.js';
import {
  createConversation,
  isDelta,
  say,
  sayAndExpectStreamedReply,
  scriptTagged,
  streaming,
  toolResultsOf,
} from '../support/agent-e2e.js';
import { ConversationClient, api } from '../support/clients.js';
import {
  holderOf,
  readAllEvents,
  startCluster,
  until,
  type TestCluster,
} from '../support/cluster.js';
import { startOtlpReceiver, type OtlpReceiver } from '../support/otlp-receiver.js';
import { uniqueName } from '../support/services.js';
import { useTestRedis } from '../support/test-redis.js';

// One Redis, or a Redis Cluster with TEST_REDIS=cluster (npm run test:redis-cluster).
useTestRedis();

const API_KEY = 'sk-cluster-e2e-THE-MODEL-KEY-0123456789';
const HMAC_SECRET = 'cluster-e2e-hmac-secret-0123456789abcdef';
const MCP_TOKEN = 'cluster-e2e-mcp-token-0123456789abcdef';
const LEASE_TTL_MS = 3000;
/** What the start scripts run before the app (a no-op without OTEL_EXPORTER_OTLP_ENDPOINT). */
const TRACING_HOOK = ['--import', './dist/libs/observability/src/tracing/tracing.register.js'];

let model: FakeModelServer;
let mcp: FakeMcpServer;
let remote: FakeRemoteAgent;
let receiver: OtlpReceiver;
let cluster: TestCluster;

/** What the remote agent does with a request, by conversation (default: a short answer). */
const remoteScripts = new Map<
  string,
  (request: RemoteAgentRequest, answer: RemoteAnswer) => unknown
>();

beforeAll(async () => {
  model = await FakeModelServer.start();
  model.when((b) => !streaming(b), {
    kind: 'json',
    status: 200,
    body: openAiCompletion('A cluster title'),
  });
  mcp = await FakeMcpServer.start({ token: MCP_TOKEN });
  remote = await FakeRemoteAgent.start(HMAC_SECRET, (request, answer) => {
    const run = remoteScripts.get(String(request.body['conversation_id']));
    if (run) return run(request, answer);
    answer.lines({ type: 'message', content: 'remote default answer' });
    return undefined;
  });
  receiver = await startOtlpReceiver();
  cluster = await startCluster({
    gateways: 2,
    workers: 2,
    nodeArgs: TRACING_HOOK,
    env: {
      LEASE_TTL_MS: String(LEASE_TTL_MS),
      MAX_CONCURRENT_CONVERSATIONS: '20',
      OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url,
      LLM_BASE_URL: `${model.url}/v1`,
      LLM_API_KEY: API_KEY,
      LLM_MODEL: 'fake-model',
      LLM_MAX_RETRIES: '1',
      MCP_SERVERS: JSON.stringify({
        files: { url: mcp.url, headers: { authorization: `Bearer ${MCP_TOKEN}` } },
      }),
      AGENT_HTTP_URL: remote.url,
      AGENT_HTTP_SECRET: HMAC_SECRET,
    },
  });
});

afterAll(async () => {
  await cluster?.close();
  await remote?.close();
  await mcp?.close();
  await model?.close();
  await receiver?.close();
});

function showOutputsOnFailure(): void {
  onTestFailed(() => {
    process.stderr.write(`\n===== process output of the failed test\n${cluster.outputs()}\n`);
  });
}

/** Creates a conversation on the first gateway and watches it from the second. */
async function openAcrossGateways(
  token: string,
  body: Record<string, unknown>,
): Promise<{ id: string; client: ConversationClient }> {
  const id = await createConversation(cluster.gateways[0]!.url, token, body);
  const client = await ConversationClient.connect(cluster.gateways[1]!.url, token, {
    conversation_id: id,
  });
  return { id, client };
}

const agentMessages = (events: StoredEvent[]) =>
  events.filter((e) => e.source === 'agent' && 'action' in e && e.action === 'message');

describe('the llm agent on two gateways and two workers', () => {
  it('streams deltas to a client on the other gateway before the final message, and stores only the message', async () => {
    showOutputsOnFailure();
    scriptTagged(model, 'tag-cluster-stream', {
      kind: 'stream',
      delayMs: 40,
      events: openAiStream({
        text: ['Across', ' two', ' gateways', '.'],
        usage: { prompt_tokens: 50, completion_tokens: 8 },
      }),
    });
    const token = await cluster.token(uniqueName('streamer'));
    const { id, client } = await openAcrossGateways(token, { agent: 'llm', title: 'fixed' });
    try {
      const { cause } = await sayAndExpectStreamedReply(
        client,
        'tag-cluster-stream: hello',
        'Across two gateways.',
        30_000,
      );
      const stored = await readAllEvents(cluster.gateways[0]!.url, token, id);
      expect(stored.some((e) => (e as { stream?: unknown }).stream)).toBe(false);
      expect(agentMessages(stored)).toHaveLength(1);
      expect(agentMessages(stored)[0]).toMatchObject({
        cause,
        args: { content: 'Across two gateways.' },
      });
    } finally {
      client.close();
    }
  });

  it('runs a built-in and an MCP tool call on the worker and stores each call and result linked; a failing tool is an is_error result and the turn goes on', async () => {
    showOutputsOnFailure();
    scriptTagged(
      model,
      'tag-cluster-tools',
      {
        kind: 'stream',
        events: openAiStream({
          toolCalls: [
            { id: 'call_time', name: 'current_time', argumentPieces: ['{', '}'] },
            {
              id: 'call_echo',
              name: 'files__echo',
              argumentPieces: ['{"text":', '"from the', ' cluster"}'],
            },
            { id: 'call_fail', name: 'files__fail', argumentPieces: ['{}'] },
          ],
        }),
      },
      { kind: 'stream', events: openAiStream({ text: ['Both ran.'] }) },
    );
    const token = await cluster.token(uniqueName('tools'));
    const { id, client } = await openAcrossGateways(token, { agent: 'llm', title: 'fixed' });
    try {
      const ack = await client.message('tag-cluster-tools: use them');
      const cause = ack.ok ? ack.event_id : -1;
      await client.waitForReply(cause, 30_000);
      const stored = await readAllEvents(cluster.gateways[0]!.url, token, id);
      const calls = stored.filter(
        (e): e is StoredEvent & { args: Record<string, unknown> } =>
          'action' in e && e.action === 'tool_call',
      );
      expect(calls.map((c) => c.args['tool'])).toEqual([
        'current_time',
        'files__echo',
        'files__fail',
      ]);
      for (const call of calls) {
        const results = toolResultsOf(stored, call.args['tool_call_id']);
        expect(results).toHaveLength(1);
        expect(results[0]!.cause).toBe(call.id);
        expect(results[0]!.extras['is_error']).toBe(call.args['tool'] === 'files__fail');
        if (call.args['tool'] === 'files__echo')
          expect(results[0]!.content).toBe('from the cluster');
      }
      expect(agentMessages(stored)).toHaveLength(1);
      expect(agentMessages(stored)[0]).toMatchObject({ cause, args: { content: 'Both ran.' } });
    } finally {
      client.close();
    }
  });

  it("makes each model request a span of the message's trace, under its agent step, with no key and no text in any span", async () => {
    showOutputsOnFailure();
    const question = 'tag-cluster-trace: the confidential plan 3e9a1f';
    const answer = 'the confidential answer 77c1d0';
    scriptTagged(model, 'tag-cluster-trace', {
      kind: 'stream',
      events: openAiStream({ text: [answer] }),
    });
    scriptTagged(model, 'tag-cluster-first', {
      kind: 'stream',
      events: openAiStream({ text: ['first'] }),
    });
    const token = await cluster.token(uniqueName('tracer'));
    const gateway = cluster.gateways[0]!;
    const id = await createConversation(cluster.gateways[0]!.url, token, {
      agent: 'llm',
      title: 'fixed',
      initial_user_msg: 'tag-cluster-first',
    });
    await until(
      async () => agentMessages(await readAllEvents(gateway.url, token, id)).length === 1,
      'the first answer',
      30_000,
    );
    const sent = await api<{ event_id: number }>(
      gateway.url,
      'POST',
      `/api/conversations/${id}/events`,
      { token, body: { action: 'message', args: { content: question } } },
    );
    expect(sent.status).toBe(201);
    await until(
      async () => agentMessages(await readAllEvents(gateway.url, token, id)).length === 2,
      'the second answer',
      30_000,
    );

    const spans = receiver.spans;
    // The model request of this message's turn, in a trace the gateway began (the message's:
    // stored there, then woken here). Other tests' turns are in the receiver too, some of them
    // of two steps: only the turn of this conversation's message counts.
    const ownTurn = (traceId: string) =>
      spans.some(
        (s) =>
          s.traceId === traceId &&
          s.name === 'agent turn' &&
          s.attributes['cs.conversation_id'] === id &&
          s.attributes['cs.event_id'] === sent.body.event_id,
      );
    const requestSpan = () =>
      spans.find(
        (span) =>
          span.name === 'model request' &&
          span.role === 'worker' &&
          ownTurn(span.traceId) &&
          spans.some((s) => s.traceId === span.traceId && s.role === 'gateway') &&
          spans.some(
            (s) => s.traceId === span.traceId && s.name === 'agent step' && s.role === 'worker',
          ),
      );
    await until(
      () => requestSpan() !== undefined,
      () =>
        `a model request span in a gateway's trace; the traces of model requests: ${JSON.stringify(
          spans
            .filter((s) => s.name === 'model request')
            .map((r) =>
              spans
                .filter((s) => s.traceId === r.traceId)
                .map((s) => `${s.role}:${s.name}:${s.spanId}<${s.parentSpanId ?? ''}`),
            ),
        )}`,
      20_000,
      200,
    );
    const request = requestSpan()!;
    const trace = spans.filter((s) => s.traceId === request.traceId);
    const parent = trace.find((s) => s.spanId === request.parentSpanId);
    expect(parent?.name).toBe('agent step');
    const turn = trace.find((s) => s.spanId === parent?.parentSpanId);
    expect(turn?.name).toBe('agent turn');
    expect(trace.filter((s) => s.name === 'model request')).toHaveLength(1);
    expect(request.attributes).toMatchObject({
      'gen_ai.provider.name': 'openai',
      'gen_ai.request.model': 'fake-model',
      'cs.llm.outcome': 'ok',
    });
    // Every span of every process: no key, no secret, no message text.
    for (const span of spans) {
      const seen = `${span.name} ${span.text}`;
      for (const secret of [API_KEY, HMAC_SECRET, MCP_TOKEN, question, answer, '3e9a1f', '77c1d0'])
        expect(seen, `${span.role} span ${span.name}`).not.toContain(secret);
    }
  });
});

describe('the http agent on two gateways and two workers', () => {
  it('repeats the request cut by kill -9 of its worker with the same idempotency-key, and stores the answer once', async () => {
    showOutputsOnFailure();
    const token = await cluster.token(uniqueName('remote'));
    const id = await createConversation(cluster.gateways[0]!.url, token, {
      agent: 'http',
      title: 'fixed',
    });
    let requests = 0;
    remoteScripts.set(id, (_request, answer) => {
      requests += 1;
      if (requests === 1) {
        // Held open: the worker dies in the middle of it.
        answer.lines({ type: 'delta', delta: 'thinking' });
        return 'hang';
      }
      answer.lines(
        { type: 'delta', delta: 'Answered ' },
        { type: 'message', content: 'Answered after the failover.' },
      );
      return undefined;
    });
    const mine = () => remote.requests.filter((r) => r.body['conversation_id'] === id);
    const client = await ConversationClient.connect(cluster.gateways[1]!.url, token, {
      conversation_id: id,
    });
    try {
      const cause = await say(client, 'please think');
      await until(() => mine().length === 1, 'the first request to the remote agent', 30_000);
      await client.waitFor((events) => events.some(isDelta), 20_000, 'the first delta');

      const holder = await holderOf(cluster.workers, id);
      holder.signal('SIGKILL');
      await holder.exited;
      // The remote agent sees the connection of the dead worker end.
      await mine()[0]!.closed;
      await cluster.startWorker();

      await until(
        async () =>
          agentMessages(await readAllEvents(cluster.gateways[0]!.url, token, id)).length > 0,
        'the answer after the failover',
        LEASE_TTL_MS + 40_000,
        200,
      );
      const [first, second, ...more] = mine();
      expect(more).toHaveLength(0);
      expect(first!.verified && second!.verified).toBe(true);
      const key = first!.headers['idempotency-key'];
      expect(key).toMatch(new RegExp(`^${id}:\\d+$`));
      expect(second!.headers['idempotency-key']).toBe(key);
      expect(second!.body['trigger']).toMatchObject({ id: cause });

      // Settle: the turn has ended (the state change that settles it is stored after
      // its answer), so nothing more is stored for it, and no third request came.
      let stored: StoredEvent[] = [];
      await until(
        async () => {
          stored = await readAllEvents(cluster.gateways[0]!.url, token, id);
          const answer = agentMessages(stored).at(-1);
          return stored.some(
            (e) =>
              answer !== undefined &&
              e.id > answer.id &&
              'observation' in e &&
              e.extras['agent_state'] === 'awaiting_user_input',
          );
        },
        'the turn to end after its answer',
        20_000,
        100,
      );
      expect(mine()).toHaveLength(2);
      const answers = agentMessages(stored);
      expect(answers).toHaveLength(1);
      expect(answers[0]).toMatchObject({
        cause,
        args: { content: 'Answered after the failover.' },
      });
      expect((answers[0] as { args: Record<string, unknown> }).args).not.toHaveProperty(
        'interrupted',
      );
    } finally {
      client.close();
    }
  });
});

describe('secrets on the cluster', () => {
  it('never writes the model key, the HMAC secret or the MCP header to any process output', () => {
    const outputs = cluster.outputs();
    expect(outputs.length).toBeGreaterThan(0);
    for (const proc of [...cluster.gateways, ...cluster.workers]) {
      const output = proc.output();
      expect(output, `${proc.name} logged the model key`).not.toContain(API_KEY);
      expect(output, `${proc.name} logged the HMAC secret`).not.toContain(HMAC_SECRET);
      expect(output, `${proc.name} logged the MCP header`).not.toContain(MCP_TOKEN);
    }
  });
});
