// The open conversation: header with its state and controls, notices, the
// message log, the approval panel, the composer; and what branching does.
import { Fragment } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import type { ConversationInfo, ConversationServiceClient } from '@cs/client';
import { Composer } from './composer.js';
import type { BranchControls } from './message-actions.js';
import { MessageLog } from './message-log.js';
import {
  agentStateLabel,
  buildTimeline,
  lastAnswerKey,
  statusLabel,
  unansweredCalls,
} from './timeline.js';
import { useConversation, type ConversationView } from './use-conversation.js';

const CONNECTION_LABELS = {
  connecting: 'Connecting…',
  connected: 'Live',
  reconnecting: 'Reconnecting…',
  closed: 'Disconnected',
} as const;

export function ChatView(props: {
  client: ConversationServiceClient;
  id: string;
  onInfo: (id: string, patch: Partial<ConversationInfo>) => void;
  onBack: () => void;
  /** Opens another conversation (a fork just made). */
  onOpen: (id: string) => void;
  onUnauthorized: (message: string) => void;
}) {
  const { client, id } = props;
  const [view, actions] = useConversation(client, id, (patch) => props.onInfo(id, patch));
  // Whether the log follows its newest message (MessageLog).
  const stick = useRef(true);

  const items = buildTimeline(view.events);
  const regenerable = lastAnswerKey(items);
  const [editing, setEditing] = useState<{ eventId: number; text: string } | null>(null);
  const { onOpen } = props;
  const branch: BranchControls = {
    ready: view.info !== undefined,
    regenerable,
    editing,
    startEdit: (eventId, text) => setEditing({ eventId, text }),
    changeEdit: (text) => setEditing((current) => current && { ...current, text }),
    cancelEdit: () => setEditing(null),
    saveEdit: () => {
      if (!editing || !editing.text.trim()) return;
      const { eventId, text } = editing;
      setEditing(null);
      stick.current = true;
      void actions.edit(eventId, text);
    },
    regenerate: () => {
      stick.current = true;
      void actions.regenerate();
    },
    fork: (eventId) => {
      void actions.fork(eventId).then((forkId) => {
        if (forkId) onOpen(forkId);
      });
    },
  };
  const awaitingApproval = view.agentState === 'awaiting_user_confirmation';
  const pendingCalls = awaitingApproval ? unansweredCalls(items) : [];

  const error = view.error;
  const unauthorized = error !== undefined && 'code' in error && error.code === 'UNAUTHORIZED';
  const { onUnauthorized } = props;
  useEffect(() => {
    if (unauthorized) onUnauthorized('The service no longer accepts your token. Sign in again.');
  }, [unauthorized, onUnauthorized]);

  const send = (text: string): boolean => {
    if (!actions.send(text)) return false;
    stick.current = true;
    return true;
  };

  const title = view.info?.title || 'Untitled conversation';
  const paused = view.agentState === 'paused';
  const agentIdle = view.agentState === null || view.agentState === 'stopped';

  return (
    <section class="chat" aria-labelledby="chat-title">
      <header class="chat-head">
        <button type="button" class="back" onClick={props.onBack}>
          Conversations
        </button>
        <div class="chat-title">
          <h2 id="chat-title">{view.loading ? 'Loading…' : <bdi>{title}</bdi>}</h2>
          <p class="chat-meta">
            <span>{view.info ? statusLabel(view.info.status) : ''}</span>
            <span aria-hidden="true"> · </span>
            <span>Agent: {agentStateLabel(view.agentState)}</span>
          </p>
        </div>
        <p class={`connection connection-${view.connection}`} role="status">
          <span class="dot" aria-hidden="true"></span>
          {CONNECTION_LABELS[view.connection]}
        </p>
        <div class="controls" role="group" aria-label="Agent controls">
          {paused ? (
            <button type="button" onClick={() => actions.setAgentState('running')}>
              Resume
            </button>
          ) : (
            <button
              type="button"
              disabled={agentIdle}
              onClick={() => actions.setAgentState('paused')}
            >
              Pause
            </button>
          )}
          <button
            type="button"
            disabled={agentIdle}
            onClick={() => actions.setAgentState('stopped')}
          >
            Stop
          </button>
        </div>
      </header>

      {view.connection === 'reconnecting' && (
        <p class="banner banner-warning">
          Connection lost. Reconnecting… Messages you send meanwhile are delivered once it is back.
        </p>
      )}
      {error && (
        <p class="banner banner-error" role="alert">
          {describeError(error)}
        </p>
      )}
      {view.notices.map((notice) => (
        <div key={notice.key} class={`banner banner-${notice.tone}`} role="alert">
          <span>{notice.text}</span>
          <button
            type="button"
            class="dismiss"
            aria-label="Dismiss"
            onClick={() => actions.dismiss(notice.key)}
          >
            ×
          </button>
        </div>
      ))}

      <MessageLog
        view={view}
        items={items}
        awaitingApproval={awaitingApproval}
        branch={branch}
        stick={stick}
        onLoadOlder={() => void actions.loadOlder()}
      />

      {awaitingApproval && (
        <div class="approval" role="group" aria-labelledby="approval-title">
          <p id="approval-title">
            The agent asks to run{' '}
            {pendingCalls.length > 0
              ? pendingCalls.map((tool, index) => (
                  <Fragment key={index}>
                    {index > 0 && ', '}“<bdi>{tool}</bdi>”
                  </Fragment>
                ))
              : 'a tool'}
            .
          </p>
          <button
            type="button"
            class="primary"
            onClick={() => actions.setAgentState('user_confirmed')}
          >
            Approve
          </button>
          <button type="button" onClick={() => actions.setAgentState('user_rejected')}>
            Reject
          </button>
        </div>
      )}

      <Composer ready={view.info !== undefined} onSend={send} />
    </section>
  );
}

function describeError(error: NonNullable<ConversationView['error']>): string {
  const code = 'code' in error ? error.code : undefined;
  if (code === 'NOT_FOUND') return 'This conversation does not exist, or was deleted.';
  if (code === 'UNAUTHORIZED') return 'Your token was refused. Sign in again.';
  return `Something went wrong: ${error.message}`;
}
