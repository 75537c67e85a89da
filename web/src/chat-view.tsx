// The open conversation: header with its state and controls, notices, the
// message log (stored messages as articles, streamed text, folded tool calls),
// the approval panel, the composer.
import { Fragment, type ComponentChildren } from 'preact';
import { useEffect, useLayoutEffect, useRef, useState } from 'preact/hooks';
import {
  MAX_MESSAGE_CONTENT_CHARS,
  type ConversationInfo,
  type ConversationServiceClient,
  type StoredEvent,
} from '@cs/client';
import { renderMessageOnce } from './markdown.js';
import { MessageBoundary } from './message-boundary.js';
import { MessageText } from './plain-text.js';
import {
  agentStateLabel,
  buildTimeline,
  lastAnswerKey,
  messageTime,
  SPEAKER_LABELS,
  statusLabel,
  timelineRuns,
  unansweredCalls,
  type TimelineItem,
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
  const [draft, setDraft] = useState('');
  const log = useRef<HTMLDivElement>(null);
  const stick = useRef(true);
  const drawn = useRef<{ firstId: number | undefined; height: number }>({
    firstId: undefined,
    height: 0,
  });

  const items = buildTimeline(view.events);
  const runs = timelineRuns(items);
  const regenerable = lastAnswerKey(items);
  // Runs of earlier versions the reader unfolded, by key.
  const [unfolded, setUnfolded] = useState<ReadonlySet<string>>(new Set());
  const [editing, setEditing] = useState<{ eventId: number; text: string } | null>(null);
  // Long texts the reader showed whole (MessageText), by key (see textOf).
  const [expanded, setExpanded] = useState<ReadonlySet<string>>(new Set());
  /** A long text's state and button, known by `keys`: expanded if any is, toggled as one. */
  const textOf = (...keys: string[]): TextToggle => {
    const open = keys.some((key) => expanded.has(key));
    return {
      expanded: open,
      onToggle: () => {
        // Shown whole in place: the log stays where it is, not at the text's end.
        if (!open) stick.current = false;
        setExpanded((current) => {
          const next = new Set(current);
          if (open) for (const key of keys) next.delete(key);
          else next.add(keys[0]!);
          return next;
        });
      },
    };
  };
  /**
   * A stored message's: by its id; an agent's also by the turn its text was
   * streamed in (`cause`), so that a streamed text shown whole stays so once stored.
   */
  const storedText = (event: StoredEvent): TextToggle =>
    event.source === 'agent' && event.cause !== undefined
      ? textOf(`e${event.id}`, `s${event.cause}`)
      : textOf(`e${event.id}`);
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
  const streaming = [...view.streams.entries()].filter(([, text]) => text !== '');
  const firstId = view.events[0]?.id;

  // Keep the newest message in view unless the reader scrolled up; keep the
  // reader's place when older messages are put above.
  useLayoutEffect(() => {
    const element = log.current;
    if (!element) return;
    const before = drawn.current;
    if (stick.current) element.scrollTop = element.scrollHeight;
    else if (before.firstId !== undefined && firstId !== undefined && firstId < before.firstId) {
      element.scrollTop += element.scrollHeight - before.height;
    }
    drawn.current = { firstId, height: element.scrollHeight };
  });

  const error = view.error;
  const unauthorized = error !== undefined && 'code' in error && error.code === 'UNAUTHORIZED';
  const { onUnauthorized } = props;
  useEffect(() => {
    if (unauthorized) onUnauthorized('The service no longer accepts your token. Sign in again.');
  }, [unauthorized, onUnauthorized]);

  const loadOlder = () => {
    if (view.hasOlder && !view.loadingOlder) void actions.loadOlder();
  };

  const onScroll = () => {
    const element = log.current;
    if (!element) return;
    stick.current = element.scrollHeight - element.scrollTop - element.clientHeight < 48;
    if (element.scrollTop < 120) loadOlder();
  };

  const submit = (event?: Event) => {
    event?.preventDefault();
    const text = draft.trim();
    if (!text || !actions.send(text)) return;
    setDraft('');
    stick.current = true;
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

      <div
        class="log"
        role="log"
        aria-label="Messages"
        aria-busy={streaming.length > 0}
        tabIndex={0}
        ref={log}
        onScroll={onScroll}
      >
        {view.hasOlder && (
          <button type="button" class="older" onClick={loadOlder} disabled={view.loadingOlder}>
            {view.loadingOlder ? 'Loading older messages…' : 'Load older messages'}
          </button>
        )}
        {!view.loading && items.length === 0 && view.pending.length === 0 && (
          <p class="empty">No messages yet. Say something to start the agent.</p>
        )}
        {runs.map((run) => {
          const entries = (controls: BranchControls | undefined) =>
            run.items.map((item) => (
              <MessageBoundary
                key={item.key}
                fallback={() => <EntryAsText item={item} texts={storedText} />}
              >
                <TimelineEntry
                  item={item}
                  awaitingApproval={awaitingApproval}
                  branch={controls}
                  texts={storedText}
                />
              </MessageBoundary>
            ));
          if (!run.undone) return <Fragment key={run.key}>{entries(branch)}</Fragment>;
          // Undone by a rewind: folded under a button, shown without controls when unfolded.
          const open = unfolded.has(run.key);
          return (
            <div key={run.key} class="earlier">
              <button
                type="button"
                class="small earlier-toggle"
                aria-expanded={open}
                aria-controls={`${run.key}-items`}
                onClick={() =>
                  setUnfolded((current) => {
                    const next = new Set(current);
                    if (open) next.delete(run.key);
                    else next.add(run.key);
                    return next;
                  })
                }
              >
                Show earlier version
              </button>
              <div id={`${run.key}-items`} class="earlier-items" hidden={!open}>
                {open && entries(undefined)}
              </div>
            </div>
          );
        })}
        {streaming.map(([cause, text]) => (
          <div key={`s${cause}`} class="message agent streaming" data-streaming="true">
            <MessageText
              text={text}
              id={`text-s${cause}`}
              class="message-text"
              {...textOf(`s${cause}`)}
            />
            <span class="visually-hidden">The agent is writing</span>
          </div>
        ))}
        {view.pending.map((message) => (
          <div key={message.clientEventId} class="message user pending">
            <MessageText
              text={message.text}
              id={`text-p${message.clientEventId}`}
              class="message-text"
              {...textOf(`p${message.clientEventId}`)}
            />
            <span class="sending">Sending…</span>
          </div>
        ))}
      </div>

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

      <form class="composer" onSubmit={submit}>
        <label for="message" class="visually-hidden">
          Message
        </label>
        <textarea
          id="message"
          rows={2}
          maxLength={MAX_MESSAGE_CONTENT_CHARS}
          placeholder="Write a message (Enter sends, Shift+Enter adds a line)"
          value={draft}
          onInput={(event) => setDraft(event.currentTarget.value)}
          onKeyDown={(event) => {
            if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) submit(event);
          }}
        />
        <button type="submit" class="primary" disabled={!draft.trim() || !view.info}>
          Send
        </button>
      </form>
    </section>
  );
}

/** Whether a long text is shown whole, and its button's action (MessageText). */
interface TextToggle {
  expanded: boolean;
  onToggle: () => void;
}

/** What the messages still in force offer (docs/protocol.md "Branching"). */
interface BranchControls {
  /** The conversation is open: the controls may act. */
  ready: boolean;
  /** The key of the last agent answer: the one with "Regenerate". */
  regenerable: string | undefined;
  editing: { eventId: number; text: string } | null;
  startEdit: (eventId: number, text: string) => void;
  changeEdit: (text: string) => void;
  cancelEdit: () => void;
  saveEdit: () => void;
  regenerate: () => void;
  fork: (eventId: number) => void;
}

/** A message's buttons: "Edit" (user messages), "Regenerate" (the last answer), "Fork from here". */
function MessageActions({
  item,
  branch,
}: {
  item: Extract<TimelineItem, { kind: 'user' | 'agent' }>;
  branch: BranchControls;
}) {
  return (
    <div class="message-actions" role="group" aria-label="Message actions">
      {item.kind === 'user' && (
        <button
          type="button"
          class="small"
          disabled={!branch.ready}
          onClick={() => branch.startEdit(item.event.id, item.text)}
        >
          Edit
        </button>
      )}
      {item.kind === 'agent' && item.key === branch.regenerable && (
        <button type="button" class="small" disabled={!branch.ready} onClick={branch.regenerate}>
          Regenerate
        </button>
      )}
      <button
        type="button"
        class="small"
        disabled={!branch.ready}
        onClick={() => branch.fork(item.event.id)}
      >
        Fork from here
      </button>
    </div>
  );
}

/** A user message being edited: its text in a box, then "Save and send". */
function EditForm({ eventId, branch }: { eventId: number; branch: BranchControls }) {
  const text = branch.editing?.text ?? '';
  const inputId = `edit-${eventId}`;
  // Opened from its "Edit" button: the keyboard goes on in the box. (The
  // autofocus attribute does nothing here: a document honours it once.)
  const box = useRef<HTMLTextAreaElement>(null);
  useEffect(() => box.current?.focus(), []);
  return (
    <form
      class="edit-form"
      onSubmit={(event) => {
        event.preventDefault();
        branch.saveEdit();
      }}
    >
      <label for={inputId} class="visually-hidden">
        Edit message
      </label>
      <textarea
        id={inputId}
        rows={2}
        maxLength={MAX_MESSAGE_CONTENT_CHARS}
        ref={box}
        value={text}
        onInput={(event) => branch.changeEdit(event.currentTarget.value)}
        onKeyDown={(event) => {
          if (event.key === 'Escape') branch.cancelEdit();
        }}
      />
      <button type="submit" class="primary small" disabled={!text.trim()}>
        Save and send
      </button>
      <button type="button" class="small" onClick={branch.cancelEdit}>
        Cancel
      </button>
    </form>
  );
}

function TimelineEntry({
  item,
  awaitingApproval,
  branch,
  texts,
}: {
  item: TimelineItem;
  awaitingApproval: boolean;
  /** Absent for earlier versions (undone): they offer nothing. */
  branch: BranchControls | undefined;
  /** Whether a message's long text is shown whole. */
  texts: (event: StoredEvent) => TextToggle;
}) {
  switch (item.kind) {
    case 'user': {
      const editing = branch?.editing?.eventId === item.event.id;
      return (
        <Message kind="user" event={item.event}>
          {editing && branch ? (
            <EditForm eventId={item.event.id} branch={branch} />
          ) : (
            <>
              <MessageText
                text={item.text}
                id={`text-${item.event.id}`}
                class="message-body message-text"
                {...texts(item.event)}
              />
              {branch && <MessageActions item={item} branch={branch} />}
            </>
          )}
        </Message>
      );
    }
    case 'agent': {
      const rendered = renderMessageOnce(item.event, item.text);
      return (
        <>
          <Message kind="agent" event={item.event}>
            {'html' in rendered ? (
              <div
                class="message-body markdown"
                dir="auto"
                dangerouslySetInnerHTML={{ __html: rendered.html }}
              />
            ) : (
              <MessageText
                text={item.text}
                id={`text-${item.event.id}`}
                class="message-body message-text"
                plain={rendered.plain}
                {...texts(item.event)}
              />
            )}
            {branch && <MessageActions item={item} branch={branch} />}
          </Message>
          {item.interrupted && <p class="note">Interrupted before the answer was complete.</p>}
        </>
      );
    }
    case 'tool': {
      const waiting = !item.result && awaitingApproval;
      const state = item.result
        ? item.result.rejected
          ? 'rejected'
          : item.result.inDoubt
            ? 'interrupted'
            : item.result.isError
              ? 'failed'
              : 'done'
        : waiting
          ? 'awaiting approval'
          : 'running';
      return (
        <details class={`tool tool-${state.replace(' ', '-')}`} open={waiting}>
          <summary>
            Tool call{' '}
            <code>
              <bdi>{item.tool}</bdi>
            </code>{' '}
            <span class="tool-state">{state}</span>
          </summary>
          {item.args !== undefined && (
            <>
              <h3>Arguments</h3>
              <pre>{JSON.stringify(item.args, null, 2)}</pre>
            </>
          )}
          {item.result && (
            <>
              <h3>Result</h3>
              <pre>{item.result.content}</pre>
            </>
          )}
        </details>
      );
    }
    case 'note':
      return (
        <p class={`note note-${item.tone}`} dir="auto">
          {item.text}
        </p>
      );
  }
}

/**
 * An entry whose drawing threw: a message as its text alone (no time, no
 * Markdown), anything else as a line saying so.
 */
function EntryAsText({
  item,
  texts,
}: {
  item: TimelineItem;
  texts: (event: StoredEvent) => TextToggle;
}) {
  if (item.kind !== 'user' && item.kind !== 'agent') {
    return <p class="note note-error">This entry could not be shown.</p>;
  }
  return (
    <article class={`message ${item.kind}`} aria-label={SPEAKER_LABELS[item.kind]}>
      <MessageText
        text={item.text}
        id={`text-${item.event.id}`}
        class="message-body message-text"
        {...texts(item.event)}
      />
    </article>
  );
}

/**
 * A stored message: an article named by who wrote it and when ("You 17:33"),
 * both shown above its text; the exact time is the <time>'s datetime.
 */
function Message({
  kind,
  event,
  children,
}: {
  kind: 'user' | 'agent';
  event: StoredEvent;
  children: ComponentChildren;
}) {
  const id = `message-${event.id}`;
  const time = messageTime(event.timestamp);
  return (
    <article class={`message ${kind}`} aria-labelledby={`${id}-speaker ${id}-time`}>
      <p class="message-head">
        <span id={`${id}-speaker`} class="speaker">
          {SPEAKER_LABELS[kind]}
        </span>{' '}
        <time id={`${id}-time`} dateTime={event.timestamp} title={time.full}>
          {time.short}
        </time>
      </p>
      {children}
    </article>
  );
}

function describeError(error: NonNullable<ConversationView['error']>): string {
  const code = 'code' in error ? error.code : undefined;
  if (code === 'NOT_FOUND') return 'This conversation does not exist, or was deleted.';
  if (code === 'UNAUTHORIZED') return 'Your token was refused. Sign in again.';
  return `Something went wrong: ${error.message}`;
}
