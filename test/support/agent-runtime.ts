// Helpers of the agent runtime's end-to-end tests: the test agent module,
// tokens, and the streamed text a client assembles.
import { join } from 'node:path';
import { SignJWT } from 'jose';
import type { ServerEvent, StreamDelta } from '@cs/protocol';
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
