/**
 * What an agent yields in a step (docs/protocol.md "Agent outputs"): the same JSON
 * objects for built-in agents, agent modules and the HTTP agent's response
 * lines. One schema, checked by the runtime for every agent kind: an agent's
 * output is untrusted.
 */
import { z } from 'zod';
import { ActionBodySchema, ObservationBodySchema } from './events.js';
import { findJsonTooDeep, findUnstorableText, jsonByteLength } from './json-limits.js';
import { MAX_JSON_DEPTH, MAX_PAYLOAD_BYTES } from './limits.js';

const JsonObjectSchema = z.record(z.string(), z.unknown());
/** Tool names: what MCP and model APIs accept (`<server>__<tool>` included). */
export const ToolNameSchema = z.string().regex(/^[A-Za-z0-9_.-]{1,128}$/, 'must be a tool name');
const tokens = z.number().int().min(0).max(1e9);

/**
 * Events only the runtime stores, from the outputs meant for them: an
 * `event` output of one of these kinds could end a turn twice, leave a call
 * the runtime never ran, or set the conversation's state behind its back.
 */
const RUNTIME_EVENTS: ReadonlySet<string> = new Set([
  'message',
  'tool_call',
  'tool_result',
  'agent_state_changed',
]);
const EventOutputBodySchema = z
  .union([ActionBodySchema, ObservationBodySchema])
  .refine((body) => !RUNTIME_EVENTS.has('action' in body ? body.action : body.observation), {
    message:
      'message, tool_call, tool_result and agent_state_changed events are stored by the runtime: use the message and tool_call outputs',
  });

const AgentOutputShapeSchema = z.discriminatedUnion('type', [
  z.strictObject({ type: z.literal('delta'), delta: z.string().max(1_000_000) }),
  z.strictObject({ type: z.literal('message'), content: z.string() }),
  z.strictObject({
    type: z.literal('tool_call'),
    tool: ToolNameSchema,
    arguments: JsonObjectSchema,
    tool_call_id: z.string().min(1).max(256).optional(),
  }),
  z.strictObject({
    type: z.literal('event'),
    body: EventOutputBodySchema,
    state_delta: JsonObjectSchema.optional(),
  }),
  z.strictObject({ type: z.literal('state'), delta: JsonObjectSchema }),
  z.strictObject({
    type: z.literal('usage'),
    prompt_tokens: tokens,
    completion_tokens: tokens,
    cost_usd: z.number().min(0).max(1e6).optional(),
  }),
  z.strictObject({ type: z.literal('finish'), reason: z.string().max(1000).optional() }),
]);

/**
 * An output within the bounds of what a client may send (docs/protocol.md
 * "Limits"): nested at most `MAX_JSON_DEPTH` deep, at most
 * `MAX_PAYLOAD_BYTES` as JSON, with no text Postgres cannot store (NUL, an
 * unpaired surrogate). Such an output would otherwise fail when stored (too
 * deep a value overflows the stack of every recursive step on its way),
 * taking its whole step with it. A delta is stored only as part of its step's
 * text, which is checked then: a surrogate pair may be split across two. A
 * message's text is bounded by characters instead (`MAX_AGENT_MESSAGE_CHARS`,
 * by the step, which keeps what fits).
 */
export const AgentOutputSchema = AgentOutputShapeSchema.superRefine((output, ctx) => {
  if (output.type === 'delta') return;
  const tooDeep = findJsonTooDeep(output, MAX_JSON_DEPTH);
  if (tooDeep) {
    ctx.addIssue({
      code: 'custom',
      path: tooDeep,
      message: `nested more than ${MAX_JSON_DEPTH} deep`,
    });
    return;
  }
  const unstorable = findUnstorableText(output);
  if (unstorable) {
    ctx.addIssue({
      code: 'custom',
      path: unstorable,
      message: 'text contains characters that cannot be stored (NUL, an unpaired surrogate)',
    });
    return;
  }
  if (output.type !== 'message' && jsonByteLength(output) > MAX_PAYLOAD_BYTES) {
    ctx.addIssue({ code: 'custom', message: `larger than ${MAX_PAYLOAD_BYTES} bytes as JSON` });
  }
});
export type AgentOutput = z.infer<typeof AgentOutputSchema>;

/** A tool as agents see it (`context.tools`, the HTTP agent's `tools`). */
export interface ToolDescription {
  name: string;
  description: string;
  /** A JSON Schema of the arguments. */
  parameters: Record<string, unknown>;
}

/** Why a turn could not go on (`extras.reason` of its `agent_state_changed` to `error`). */
export const TURN_ERROR_REASONS = [
  'max_iterations',
  'max_budget_exceeded',
  'llm_error',
  'agent_http_error',
  'agent_error',
  'budget_exhausted',
] as const;
export type TurnErrorReason = (typeof TURN_ERROR_REASONS)[number];

export const MULTITASK_STRATEGIES = ['enqueue', 'interrupt', 'reject'] as const;
export const MultitaskStrategySchema = z.enum(MULTITASK_STRATEGIES);
export type MultitaskStrategy = z.infer<typeof MultitaskStrategySchema>;
/** `MULTITASK_STRATEGY` when the deployment sets none. */
export const DEFAULT_MULTITASK_STRATEGY: MultitaskStrategy = 'enqueue';

export const CONCURRENCY_POLICIES = ['evict_oldest', 'reject'] as const;
export type ConcurrencyPolicy = (typeof CONCURRENCY_POLICIES)[number];
