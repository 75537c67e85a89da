import { describe, expect, it } from 'vitest';
import { BadRequestError } from '@cs/core';
import { preferredWait } from './prefer-header.js';

describe('preferredWait', () => {
  it('reads wait among other preferences, in any case, quoted or not', () => {
    expect(preferredWait(undefined)).toBeUndefined();
    expect(preferredWait('respond-async')).toBeUndefined();
    expect(preferredWait('wait=5')).toBe(5);
    expect(preferredWait('respond-async, WAIT = 120')).toBe(120);
    expect(preferredWait('return=minimal; foo="a,wait=0", wait="7"')).toBe(7);
    expect(preferredWait('wait=1;x=y')).toBe(1);
  });

  it('takes the first of two waits', () => {
    expect(preferredWait('wait=3, wait=9')).toBe(3);
  });

  it.each(['wait', 'wait=', 'wait=0', 'wait=121', 'wait=1.5', 'wait=-1', 'wait=abc', 'wait=1e2'])(
    'refuses %j naming Prefer',
    (header) => {
      let error: unknown;
      try {
        preferredWait(header);
      } catch (thrown) {
        error = thrown;
      }
      expect(error).toBeInstanceOf(BadRequestError);
      expect((error as BadRequestError).field).toBe('Prefer');
    },
  );
});
