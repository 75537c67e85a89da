import { describe, expect, it } from 'vitest';
import { cutText, wholeCharEnd } from './text.js';

describe('cutText', () => {
  it('cuts to at most max code units, never inside a surrogate pair', () => {
    expect(cutText('abcdef', 4)).toBe('abcd');
    expect(cutText('abc', 4)).toBe('abc');
    // '😀' is two code units: a cut between them drops it whole.
    expect(cutText('ab😀cd', 3)).toBe('ab');
    expect(cutText('ab😀cd', 4)).toBe('ab😀');
    expect(cutText('😀', 1)).toBe('');
    expect(cutText('abc', 0)).toBe('');
  });

  it('leaves a cut between whole characters where it is', () => {
    expect(wholeCharEnd('ab😀cd', 2)).toBe(2);
    expect(wholeCharEnd('ab😀cd', 3)).toBe(2);
    expect(wholeCharEnd('ab😀cd', 4)).toBe(4);
    expect(wholeCharEnd('ab', 5)).toBe(5);
  });
});
