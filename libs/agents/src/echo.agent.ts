/**
 * The `echo` agent: answers each user message with `echo: <the text verbatim>`.
 * Deterministic and instant; the default agent, used by the demo and the
 * end-to-end tests of the exactly-once guarantee.
 */
import { isAction, type AgentOutput } from '@cs/protocol';
import type { Agent, AgentContext } from '@cs/core';

export const ECHO_AGENT = 'echo';
export const ECHO_PREFIX = 'echo: ';

export class EchoAgent implements Agent {
  // eslint-disable-next-line @typescript-eslint/require-await -- an agent is an async iterable by contract
  async *step(context: AgentContext): AsyncIterable<AgentOutput> {
    const { trigger } = context;
    if (!isAction(trigger) || trigger.action !== 'message') return;
    const text = trigger.args['content'];
    // Whole also for the longest message a user may send: an agent's message
    // may be four times as long (MAX_AGENT_MESSAGE_CHARS).
    yield { type: 'message', content: ECHO_PREFIX + (typeof text === 'string' ? text : '') };
  }
}
