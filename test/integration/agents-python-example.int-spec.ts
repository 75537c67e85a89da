// The Python example remote agent (examples/http-agent-python) driven by the
// `http` agent through two steps of a turn: it verifies the signature,
// streams deltas and calls the service's `current_time` tool; given the
// tool's result in the history, it answers with a message.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AgentTurnError } from '@cs/core';
import { HttpAgent } from '@cs/agents';
import type { StoredEvent } from '@cs/protocol';
import {
  CURRENT_TIME_TOOL,
  contextOf,
  events,
  resetEventIds,
  settle,
} from '../fakes/agent-context.js';

const script = fileURLToPath(new URL('../../examples/http-agent-python/agent.py', import.meta.url));
const SECRET = 'python-example-secret-0123456789';

let child: ChildProcess;
let url: string;

beforeAll(async () => {
  child = spawn('python3', [script], {
    env: { PATH: process.env.PATH, PORT: '0', AGENT_HTTP_SECRET: SECRET, DELTA_PAUSE: '0.01' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines = createInterface({ input: child.stdout! });
  url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the Python agent did not start')), 15_000);
    child.once('exit', (code) => reject(new Error(`the Python agent exited with ${code}`)));
    lines.on('line', (line) => {
      const found = /listening on (http:\/\/\S+)/.exec(line);
      if (found) {
        clearTimeout(timer);
        resolve(found[1]!);
      }
    });
  });
});

afterAll(() => {
  child?.kill('SIGTERM');
});

const agent = (secret = SECRET) => new HttpAgent({ url, secret, timeoutMs: 10_000 });

describe('examples/http-agent-python', () => {
  it('calls current_time, then answers with the time it is given', async () => {
    resetEventIds();
    const history: StoredEvent[] = [events.user('What time is it?')];
    const first = await settle(
      agent().step(contextOf(history, { tools: [CURRENT_TIME_TOOL], conversation_id: 'py-1' })),
    );
    expect(first.error).toBeUndefined();
    const deltas = first.outputs.filter((o) => o.type === 'delta');
    expect(deltas.length).toBeGreaterThan(1);
    expect(deltas.map((o) => (o.type === 'delta' ? o.delta : '')).join('')).toBe(
      'Let me look at the clock.',
    );
    const call = first.outputs.at(-1)!;
    expect(call).toMatchObject({ type: 'tool_call', tool: 'current_time', arguments: {} });
    const callId = call.type === 'tool_call' ? call.tool_call_id! : '';
    expect(callId).toMatch(/^time-[0-9a-f]{16}$/);

    // The runtime stores the call and its result; the next step sees them.
    history.push(events.toolCall('current_time', {}, callId));
    history.push(events.toolResult('current_time', '2026-12-01T10:00:00.000Z', callId));
    const second = await settle(
      agent().step(contextOf(history, { tools: [CURRENT_TIME_TOOL], conversation_id: 'py-1' })),
    );
    expect(second.error).toBeUndefined();
    expect(second.outputs.at(-1)).toEqual({
      type: 'message',
      content: 'It is 2026-12-01T10:00:00.000Z (UTC).',
    });
    expect(second.outputs.filter((o) => o.type === 'delta').length).toBeGreaterThan(1);
  });

  it('answers a repeated request (same idempotency-key) the same way', async () => {
    resetEventIds();
    const history = [events.user('time please')];
    const context = () =>
      contextOf(history, { tools: [CURRENT_TIME_TOOL], conversation_id: 'py-2' });
    const a = await settle(agent().step(context()));
    const b = await settle(agent().step(context()));
    expect(b.outputs).toEqual(a.outputs);
  });

  it('keeps the answers of the most recent ANSWERS_KEPT keys only (bounded memory)', () => {
    const program = [
      'import json, sys',
      'sys.path.insert(0, sys.argv[1])',
      'import agent',
      'request = {"trigger": {"id": 0}, "events": [], "tools": []}',
      'for key in ["a", "b", "c", "b"]: agent.answer_for(request, key)',
      'print(json.dumps(list(agent.answers)))',
    ].join('\n');
    const kept = execFileSync('python3', ['-c', program, dirname(script)], {
      env: { PATH: process.env.PATH, ANSWERS_KEPT: '2', PYTHONDONTWRITEBYTECODE: '1' },
      encoding: 'utf8',
    });
    // "a" went when "c" came; "b", asked again, is the most recent.
    expect(JSON.parse(kept)).toEqual(['c', 'b']);
  });

  it('refuses a request signed with another secret, which ends the turn in agent_http_error', async () => {
    resetEventIds();
    const { error } = await settle(
      agent('another-secret-that-is-wrong').step(
        contextOf([events.user('hi')], { tools: [CURRENT_TIME_TOOL] }),
      ),
    );
    expect(error).toBeInstanceOf(AgentTurnError);
    expect(error).toMatchObject({
      reason: 'agent_http_error',
      safeMessage: 'the remote agent answered with status 401',
    });
  });
});
