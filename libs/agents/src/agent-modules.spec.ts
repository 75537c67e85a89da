import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { AgentModuleError, loadAgentModules } from './agent-modules.js';

const dir = mkdtempSync(join(tmpdir(), 'cs-agent-modules-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Writes a module of `source` and returns its path. */
function moduleOf(name: string, source: string): string {
  const path = join(dir, `${name}.mjs`);
  writeFileSync(path, source);
  return path;
}

const TOOL = `{ description: 'd', parameters: { type: 'object' }, idempotent: true, run: () => 'ok' }`;

describe('loadAgentModules', () => {
  it('loads agents and tools whose names can be picked and called', async () => {
    const path = moduleOf(
      'good',
      `export const agents = { 'my-agent.v2': () => ({ step: async function* () {} }) };
       export const tools = { 'files.read': ${TOOL} };`,
    );
    const [loaded] = await loadAgentModules([path]);
    expect(Object.keys(loaded!.module.agents!)).toEqual(['my-agent.v2']);
    expect(Object.keys(loaded!.module.tools!)).toEqual(['files.read']);
  });

  it('refuses, in one line, an agent name no conversation could pick and a tool name no agent could call', async () => {
    const badAgent = moduleOf(
      'bad-agent',
      `export const agents = { 'My Agent': () => ({ step: async function* () {} }) };`,
    );
    const badTool = moduleOf('bad-tool', `export const tools = { 'read file': ${TOOL} };`);
    await expect(loadAgentModules([badAgent])).rejects.toThrow(
      new AgentModuleError(
        `AGENT_MODULES: ${badAgent}: the agent name "My Agent" is not one (lowercase letters, digits, _ . -, at most 64)`,
      ),
    );
    await expect(loadAgentModules([badTool])).rejects.toThrow(
      `AGENT_MODULES: ${badTool}: the tool name "read file" is not one (letters, digits, _ . -, at most 128)`,
    );
  });
});
