import { lstatSync, readFileSync, realpathSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import {
  AGENT_STATES,
  isAgentState,
  isSettledState,
  readAgentState,
  readAgentStateChange,
} from './agent-state-change.js';
import { AgentStateChangedExtrasSchema, type StoredEvent } from './events.js';

const change = (extras: Record<string, unknown>): StoredEvent => ({
  id: 3,
  timestamp: '2026-12-01T12:00:00.000Z',
  source: 'environment',
  cause: 2,
  observation: 'agent_state_changed',
  content: '',
  extras,
  message: '',
});

describe('readAgentState', () => {
  it('reads the state of an agent_state_changed observation, stored or as a body', () => {
    expect(readAgentState(change({ agent_state: 'paused' }))).toBe('paused');
    const {
      id: _id,
      timestamp: _t,
      source: _s,
      cause: _c,
      ...body
    } = change({
      agent_state: 'error',
    });
    expect(readAgentState(body)).toBe('error');
  });

  it('is null for other events and for a state change naming no known state', () => {
    expect(readAgentState({ ...change({ agent_state: 'paused' }), observation: 'error' })).toBe(
      null,
    );
    expect(readAgentState({ action: 'message', args: { agent_state: 'paused' } })).toBeNull();
    for (const extras of [{}, { agent_state: 'dancing' }, { agent_state: 7 }]) {
      expect(readAgentState(change(extras))).toBeNull();
    }
    expect(readAgentState({ observation: 'agent_state_changed' })).toBeNull();
    expect(readAgentState({ observation: 'agent_state_changed', extras: null })).toBeNull();
  });

  it('agrees with the schema of the extras', () => {
    for (const extras of [{ agent_state: 'running' }, { agent_state: 'nope' }, {}]) {
      expect(readAgentState(change(extras)) !== null).toBe(
        AgentStateChangedExtrasSchema.safeParse(extras).success,
      );
    }
  });
});

describe('readAgentStateChange', () => {
  it('adds the reason when there is one', () => {
    expect(readAgentStateChange(change({ agent_state: 'error', reason: 'agent_error' }))).toEqual({
      agentState: 'error',
      reason: 'agent_error',
    });
    expect(readAgentStateChange(change({ agent_state: 'stopped', reason: 3 }))).toEqual({
      agentState: 'stopped',
    });
    expect(readAgentStateChange(change({ agent_state: 'x' }))).toBeNull();
  });
});

describe('isSettledState', () => {
  it('settles on every state but running and loading', () => {
    expect(AGENT_STATES.filter((state) => !isSettledState(state))).toEqual(['loading', 'running']);
    expect(isAgentState('rate_limited')).toBe(true);
    expect(isAgentState('RUNNING')).toBe(false);
  });
});

describe('agent-state-change.ts', () => {
  const here = fileURLToPath(new URL('./agent-state-change.ts', import.meta.url));

  it('is the file the client SDK compiles into its package (through a symlink)', () => {
    const linked = fileURLToPath(
      new URL('../../client/src/protocol/agent-state-change.ts', import.meta.url),
    );
    expect(lstatSync(linked).isSymbolicLink()).toBe(true);
    expect(realpathSync(linked)).toBe(realpathSync(here));
  });

  it('imports nothing, so that zod stays out of the SDK', () => {
    expect(readFileSync(here, 'utf8')).not.toMatch(/^\s*(import|export\s.*\sfrom)\s/m);
  });
});
