import { describe, expect, it } from 'vitest';
import { undoneMarksOf } from './branching.js';

describe('undoneMarksOf', () => {
  it('marks the events after each point and before its rewind, as each rewind did in id order', () => {
    // 0..9, a rewind at 10 to 5; 11..14, a rewind at 15 to 3.
    const { marks, invalid } = undoneMarksOf([
      { id: 15, toEventId: 3 },
      { id: 10, toEventId: 5 },
    ]);
    expect(invalid).toBeNull();
    expect(Object.fromEntries(marks)).toEqual({
      4: 15,
      5: 15,
      6: 10,
      7: 10,
      8: 10,
      9: 10,
      10: 15,
      11: 15,
      12: 15,
      13: 15,
      14: 15,
    });
  });

  it('undoes everything with a point of -1, and nothing with the event just before it', () => {
    expect(Object.fromEntries(undoneMarksOf([{ id: 2, toEventId: -1 }]).marks)).toEqual({
      0: 2,
      1: 2,
    });
    expect(undoneMarksOf([{ id: 2, toEventId: 1 }]).marks.size).toBe(0);
  });

  it('names the first rewind whose point is not a live event before it', () => {
    expect(undoneMarksOf([{ id: 2, toEventId: 2 }]).invalid).toBe(2);
    expect(undoneMarksOf([{ id: 2, toEventId: -2 }]).invalid).toBe(2);
    expect(
      undoneMarksOf([
        { id: 4, toEventId: 1 },
        { id: 6, toEventId: 3 },
      ]).invalid,
    ).toBe(6);
  });
});
