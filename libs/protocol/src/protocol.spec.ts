import { describe, expect, it } from 'vitest';
import {
  DevTokenBodySchema,
  ConnectQuerySchema,
  CreateConversationBodySchema,
  ListConversationsQuerySchema,
  ListEventsQuerySchema,
  MAX_JSON_DEPTH,
  MAX_MESSAGE_CONTENT_CHARS,
  MAX_METADATA_BYTES,
  PatchConversationBodySchema,
  UserActionSchema,
  describeZodError,
} from './index.js';

function problem(
  schema: { safeParse(v: unknown): { success: boolean; error?: unknown } },
  value: unknown,
) {
  const result = schema.safeParse(value);
  if (result.success) throw new Error('expected a failure');
  return describeZodError(result.error as Parameters<typeof describeZodError>[0]);
}

describe('UserActionSchema', () => {
  it('accepts a message and fills the url lists', () => {
    expect(UserActionSchema.parse({ action: 'message', args: { content: 'hi' } })).toEqual({
      action: 'message',
      args: { content: 'hi', image_urls: [], file_urls: [] },
    });
  });

  it('accepts the three requestable agent states', () => {
    for (const agent_state of ['stopped', 'paused', 'running']) {
      expect(
        UserActionSchema.safeParse({ action: 'change_agent_state', args: { agent_state } }).success,
      ).toBe(true);
    }
    expect(
      UserActionSchema.safeParse({
        action: 'change_agent_state',
        args: { agent_state: 'finished' },
      }).success,
    ).toBe(false);
  });

  it('names the offending field', () => {
    expect(
      problem(UserActionSchema, {
        action: 'message',
        args: { content: 'x'.repeat(MAX_MESSAGE_CONTENT_CHARS + 1) },
      }).field,
    ).toBe('args.content');
    expect(
      problem(UserActionSchema, { action: 'message', args: { content: 'x', colour: 1 } }).field,
    ).toBe('args.colour');
    expect(problem(UserActionSchema, { action: 'message', args: {} }).field).toBe('args.content');
    expect(
      problem(UserActionSchema, {
        action: 'message',
        args: { content: 'x' },
        client_event_id: 'k'.repeat(129),
      }).field,
    ).toBe('client_event_id');
    expect(problem(UserActionSchema, { action: 'dance', args: {} }).field).toBe('action');
  });
});

describe('query schemas', () => {
  it('parses the connect query with its defaults', () => {
    const id = '6f1f3f4e-8d6b-4c1a-9d7e-2b1a0c9e8f7d';
    expect(ConnectQuerySchema.parse({ conversation_id: id })).toEqual({
      conversation_id: id,
      latest_event_id: -1,
      start: true,
    });
    expect(
      ConnectQuerySchema.parse({ conversation_id: id, latest_event_id: '7', start: 'false' }),
    ).toMatchObject({
      latest_event_id: 7,
      start: false,
    });
    expect(problem(ConnectQuerySchema, { conversation_id: id, latest_event_id: '-2' }).field).toBe(
      'latest_event_id',
    );
    expect(problem(ConnectQuerySchema, { conversation_id: id, start: 'yes' }).field).toBe('start');
  });

  it('refuses repeated, empty and out-of-range query values', () => {
    expect(problem(ListEventsQuerySchema, { limit: ['1', '2'] }).field).toBe('limit');
    expect(problem(ListEventsQuerySchema, { limit: '' }).field).toBe('limit');
    expect(problem(ListEventsQuerySchema, { limit: '101' }).field).toBe('limit');
    expect(problem(ListEventsQuerySchema, { start_id: '-1' }).field).toBe('start_id');
    expect(ListEventsQuerySchema.parse({})).toEqual({ start_id: 0, reverse: false, limit: 20 });
  });

  it('takes a page_id only as base64url text', () => {
    const page_id = Buffer.from(JSON.stringify(['1', 'x'])).toString('base64url');
    expect(ListConversationsQuerySchema.parse({ page_id })).toMatchObject({ page_id });
    for (const bad of ['', 'a b', 'abc=', 'a+b/c', '-1!', 'x'.repeat(513), ['a', 'b']]) {
      expect(problem(ListConversationsQuerySchema, { page_id: bad }).field).toBe('page_id');
    }
  });
});

/** Metadata `{"a":{"a":…{}}}` with `depth` levels of braces. */
function nestedMetadata(depth: number): Record<string, unknown> {
  let value: Record<string, unknown> = {};
  for (let level = 1; level < depth; level += 1) value = { a: value };
  return value;
}

/** Metadata whose JSON text is exactly `bytes` UTF-8 bytes long, in 2-byte characters. */
function metadataOfBytes(bytes: number): Record<string, unknown> {
  const overhead = '{"k":""}'.length;
  const text = 'é'.repeat(Math.floor((bytes - overhead) / 2)) + 'x'.repeat((bytes - overhead) % 2);
  return { k: text };
}

describe.each([
  ['CreateConversationBodySchema', CreateConversationBodySchema],
  ['PatchConversationBodySchema', PatchConversationBodySchema],
])('%s metadata', (_name, schema) => {
  it('takes at most MAX_METADATA_BYTES as JSON (UTF-8), naming metadata beyond', () => {
    expect(MAX_METADATA_BYTES).toBe(16 * 1024);
    const fits = metadataOfBytes(MAX_METADATA_BYTES);
    expect(new TextEncoder().encode(JSON.stringify(fits)).length).toBe(MAX_METADATA_BYTES);
    expect(schema.safeParse({ metadata: fits }).success).toBe(true);
    // One byte more, though far fewer characters than bytes.
    const over = problem(schema, { metadata: metadataOfBytes(MAX_METADATA_BYTES + 1) });
    expect(over.field).toBe('metadata');
    expect(over.message).toMatch(/16384 bytes/);
    // Many small keys (36k of them made 20 MB list pages).
    const keys = Object.fromEntries(Array.from({ length: 36_000 }, (_, n) => [`k${n}`, 1]));
    expect(problem(schema, { metadata: keys }).field).toBe('metadata');
  });

  it('takes metadata nested at most MAX_JSON_DEPTH deep, naming metadata beyond', () => {
    expect(schema.safeParse({ metadata: nestedMetadata(MAX_JSON_DEPTH) }).success).toBe(true);
    const deeper = problem(schema, { metadata: nestedMetadata(MAX_JSON_DEPTH + 1) });
    expect(deeper).toEqual({ field: 'metadata', message: 'metadata: nested more than 32 deep' });
    // Measuring the size of 5,000 levels would throw a RangeError: the depth is checked first.
    expect(problem(schema, { metadata: nestedMetadata(5_000) }).field).toBe('metadata');
  });
});

describe('CreateConversationBodySchema', () => {
  it('rejects unknown fields by name', () => {
    const found = problem(CreateConversationBodySchema, { title: 't', colour: 'red' });
    expect(found).toEqual({ field: 'colour', message: 'unknown field colour' });
  });
});

describe('DevTokenBodySchema', () => {
  it('refuses ids Postgres cannot store as they are (NUL, an unpaired surrogate), naming the field', () => {
    for (const [body, field] of [
      [{ user_id: 'a\u0000' }, 'user_id'],
      [{ tenant_id: 'x\ud83d' }, 'tenant_id'],
    ] as const) {
      const parsed = DevTokenBodySchema.safeParse(body);
      expect(parsed.success).toBe(false);
      expect(parsed.error?.issues[0]?.path).toEqual([field]);
    }
    expect(DevTokenBodySchema.safeParse({ user_id: 'ünïcødé-😀' }).success).toBe(true);
  });
});
