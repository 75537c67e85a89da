/**
 * What a process needs to run agents, made once at start from the
 * configuration: the agents by name (built-in, `llm` and `http` when
 * configured, and those of agent modules), the tools they may call
 * (built-in, MCP servers', modules'), and how a usage is priced. A name
 * taken twice stops the process with one line.
 */
import { StartupError, type AppConfig } from '@cs/config';
import {
  BUILTIN_TOOLS,
  ToolRegistry,
  type ModelBudget,
  type SessionRuntime,
  type StepUsage,
} from '@cs/core';
import { AgentRegistry } from './agent-registry.js';
import { AgentModuleError, loadAgentModules } from './agent-modules.js';
import { builtinAgents, validateAgentConfig } from './builtin-agents.js';
import { loadMcpTools } from './mcp/mcp-tools.js';

export interface AgentRuntime {
  agents: AgentRegistry;
  tools: ToolRegistry;
  /** `LLM_PRICES` of the usage's model (the conversation's, or `LLM_MODEL`). */
  price: (model: string | undefined, usage: StepUsage) => number;
  /**
   * Ends what this process holds for a conversation whose session ended
   * here (stopped, closed, evicted, handed off, lease lost): its MCP
   * sessions, each with the Streamable HTTP DELETE. A later tool call opens
   * new ones. Never throws.
   */
  endConversation(conversationId: string): Promise<void>;
  /**
   * What every session of the process gets: these tools and prices, the
   * deployment's budget and strategy, and the end of its MCP sessions when
   * it ends; metrics and tracing are the process's.
   */
  sessionRuntime(observability: Pick<SessionRuntime, 'metrics' | 'tracing'>): SessionRuntime;
  close(): Promise<void>;
}

/**
 * How long a budget hold outlives a worker that died holding it: one model
 * request's longest (`LLM_TIMEOUT_MS`, its stream included) and a margin.
 */
export function budgetHoldTtlMs(config: AppConfig): number {
  return config.llm.timeoutMs + 30_000;
}

export async function createAgentRuntime(
  config: AppConfig,
  options: {
    onWarning?: (message: string) => void;
    withTools?: boolean;
    /** Each model request's duration, for `cs_llm_request_seconds` (ServiceMetrics.runtime().llmRequest). */
    onModelRequest?: (seconds: number) => void;
    /** The budgets of model requests (`modelBudget` of libs/core; default: none). */
    budget?: ModelBudget;
  } = {},
): Promise<AgentRuntime> {
  const agents = new AgentRegistry((name, agentConfig) =>
    validateAgentConfig(name, agentConfig, config),
  );
  for (const [name, make] of Object.entries(
    builtinAgents(config, {
      ...(options.onModelRequest ? { onModelRequest: options.onModelRequest } : {}),
      ...(options.budget ? { budget: options.budget } : {}),
    }),
  ))
    agents.register(name, make);
  const tools = new ToolRegistry(config.tools.timeoutMs);
  for (const [name, tool] of Object.entries(BUILTIN_TOOLS)) tools.add(name, tool);
  // Gateways only need the names of the agents: no MCP session from them.
  const mcp =
    options.withTools === false
      ? null
      : await loadMcpTools(config.mcp.servers, {
          timeoutMs: config.tools.timeoutMs,
          ...(options.onWarning ? { onWarning: options.onWarning } : {}),
        });
  for (const [name, tool] of Object.entries(mcp?.tools ?? {})) tools.add(name, tool);
  for (const { entry, module } of await loadAgentModules(config.agent.modules)) {
    for (const [name, make] of Object.entries(module.agents ?? {})) {
      if (agents.has(name)) {
        throw new AgentModuleError(`AGENT_MODULES: ${entry}: the agent name ${name} is taken`);
      }
      agents.register(name, make);
    }
    for (const [name, tool] of Object.entries(module.tools ?? {})) {
      if (tools.has(name)) {
        throw new AgentModuleError(`AGENT_MODULES: ${entry}: the tool name ${name} is taken`);
      }
      try {
        tools.add(name, tool);
      } catch (error) {
        throw new AgentModuleError(
          `AGENT_MODULES: ${entry}: ${error instanceof Error ? error.message : String(error)}`,
        );
      }
    }
  }
  if (!agents.has(config.agent.default)) {
    // Else the process would start, and every conversation created without
    // an agent would be refused for a field its client never sent.
    throw new StartupError(
      `AGENT: no agent is named ${config.agent.default} (there are: ${agents.names().join(', ')})`,
    );
  }
  const prices = config.llm.prices;
  const price = (model: string | undefined, usage: StepUsage): number => {
    const perToken = prices[model ?? config.llm.model ?? ''];
    if (!perToken) return 0;
    return (usage.promptTokens * perToken.input + usage.completionTokens * perToken.output) / 1e6;
  };
  const endConversation = async (conversationId: string): Promise<void> => {
    await mcp?.endConversation(conversationId).catch(() => undefined);
  };
  return {
    agents,
    tools,
    price,
    endConversation,
    sessionRuntime: (observability) => ({
      ...observability,
      tools,
      price,
      ...(config.llm.model ? { defaultModel: config.llm.model } : {}),
      maxBudgetUsd: config.limits.maxBudgetUsd,
      multitaskStrategy: config.agent.multitaskStrategy,
      onEnd: (ref) => void endConversation(ref.conversationId),
    }),
    close: async () => {
      await mcp?.close();
    },
  };
}
