import { describe, expect, it, vi } from 'vitest';
import { StatusUpdateSchema } from '@cs/protocol';
import {
  HELD_SLOT,
  TOO_MANY_CONVERSATIONS_NOTICE,
  claimsSlotBeforeStoring,
  isIdleSince,
  withSlotClaim,
} from './conversation-limits.js';

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

describe(claimsSlotBeforeStoring.name, () => {
  it('takes the slot before storing a write that starts a conversation under reject only', () => {
    expect(claimsSlotBeforeStoring('reject', true)).toBe(true);
    expect(claimsSlotBeforeStoring('reject', false)).toBe(false);
    // evict_oldest refuses nothing: the start follows the store, evicting for stored writes only.
    expect(claimsSlotBeforeStoring('evict_oldest', true)).toBe(false);
    expect(claimsSlotBeforeStoring('evict_oldest', false)).toBe(false);
  });
});

describe(withSlotClaim.name, () => {
  const claim = () => ({ taken: true, release: vi.fn(() => Promise.resolve()) });

  it('keeps the slot when the write succeeds', async () => {
    const held = claim();
    await expect(withSlotClaim(held, () => Promise.resolve(7))).resolves.toBe(7);
    expect(held.release).not.toHaveBeenCalled();
  });

  it('gives the slot back when the write fails, and fails as it did', async () => {
    const held = claim();
    const failure = new Error('not stored');
    await expect(withSlotClaim(held, () => Promise.reject(failure))).rejects.toBe(failure);
    expect(held.release).toHaveBeenCalledOnce();
  });

  it('runs the write alone without a claim, and with a slot held already', async () => {
    await expect(withSlotClaim(null, () => Promise.reject(new Error('x')))).rejects.toThrow('x');
    await expect(withSlotClaim(HELD_SLOT, () => Promise.reject(new Error('y')))).rejects.toThrow(
      'y',
    );
    expect(HELD_SLOT.taken).toBe(false);
  });
});
