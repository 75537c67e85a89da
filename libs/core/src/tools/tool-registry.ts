/**
 * The tools the runtime runs for agents: built-in, from agent modules and
 * from MCP servers, each with a JSON Schema of its arguments. A call to an
 * unknown tool, with arguments that do not match, that throws, or that takes
 * longer than the timeout is an `is_error` result, never a crash.
 */
import { Ajv, type ValidateFunction } from 'ajv';
import { cutText, type ToolDescription } from '@cs/protocol';
import type { ToolDefinition, ToolRunContext } from '../agent.js';
import type { StateDelta } from '../conversation.js';

/** What a call gave: the result's text, whether it failed, and a state change it asked for. */
export interface ToolOutcome {
  content: string;
  isError: boolean;
  outcome: 'ok' | 'error' | 'timeout';
  stateDelta?: StateDelta;
}

/** A registered tool; `run` may return `{ stateDelta }` through `StatefulResult`. */
interface RegisteredTool extends ToolDefinition {
  validate: ValidateFunction;
}

/** A tool's result that also changes the session state (the built-in `set_state`). */
export class StatefulResult {
  constructor(
    readonly value: unknown,
    readonly stateDelta: StateDelta,
  ) {}
}

/** The longest result text stored; longer ones are cut (the model is told). */
const MAX_RESULT_CHARS = 256 * 1024;

export class ToolRegistry {
  private readonly tools = new Map<string, RegisteredTool>();
  private readonly ajv = new Ajv({ strict: false, allErrors: false });

  constructor(private readonly timeoutMs: number) {}

  /** Adds a tool; a name already taken is refused (one clear line, at start). */
  add(name: string, tool: ToolDefinition): this {
    if (this.tools.has(name)) throw new Error(`the tool name ${name} is taken twice`);
    let validate: ValidateFunction;
    try {
      validate = this.ajv.compile(tool.parameters);
    } catch (error) {
      throw new Error(`the tool ${name} has an invalid parameters schema: ${String(error)}`, {
        cause: error,
      });
    }
    this.tools.set(name, { ...tool, validate });
    return this;
  }

  has(name: string): boolean {
    return this.tools.has(name);
  }

  /**
   * The name metrics and spans know a called tool by: its own, or `unknown`
   * for a name no tool has (an agent may call any name; labels stay bounded).
   */
  labelOf(name: string): string {
    return this.tools.has(name) ? name : 'unknown';
  }

  isIdempotent(name: string): boolean {
    return this.tools.get(name)?.idempotent ?? false;
  }

  /** The tools as agents see them (all, or only `allowed`). */
  describe(allowed?: readonly string[]): ToolDescription[] {
    return [...this.tools.entries()]
      .filter(([name]) => allowed === undefined || allowed.includes(name))
      .map(([name, tool]) => ({
        name,
        description: tool.description,
        parameters: tool.parameters,
      }));
  }

  /**
   * Runs one call under the timeout; never throws. A tool outside `allowed`
   * (the conversation's `agent_config.tools`) is not run: the agent was not
   * offered it, and it is answered as a name no tool has.
   */
  async run(
    name: string,
    args: Record<string, unknown>,
    context: ToolRunContext,
    allowed?: readonly string[],
  ): Promise<ToolOutcome> {
    const tool = allowed === undefined || allowed.includes(name) ? this.tools.get(name) : undefined;
    if (!tool) return failure(`unknown tool: ${name}`);
    if (!tool.validate(args)) {
      const issue = tool.validate.errors?.[0];
      const where = issue?.instancePath ? `${issue.instancePath} ` : '';
      return failure(`invalid arguments for ${name}: ${where}${issue?.message ?? 'do not match'}`);
    }
    const timeout = new AbortController();
    const signal = AbortSignal.any([context.signal, timeout.signal]);
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<'timeout'>((resolve) => {
      timer = setTimeout(() => {
        timeout.abort(new Error('tool timeout'));
        resolve('timeout');
      }, this.timeoutMs);
      timer.unref();
    });
    try {
      const value = await Promise.race([
        Promise.resolve().then(() => tool.run(args, { ...context, signal })),
        timedOut,
      ]);
      if (value === 'timeout') {
        return { ...failure(`${name} took longer than ${this.timeoutMs} ms`), outcome: 'timeout' };
      }
      if (value instanceof StatefulResult) {
        return {
          content: render(value.value),
          isError: false,
          outcome: 'ok',
          stateDelta: value.stateDelta,
        };
      }
      return { content: render(value), isError: false, outcome: 'ok' };
    } catch (error) {
      const message = error instanceof Error ? error.message : String(error);
      // A result must say something (Anthropic refuses an empty error result).
      return failure(message.trim() === '' ? `${name} failed without saying why` : message);
    } finally {
      clearTimeout(timer);
    }
  }
}

function failure(message: string): ToolOutcome {
  return { content: cut(message), isError: true, outcome: 'error' };
}

function render(value: unknown): string {
  if (typeof value === 'string') return cut(value);
  try {
    return cut(JSON.stringify(value) ?? 'null');
  } catch {
    return 'the tool returned a value that is not JSON';
  }
}

function cut(text: string): string {
  return text.length > MAX_RESULT_CHARS
    ? `${cutText(text, MAX_RESULT_CHARS)}… [cut at ${MAX_RESULT_CHARS} characters]`
    : text;
}
