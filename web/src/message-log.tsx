// The message log: its entries (earlier versions folded under a button), the
// text streaming in, the messages still sending; which long texts the reader
// showed whole; and its scroll, kept at the newest message unless scrolled up.
import { Fragment } from 'preact';
import { useLayoutEffect, useRef, useState } from 'preact/hooks';
import type { StoredEvent } from '@cs/client';
import type { BranchControls } from './message-actions.js';
import { MessageBoundary } from './message-boundary.js';
import { MessageText } from './plain-text.js';
import { timelineRuns, type TimelineItem } from './timeline.js';
import { EntryAsText, TimelineEntry, type TextToggle } from './timeline-entry.js';
import type { ConversationView } from './use-conversation.js';

export function MessageLog({
  view,
  items,
  awaitingApproval,
  branch,
  stick,
  onLoadOlder,
}: {
  view: ConversationView;
  /** `view.events` as a timeline. */
  items: TimelineItem[];
  awaitingApproval: boolean;
  branch: BranchControls;
  /** The log follows its newest message: set again when the reader sends or branches. */
  stick: { current: boolean };
  onLoadOlder: () => void;
}) {
  const log = useRef<HTMLDivElement>(null);
  const drawn = useRef<{ firstId: number | undefined; height: number }>({
    firstId: undefined,
    height: 0,
  });
  const runs = timelineRuns(items);
  // Runs of earlier versions the reader unfolded, by key.
  const [unfolded, setUnfolded] = useState<ReadonlySet<string>>(new Set());
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

  const loadOlder = () => {
    if (view.hasOlder && !view.loadingOlder) onLoadOlder();
  };

  const onScroll = () => {
    const element = log.current;
    if (!element) return;
    stick.current = element.scrollHeight - element.scrollTop - element.clientHeight < 48;
    if (element.scrollTop < 120) loadOlder();
  };

  return (
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
  );
}
