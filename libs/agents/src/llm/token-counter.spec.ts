import { describe, expect, it } from 'vitest';
import { TOKEN_COUNT_CACHE_SIZE, rememberedTokenCounts, tokenCounter } from './token-counter.js';

describe('tokenCounter', () => {
  it('counts a remembered text as it counted it the first time', async () => {
    const { count, truncate } = await tokenCounter();
    const text = 'The migration of the billing system starts on Monday. '.repeat(20);
    const first = count(text);
    expect(first).toBeGreaterThan(100);
    expect(count(text)).toBe(first);
    // The same text in a fresh string (as read from the store again).
    expect(count(text.split('').join(''))).toBe(first);
    expect(count(truncate(text, 50))).toBeLessThanOrEqual(50);
  });

  it('remembers a bounded number of counts, and no short or huge text', async () => {
    const { count } = await tokenCounter();
    const before = rememberedTokenCounts();
    count('short');
    count('x'.repeat(70 * 1024));
    expect(rememberedTokenCounts()).toBe(before);
    for (let i = 0; i < TOKEN_COUNT_CACHE_SIZE + 100; i += 1) {
      count(`event ${i}: ${'some words of a long answer '.repeat(4)}`);
    }
    expect(rememberedTokenCounts()).toBe(TOKEN_COUNT_CACHE_SIZE);
  });
});
