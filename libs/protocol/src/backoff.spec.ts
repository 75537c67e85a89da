import { afterEach, describe, expect, it, vi } from 'vitest';
import { backoffDelay } from './backoff.js';

describe('backoffDelay', () => {
  afterEach(() => {
    vi.restoreAllMocks();
  });

  it('doubles from the base with each attempt and stops at the maximum', () => {
    const delays = [0, 1, 2, 3, 4, 10, 100].map((attempt) =>
      backoffDelay(attempt, { baseMs: 100, maxMs: 1000 }),
    );
    expect(delays).toEqual([100, 200, 400, 800, 1000, 1000, 1000]);
  });

  it('scales the delay within the jitter bounds', () => {
    const backoff = { baseMs: 1000, maxMs: 60_000, jitter: [0.5, 1] } as const;
    vi.spyOn(Math, 'random').mockReturnValue(0);
    expect(backoffDelay(2, backoff)).toBe(2000);
    vi.spyOn(Math, 'random').mockReturnValue(0.999_999);
    expect(backoffDelay(2, backoff)).toBe(4000);
  });

  it('treats a negative attempt as the first', () => {
    expect(backoffDelay(-3, { baseMs: 50, maxMs: 2000 })).toBe(50);
  });
});
