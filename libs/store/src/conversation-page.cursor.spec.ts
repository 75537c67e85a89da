import { BadRequestError } from '@cs/core';
import { describe, expect, it } from 'vitest';
import { decodeCursor, encodeCursor } from './conversation-page.cursor.js';

const id = '0b7e6c1e-3f4a-4b8e-9c7d-2a1b3c4d5e6f';

describe('conversation page cursor', () => {
  it('round-trips a microsecond timestamp and an id', () => {
    const position = { updatedAtMicros: '1796036053321123', id };
    const cursor = encodeCursor(position);
    expect(cursor).toMatch(/^[A-Za-z0-9_-]+$/);
    expect(decodeCursor(cursor)).toEqual(position);
  });

  it('takes every time from 1970 to the 18-digit bound', () => {
    for (const updatedAtMicros of ['0', '7', '999999999999999999']) {
      expect(decodeCursor(encodeCursor({ updatedAtMicros, id }))).toEqual({ updatedAtMicros, id });
    }
  });

  it('refuses anything else as an invalid page_id', () => {
    const valid = encodeCursor({ updatedAtMicros: '1', id });
    const invalid = [
      '',
      'garbage',
      `${valid}!`,
      `${valid}=`,
      Buffer.from('{"a":1}').toString('base64url'),
      Buffer.from(JSON.stringify(['1.5', id])).toString('base64url'),
      Buffer.from(JSON.stringify(['1', 'not-a-uuid'])).toString('base64url'),
      Buffer.from(JSON.stringify([1, id])).toString('base64url'),
      Buffer.from(JSON.stringify(['9'.repeat(19), id])).toString('base64url'),
      // Negative (out of Postgres' timestamp range: a 500 once) or not as the server writes it.
      encodeCursor({ updatedAtMicros: '-1', id }),
      encodeCursor({ updatedAtMicros: '-999999999999999999', id }),
      encodeCursor({ updatedAtMicros: '-0', id }),
      encodeCursor({ updatedAtMicros: '01', id }),
      encodeCursor({ updatedAtMicros: '+1', id }),
      encodeCursor({ updatedAtMicros: '1', id: id.toUpperCase() }),
      Buffer.from(`[ "1", "${id}" ]`).toString('base64url'),
    ];
    for (const cursor of invalid) {
      expect(() => decodeCursor(cursor)).toThrow(BadRequestError);
      try {
        decodeCursor(cursor);
      } catch (error) {
        expect(error).toMatchObject({ message: 'invalid page_id', field: 'page_id' });
      }
    }
  });
});
