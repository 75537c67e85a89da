import { describe, expect, it } from 'vitest';
import {
  ConnectQuerySchema,
  CreateConversationBodySchema,
  ListEventsQuerySchema,
  MAX_MESSAGE_CONTENT_CHARS,
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
});

describe('CreateConversationBodySchema', () => {
  it('rejects unknown fields by name', () => {
    const found = problem(CreateConversationBodySchema, { title: 't', colour: 'red' });
    expect(found).toEqual({ field: 'colour', message: 'unknown field colour' });
  });
});
