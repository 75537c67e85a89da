import { describe, expect, it } from 'vitest';
import { BadRequestError } from '@cs/core';
import { loadConfig } from '@cs/config';
import { builtinAgents, validateAgentConfig } from './builtin-agents.js';
import { HttpAgent } from './http/http.agent.js';
import { LlmAgent } from './llm/llm.agent.js';

const configured = loadConfig('standalone', {
  LLM_MODEL: 'small',
  LLM_MODELS: 'small,big',
  LLM_BASE_URL: 'http://127.0.0.1:1/v1',
  AGENT_HTTP_URL: 'http://127.0.0.1:1/agent',
  AGENT_HTTP_SECRET: 'an-hmac-secret-of-16+',
});

function fieldOf(run: () => void): string | undefined {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(BadRequestError);
    return (error as BadRequestError).field;
  }
  return undefined;
}

describe('builtinAgents', () => {
  it('offers llm and http only when they are configured', () => {
    expect(Object.keys(builtinAgents(loadConfig('standalone', {})))).toEqual([]);
    const agents = builtinAgents(configured);
    expect(Object.keys(agents).sort()).toEqual(['http', 'llm']);
    expect(agents['llm']!({ model: 'big', temperature: 0.2 })).toBeInstanceOf(LlmAgent);
    expect(agents['http']!({})).toBeInstanceOf(HttpAgent);
  });
});

describe('validateAgentConfig', () => {
  it('accepts what the llm agent reads, and any agent_config for other agents', () => {
    expect(fieldOf(() => validateAgentConfig('llm', {}, configured))).toBeUndefined();
    expect(
      fieldOf(() =>
        validateAgentConfig(
          'llm',
          { model: 'big', tools: ['current_time'], temperature: 2 },
          configured,
        ),
      ),
    ).toBeUndefined();
    expect(
      fieldOf(() => validateAgentConfig('http', { anything: [1] }, configured)),
    ).toBeUndefined();
  });

  it('refuses a model outside LLM_MODELS, bad tool names and temperatures, naming the field', () => {
    expect(fieldOf(() => validateAgentConfig('llm', { model: 'huge' }, configured))).toBe(
      'agent_config.model',
    );
    expect(fieldOf(() => validateAgentConfig('llm', { model: 3 }, configured))).toBe(
      'agent_config.model',
    );
    expect(fieldOf(() => validateAgentConfig('llm', { tools: 'current_time' }, configured))).toBe(
      'agent_config.tools',
    );
    expect(fieldOf(() => validateAgentConfig('llm', { tools: ['no spaces'] }, configured))).toBe(
      'agent_config.tools',
    );
    expect(fieldOf(() => validateAgentConfig('llm', { temperature: 2.5 }, configured))).toBe(
      'agent_config.temperature',
    );
    expect(fieldOf(() => validateAgentConfig('llm', { temperature: '1' }, configured))).toBe(
      'agent_config.temperature',
    );
    // Anthropic takes 0–1 (OpenAI 0–2): a higher one would fail every request.
    const anthropic = loadConfig('standalone', {
      LLM_PROVIDER: 'anthropic',
      LLM_MODEL: 'claude-x',
      LLM_BASE_URL: 'http://127.0.0.1:1',
    });
    expect(fieldOf(() => validateAgentConfig('llm', { temperature: 1.5 }, anthropic))).toBe(
      'agent_config.temperature',
    );
    expect(
      fieldOf(() => validateAgentConfig('llm', { temperature: 1 }, anthropic)),
    ).toBeUndefined();
    expect(fieldOf(() => validateAgentConfig('llm', {}, loadConfig('standalone', {})))).toBe(
      'agent',
    );
  });
});
