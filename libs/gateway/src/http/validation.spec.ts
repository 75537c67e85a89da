import { BadRequestError } from '@cs/core';
import { CreateConversationBodySchema, MAX_JSON_DEPTH, UserActionSchema } from '@cs/protocol';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { assertJsonDepth, parseInput } from './validation.js';

/** `{"a":{"a":…{}}}` with `depth` levels of braces. */
function nested(depth: number): Record<string, unknown> {
  let value: Record<string, unknown> = {};
  for (let level = 1; level < depth; level += 1) value = { a: value };
  return value;
}

function refusal(run: () => unknown): BadRequestError {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(BadRequestError);
    return error as BadRequestError;
  }
  throw new Error('expected BadRequestError');
}

describe(parseInput.name, () => {
  it('refuses a body nested deeper than MAX_JSON_DEPTH, naming its top-level field', () => {
    // 5,000 levels of metadata were a RangeError (a 500) once stored.
    const error = refusal(() =>
      parseInput(CreateConversationBodySchema, { title: 't', metadata: nested(5_000) }),
    );
    expect(error).toMatchObject({
      code: 'BAD_REQUEST',
      field: 'metadata',
      message: `metadata: JSON nested more than ${MAX_JSON_DEPTH} deep`,
    });
  });

  it('counts the body itself: MAX_JSON_DEPTH levels in all pass, one more does not', () => {
    const schema = z.object({ value: z.unknown() });
    expect(parseInput(schema, { value: nested(MAX_JSON_DEPTH - 1) })).toEqual({
      value: nested(MAX_JSON_DEPTH - 1),
    });
    expect(refusal(() => parseInput(schema, { value: nested(MAX_JSON_DEPTH) })).field).toBe(
      'value',
    );
  });

  it('refuses a too-deep socket payload before the schema sees it', () => {
    const payload = { action: 'message', args: { content: 'hi', extra: nested(100) } };
    expect(refusal(() => parseInput(UserActionSchema, payload))).toMatchObject({ field: 'args' });
  });

  it('refuses half a million levels (a 1 MiB body) without a RangeError', () => {
    const body: unknown = JSON.parse(`${'['.repeat(500_000)}${']'.repeat(500_000)}`);
    const error = refusal(() => parseInput(CreateConversationBodySchema, body));
    expect(error.field).toBeUndefined();
    expect(error.message).toBe(`the input: JSON nested more than ${MAX_JSON_DEPTH} deep`);
  });

  it('names the field of a schema problem as before', () => {
    expect(
      refusal(() => parseInput(CreateConversationBodySchema, { colour: 'red' })),
    ).toMatchObject({ field: 'colour', message: 'unknown field colour' });
  });
});

describe(assertJsonDepth.name, () => {
  it('passes input within MAX_JSON_DEPTH and refuses deeper input as BAD_REQUEST', () => {
    expect(() => assertJsonDepth({ args: nested(MAX_JSON_DEPTH - 1) })).not.toThrow();
    expect(refusal(() => assertJsonDepth({ args: nested(5_000) }))).toMatchObject({
      code: 'BAD_REQUEST',
      field: 'args',
    });
  });
});
