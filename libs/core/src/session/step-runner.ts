/**
 * One step of a turn: asks the agent for its outputs, checks each against
 * the one schema of agent outputs (an agent's output is untrusted), streams
 * its text to the room as it comes, and sums up what the step produced. It
 * stores nothing: the turn runner stores a step's outcome in one batch.
 */
import {
  AgentOutputSchema,
  MAX_AGENT_MESSAGE_CHARS,
  cutText,
  type AgentOutput,
  type EventBody,
} from '@cs/protocol';
import type { Agent, AgentContext } from '../agent.js';
import type { StateDelta } from '../conversation.js';
import type { DeltaStream } from './delta-stream.js';

export interface StepToolCall {
  tool: string;
  arguments: Record<string, unknown>;
  tool_call_id?: string;
}

export interface StepUsage {
  promptTokens: number;
  completionTokens: number;
  /** Reported by the agent; otherwise priced by the runtime. */
  costUsd?: number;
}

/** What a step produced, whatever ended it. */
export interface StepResult {
  /** The step's text: its `message`, else what it streamed. */
  text: string;
  /** True when the agent gave a final `message`. */
  answered: boolean;
  toolCalls: StepToolCall[];
  events: { body: EventBody; stateDelta?: StateDelta }[];
  stateDelta: StateDelta;
  usage: StepUsage[];
  /** `finish` was yielded (with its reason). */
  finished: { reason?: string } | null;
  /**
   * How the step ended: `done` (the agent's iterable ended), `aborted` (the
   * signal), `failed` (the agent threw, or yielded what is not an output).
   */
  end: 'done' | 'aborted' | 'failed';
  error?: unknown;
}

/** The agent yielded something that is not an agent output. */
export class InvalidAgentOutputError extends Error {
  constructor(readonly issue: string) {
    super(`invalid agent output: ${issue}`);
    this.name = 'InvalidAgentOutputError';
  }
}

const ABORTED: unique symbol = Symbol('aborted');
/**
 * An agent that never ends its step (a loop of outputs) is cut off here.
 * Deltas that add text do not count: the step's text is bounded on its own
 * (`MAX_AGENT_MESSAGE_CHARS`: past it the step fails, and what fits is
 * stored as interrupted, so that an agent that never stops cannot fill the
 * worker's memory), and a model streams a long answer in as many
 * deltas as it has tokens.
 */
export const MAX_OUTPUTS_PER_STEP = 10_000;
/** Every so many outputs the step lets timers and I/O run (a stop, a timeout must get through). */
const YIELD_EVERY = 64;

export async function runStep(
  agent: Agent,
  context: AgentContext,
  stream: DeltaStream,
): Promise<StepResult> {
  const result: StepResult = {
    text: '',
    answered: false,
    toolCalls: [],
    events: [],
    stateDelta: {},
    usage: [],
    finished: null,
    end: 'done',
  };
  const { signal } = context;
  const reads = new AbortableReads(signal);
  let iterator: AsyncIterator<AgentOutput> | undefined;
  let done = false;
  try {
    iterator = agent.step(context)[Symbol.asyncIterator]();
    let counted = 0;
    for (let count = 1; ; count += 1) {
      if (count % YIELD_EVERY === 0) await new Promise((resolve) => setImmediate(resolve));
      if (counted > MAX_OUTPUTS_PER_STEP) {
        throw new InvalidAgentOutputError(`more than ${MAX_OUTPUTS_PER_STEP} outputs in one step`);
      }
      let next;
      try {
        next = await reads.next(iterator.next());
      } catch (error) {
        done = true; // an iterator that threw is finished
        throw error;
      }
      if (next === ABORTED || signal.aborted) {
        result.end = 'aborted';
        break;
      }
      if (next.done) {
        done = true;
        break;
      }
      const parsed = AgentOutputSchema.safeParse(next.value);
      if (!parsed.success) {
        const issue = parsed.error.issues[0];
        throw new InvalidAgentOutputError(
          `${issue?.path.join('.') || 'output'}: ${issue?.message ?? 'invalid'}`,
        );
      }
      if (parsed.data.type !== 'delta' || parsed.data.delta === '') counted += 1;
      collect(parsed.data, result, stream);
      if (Math.max(stream.content.length, result.text.length) > MAX_AGENT_MESSAGE_CHARS) {
        throw new InvalidAgentOutputError(
          `more than ${MAX_AGENT_MESSAGE_CHARS} characters of text`,
        );
      }
    }
  } catch (error) {
    // The runtime refusing an output leaves the iterator open: it is returned below.
    if (signal.aborted) result.end = 'aborted';
    else {
      result.end = 'failed';
      result.error = error;
    }
  } finally {
    reads.close();
    stream.flush();
    if (!done && iterator) {
      // Do not wait: an agent that ignores its signal must not hold the session.
      iterator.return?.().then(undefined, () => undefined);
    }
  }
  // The stored message holds the step's whole text: an empty final message
  // after streamed text ends the step without taking back what was shown.
  if (!result.answered || result.text === '') result.text = stream.content;
  // A step cut for its size keeps what fits.
  result.text = cutText(result.text, MAX_AGENT_MESSAGE_CHARS);
  return result;
}

function collect(output: AgentOutput, result: StepResult, stream: DeltaStream): void {
  // A step ends with a message (and perhaps `finish`), or with tool calls: with both,
  // the turn would end and go on at once (a message with calls was stored as neither).
  const ends = output.type === 'message' || output.type === 'finish';
  const endedBefore = result.answered || result.finished !== null;
  if ((ends && result.toolCalls.length > 0) || (output.type === 'tool_call' && endedBefore)) {
    throw new InvalidAgentOutputError(
      'a step ends with a message or finish, or with tool calls, not both',
    );
  }
  // The message is the final answer: text after it would reach clients and never be stored.
  if (result.answered && (output.type === 'delta' || output.type === 'message')) {
    throw new InvalidAgentOutputError(`a ${output.type} after the step's message`);
  }
  switch (output.type) {
    case 'delta':
      stream.push(output.delta);
      break;
    case 'message':
      result.text = output.content;
      result.answered = true;
      break;
    case 'tool_call':
      // Model APIs refuse a history whose calls share an id: the next request would fail.
      if (
        output.tool_call_id !== undefined &&
        result.toolCalls.some((call) => call.tool_call_id === output.tool_call_id)
      ) {
        throw new InvalidAgentOutputError(`the tool_call_id ${output.tool_call_id} is used twice`);
      }
      result.toolCalls.push({
        tool: output.tool,
        arguments: output.arguments,
        ...(output.tool_call_id === undefined ? {} : { tool_call_id: output.tool_call_id }),
      });
      break;
    case 'event':
      result.events.push({
        body: output.body,
        ...(output.state_delta ? { stateDelta: output.state_delta } : {}),
      });
      break;
    case 'state': {
      // Applied in the order yielded: after the events before it (with the last of them).
      const last = result.events.at(-1);
      if (last) last.stateDelta = { ...last.stateDelta, ...output.delta };
      else Object.assign(result.stateDelta, output.delta);
      break;
    }
    case 'usage':
      result.usage.push({
        promptTokens: output.prompt_tokens,
        completionTokens: output.completion_tokens,
        ...(output.cost_usd === undefined ? {} : { costUsd: output.cost_usd }),
      });
      break;
    case 'finish':
      result.finished = output.reason === undefined ? {} : { reason: output.reason };
      break;
  }
}

/**
 * Awaits an agent's outputs one by one, or `ABORTED` as soon as the signal
 * aborts, with one listener on the signal for the whole step (one added and
 * removed per output made the runner's cost per output 0.8 µs, not 0.5).
 */
class AbortableReads {
  private settle: ((value: typeof ABORTED) => void) | null = null;
  private readonly onAbort = (): void => this.settle?.(ABORTED);

  constructor(private readonly signal: AbortSignal) {
    signal.addEventListener('abort', this.onAbort, { once: true });
  }

  next<T>(promise: Promise<T>): Promise<T | typeof ABORTED> {
    if (this.signal.aborted) {
      promise.then(undefined, () => undefined);
      return Promise.resolve(ABORTED);
    }
    return new Promise<T | typeof ABORTED>((resolve, reject) => {
      this.settle = resolve;
      promise.then(resolve, (error: unknown) =>
        reject(error instanceof Error ? error : new Error(String(error))),
      );
    });
  }

  close(): void {
    this.settle = null;
    this.signal.removeEventListener('abort', this.onAbort);
  }
}
