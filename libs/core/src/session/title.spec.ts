import { describe, expect, it } from 'vitest';
import { MAX_FALLBACK_TITLE_CHARS } from '@cs/protocol';
import { fallbackTitle } from './title.js';

describe('fallbackTitle', () => {
  it('is the first message cut at a word boundary, its spaces collapsed', () => {
    expect(fallbackTitle('  Plan   a trip\nto Lisbon  ')).toBe('Plan a trip to Lisbon');
    const long = 'word '.repeat(20);
    expect(fallbackTitle(long).length).toBeLessThanOrEqual(MAX_FALLBACK_TITLE_CHARS);
    expect(fallbackTitle(long).endsWith('word')).toBe(true);
  });

  it('cuts a first word longer than the limit at it, never inside an emoji', () => {
    expect(fallbackTitle('a'.repeat(80))).toBe('a'.repeat(MAX_FALLBACK_TITLE_CHARS));
    // The emoji's two code units straddle the limit: it is dropped whole.
    expect(fallbackTitle(`${'a'.repeat(MAX_FALLBACK_TITLE_CHARS - 1)}😀${'b'.repeat(10)}`)).toBe(
      'a'.repeat(MAX_FALLBACK_TITLE_CHARS - 1),
    );
  });
});
