import { BadRequestError, NotFoundError } from '@cs/core';
import {
  ClientEventIdSchema,
  ConversationIdSchema,
  MAX_JSON_DEPTH,
  describeZodError,
  findJsonTooDeep,
  findUnstorableText,
} from '@cs/protocol';
import { z } from 'zod';

/**
 * Parses untrusted input (a body, a query string, a socket payload) or throws
 * `BadRequestError` naming the offending field as a dotted path. Input nested
 * deeper than `MAX_JSON_DEPTH` is refused first (see `assertJsonDepth`), and
 * text Postgres cannot store (NUL, an unpaired surrogate) last.
 */
export function parseInput<S extends z.ZodType>(schema: S, value: unknown): z.output<S> {
  assertJsonDepth(value);
  const result = schema.safeParse(value);
  if (!result.success) {
    const problem = describeZodError(result.error);
    throw new BadRequestError(problem.message, problem.field);
  }
  // What Postgres would refuse (it was a 400 that named no field, from the store).
  const unstorable = findUnstorableText(result.data);
  if (unstorable !== undefined) {
    throw new BadRequestError(
      'text contains characters that cannot be stored (NUL, an unpaired surrogate)',
      unstorable.length > 0 ? unstorable.join('.') : undefined,
    );
  }
  return result.data;
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

/** Path ids that are not UUIDs name no conversation: 404, not 400. */
export function conversationId(raw: string): string {
  if (!ConversationIdSchema.safeParse(raw).success) throw new NotFoundError();
  return raw;
}

/** The `Idempotency-Key` header, held to a client event id's rules; undefined when absent. */
export function idempotencyKeyOf(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  return parseInput(z.object({ 'Idempotency-Key': ClientEventIdSchema }), {
    'Idempotency-Key': header,
  })['Idempotency-Key'];
}
