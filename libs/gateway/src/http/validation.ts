import { BadRequestError } from '@cs/core';
import { MAX_JSON_DEPTH, describeZodError, findJsonTooDeep } from '@cs/protocol';
import type { z } from 'zod';

/**
 * Parses untrusted input (a body, a query string, a socket payload) or throws
 * `BadRequestError` naming the offending field as a dotted path. Input nested
 * deeper than `MAX_JSON_DEPTH` is refused first (see `assertJsonDepth`).
 */
export function parseInput<S extends z.ZodType>(schema: S, value: unknown): z.output<S> {
  assertJsonDepth(value);
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const problem = describeZodError(result.error);
  throw new BadRequestError(problem.message, problem.field);
}

/**
 * Throws `BadRequestError` when untrusted input nests deeper than
 * `MAX_JSON_DEPTH`, before zod or anything else (JSON.stringify, a size
 * check, the store) walks it recursively: 5,000 levels of metadata were a
 * RangeError, a 500. The field named is the top-level one holding the
 * too-deep part.
 */
export function assertJsonDepth(value: unknown): void {
  const tooDeep = findJsonTooDeep(value, MAX_JSON_DEPTH);
  if (tooDeep === undefined) return;
  const field = typeof tooDeep[0] === 'string' ? tooDeep[0] : undefined;
  const message = `${field ?? 'the input'}: JSON nested more than ${MAX_JSON_DEPTH} deep`;
  throw new BadRequestError(message, field);
}
