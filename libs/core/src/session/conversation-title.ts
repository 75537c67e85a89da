/**
 * The title of a conversation created without one (PROTOCOL.md "Titles"):
 * after its first answer, the agent's `title()` if it has one, else the
 * fallback rule on the first user message; stored, then announced with
 * `STATUS$TITLE_UPDATED`. A failure leaves the conversation untitled.
 */
import { StatusId, isAction } from '@cs/protocol';
import type { StatusUpdate, StoredEvent } from '@cs/protocol';
import type { Agent } from '../agent.js';
import type { ConversationRef } from '../conversation.js';
import type { ConversationStore } from '../ports/conversation-store.port.js';
import { fallbackTitle } from './title.js';
import type { TurnRunner } from './turn-runner.js';
import { isUserMessage } from './user-event-queue.js';

const MAX_AGENT_TITLE_CHARS = 200;

export interface TitleDeps {
  store: ConversationStore;
  ref: ConversationRef;
  agent: Agent;
  publishStatus: (status: StatusUpdate) => void;
  reportError: (message: string, error: unknown) => void;
  /** True once the session is closing: a title found then is not stored. */
  isClosing: () => boolean;
}

export async function titleConversation(deps: TitleDeps, runner: TurnRunner): Promise<void> {
  const { store, ref, agent } = deps;
  try {
    let title = '';
    if (agent.title) {
      try {
        title = (await agent.title(runner.titleContext())).title
          .trim()
          .slice(0, MAX_AGENT_TITLE_CHARS);
      } catch (error) {
        deps.reportError('the agent could not make a title', error);
      }
    }
    if (title === '') title = fallbackTitle(await firstUserMessage(deps, runner.trigger));
    if (title === '' || deps.isClosing()) return;
    await store.updateConversation(ref.tenantId, ref.conversationId, { title });
    deps.publishStatus({
      status_update: true,
      type: 'info',
      id: StatusId.TitleUpdated,
      message: title,
    });
  } catch (error) {
    deps.reportError('could not store a title', error);
  }
}

async function firstUserMessage(deps: TitleDeps, trigger: StoredEvent): Promise<string> {
  const { store, ref } = deps;
  const first =
    (
      await store.readEvents(ref.tenantId, ref.conversationId, {
        fromId: 0,
        toId: trigger.id,
        limit: 200,
      })
    ).find(isUserMessage) ?? trigger;
  return isAction(first) && typeof first.args['content'] === 'string' ? first.args['content'] : '';
}
