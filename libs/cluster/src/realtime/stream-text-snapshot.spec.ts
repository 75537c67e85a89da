import { describe, expect, it } from 'vitest';
import { decodeStreamText, encodeStreamText } from './stream-text-snapshot.js';

describe('stream text snapshots', () => {
  it('reads back what it wrote, colons and all', () => {
    const snapshot = { cause: 42, text: 'a: b:: c' };
    expect(decodeStreamText(encodeStreamText(snapshot))).toEqual(snapshot);
    expect(decodeStreamText('7:')).toEqual({ cause: 7, text: '' });
  });

  it('takes nothing else for a snapshot', () => {
    for (const stored of ['', 'text', ':text', '-1:text', '1.5:text', 'x7:text', '{"cause":1}'])
      expect(decodeStreamText(stored)).toBeNull();
  });
});
