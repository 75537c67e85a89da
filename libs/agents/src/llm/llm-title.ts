/**
 * The `llm` agent's titles: one short request, not streamed, on the first
 * user message and the first answer; its worst case held in the budgets and
 * its span made like a step's. When it fails the runtime's fallback title
 * is used.
 */
import type { AgentContext } from '@cs/core';
import { MAX_MODEL_TITLE_CHARS, cutText, isAction, type StoredEvent } from '@cs/protocol';
import { scrubbedError } from './llm-failure.js';
import type { LlmAgentSettings } from './llm-model.js';
import {
  endRequestSpan,
  responseAttributes,
  type RequestOutcome,
  type RequestSpans,
} from './llm-request-span.js';
import type { LlmSpending, UsageFields } from './llm-spending.js';
import type { ModelClient } from './model-client.js';
import { tokenCounter } from './token-counter.js';

const TITLE_SYSTEM =
  'You name conversations. Answer with a title of at most six words for the conversation ' +
  'below, in its language, with no quotes and no final period.';

/** Titles one conversation with its model. */
export class LlmTitles {
  constructor(
    private readonly model: ModelClient,
    private readonly settings: LlmAgentSettings,
    private readonly spending: LlmSpending,
    private readonly spans: RequestSpans,
  ) {}

  async title(context: AgentContext): Promise<{ title: string; usage?: UsageFields }> {
    const { first, answer } = await openingExchange(context);
    if (!first) throw new Error('no user message to title');
    const signal = AbortSignal.any([
      context.signal,
      AbortSignal.timeout(Math.min(this.settings.llm.timeoutMs, 30_000)),
    ]);
    let result;
    const titleText = `User: ${cutText(first, 2000)}${answer ? `\n\nAssistant: ${cutText(answer, 2000)}` : ''}`;
    const counter = await tokenCounter();
    // A refused title request throws: the runtime's fallback title is used.
    const hold = await this.spending.hold(
      context,
      counter.count(TITLE_SYSTEM) + counter.count(titleText) + 8,
    );
    const span = this.spans.start('title', 0);
    let failed: RequestOutcome = {};
    try {
      // One request: when it fails, the runtime's fallback title is good enough.
      // Short by its instructions, cut by `cleanTitle`; the cap reaches only a provider
      // that needs one (see `ModelRequest.maxOutputTokens`). Anthropic's SDK refuses a
      // request that is not streamed with its family's most.
      result = await this.model.complete(
        {
          system: TITLE_SYSTEM,
          messages: [{ role: 'user', content: titleText }],
          tools: [],
          temperature: undefined,
          maxOutputTokens: 64,
        },
        signal,
      );
      span.setAttributes(responseAttributes(result.reason, result.usage));
      await hold
        .settle(result.usage ? (this.spending.costOf(result.usage) ?? 0) : hold.worstCaseUsd)
        .catch(() => undefined);
    } catch (error) {
      failed = { error };
      throw new Error('the model could not title the conversation', {
        // A scrubbed copy: the SDK's error may quote a provider that echoes the key.
        // eslint-disable-next-line preserve-caught-error
        cause: scrubbedError(error, [this.settings.llm.apiKey]),
      });
    } finally {
      endRequestSpan(span, failed, signal.aborted);
      hold.release().catch(() => undefined);
    }
    const title = cleanTitle(result.text);
    if (!title) throw new Error('the model gave an empty title');
    const { usage } = result;
    return usage ? { title, usage: this.spending.usageFields(usage) } : { title };
  }
}

/** The first user message and the first agent answer, read from the start. */
async function openingExchange(
  context: AgentContext,
): Promise<{ first: string | undefined; answer: string | undefined }> {
  let first: string | undefined;
  let answer: string | undefined;
  const end = Math.min(context.history.last_event_id, 199);
  for await (const event of context.history.range(0, end)) {
    const text = messageText(event);
    if (text === undefined) continue;
    if (event.source === 'user' && first === undefined) first = text;
    if (event.source === 'agent' && first !== undefined) {
      answer = text;
      break;
    }
  }
  return { first, answer };
}

function messageText(event: StoredEvent): string | undefined {
  if (!isAction(event) || event.action !== 'message') return undefined;
  const content = event.args['content'];
  return typeof content === 'string' ? content : undefined;
}

/** One line, no wrapping quotes, no final period, at most `MAX_MODEL_TITLE_CHARS`. */
export function cleanTitle(text: string): string {
  const line = text
    .trim()
    .split('\n')[0]!
    .replace(/^(title|titre)\s*:\s*/i, '')
    .replace(/^["'“‘«*`]+|["'”’»*`.]+$/g, '')
    .replace(/\.$/, '')
    .replace(/\s+/g, ' ')
    .trim();
  if (line.length <= MAX_MODEL_TITLE_CHARS) return line;
  const cut = cutText(line, MAX_MODEL_TITLE_CHARS);
  const space = cut.lastIndexOf(' ');
  return space > 20 ? cut.slice(0, space) : cut;
}
