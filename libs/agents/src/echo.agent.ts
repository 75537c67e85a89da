/**
 * The `echo` agent: answers each user message with `echo: <the text verbatim>`.
 * Deterministic and instant; the default agent, used by the demo and the
 * end-to-end tests of the exactly-once guarantee.
 */
import { MAX_MESSAGE_CONTENT_CHARS, cutText, isAction, type AgentOutput } from '@cs/protocol';
import type { Agent, AgentContext } from '@cs/core';

export const ECHO_AGENT = 'echo';
export const ECHO_PREFIX = 'echo: ';

export class EchoAgent implements Agent {
  // eslint-disable-next-line @typescript-eslint/require-await -- an agent is an async iterable by contract
  async *step(context: AgentContext): AsyncIterable<AgentOutput> {
    const { trigger } = context;
    if (!isAction(trigger) || trigger.action !== 'message') return;
    const text = trigger.args['content'];
    // A message of the longest length a user may send is answered cut to the
    // longest a step's text may be, rather than not at all.
    const answer = ECHO_PREFIX + (typeof text === 'string' ? text : '');
    yield { type: 'message', content: cutText(answer, MAX_MESSAGE_CONTENT_CHARS) };
  }
}
