import { describe, expect, it } from 'vitest';
import { countTokens } from 'gpt-tokenizer/encoding/o200k_base';
import {
  PIECE_CHARS,
  TOKEN_COUNT_CACHE_SIZE,
  piecesOf,
  rememberedTokenCounts,
  tokenCounter,
} from './token-counter.js';

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
    count('x'.repeat(70 * 1024)); // longer than any remembered text
    expect(rememberedTokenCounts()).toBe(before);
    for (let i = 0; i < TOKEN_COUNT_CACHE_SIZE + 100; i += 1) {
      count(`event ${i}: ${'some words of a long answer '.repeat(4)}`);
    }
    expect(rememberedTokenCounts()).toBe(TOKEN_COUNT_CACHE_SIZE);
  });

  describe('texts the tokenizer does not split (its cost is the square of their length)', () => {
    const long = {
      cjk: '漢字仮名交じり文'.repeat(8192), // 64 Ki characters without a space
      spaces: ' '.repeat(65_536),
      word: 'x'.repeat(65_536),
      emoji: '😀'.repeat(32_768),
    };

    it('are encoded in bounded pieces that make up the text, cut before a space where there is one', () => {
      const prose = 'The migration of the billing system starts on Monday. '.repeat(40);
      for (const text of [...Object.values(long), prose]) {
        const pieces = piecesOf(text);
        expect(pieces.join('')).toBe(text);
        expect(Math.max(...pieces.map((p) => p.length))).toBeLessThanOrEqual(PIECE_CHARS);
      }
      // Prose is cut only before spaces, where a token starts anyway, so it counts exactly as whole.
      expect(piecesOf(prose).every((piece, i) => i === 0 || piece.startsWith(' '))).toBe(true);
      // A surrogate pair is never cut in two.
      expect(piecesOf(long.emoji).every((piece) => !/^[\udc00-\udfff]/.test(piece))).toBe(true);
    });

    it('are counted and truncated (a whole 64 Ki of each would take minutes)', async () => {
      const { count, truncate } = await tokenCounter();
      const prose = 'The migration of the billing system starts on Monday. '.repeat(40);
      expect(count(prose)).toBe(countTokens(prose));
      for (const text of Object.values(long)) {
        const tokens = count(text);
        expect(tokens).toBeGreaterThan(0);
        const cut = truncate(text, 100);
        expect(text.startsWith(cut)).toBe(true);
        expect(count(cut)).toBeLessThanOrEqual(100);
        expect(count(cut)).toBeGreaterThan(90);
      }
      // Finding where to cut looks only within a piece's window: a search back to the
      // start of the text (lastIndexOf) made 4 Mi characters without a space take minutes.
      expect(count('x'.repeat(4 * 1024 * 1024))).toBeGreaterThan(0);
      // A count a little above the true one (checked on a run short enough to count whole).
      const run = '漢字仮名交じり文'.repeat(256);
      expect(count(run)).toBeGreaterThanOrEqual(countTokens(run));
      expect(count(run)).toBeLessThanOrEqual(countTokens(run) * 1.1);
    });
  });
});
