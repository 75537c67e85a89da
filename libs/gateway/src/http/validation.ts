import { BadRequestError } from '@cs/core';
import { describeZodError } from '@cs/protocol';
import type { z } from 'zod';

/**
 * Parses untrusted input (a body, a query string, a socket payload) or throws
 * `BadRequestError` naming the offending field as a dotted path.
 */
export function parseInput<S extends z.ZodType>(schema: S, value: unknown): z.output<S> {
  const result = schema.safeParse(value);
  if (result.success) return result.data;
  const problem = describeZodError(result.error);
  throw new BadRequestError(problem.message, problem.field);
}
