import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { UnavailableError } from '@cs/core';
import { REQUEST_COMMAND_TIMEOUT_MS, answeredInTime } from './redis-connections.js';

describe('answeredInTime', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it('gives the reply that comes within REQUEST_COMMAND_TIMEOUT_MS, and its error', async () => {
    const reply = answeredInTime(
      new Promise<number>((resolve) =>
        setTimeout(() => resolve(2), REQUEST_COMMAND_TIMEOUT_MS - 1),
      ),
    );
    await vi.advanceTimersByTimeAsync(REQUEST_COMMAND_TIMEOUT_MS - 1);
    await expect(reply).resolves.toBe(2);
    await expect(answeredInTime(Promise.reject(new Error('MOVED')))).rejects.toThrow('MOVED');
    expect(vi.getTimerCount()).toBe(0);
  });

  it('fails UNAVAILABLE once REQUEST_COMMAND_TIMEOUT_MS has passed without a reply', async () => {
    const reply = answeredInTime(new Promise<number>(() => undefined));
    const settled = vi.fn();
    reply.catch(settled);
    await vi.advanceTimersByTimeAsync(REQUEST_COMMAND_TIMEOUT_MS - 1);
    expect(settled).not.toHaveBeenCalled();
    await vi.advanceTimersByTimeAsync(1);
    await expect(reply).rejects.toBeInstanceOf(UnavailableError);
  });
});
