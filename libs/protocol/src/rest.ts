import { z } from 'zod';
import { AgentStateSchema, ConversationStatusSchema } from './agent-state.js';
import { MultitaskStrategySchema } from './agent-outputs.js';
import { StoredEventSchema } from './events.js';
import { isStorableText, jsonByteLength, jsonDepthWithin, withoutProtoKey } from './json-limits.js';
import {
  DEFAULT_PAGE_LIMIT,
  MAX_INSTRUCTIONS_CHARS,
  MAX_JSON_DEPTH,
  MAX_MESSAGE_CONTENT_CHARS,
  MAX_METADATA_BYTES,
  MAX_PAGE_LIMIT,
  MAX_TITLE_CHARS,
} from './limits.js';

/** Conversation ids are UUIDs; anything else is `NOT_FOUND` on the wire. */
export const ConversationIdSchema = z.uuid();

/** Query-string helpers: a value must be one non-empty string (no repeats). */
export const queryInt = (min: number, max = Number.MAX_SAFE_INTEGER) =>
  z
    .string()
    .regex(/^-?\d{1,16}$/, 'must be an integer')
    .transform(Number)
    .pipe(z.number().int().min(min).max(max));
const queryBool = z.enum(['true', 'false']).transform((v) => v === 'true');

export const AgentNameSchema = z
  .string()
  .min(1)
  .max(64)
  .regex(/^[a-z0-9][a-z0-9_.-]*$/, 'must be an agent name');

/**
 * A conversation's free-form `metadata`: at most `MAX_METADATA_BYTES` as JSON
 * and nested at most `MAX_JSON_DEPTH` deep (the depth first, since measuring
 * the size stringifies it).
 */
const boundedJsonObject = () =>
  withoutProtoKey(
    z.record(z.string().max(256), z.unknown()).superRefine((value, ctx) => {
      if (!jsonDepthWithin(value, MAX_JSON_DEPTH)) {
        ctx.addIssue({ code: 'custom', message: `nested more than ${MAX_JSON_DEPTH} deep` });
      } else if (jsonByteLength(value) > MAX_METADATA_BYTES) {
        ctx.addIssue({
          code: 'custom',
          message: `larger than ${MAX_METADATA_BYTES} bytes as JSON`,
        });
      }
    }),
  );
export const MetadataSchema = boundedJsonObject();
/** A conversation's `agent_config`, given to its agent: the same bounds as metadata. */
export const AgentConfigSchema = boundedJsonObject();

export const CreateConversationBodySchema = z.strictObject({
  initial_user_msg: z.string().max(MAX_MESSAGE_CONTENT_CHARS).optional(),
  title: z.string().max(MAX_TITLE_CHARS).optional(),
  agent: AgentNameSchema.optional(),
  metadata: MetadataSchema.optional(),
  conversation_instructions: z.string().max(MAX_INSTRUCTIONS_CHARS).optional(),
  replay_json: z.string().optional(),
  conversation_id: ConversationIdSchema.optional(),
  agent_config: AgentConfigSchema.optional(),
  confirmation_mode: z.boolean().optional(),
  multitask_strategy: MultitaskStrategySchema.optional(),
  /** May only lower `MAX_ITERATIONS` (checked against the configuration). */
  max_iterations: z.number().int().min(1).max(10_000).optional(),
  /** May only lower `MAX_BUDGET_PER_TASK_USD` (checked against the configuration). */
  max_budget_usd: z.number().positive().max(1e6).optional(),
});
export type CreateConversationBody = z.infer<typeof CreateConversationBodySchema>;

export const CreateConversationResponseSchema = z.object({
  conversation_id: z.string(),
  conversation_status: ConversationStatusSchema,
});

/** The body of `POST /conversations/:id/start` and `…/stop`: none, or an empty object. */
export const EmptyBodySchema = z.strictObject({});

export const PatchConversationBodySchema = z.strictObject({
  title: z.string().max(MAX_TITLE_CHARS).optional(),
  metadata: MetadataSchema.optional(),
  confirmation_mode: z.boolean().optional(),
  multitask_strategy: MultitaskStrategySchema.optional(),
});
export type PatchConversationBody = z.infer<typeof PatchConversationBodySchema>;

export const ListConversationsQuerySchema = z.object({
  limit: queryInt(1, MAX_PAGE_LIMIT).default(DEFAULT_PAGE_LIMIT),
  /** The opaque cursor of the previous page (base64url); the store decodes and checks it. */
  page_id: z
    .string()
    .min(1)
    .max(512)
    .regex(/^[A-Za-z0-9_-]+$/, 'must be a page id')
    .optional(),
  all: queryBool.default(false),
});
export type ListConversationsQuery = z.infer<typeof ListConversationsQuerySchema>;

export const ListEventsQuerySchema = z.object({
  start_id: queryInt(0).default(0),
  end_id: queryInt(0).optional(),
  reverse: queryBool.default(false),
  limit: queryInt(1, MAX_PAGE_LIMIT).default(DEFAULT_PAGE_LIMIT),
});
export type ListEventsQuery = z.infer<typeof ListEventsQuerySchema>;

export const ConversationInfoSchema = z.object({
  conversation_id: z.string(),
  title: z.string(),
  created_at: z.string(),
  last_updated_at: z.string(),
  status: ConversationStatusSchema,
  agent_state: AgentStateSchema.nullable(),
  metadata: z.record(z.string(), z.unknown()),
  last_event_id: z.number().int(),
  agent: z.string(),
  confirmation_mode: z.boolean(),
  multitask_strategy: MultitaskStrategySchema,
  /** The conversation this one was forked from, and the event it was forked at; null unless forked. */
  parent_conversation_id: z.string().nullable(),
  forked_from_event_id: z.number().int().nullable(),
});
export type ConversationInfo = z.infer<typeof ConversationInfoSchema>;

export const ConversationPageSchema = z.object({
  results: z.array(ConversationInfoSchema),
  next_page_id: z.string().nullable(),
});
export type ConversationPage = z.infer<typeof ConversationPageSchema>;

export const EventPageSchema = z.object({
  events: z.array(StoredEventSchema),
  has_more: z.boolean(),
});

export const ConversationMetricsSchema = z.object({
  iterations: z.number(),
  prompt_tokens: z.number(),
  completion_tokens: z.number(),
  cost_usd: z.number(),
});
export type ConversationMetrics = z.infer<typeof ConversationMetricsSchema>;

export const ConversationStateResponseSchema = z.object({
  agent_state: AgentStateSchema.nullable(),
  state: z.record(z.string(), z.unknown()),
  metrics: ConversationMetricsSchema,
  last_event_id: z.number().int(),
  runtime: z.object({ worker_id: z.string(), lease_epoch: z.number().int() }).optional(),
});
export type ConversationStateResponse = z.infer<typeof ConversationStateResponseSchema>;

/** `GET /conversations/:id/presence`: the sockets attached to it on every gateway. */
export const ConversationPresenceSchema = z.object({ sockets: z.number().int().min(0) });
export type ConversationPresence = z.infer<typeof ConversationPresenceSchema>;

/** Where the turn of one user event stands (`GET /conversations/:id/turns/:event_id`). */
export const TurnStatusSchema = z.enum([
  'pending',
  'running',
  'awaiting_user_confirmation',
  'completed',
  'error',
  'undone',
]);
export const TurnResponseSchema = z.object({
  status: TurnStatusSchema,
  agent_state: AgentStateSchema.nullable(),
  events: z.array(StoredEventSchema),
});
export type TurnResponse = z.infer<typeof TurnResponseSchema>;

/**
 * `POST /conversations/:id/events`: `turn` only with `Prefer: wait=<s>`
 * (null when the time was up before the turn ended).
 */
export const SentUserActionSchema = z.object({
  event_id: z.number().int(),
  turn: z
    .object({ agent_state: AgentStateSchema.nullable(), events: z.array(StoredEventSchema) })
    .nullable()
    .optional(),
});
export type SentUserAction = z.infer<typeof SentUserActionSchema>;

/** A UTC day `YYYY-MM-DD` that exists in the calendar. */
const queryDay = z
  .string()
  .regex(/^\d{4}-\d{2}-\d{2}$/, 'must be a date YYYY-MM-DD')
  .refine((day) => {
    const time = Date.parse(`${day}T00:00:00Z`);
    return Number.isFinite(time) && new Date(time).toISOString().startsWith(day);
  }, 'must be a date YYYY-MM-DD');

/** `GET /usage`: UTC days `from..to` (both included), grouped. */
export const UsageQuerySchema = z
  .object({
    from: queryDay,
    to: queryDay,
    group_by: z.enum(['day', 'user', 'model', 'conversation']).default('day'),
    user_id: z.string().min(1).max(128).optional(),
  })
  .refine((query) => query.from <= query.to, { message: 'must not be after to', path: ['from'] });
export type UsageQueryInput = z.infer<typeof UsageQuerySchema>;

const UsageTotalsSchema = z.object({
  prompt_tokens: z.number(),
  completion_tokens: z.number(),
  cost_usd: z.number(),
  requests: z.number(),
});
export const UsageResponseSchema = z.object({
  results: z.array(UsageTotalsSchema.extend({ key: z.string() })),
  total: UsageTotalsSchema,
});
export type UsageResponse = z.infer<typeof UsageResponseSchema>;

/**
 * A user or tenant id, as Postgres stores it: no NUL (refused) and no lone
 * surrogate (stored as U+FFFD, so that two such ids would be one).
 */
const StorableIdSchema = z
  .string()
  .min(1)
  .refine(isStorableText, 'must not contain NUL or unpaired surrogate characters');
const TokenIdSchema = StorableIdSchema.max(128);
export const DevTokenBodySchema = z.strictObject({
  user_id: TokenIdSchema.optional(),
  tenant_id: TokenIdSchema.optional(),
  roles: z.array(z.string().min(1).max(64)).max(16).optional(),
});
export type DevTokenBody = z.infer<typeof DevTokenBodySchema>;

/** The claims of a bearer token, once verified. */
/** A token's `sub` or `tid`: a storable id with something besides white space. */
const TokenClaimIdSchema = StorableIdSchema.refine(
  (value) => value.trim() !== '',
  'must not be blank',
);
export const TokenClaimsSchema = z.object({
  sub: TokenClaimIdSchema,
  tid: TokenClaimIdSchema,
  exp: z.number(),
  roles: z.array(z.string()).optional(),
});
