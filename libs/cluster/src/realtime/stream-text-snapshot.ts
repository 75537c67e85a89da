/**
 * How a step's text so far is kept in Redis for gateways that open a room
 * mid-step: `<cause>:<text>`, a plain string, so that each delta that follows
 * on is an APPEND of its own text (never a rewrite of the whole).
 */

export interface StreamTextSnapshot {
  cause: number;
  text: string;
}

export function encodeStreamText(snapshot: StreamTextSnapshot): string {
  return `${snapshot.cause}:${snapshot.text}`;
}

/** The snapshot a stored value holds; null for anything else. */
export function decodeStreamText(stored: string): StreamTextSnapshot | null {
  const colon = stored.indexOf(':');
  const digits = stored.slice(0, colon);
  if (colon < 1 || !/^\d{1,15}$/.test(digits)) return null;
  return { cause: Number(digits), text: stored.slice(colon + 1) };
}
