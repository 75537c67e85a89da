import { describe, expect, it } from 'vitest';
import { StatusUpdateSchema } from '@cs/protocol';
import { TOO_MANY_CONVERSATIONS_NOTICE, isIdleSince } from './conversation-limits.js';

describe(isIdleSince.name, () => {
  it('is idle once IDLE_TIMEOUT_MS have passed since the last activity, not a millisecond before', () => {
    expect(isIdleSince(1_000, 1_000 + 59_999, 60_000)).toBe(false);
    expect(isIdleSince(1_000, 1_000 + 60_000, 60_000)).toBe(true);
    expect(isIdleSince(1_000, 1_000 + 60_001, 60_000)).toBe(true);
  });

  it('is not idle with activity in the future of `now` (clocks of two processes)', () => {
    expect(isIdleSince(2_000, 1_000, 60_000)).toBe(false);
  });
});

describe('TOO_MANY_CONVERSATIONS_NOTICE', () => {
  it('is the status update of PROTOCOL.md an evicted conversation receives', () => {
    expect(StatusUpdateSchema.parse(TOO_MANY_CONVERSATIONS_NOTICE)).toMatchObject({
      status_update: true,
      type: 'error',
      id: 'AGENT_ERROR$TOO_MANY_CONVERSATIONS',
    });
  });
});
