/**
 * Agents for domain unit tests (not for the registry): a scripted agent whose
 * behaviour a test writes inline, and a gated agent that blocks inside a turn
 * until the test releases it, to stage crashes, pauses and lost leases.
 */
import { isAction } from '@cs/protocol';
import type { AgentOutput, StoredEvent } from '@cs/protocol';
import type { Agent, AgentContext } from '../agent.js';
import type { AgentSpec } from '../conversation.js';
import type { AgentFactory } from '../agent.js';

/** The text of a user message event ('' for anything else). */
export function messageText(event: StoredEvent): string {
  if (!isAction(event)) return '';
  const content = event.args['content'];
  return typeof content === 'string' ? content : '';
}

/** An agent message output answering with `content`. */
export function say(content: string): AgentOutput {
  return { type: 'message', content };
}

/** An agent whose turns are written by the test; records every turn it was given. */
export class ScriptedAgent implements Agent {
  /** The context of every step it was asked for. */
  readonly turns: AgentContext[] = [];

  constructor(private readonly script: (turn: AgentContext) => AsyncIterable<AgentOutput>) {}

  step(context: AgentContext): AsyncIterable<AgentOutput> {
    this.turns.push(context);
    return this.script(context);
  }
}

/** Answers `echo: <text>` like the built-in echo agent, without depending on libs/agents. */
export function echoTestAgent(): ScriptedAgent {
  // eslint-disable-next-line @typescript-eslint/require-await -- an async generator by contract
  return new ScriptedAgent(async function* (turn) {
    yield say(`echo: ${messageText(turn.trigger)}`);
  });
}

/**
 * Blocks each turn until `release()` is called, then answers `echo: <text>`.
 * `entered` resolves when a turn has begun (the session has stored `running`).
 */
export class GatedAgent implements Agent {
  readonly signals: AbortSignal[] = [];
  private gate = deferred();
  private enteredTurn = deferred();

  get entered(): Promise<void> {
    return this.enteredTurn.promise;
  }

  release(): void {
    this.gate.resolve();
  }

  /** Re-arms the gate for the next turn. */
  reset(): void {
    this.gate = deferred();
    this.enteredTurn = deferred();
  }

  async *step(turn: AgentContext): AsyncIterable<AgentOutput> {
    this.signals.push(turn.signal);
    this.enteredTurn.resolve();
    await this.gate.promise;
    yield say(`echo: ${messageText(turn.trigger)}`);
  }
}

/** An AgentFactory over a fixed map of names, for manager tests. */
export class TestAgentFactory implements AgentFactory {
  constructor(private readonly agents: Record<string, () => Agent>) {}

  has(name: string): boolean {
    return name in this.agents;
  }

  create(spec: AgentSpec): Agent {
    const make = this.agents[spec.name];
    if (!make) throw new Error(`unknown agent: ${spec.name}`);
    return make();
  }
}

function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve: () => void = () => undefined;
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}
