// The open conversation as the chat view needs it: its latest events read
// through REST (reverse, one page), then the live conversation from the last
// of them on (the SDK resumes without gaps across reconnects), older pages on
// demand, messages being sent, streamed text, notices.
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import {
  newClientEventId,
  type AgentState,
  type ConnectionState,
  type ConversationInfo,
  type ConversationServiceClient,
  type ConversationServiceError,
  type LiveConversation,
  type RequestableAgentState,
  type StatusUpdate,
  type StoredEvent,
} from '@cs/client';
import { buildTimeline, TOO_MANY_CONVERSATIONS } from './timeline.js';

const PAGE = 50;
/** How many items the first screen (or one load of older ones) should show at least. */
const SHOWN = 20;
const MAX_PAGES_AT_ONCE = 10;

/** Agent states in which a turn is over: streamed text not stored by then is dropped. */
const AT_REST: ReadonlySet<AgentState> = new Set<AgentState>([
  'awaiting_user_input',
  'finished',
  'stopped',
  'paused',
  'error',
  'rejected',
]);

export interface Notice {
  key: string;
  tone: 'info' | 'warning' | 'error';
  text: string;
}

export interface PendingMessage {
  clientEventId: string;
  text: string;
}

export interface ConversationView {
  loading: boolean;
  info: ConversationInfo | undefined;
  events: readonly StoredEvent[];
  hasOlder: boolean;
  loadingOlder: boolean;
  pending: readonly PendingMessage[];
  /** Streamed text by `cause`, for turns whose answer is not stored yet. */
  streams: ReadonlyMap<number, string>;
  agentState: AgentState | null;
  connection: ConnectionState;
  notices: readonly Notice[];
  /** Why the conversation cannot be shown or followed any more. */
  error: ConversationServiceError | Error | undefined;
}

interface Model extends ConversationView {
  events: StoredEvent[];
  pending: PendingMessage[];
  streams: Map<number, string>;
  notices: Notice[];
}

export interface ConversationActions {
  /** False when the conversation is not open yet (the text is then not taken). */
  send(text: string): boolean;
  setAgentState(state: RequestableAgentState): void;
  loadOlder(): Promise<void>;
  dismiss(key: string): void;
  /** Replaces user message `eventId` with `content` (docs/protocol.md "Branching"). */
  edit(eventId: number, content: string): Promise<void>;
  /** Answers the last user message again. */
  regenerate(): Promise<void>;
  /** A new conversation with the events up to `eventId`; resolves with its id (undefined: failed). */
  fork(eventId: number): Promise<string | undefined>;
}

export function useConversation(
  client: ConversationServiceClient,
  id: string,
  onInfo: (patch: Partial<ConversationInfo>) => void,
): [ConversationView, ConversationActions] {
  const model = useRef<Model>(emptyModel()).current;
  const [, setVersion] = useState(0);
  const redraw = useCallback(() => setVersion((v) => v + 1), []);
  const liveRef = useRef<LiveConversation | undefined>(undefined);
  const onInfoRef = useRef(onInfo);
  onInfoRef.current = onInfo;

  const notify = useCallback(
    (notice: Notice) => {
      model.notices = [...model.notices.filter((n) => n.key !== notice.key), notice];
      redraw();
    },
    [model, redraw],
  );

  useEffect(() => {
    Object.assign(model, emptyModel());
    redraw();
    let closed = false;
    let live: LiveConversation | undefined;
    // The status (RUNNING, STOPPED, …) is not on the socket: read it again after changes.
    let infoTimer: ReturnType<typeof setTimeout> | undefined;
    const refreshInfo = () => {
      clearTimeout(infoTimer);
      infoTimer = setTimeout(() => {
        client.conversations.get(id).then(
          (info) => {
            if (closed) return;
            model.info = { ...info, agent_state: model.agentState ?? info.agent_state };
            onInfoRef.current({ status: info.status, title: info.title });
            redraw();
          },
          () => undefined, // the next change or reconnect reads it again
        );
      }, 300);
    };
    const open = async () => {
      const [info, page] = await Promise.all([
        client.conversations.get(id),
        client.conversations.events(id, { reverse: true, limit: PAGE }),
      ]);
      if (closed) return;
      model.info = info;
      model.agentState = info.agent_state;
      model.events = page.events.slice().reverse();
      model.hasOlder = page.has_more;
      // A page of state changes only shows nothing: read back until there is something to see.
      await readOlderUntilShown(client, id, model, () => closed);
      if (closed) return;
      model.loading = false;
      redraw();
      live = client.conversation(id, {
        start: false,
        latestEventId: model.events.at(-1)?.id ?? -1,
      });
      liveRef.current = live;
      live.on('event', (event) => {
        model.events.push(event);
        if ('client_event_id' in event && event.client_event_id) {
          model.pending = model.pending.filter((p) => p.clientEventId !== event.client_event_id);
        }
        if (event.source === 'agent' && event.cause !== undefined)
          model.streams.delete(event.cause);
        redraw();
      });
      // A rewind arrived: what it undid folds away (events read later carry `undone_by`).
      live.on('undone', ({ rewind, toEventId }) => {
        model.events = model.events.map((event) =>
          event.id > toEventId && event.id < rewind.id && event.undone_by === undefined
            ? { ...event, undone_by: rewind.id }
            : event,
        );
        redraw();
      });
      live.on('delta', ({ cause, text }) => {
        model.streams.set(cause, text);
        redraw();
      });
      live.on('agent_state', (state) => {
        model.agentState = state;
        if (AT_REST.has(state)) model.streams.clear();
        if (state === 'running') dropNotice('retry');
        onInfoRef.current({ agent_state: state });
        refreshInfo();
        redraw();
      });
      live.on('status', (status) => onStatus(status));
      live.on('connection', (state, error) => {
        model.connection = state;
        if (error) model.error = error;
        if (state === 'connected') refreshInfo();
        redraw();
      });
      await live.connect();
    };
    const dropNotice = (key: string) => {
      model.notices = model.notices.filter((n) => n.key !== key);
    };
    const onStatus = (status: StatusUpdate) => {
      switch (status.id) {
        case TOO_MANY_CONVERSATIONS:
          notify({
            key: 'too-many',
            tone: 'warning',
            text: 'This conversation was stopped because too many of your conversations were running at once. Send a message to start it again.',
          });
          break;
        case 'STATUS$TITLE_UPDATED':
          if (model.info) model.info = { ...model.info, title: status.message };
          onInfoRef.current({ title: status.message });
          redraw();
          break;
        case 'STATUS$LLM_RETRY':
          notify({ key: 'retry', tone: 'info', text: 'The model did not answer; retrying…' });
          break;
        case 'STATUS$CONVERSATION_DELETED':
          notify({ key: 'deleted', tone: 'error', text: 'This conversation was deleted.' });
          break;
        default:
          if (status.type === 'error') {
            notify({ key: status.id, tone: 'error', text: status.message || status.id });
          }
      }
    };
    open().catch((error: unknown) => {
      if (closed) return;
      model.loading = false;
      model.error = error instanceof Error ? error : new Error(String(error));
      redraw();
    });
    return () => {
      closed = true;
      clearTimeout(infoTimer);
      live?.close();
      liveRef.current = undefined;
    };
  }, [client, id, model, redraw, notify]);

  const actions: ConversationActions = {
    send(text) {
      const live = liveRef.current;
      if (!live) return false;
      const clientEventId = newClientEventId();
      model.pending = [...model.pending, { clientEventId, text }];
      dropTooMany(model);
      redraw();
      live.send(text, { clientEventId }).then(
        ({ eventId }) => {
          // Normally the stored event has arrived already; if not, it will.
          if (model.events.some((e) => e.id === eventId)) {
            model.pending = model.pending.filter((p) => p.clientEventId !== clientEventId);
            redraw();
          }
        },
        (error: ConversationServiceError) => {
          model.pending = model.pending.filter((p) => p.clientEventId !== clientEventId);
          notify({ key: `send-${clientEventId}`, tone: 'error', text: sendFailure(error) });
        },
      );
      return true;
    },
    setAgentState(state) {
      const live = liveRef.current;
      if (!live) return;
      live.setAgentState(state).catch((error: ConversationServiceError) => {
        notify({ key: 'agent-state', tone: 'error', text: `Could not do that: ${error.message}` });
      });
    },
    async loadOlder() {
      const oldest = model.events[0]?.id;
      if (!model.hasOlder || model.loadingOlder || oldest === undefined || oldest <= 0) return;
      model.loadingOlder = true;
      redraw();
      try {
        await readOlderUntilShown(
          client,
          id,
          model,
          () => false,
          buildTimeline(model.events).length,
        );
      } catch (error) {
        notify({
          key: 'older',
          tone: 'error',
          text: `Could not load older messages: ${(error as Error).message}`,
        });
      } finally {
        model.loadingOlder = false;
        redraw();
      }
    },
    dismiss(key) {
      model.notices = model.notices.filter((n) => n.key !== key);
      redraw();
    },
    async edit(eventId, content) {
      try {
        await client.conversations.edit(id, eventId, content);
      } catch (error) {
        notify({ key: 'edit', tone: 'error', text: `Not edited: ${(error as Error).message}` });
      }
    },
    async regenerate() {
      try {
        await client.conversations.regenerate(id);
      } catch (error) {
        notify({
          key: 'regenerate',
          tone: 'error',
          text: `Not regenerated: ${(error as Error).message}`,
        });
      }
    },
    async fork(eventId) {
      try {
        return (await client.conversations.fork(id, { at_event_id: eventId })).conversation_id;
      } catch (error) {
        notify({ key: 'fork', tone: 'error', text: `Not forked: ${(error as Error).message}` });
        return undefined;
      }
    },
  };
  return [model, actions];
}

/** Prepends older pages until `shownBefore + SHOWN` items show, or none is left. */
async function readOlderUntilShown(
  client: ConversationServiceClient,
  id: string,
  model: Model,
  closed: () => boolean,
  shownBefore = 0,
): Promise<void> {
  for (let pages = 0; pages < MAX_PAGES_AT_ONCE; pages += 1) {
    if (pages > 0 || shownBefore > 0 || model.events.length === 0) {
      const oldest = model.events[0]?.id;
      if (!model.hasOlder || oldest === undefined || oldest <= 0) return;
      const page = await client.conversations.events(id, {
        reverse: true,
        end_id: oldest - 1,
        limit: PAGE,
      });
      if (closed()) return;
      const older = page.events.filter((e) => e.id < oldest).reverse();
      model.events = [...older, ...model.events];
      model.hasOlder = page.has_more && (older[0]?.id ?? 0) > 0;
    }
    if (buildTimeline(model.events).length >= shownBefore + SHOWN) return;
  }
}

function emptyModel(): Model {
  return {
    loading: true,
    info: undefined,
    events: [],
    hasOlder: false,
    loadingOlder: false,
    pending: [],
    streams: new Map(),
    agentState: null,
    connection: 'connecting',
    notices: [],
    error: undefined,
  };
}

function dropTooMany(model: Model): void {
  model.notices = model.notices.filter((n) => n.key !== 'too-many');
}

function sendFailure(error: ConversationServiceError): string {
  switch (error.code) {
    case 'CONCURRENCY_LIMIT_REACHED':
      return 'Not sent: too many of your conversations are running. Stop one and try again.';
    case 'RATE_LIMITED':
      return 'Not sent: you are sending too fast. Wait a moment and try again.';
    case 'AGENT_BUSY':
      return 'Not sent: the agent is busy with the previous message.';
    default:
      return `Not sent: ${error.message}`;
  }
}
