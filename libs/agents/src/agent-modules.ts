/**
 * Agent modules (`AGENT_MODULES`, docs/protocol.md "Agent modules"): ES modules
 * that export `agents` (names → factories) and `tools` (names → tool
 * definitions). Each is imported once at start; one that fails to load, or a
 * name already taken, stops the process with one clear line.
 */
import { isAbsolute, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { StartupError } from '@cs/config';
import type { Agent, ToolDefinition } from '@cs/core';
import { AgentNameSchema, ToolNameSchema } from '@cs/protocol';

/** What an agent module exports: the types a module author needs. */
export interface AgentModule {
  agents?: Record<string, (config: Record<string, unknown>) => Agent>;
  tools?: Record<string, ToolDefinition>;
}

/** A module failed to load or to register: the message is the one line to print. */
export class AgentModuleError extends StartupError {
  constructor(message: string) {
    super(message);
    this.name = 'AgentModuleError';
  }
}

/** A path (`./x.js`, `/abs/x.mjs`) is imported as a file; anything else as a package. */
function specifierOf(entry: string, cwd: string): string {
  const isPath = entry.startsWith('.') || isAbsolute(entry) || /\.(m?js|cjs)$/.test(entry);
  return isPath ? pathToFileURL(resolve(cwd, entry)).href : entry;
}

export async function loadAgentModules(
  entries: readonly string[],
  cwd: string = process.cwd(),
): Promise<{ entry: string; module: AgentModule }[]> {
  const loaded: { entry: string; module: AgentModule }[] = [];
  for (const entry of entries) {
    let imported: Record<string, unknown>;
    try {
      imported = (await import(specifierOf(entry, cwd))) as Record<string, unknown>;
    } catch (error) {
      const why = error instanceof Error ? error.message.split('\n')[0] : String(error);
      throw new AgentModuleError(`AGENT_MODULES: ${entry} failed to load: ${why}`);
    }
    const { agents, tools } = imported;
    if (agents !== undefined && !isRecordOf(agents, 'function')) {
      throw new AgentModuleError(`AGENT_MODULES: ${entry}: \`agents\` must map names to factories`);
    }
    if (tools !== undefined && !isToolMap(tools)) {
      throw new AgentModuleError(
        `AGENT_MODULES: ${entry}: \`tools\` must map names to { description, parameters, idempotent, run }`,
      );
    }
    if (agents === undefined && tools === undefined) {
      throw new AgentModuleError(`AGENT_MODULES: ${entry} exports neither agents nor tools`);
    }
    // A name no conversation could pick, or no agent could call, would load for nothing.
    const badAgent = Object.keys(agents ?? {}).find((n) => !AgentNameSchema.safeParse(n).success);
    if (badAgent !== undefined) {
      throw new AgentModuleError(
        `AGENT_MODULES: ${entry}: the agent name ${JSON.stringify(badAgent.slice(0, 100))} is not one (lowercase letters, digits, _ . -, at most 64)`,
      );
    }
    const badTool = Object.keys(tools ?? {}).find((n) => !ToolNameSchema.safeParse(n).success);
    if (badTool !== undefined) {
      throw new AgentModuleError(
        `AGENT_MODULES: ${entry}: the tool name ${JSON.stringify(badTool.slice(0, 100))} is not one (letters, digits, _ . -, at most 128)`,
      );
    }
    loaded.push({ entry, module: { agents, tools } as AgentModule });
  }
  return loaded;
}

function isRecordOf(value: unknown, type: 'function'): value is Record<string, unknown> {
  return (
    typeof value === 'object' &&
    value !== null &&
    Object.values(value).every((item) => typeof item === type)
  );
}

function isToolMap(value: unknown): value is Record<string, ToolDefinition> {
  return (
    typeof value === 'object' &&
    value !== null &&
    Object.values(value).every(
      (tool: unknown) =>
        typeof tool === 'object' &&
        tool !== null &&
        typeof (tool as ToolDefinition).run === 'function' &&
        typeof (tool as ToolDefinition).description === 'string' &&
        typeof (tool as ToolDefinition).parameters === 'object' &&
        typeof (tool as ToolDefinition).idempotent === 'boolean',
    )
  );
}
