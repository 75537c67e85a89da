// What the chat view shows, worked out from the stored events it has loaded:
// messages, each tool call folded with its result, and notes for errors and
// stops. Pure, so that the view only draws it.
import { agentStateOf, isActionEvent, isObservationEvent, type StoredEvent } from '@cs/client';

/** `undoneBy`: the rewind event that undid the item's event (docs/protocol.md "Branching"). */
export type TimelineItem = (
  | { kind: 'user'; key: string; event: StoredEvent; text: string }
  | { kind: 'agent'; key: string; event: StoredEvent; text: string; interrupted: boolean }
  | {
      kind: 'tool';
      key: string;
      tool: string;
      args: unknown;
      result?: { content: string; isError: boolean; rejected: boolean; inDoubt: boolean };
    }
  | { kind: 'note'; key: string; tone: 'error' | 'info'; text: string }
) & { undoneBy?: number };

/** A run of items shown together: the items still in force, or earlier versions folded away. */
export interface TimelineRun {
  key: string;
  undone: boolean;
  items: TimelineItem[];
}

/** Consecutive items grouped by whether a rewind undid them. */
export function timelineRuns(items: readonly TimelineItem[]): TimelineRun[] {
  const runs: TimelineRun[] = [];
  for (const item of items) {
    const undone = item.undoneBy !== undefined;
    const last = runs.at(-1);
    if (last && last.undone === undone) last.items.push(item);
    else runs.push({ key: `run-${item.key}`, undone, items: [item] });
  }
  return runs;
}

/** The key of the last agent answer still in force (not undone, not interrupted): the one to regenerate. */
export function lastAnswerKey(items: readonly TimelineItem[]): string | undefined {
  for (let index = items.length - 1; index >= 0; index -= 1) {
    const item = items[index]!;
    if (item.undoneBy !== undefined) continue;
    if (item.kind === 'user') return undefined;
    if (item.kind === 'agent' && !item.interrupted) return item.key;
  }
  return undefined;
}

export const TOO_MANY_CONVERSATIONS = 'AGENT_ERROR$TOO_MANY_CONVERSATIONS';

export function buildTimeline(events: readonly StoredEvent[]): TimelineItem[] {
  const items: TimelineItem[] = [];
  const calls = new Map<string, Extract<TimelineItem, { kind: 'tool' }>>();
  for (const event of events) {
    const key = `e${event.id}`;
    const undone = event.undone_by === undefined ? {} : { undoneBy: event.undone_by };
    if (isActionEvent(event)) {
      if (event.action === 'message' && typeof event.args.content === 'string') {
        const text = event.args.content;
        if (event.source === 'user') items.push({ kind: 'user', key, event, text, ...undone });
        else if (event.source === 'agent')
          items.push({
            kind: 'agent',
            key,
            event,
            text,
            interrupted: event.args.interrupted === true,
            ...undone,
          });
      } else if (event.action === 'tool_call') {
        const tool = typeof event.args.tool === 'string' ? event.args.tool : 'tool';
        const item: Extract<TimelineItem, { kind: 'tool' }> = {
          kind: 'tool',
          key,
          tool,
          args: event.args.arguments ?? {},
          ...undone,
        };
        const callId = event.args.tool_call_id;
        if (typeof callId === 'string') calls.set(callId, item);
        items.push(item);
      }
    } else if (isObservationEvent(event)) {
      if (event.observation === 'tool_result') {
        const callId = event.extras.tool_call_id;
        const result = {
          content: event.content,
          isError: event.extras.is_error === true,
          rejected: event.extras.rejected === true,
          inDoubt: event.extras.in_doubt === true,
        };
        const call = typeof callId === 'string' ? calls.get(callId) : undefined;
        if (call) call.result = result;
        else {
          const tool = typeof event.extras.tool === 'string' ? event.extras.tool : 'tool';
          items.push({ kind: 'tool', key, tool, args: undefined, result, ...undone });
        }
      } else if (event.observation === 'error') {
        items.push({
          kind: 'note',
          key,
          tone: 'error',
          text: event.content || event.message,
          ...undone,
        });
      } else {
        const state = agentStateOf(event);
        const reason = event.extras.reason;
        if (state === 'error') {
          items.push({
            kind: 'note',
            key,
            tone: 'error',
            text:
              event.message ||
              `The agent stopped with an error${typeof reason === 'string' ? ` (${reason})` : ''}.`,
            ...undone,
          });
        } else if (state === 'stopped' && reason === TOO_MANY_CONVERSATIONS) {
          items.push({
            kind: 'note',
            key,
            tone: 'info',
            text: 'Stopped: too many of your conversations were running at once.',
            ...undone,
          });
        }
      }
    }
  }
  return items;
}

/** Tool calls stored but not answered yet (the ones an approval is about). */
export function unansweredCalls(items: readonly TimelineItem[]): string[] {
  return items.flatMap((item) => (item.kind === 'tool' && !item.result ? [item.tool] : []));
}

const AGENT_STATE_LABELS: Record<string, string> = {
  loading: 'Starting',
  running: 'Working',
  awaiting_user_input: 'Waiting for you',
  paused: 'Paused',
  stopped: 'Stopped',
  finished: 'Finished',
  rejected: 'Rejected',
  error: 'Error',
  awaiting_user_confirmation: 'Needs your approval',
  user_confirmed: 'Approved',
  user_rejected: 'Rejected by you',
  rate_limited: 'Rate limited',
};

export function agentStateLabel(state: string | null | undefined): string {
  return state ? (AGENT_STATE_LABELS[state] ?? state) : 'Not started';
}

const STATUS_LABELS: Record<string, string> = {
  STOPPED: 'Stopped',
  STARTING: 'Starting',
  RUNNING: 'Running',
  ERROR: 'Error',
};

export function statusLabel(status: string): string {
  return STATUS_LABELS[status] ?? status;
}

/** Who wrote a message, as the page names them. */
export const SPEAKER_LABELS = { user: 'You', agent: 'Agent' } as const;

/**
 * A message's time as a reader would say it, in the reader's language and
 * time zone: the time of day for one of today, with the date for an older
 * one. `full` (date and time to the second) is for a tooltip.
 */
export function messageTime(
  timestamp: string,
  now: Date = new Date(),
  zone: { locale?: string; timeZone?: string } = {},
): { short: string; full: string } {
  const date = new Date(timestamp);
  if (Number.isNaN(date.getTime())) return { short: timestamp, full: timestamp };
  // en-CA writes the calendar day as YYYY-MM-DD, whatever the reader's language.
  const day = formatter('en-CA', zone.timeZone, CALENDAR_DAY);
  const today = day.format(date) === day.format(now);
  return {
    short: formatter(zone.locale, zone.timeZone, today ? TIME_OF_DAY : DATED).format(date),
    full: formatter(zone.locale, zone.timeZone, FULL).format(date),
  };
}

const CALENDAR_DAY: Intl.DateTimeFormatOptions = {
  year: 'numeric',
  month: '2-digit',
  day: '2-digit',
};
const TIME_OF_DAY: Intl.DateTimeFormatOptions = { timeStyle: 'short' };
const DATED: Intl.DateTimeFormatOptions = { dateStyle: 'medium', timeStyle: 'short' };
const FULL: Intl.DateTimeFormatOptions = { dateStyle: 'full', timeStyle: 'medium' };

// Every message is drawn again on each streamed delta: formatters are made once.
const formatters = new Map<string, Intl.DateTimeFormat>();

function formatter(
  locale: string | undefined,
  timeZone: string | undefined,
  options: Intl.DateTimeFormatOptions,
): Intl.DateTimeFormat {
  const key = JSON.stringify([locale, timeZone, options]);
  let made = formatters.get(key);
  if (made === undefined) {
    made = new Intl.DateTimeFormat(locale, { ...options, timeZone });
    formatters.set(key, made);
  }
  return made;
}
