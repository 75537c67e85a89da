// One entry of the message log: a stored message (an article with its
// speaker and time, its text or Markdown, its branching controls), a folded
// tool call or a note; and the plain text drawn instead when drawing it threw.
import type { ComponentChildren } from 'preact';
import type { StoredEvent } from '@cs/client';
import { renderMessageOnce } from './markdown.js';
import { EditForm, MessageActions, type BranchControls } from './message-actions.js';
import { MessageText } from './plain-text.js';
import { messageTime, SPEAKER_LABELS, type TimelineItem } from './timeline.js';

/** Whether a long text is shown whole, and its button's action (MessageText). */
export interface TextToggle {
  expanded: boolean;
  onToggle: () => void;
}

export function TimelineEntry({
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
export function EntryAsText({
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
