// Helpers of the agent runtime's end-to-end tests: the test agent module,
// tokens, the streamed text a client assembles, and an SSE stream's deltas.
import { join } from 'node:path';
import { SignJWT } from 'jose';
import type { ServerEvent, StreamDelta } from '@cs/protocol';
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
