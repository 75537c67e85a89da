// The benchmark's clients of the service: REST calls and Socket.IO
// connections that time user messages against the agent's answers.
import { io } from 'socket.io-client';

const REQUEST_TIMEOUT_MS = 30_000;

/** Runs `fn` over `items` with at most `limit` calls in flight; results keep the order. */
export async function mapLimit(items, limit, fn) {
  const results = new Array(items.length);
  let next = 0;
  const lanes = Array.from({ length: Math.min(limit, items.length) }, async () => {
    while (next < items.length) {
      const index = next;
      next += 1;
      results[index] = await fn(items[index], index);
    }
  });
  await Promise.all(lanes);
  return results;
}

/** A JSON request; throws on a non-2xx status with the error body. */
export async function api(baseUrl, token, method, path, body) {
  const response = await fetch(`${baseUrl}${path}`, {
    method,
    headers: {
      ...(token ? { authorization: `Bearer ${token}` } : {}),
      ...(body === undefined ? {} : { 'content-type': 'application/json' }),
    },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  });
  const text = await response.text();
  const parsed = text ? JSON.parse(text) : null;
  if (!response.ok) {
    throw new Error(`${method} ${path}: ${response.status} ${text.slice(0, 300)}`);
  }
  return parsed;
}

export async function devToken(baseUrl, userId, tenantId) {
  const { token } = await api(baseUrl, null, 'POST', '/api/dev/token', {
    user_id: userId,
    tenant_id: tenantId,
  });
  return token;
}

/** Creates a conversation; returns its id. */
export async function createConversation(baseUrl, token, body = {}) {
  const created = await api(baseUrl, token, 'POST', '/api/conversations', body);
  return created.conversation_id;
}

/** Stores a user message through REST; returns its event id. */
export async function postMessage(baseUrl, token, conversationId, content) {
  const { event_id } = await api(
    baseUrl,
    token,
    'POST',
    `/api/conversations/${conversationId}/events`,
    { action: 'message', args: { content } },
  );
  return event_id;
}

export function stopConversation(baseUrl, token, conversationId) {
  return api(baseUrl, token, 'POST', `/api/conversations/${conversationId}/stop`, {});
}

const isAgentMessage = (event) =>
  event.source === 'agent' && event.action === 'message' && typeof event.cause === 'number';

const isReady = (event) =>
  event.observation === 'agent_state_changed' &&
  event.extras?.agent_state === 'awaiting_user_input';

/**
 * One Socket.IO connection to one conversation. Tracks the stored events it
 * receives (without keeping them), when the agent first said it was ready,
 * and the agent's answers by the id of the user event they answer.
 */
export class ConversationSocket {
  constructor(baseUrl, token, conversationId, { latestEventId = -1, start = true } = {}) {
    this.conversationId = conversationId;
    this.openedAt = performance.now();
    this.connectedAt = null;
    this.readyAt = null;
    this.lastEventId = latestEventId;
    this.received = 0;
    this.outOfOrder = 0;
    this.answers = new Map(); // cause → time the answer arrived
    this.answerWaiters = new Map(); // cause → resolve
    this.watchers = new Set();
    this.socket = io(baseUrl, {
      path: '/socket.io',
      transports: ['websocket'],
      forceNew: true,
      reconnection: false,
      timeout: 15_000,
      auth: { token },
      query: {
        conversation_id: conversationId,
        latest_event_id: String(latestEventId),
        start: String(start),
      },
    });
    this.socket.on('oh_event', (event) => this.onEvent(event));
    this.connected = new Promise((resolve, reject) => {
      this.socket.once('connect', () => {
        this.connectedAt = performance.now();
        resolve(this);
      });
      this.socket.once('connect_error', (error) =>
        reject(new Error(`connect_error ${error.message}`)),
      );
    });
  }

  onEvent(event) {
    const now = performance.now();
    if (typeof event.id === 'number') {
      if (event.id !== this.lastEventId + 1) this.outOfOrder += 1;
      this.lastEventId = event.id;
      this.received += 1;
    }
    if (this.readyAt === null && isReady(event)) this.readyAt = now;
    if (isAgentMessage(event)) {
      const waiter = this.answerWaiters.get(event.cause);
      if (waiter) {
        this.answerWaiters.delete(event.cause);
        waiter(now);
      } else {
        this.answers.set(event.cause, now);
      }
    }
    for (const watcher of this.watchers) watcher(event, now);
  }

  /** Resolves with the time of the first event matching `predicate` from now on. */
  waitFor(predicate, timeoutMs, what = 'an event') {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.watchers.delete(watcher);
        reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`));
      }, timeoutMs);
      const watcher = (event, now) => {
        if (!predicate(event)) return;
        clearTimeout(timer);
        this.watchers.delete(watcher);
        resolve(now);
      };
      this.watchers.add(watcher);
    });
  }

  /** Resolves once the agent is ready (awaiting user input), whenever that was. */
  async ready(timeoutMs) {
    if (this.readyAt !== null) return this.readyAt;
    return this.waitFor(isReady, timeoutMs, 'awaiting_user_input');
  }

  /**
   * Sends a user message and waits for the agent's answer to it.
   * Returns `{ ack, total }` in ms from the send (the acknowledgement, the
   * answer), the user event's id, and the wall-clock times (epoch ms, with
   * fractions) of the send, the ack and the answer.
   */
  async roundTrip(content, timeoutMs = 10_000) {
    const started = performance.now();
    const ack = await this.socket
      .timeout(timeoutMs)
      .emitWithAck('oh_user_action', { action: 'message', args: { content } });
    const acked = performance.now();
    if (!ack?.ok) throw new Error(`user action refused: ${JSON.stringify(ack?.error)}`);
    const cause = ack.event_id;
    const answered = await this.answerTo(cause, timeoutMs);
    const wall = (t) => performance.timeOrigin + t;
    return {
      ack: acked - started,
      total: answered - started,
      eventId: cause,
      wall: { sent: wall(started), acked: wall(acked), answered: wall(answered) },
    };
  }

  /** The time the agent's answer to event `cause` arrived, whether before this call or after. */
  answerTo(cause, timeoutMs) {
    const answered = this.answers.get(cause);
    if (answered !== undefined) {
      this.answers.delete(cause);
      return Promise.resolve(answered);
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.answerWaiters.delete(cause);
        reject(new Error(`no answer to event ${cause} within ${timeoutMs} ms`));
      }, timeoutMs);
      this.answerWaiters.set(cause, (at) => {
        clearTimeout(timer);
        resolve(at);
      });
    });
  }

  close() {
    this.socket.removeAllListeners();
    this.socket.disconnect();
  }
}

/** Opens a socket and waits for the connection (throws on `connect_error`). */
export async function connectConversation(baseUrl, token, conversationId, options) {
  const conversation = new ConversationSocket(baseUrl, token, conversationId, options);
  try {
    return await conversation.connected;
  } catch (error) {
    conversation.close();
    throw error;
  }
}
