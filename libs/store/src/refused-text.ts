/**
 * Postgres refuses some text a JS string can hold (NUL characters, lone
 * surrogates in JSON): that is the caller's input, not a server fault.
 */
import { BadRequestError } from '@cs/core';
import { sqlErrorCode } from './database/sql-database.js';

const REFUSED_TEXT = new Set(['22P05', '22021', '22P02']);

export async function guardData<T>(write: () => Promise<T>): Promise<T> {
  try {
    return await write();
  } catch (error) {
    if (REFUSED_TEXT.has(sqlErrorCode(error) ?? '')) {
      throw new BadRequestError('text contains characters that cannot be stored');
    }
    throw error;
  }
}
