/**
 * AgentRegistry: the agents this deployment can run, by name (`AGENT`, a
 * conversation's `agent` field). `echo` is built in; apps register more.
 */
import { BadRequestError } from '@cs/core';
import type { Agent, AgentFactory, AgentSpec } from '@cs/core';
import { ECHO_AGENT, EchoAgent } from './echo.agent.js';

/** Makes one agent from a conversation's agent spec (its `config`). */
export type AgentConstructor = (config: Record<string, unknown>) => Agent;

/** A conversation names an agent this deployment does not have (`BAD_REQUEST` on field `agent`). */
export class UnknownAgentError extends BadRequestError {
  constructor(readonly agentName: string) {
    super(`unknown agent: ${agentName}`, 'agent');
  }
}

export class AgentRegistry implements AgentFactory {
  private readonly constructors = new Map<string, AgentConstructor>();

  /** @param validate checks a conversation's `agent_config` for an agent (at creation) */
  constructor(
    private readonly validate: (name: string, config: Record<string, unknown>) => void = () =>
      undefined,
  ) {
    this.register(ECHO_AGENT, () => new EchoAgent());
  }

  validateConfig(name: string, config: Record<string, unknown>): void {
    this.validate(name, config);
  }

  /** Adds (or replaces) an agent under `name`. */
  register(name: string, make: AgentConstructor): this {
    this.constructors.set(name, make);
    return this;
  }

  has(name: string): boolean {
    return this.constructors.has(name);
  }

  /** Registered names, sorted. */
  names(): string[] {
    return [...this.constructors.keys()].sort();
  }

  create(spec: AgentSpec): Agent {
    const make = this.constructors.get(spec.name);
    if (!make) throw new UnknownAgentError(spec.name);
    return make(spec.config);
  }
}
