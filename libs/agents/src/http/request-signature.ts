/**
 * The signature of a request to a remote agent (docs/protocol.md "HTTP agent"):
 * `x-cs-signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<raw body>">`,
 * keyed with `AGENT_HTTP_SECRET`, with the timestamp in `x-cs-timestamp`
 * (unix seconds). `verifyRequestSignature` is what a remote agent written in
 * TypeScript does with them (the Python example does the same).
 */
import { createHmac, timingSafeEqual } from 'node:crypto';

export const TIMESTAMP_HEADER = 'x-cs-timestamp';
export const SIGNATURE_HEADER = 'x-cs-signature';

export function signRequest(secret: string, timestamp: string, body: string): string {
  return `sha256=${createHmac('sha256', secret).update(`${timestamp}.${body}`).digest('hex')}`;
}

/** True when `signature` signs `body` at `timestamp`, and the timestamp is within `toleranceSeconds`. */
export function verifyRequestSignature(
  secret: string,
  timestamp: string | undefined,
  body: string,
  signature: string | undefined,
  { now = Date.now(), toleranceSeconds = 300 }: { now?: number; toleranceSeconds?: number } = {},
): boolean {
  if (!timestamp || !signature || !/^\d+$/.test(timestamp)) return false;
  if (Math.abs(now / 1000 - Number(timestamp)) > toleranceSeconds) return false;
  const expected = Buffer.from(signRequest(secret, timestamp, body));
  const given = Buffer.from(signature);
  return expected.length === given.length && timingSafeEqual(expected, given);
}
