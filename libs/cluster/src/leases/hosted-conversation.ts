import { TOO_MANY_CONVERSATIONS_NOTICE, type AgentSession, type ConversationRef } from '@cs/core';
import type { InboxMessage } from '@cs/protocol';

/** A conversation this worker holds: its job is active here, its lease epoch current. */
export interface HostedConversation {
  ref: ConversationRef;
  session: AgentSession | null;
  epoch: number;
  /** Set on SIGTERM: hand the lease back instead of finishing the job. */
  handOff: boolean;
  /** A stop or eviction that arrived before the session was ready. */
  pending: SessionMessage | null;
  /** A newer holder took the lease: leave its slot and status alone. */
  leaseLost: boolean;
}

/** A hosted conversation whose session is open. */
export type HostedSession = HostedConversation & { session: AgentSession };

/** The conversations held here whose session is open. */
export function hostedSessions(hosted: Iterable<HostedConversation>): HostedSession[] {
  return [...hosted].filter((h): h is HostedSession => h.session !== null && !h.session.isClosed);
}

/** The inbox's messages for the session (a catch-up request is the broadcaster's). */
export type SessionMessage = Exclude<InboxMessage, { type: 'catch_up' }>;

/**
 * A message of the conversation's inbox: a wake-up reaches the session; a
 * stop or an eviction that arrives before the session is ready waits for it.
 */
export function deliverToHosted(hosted: HostedConversation, message: SessionMessage): void {
  const session = hosted.session;
  if (message.type === 'wake') {
    session?.wake(message.events);
    return;
  }
  // Before the session exists, its start reads the settings as they are.
  if (message.type === 'settings') {
    session?.settingsChanged();
    return;
  }
  if (!session) {
    hosted.pending = message;
    return;
  }
  if (message.type === 'evict') {
    void session.stop(TOO_MANY_CONVERSATIONS_NOTICE.id, TOO_MANY_CONVERSATIONS_NOTICE);
  } else {
    void session.stop();
  }
}

/** The ids of docs/protocol.md "Operations" on every log line about a conversation. */
export function idsOf(hosted: HostedConversation): Record<string, unknown> {
  return {
    conversation_id: hosted.ref.conversationId,
    tenant_id: hosted.ref.tenantId,
    user_id: hosted.ref.userId,
    lease_epoch: hosted.epoch,
  };
}

export function describeError(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** How the host's parts write a log line. */
export type HostLog = (
  level: 'log' | 'warn' | 'error',
  message: string,
  fields?: Record<string, unknown>,
) => void;
