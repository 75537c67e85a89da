// Helpers of the agent runtime's end-to-end tests: the test agent module,
// tokens, the streamed text a client assembles, and an SSE stream's deltas.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { SignJWT } from 'jose';
import { expect } from 'vitest';
import type { ServerEvent, StreamDelta } from '@cs/protocol';
import { ConversationClient } from './clients.js';
import { PROMPTLY_MS } from './bounds.js';
import { until } from './cluster.js';
import { ROOT } from './processes.js';

export const AGENT_MODULE = join(ROOT, 'test/fixtures/agents/scripted-agents.mjs');

export async function signFor(secret: string, sub: string, tid: string): Promise<string> {
  return new SignJWT({ tid, roles: [] })
    .setProtectedHeader({ alg: 'HS256' })
    .setSubject(sub)
    .setExpirationTime('1h')
    .sign(new TextEncoder().encode(secret));
}

export function deltasOf(events: ServerEvent[], cause?: number): StreamDelta[] {
  return events.filter(
    (e): e is StreamDelta => 'stream' in e && (cause === undefined || e.cause === cause),
  );
}

/** The text a client assembles from deltas by offset. */
export function assemble(deltas: StreamDelta[]): string {
  let text = '';
  for (const delta of deltas) text = text.slice(0, delta.offset) + delta.delta;
  return text;
}

/** An SSE stream of the conversation on `baseUrl` from `lastEventId`, read as it comes. */
export async function watchSse(baseUrl: string, id: string, token: string, lastEventId: number) {
  const controller = new AbortController();
  const response = await fetch(`${baseUrl}/api/conversations/${id}/stream`, {
    headers: { authorization: `Bearer ${token}`, 'last-event-id': String(lastEventId) },
    signal: controller.signal,
  });
  let text = '';
  const reading = (async () => {
    const decoder = new TextDecoder();
    try {
      for await (const chunk of response.body!) text += decoder.decode(chunk as Uint8Array);
    } catch {
      // aborted
    }
  })();
  return {
    /** Waits for an answer on the stream, closes it, and gives the deltas it carried. */
    async deltasUntilAnswer(): Promise<StreamDelta[]> {
      await until(async () => text.includes('"action":"message"'), 'the SSE answer');
      controller.abort();
      await reading;
      return text
        .split('\n')
        .filter((line) => line.startsWith('data: ') && line.includes('"stream":true'))
        .map((line) => JSON.parse(line.slice(6)) as StreamDelta);
    },
  };
}

/** The turns (trigger ids) whose signal the `rollback_watcher` agent saw abort, and when. */
function rollbacks(toolLog: string, conversationId: string): Map<number, number> {
  const seen = new Map<number, number>();
  for (const line of readFileSync(toolLog, 'utf8').split('\n')) {
    const [word, conversation, trigger, at] = line.split(' ');
    if (word === 'rollback' && conversation === conversationId)
      seen.set(Number(trigger), Number(at));
  }
  return seen;
}

/**
 * docs/protocol.md, "Agent modules": a turn's signal aborts when the turn is cut
 * (here: an interrupt, at once) and never when it ends with its answer,
 * under each strategy with a message sent during the turn. A third message
 * answered afterwards proves the earlier turns are over (each turn begins
 * after the one before it has ended).
 */
export async function expectSignalAbortedOnlyWhenCut(
  url: string,
  token: string,
  toolLog: string,
  create: (body: Record<string, unknown>) => Promise<string>,
): Promise<void> {
  const idOf = (ack: unknown) => (ack as { event_id: number }).event_id;
  for (const strategy of ['enqueue', 'reject', 'interrupt'] as const) {
    const id = await create({ agent: 'rollback_watcher', multitask_strategy: strategy });
    const client = await ConversationClient.connect(url, token, { conversation_id: id });
    try {
      // Long enough that the message sent during it reaches the agent on a busy machine.
      const first = idOf(await client.message('slow one'));
      await client.waitFor((events) => deltasOf(events, first).length >= 1);
      const sentAt = Date.now();
      const during = await client.message('two');
      const second = strategy === 'reject' ? null : idOf(during);
      if (strategy === 'reject') {
        expect(during).toMatchObject({ ok: false, error: { code: 'AGENT_BUSY' } });
        await client.waitForReply(first);
      } else {
        await client.waitForReply(second!);
      }
      const third = idOf(await client.message('three'));
      await client.waitForReply(third);
      const aborted = rollbacks(toolLog, id);
      if (strategy === 'interrupt') {
        expect([...aborted.keys()], strategy).toEqual([first]);
        expect(aborted.get(first)! - sentAt, strategy).toBeLessThan(PROMPTLY_MS);
      } else {
        expect([...aborted.keys()], strategy).toEqual([]);
      }
    } finally {
      client.close();
    }
  }
}
