import { BadRequestError } from '@cs/core';
import { MAX_JSON_DEPTH, describeZodError, findJsonTooDeep } from '@cs/protocol';
import type { z } from 'zod';

/**
 * Parses untrusted input (a body, a query string, a socket payload) or throws
 * `BadRequestError` naming the offending field as a dotted path. Input nested
 * deeper than `MAX_JSON_DEPTH` is refused first, before zod or anything else
 * walks it recursively (5,000 levels of metadata were a RangeError, a 500);
 * the field named is the top-level one that holds the too-deep part.
 */
export function parseInput<S extends z.ZodType>(schema: S, value: unknown): z.output<S> {
  const tooDeep = findJsonTooDeep(value, MAX_JSON_DEPTH);
  if (tooDeep !== undefined) {
    const field = typeof tooDeep[0] === 'string' ? tooDeep[0] : undefined;
    const message = `${field === undefined ? 'the input' : field}: JSON nested more than ${MAX_JSON_DEPTH} deep`;
    throw new BadRequestError(message, field);
  }
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const problem = describeZodError(result.error);
  throw new BadRequestError(problem.message, problem.field);
}
