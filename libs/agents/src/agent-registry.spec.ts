import { describe, expect, it } from 'vitest';
import { AgentRegistry, UnknownAgentError } from './agent-registry.js';
import { EchoAgent } from './echo.agent.js';

describe(AgentRegistry.name, () => {
  it('has the echo agent built in', () => {
    const registry = new AgentRegistry();
    expect(registry.has('echo')).toBe(true);
    expect(registry.names()).toEqual(['echo']);
    expect(registry.create({ name: 'echo', config: {} })).toBeInstanceOf(EchoAgent);
  });

  it('refuses an unknown name with a BAD_REQUEST on the agent field', () => {
    const registry = new AgentRegistry();
    expect(registry.has('nope')).toBe(false);
    let thrown: unknown;
    try {
      registry.create({ name: 'nope', config: {} });
    } catch (error) {
      thrown = error;
    }
    expect(thrown).toBeInstanceOf(UnknownAgentError);
    expect(thrown).toMatchObject({ code: 'BAD_REQUEST', field: 'agent', agentName: 'nope' });
  });

  it('creates registered agents from the spec config, a new one each time', () => {
    const configs: Record<string, unknown>[] = [];
    const registry = new AgentRegistry().register('custom', (config) => {
      configs.push(config);
      return new EchoAgent();
    });
    const a = registry.create({ name: 'custom', config: { model: 'x' } });
    const b = registry.create({ name: 'custom', config: {} });
    expect(a).not.toBe(b);
    expect(configs).toEqual([{ model: 'x' }, {}]);
    expect(registry.names()).toEqual(['custom', 'echo']);
  });
});
