/**
 * What a session sends out: appends fenced by its lease epoch (none once
 * closing began but a stop's last), which then bring what the session knows
 * up to date (state, agent state, recent events, queue) and go to its room;
 * fan-out to the room and to other conversations is best effort.
 */
import type { AgentState, StatusUpdate, StoredEvent, StreamDelta } from '@cs/protocol';
import type { EventDraft } from '../conversation.js';
import { LeaseLostError } from '../errors.js';
import { scopedStateChangeOf } from '../state.js';
import { readAgentStateChange } from './agent-state-change.js';
import type { EventReader } from './event-reader.js';
import type { SessionLifecycle } from './session-lifecycle.js';
import type { SessionConversation } from './session-conversation.js';
import type { AgentSessionInit } from './session-options.js';
import type { SessionOutlet } from './session-outlet.js';
import type { RecentEvents } from './turn-history.js';
import type { UserEventQueue } from './user-event-queue.js';

/** Internal: a write attempted after closing began. Never escapes the session. */
export class ClosingSignal extends Error {}

/** What the writes need of their session. */
export interface SessionWriterDeps extends Pick<
  AgentSessionInit,
  'store' | 'broadcaster' | 'ref' | 'leaseEpoch' | 'options'
> {
  room: string;
  lifecycle: SessionLifecycle;
  /** Its row and state: a write's state delta applies to the state. */
  conversation: SessionConversation;
  cache: RecentEvents;
  queue: UserEventQueue;
  reader: EventReader;
  /** The session was active just now (it wrote). */
  touch: () => void;
}

export class SessionWriter implements SessionOutlet {
  private currentState: AgentState | null = null;

  constructor(private readonly deps: SessionWriterDeps) {}

  /** The agent state this session stored last; null before any. */
  get agentState(): AgentState | null {
    return this.currentState;
  }

  /** Appends with the lease epoch, then updates what the session knows and publishes. */
  async write(drafts: EventDraft[], final = false): Promise<StoredEvent[]> {
    const { deps } = this;
    if (!deps.lifecycle.canWrite(final)) throw new ClosingSignal();
    let events: StoredEvent[];
    try {
      const appended = await deps.store.append(deps.ref.tenantId, deps.ref.conversationId, drafts, {
        leaseEpoch: deps.leaseEpoch,
        incarnation: deps.ref.incarnation,
      });
      events = appended.map((a) => a.event).sort((a, b) => a.id - b.id);
    } catch (error) {
      if (error instanceof LeaseLostError) deps.lifecycle.loseLease();
      throw error;
    }
    deps.touch();
    const { state, record } = deps.conversation;
    for (const draft of drafts) if (draft.stateDelta) state.apply(draft.stateDelta);
    const shared = record && scopedStateChangeOf(record, drafts);
    if (shared) this.safely(() => deps.options.onScopedStateChange?.(shared));
    for (const event of events) {
      const change = readAgentStateChange(event);
      if (change) this.currentState = change.agentState;
      deps.cache.put(event);
    }
    // A user event stored in between, not seen yet, leaves a gap: read it first.
    if (!deps.queue.accept(events)) deps.reader.markUnread();
    this.safely(() => deps.broadcaster.publishEvents(deps.room, events));
    return events;
  }

  publishStatus(status: StatusUpdate): void {
    this.safely(() => this.deps.broadcaster.publishStatus(this.deps.room, status));
  }

  publishStream(delta: StreamDelta): void {
    this.safely(() => this.deps.broadcaster.publishStream(this.deps.room, delta));
  }

  /** Fan-out is best effort: a failing broadcaster must not break the loop. */
  private safely(publish: () => void): void {
    try {
      publish();
    } catch {
      // Clients fill gaps from the store on reconnect.
    }
  }
}
