import { createHmac } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { signRequest, verifyRequestSignature } from './request-signature.js';

describe('request signatures', () => {
  const secret = 'a-secret-for-the-signature';
  const body = '{"conversation_id":"c1"}';

  it('is sha256=<hex HMAC-SHA256 of "<timestamp>.<raw body>">', () => {
    const expected = createHmac('sha256', secret).update(`1700000000.${body}`).digest('hex');
    expect(signRequest(secret, '1700000000', body)).toBe(`sha256=${expected}`);
  });

  it('verifies a fresh signature and refuses another secret, body, or an old timestamp', () => {
    const now = 1_700_000_000_000;
    const timestamp = String(now / 1000);
    const signature = signRequest(secret, timestamp, body);
    expect(verifyRequestSignature(secret, timestamp, body, signature, { now })).toBe(true);
    expect(
      verifyRequestSignature('another-secret-entirely', timestamp, body, signature, { now }),
    ).toBe(false);
    expect(verifyRequestSignature(secret, timestamp, `${body} `, signature, { now })).toBe(false);
    expect(verifyRequestSignature(secret, timestamp, body, signature, { now: now + 301_000 })).toBe(
      false,
    );
    expect(verifyRequestSignature(secret, undefined, body, signature, { now })).toBe(false);
    expect(verifyRequestSignature(secret, timestamp, body, 'sha256=00', { now })).toBe(false);
  });
});
