import { describe, expect, it } from 'vitest';
import { WriteClock, formatMicros } from './write-clock.js';

describe(WriteClock.name, () => {
  it('reads the wall clock with six fractional digits', () => {
    const clock = new WriteClock(() => Date.UTC(2026, 11, 6, 5, 40, 1, 234));
    expect(clock.now()).toBe('2026-12-06T05:40:01.234000Z');
  });

  it('moves on by a microsecond while the wall clock stands still or goes back', () => {
    let wall = Date.UTC(2026, 11, 6, 5, 40, 1, 234);
    const clock = new WriteClock(() => wall);
    expect([clock.now(), clock.now()]).toEqual([
      '2026-12-06T05:40:01.234000Z',
      '2026-12-06T05:40:01.234001Z',
    ]);
    wall -= 5;
    expect(clock.now()).toBe('2026-12-06T05:40:01.234002Z');
    wall += 10;
    expect(clock.now()).toBe('2026-12-06T05:40:01.239000Z');
  });

  it('formats microseconds across a second', () => {
    expect(formatMicros(Date.UTC(2030, 0, 1) * 1000 - 1)).toBe('2029-12-31T23:59:59.999999Z');
  });
});
