/**
 * A session's start: reads the conversation row and state and the agent
 * state before this run, stores `loading`, reads the work pending after
 * `answered_through` and stores the settled state it leaves (`paused` stays
 * paused). A start that fails, or is closed first, finishes the session.
 */
import type { AgentState } from '@cs/protocol';
import type { ConversationRecord } from '../conversation.js';
import { LeaseLostError, NotFoundError } from '../errors.js';
import {
  agentStateChangeDraft,
  readAgentStateChange,
  settledStateAfter,
} from './agent-state-change.js';
import type { EventReader } from './event-reader.js';
import type { SessionConversation } from './session-conversation.js';
import type { SessionLifecycle } from './session-lifecycle.js';
import type { AgentSessionInit } from './session-options.js';
import type { SessionOutlet } from './session-outlet.js';
import { ClosingSignal } from './session-writer.js';
import type { UserEventQueue } from './user-event-queue.js';

/** `start()` rejects with this when the session was stopped or closed before it was ready. */
export class SessionClosedError extends Error {
  constructor(message = 'the session was closed before it was ready') {
    super(message);
    this.name = 'SessionClosedError';
  }
}

/** What the start needs of its session. */
export interface SessionStartDeps extends Pick<AgentSessionInit, 'store' | 'ref'> {
  lifecycle: SessionLifecycle;
  queue: UserEventQueue;
  reader: EventReader;
  outlet: Pick<SessionOutlet, 'write'>;
  /** Told the row and state as read, before anything is stored, then the `loading` event. */
  conversation: SessionConversation;
}

/** Resolves once the settled state is stored; rejects, the session finished, if it cannot be. */
export async function startSession(deps: SessionStartDeps): Promise<void> {
  const { lifecycle, ref } = deps;
  try {
    if (lifecycle.isClosing) throw new ClosingSignal();
    // Read before `loading` is stored: the state before this run (paused?).
    const snapshot = await deps.store.getSnapshot(ref.tenantId, ref.conversationId);
    if (!snapshot || snapshot.conversation.incarnation !== ref.incarnation)
      throw new NotFoundError();
    deps.conversation.restore(snapshot);
    const previous = await stateBefore(deps, snapshot.conversation);
    // Everything up to `answered_through` is settled: only what follows is read.
    deps.queue.startAfter(snapshot.conversation.answeredThrough);
    const [loading] = await deps.outlet.write([agentStateChangeDraft('loading')]);
    deps.conversation.loaded(loading?.id ?? -1);
    await deps.reader.sync();
    await deps.outlet.write([agentStateChangeDraft(settledStateAfter(previous))]);
  } catch (error) {
    if (error instanceof LeaseLostError) lifecycle.loseLease();
    if (!lifecycle.shutdownRequested) {
      lifecycle.finish(
        lifecycle.endReason ?? (error instanceof ClosingSignal ? 'closed' : 'start_failed'),
      );
    }
    throw error instanceof ClosingSignal ? new SessionClosedError() : error;
  }
}

/**
 * The agent state before this run: the row's, unless a holder that died
 * while starting left `loading` there; then the last other one stored.
 */
async function stateBefore(
  { store, ref }: SessionStartDeps,
  record: ConversationRecord,
): Promise<AgentState | null> {
  if (record.agentState !== 'loading') return record.agentState;
  const recent = await store.readEvents(ref.tenantId, ref.conversationId, {
    reverse: true,
    limit: 50,
  });
  for (const event of recent) {
    const change = readAgentStateChange(event);
    if (change && change.agentState !== 'loading') return change.agentState;
  }
  return null;
}
