import { describe, expect, it } from 'vitest';
import { StreamedText } from './streamed-text.js';

describe(StreamedText.name, () => {
  it('appends deltas at the end of the text', () => {
    const text = new StreamedText();
    expect(text.apply(3, 0, 'Hel')).toBe(true);
    expect(text.apply(3, 3, 'lo')).toBe(true);
    expect(text.text(3)).toBe('Hello');
  });

  it('keeps turns apart by cause', () => {
    const text = new StreamedText();
    text.apply(1, 0, 'one');
    text.apply(2, 0, 'two');
    expect([text.text(1), text.text(2), text.text(9)]).toEqual(['one', 'two', '']);
  });

  it('changes nothing for a repeated or late delta', () => {
    const text = new StreamedText();
    const deltas: Array<[number, string]> = [
      [0, 'Hel'],
      [3, 'lo'],
      [5, ' world'],
    ];
    for (const [offset, delta] of [...deltas, ...deltas]) text.apply(7, offset, delta);
    expect(text.text(7)).toBe('Hello world');
    expect(text.apply(7, 3, 'lo')).toBe(false);
    expect(text.apply(7, 0, 'Hello')).toBe(false);
    expect(text.text(7)).toBe('Hello world');
  });

  it('drops a delta beyond the end (one before it was lost) until a catch-up fills the hole', () => {
    const text = new StreamedText();
    text.apply(1, 0, 'ab');
    expect(text.apply(1, 5, 'fg')).toBe(false);
    expect(text.text(1)).toBe('ab');
    expect(text.apply(1, 0, 'abcde')).toBe(true);
    expect(text.apply(1, 5, 'fg')).toBe(true);
    expect(text.text(1)).toBe('abcdefg');
  });

  it('starts the text afresh at offset 0 with other text (a retried request, a new step)', () => {
    const text = new StreamedText();
    text.apply(1, 0, 'The answer');
    text.apply(1, 10, ' is 4');
    expect(text.apply(1, 0, 'The')).toBe(false); // agrees with what is there
    expect(text.apply(1, 3, ' result')).toBe(true); // disagrees: rewritten from offset 3
    expect(text.text(1)).toBe('The result');
    expect(text.apply(1, 0, 'Sure')).toBe(true);
    expect(text.text(1)).toBe('Sure');
  });

  it('counts offsets in UTF-16 code units, as JavaScript strings do', () => {
    const text = new StreamedText();
    text.apply(1, 0, 'a😀');
    text.apply(1, 3, 'b');
    expect(text.text(1)).toBe('a😀b');
  });

  it('appends a delta without offset (an older server)', () => {
    const text = new StreamedText();
    text.apply(1, undefined, 'a');
    text.apply(1, undefined, 'b');
    expect(text.text(1)).toBe('ab');
  });

  it('holds the stored answer once it arrives, whatever streams after', () => {
    const text = new StreamedText();
    text.apply(4, 0, 'partial');
    text.finish(4, 'the whole answer');
    expect(text.apply(4, 0, 'late')).toBe(false);
    expect(text.text(4)).toBe('the whole answer');
    expect(text.isFinal(4)).toBe(true);
  });
});
