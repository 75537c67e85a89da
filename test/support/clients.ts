// Socket.IO and HTTP clients for end-to-end tests, speaking docs/protocol.md.
import { io, type Socket } from 'socket.io-client';
import type { ServerEvent, StoredEvent, UserActionAck } from '@cs/protocol';

export interface ApiResponse<T = unknown> {
  status: number;
  body: T;
  headers: Headers;
}

export async function api<T = any>( // eslint-disable-line @typescript-eslint/no-explicit-any -- test bodies are checked by assertions
  baseUrl: string,
  method: string,
  path: string,
  options: { token?: string; body?: unknown; headers?: Record<string, string>; raw?: string } = {},
): Promise<ApiResponse<T>> {
  const headers: Record<string, string> = { ...options.headers };
  if (options.token) headers.authorization = `Bearer ${options.token}`;
  let body: string | undefined = options.raw;
  if (options.body !== undefined) {
    body = JSON.stringify(options.body);
    headers['content-type'] ??= 'application/json';
  }
  const response = await fetch(baseUrl + path, { method, headers, body });
  const text = await response.text();
  let parsed: unknown = text;
  try {
    parsed = text ? JSON.parse(text) : undefined;
  } catch {
    // not JSON: keep the text
  }
  return { status: response.status, body: parsed as T, headers: response.headers };
}

export async function devToken(
  baseUrl: string,
  input: { user_id?: string; tenant_id?: string; roles?: string[] },
): Promise<string> {
  const response = await api<{ token: string }>(baseUrl, 'POST', '/api/dev/token', { body: input });
  if (response.status !== 200 && response.status !== 201) {
    throw new Error(`dev token: ${response.status} ${JSON.stringify(response.body)}`);
  }
  return response.body.token;
}

/** A conversation socket as docs/protocol.md asks clients to open one, without reconnection. */
function openSocket(
  baseUrl: string,
  token: string | undefined,
  query: Record<string, string>,
): Socket {
  return io(baseUrl, {
    transports: ['websocket'],
    auth: token === undefined ? {} : { token },
    query,
    reconnection: false,
    forceNew: true,
  });
}

/** A connected conversation socket that records every `oh_event`. */
export class ConversationClient {
  readonly events: ServerEvent[] = [];
  private waiters: Array<() => void> = [];

  private constructor(readonly socket: Socket) {
    socket.on('oh_event', (event: ServerEvent) => {
      this.events.push(event);
      for (const wake of this.waiters.splice(0)) wake();
    });
  }

  static async connect(
    baseUrl: string,
    token: string | undefined,
    query: Record<string, string>,
  ): Promise<ConversationClient> {
    const socket = openSocket(baseUrl, token, query);
    const client = new ConversationClient(socket);
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', () => resolve());
      socket.once('connect_error', (error) => reject(error));
    });
    return client;
  }

  /** Connects and expects a refusal; resolves with the `connect_error`. */
  static async refusal(
    baseUrl: string,
    token: string | undefined,
    query: Record<string, string>,
  ): Promise<Error & { data?: { code: string; message: string } }> {
    const socket = openSocket(baseUrl, token, query);
    try {
      return await new Promise((resolve, reject) => {
        socket.once('connect', () => reject(new Error('connected, but a refusal was expected')));
        socket.once('connect_error', (error) =>
          resolve(error as Error & { data?: { code: string; message: string } }),
        );
      });
    } finally {
      socket.close();
    }
  }

  get stored(): StoredEvent[] {
    return this.events.filter(
      (event): event is StoredEvent => typeof (event as { id?: unknown }).id === 'number',
    );
  }

  send(payload: unknown): Promise<UserActionAck> {
    return this.socket
      .timeout(30_000)
      .emitWithAck('oh_user_action', payload) as Promise<UserActionAck>;
  }

  message(content: string, clientEventId?: string): Promise<UserActionAck> {
    const payload: Record<string, unknown> = { action: 'message', args: { content } };
    if (clientEventId) payload.client_event_id = clientEventId;
    return this.send(payload);
  }

  /** Waits until `predicate` holds for the events received so far. */
  async waitFor(
    predicate: (events: ServerEvent[]) => boolean,
    timeoutMs = 10_000,
    what = 'condition',
  ): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!predicate(this.events)) {
      const left = deadline - Date.now();
      if (left <= 0) {
        throw new Error(
          `timed out waiting for ${what}; received:\n${JSON.stringify(this.events, null, 1).slice(0, 4000)}`,
        );
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Waits for the agent's reply to the user event `userEventId`. */
  waitForReply(userEventId: number, timeoutMs = 10_000): Promise<void> {
    return this.waitFor(
      (events) => events.some((e) => isAgentReply(e, userEventId)),
      timeoutMs,
      `reply to ${userEventId}`,
    );
  }

  close(): void {
    this.socket.close();
  }
}

export function isAgentReply(event: ServerEvent, cause: number): boolean {
  return (
    'action' in event &&
    event.source === 'agent' &&
    event.action === 'message' &&
    event.cause === cause
  );
}

/** Asserts-friendly: ids of stored events in the order received. */
export function ids(events: ServerEvent[]): number[] {
  return events.flatMap((e) =>
    typeof (e as { id?: unknown }).id === 'number' ? [(e as StoredEvent).id] : [],
  );
}

/** An SSE stream read as text: what arrived, and whether the server ended it. */
export async function openSse(
  url: string,
  token: string,
  id: string,
): Promise<{ text: () => string; ended: Promise<void>; abort: () => void }> {
  const controller = new AbortController();
  const response = await fetch(`${url}/api/conversations/${id}/stream`, {
    headers: { authorization: `Bearer ${token}` },
    signal: controller.signal,
  });
  if (response.status !== 200) throw new Error(`the stream answered ${response.status}`);
  let text = '';
  const decoder = new TextDecoder();
  const ended = (async () => {
    try {
      for await (const chunk of response.body!) text += decoder.decode(chunk as Uint8Array);
    } catch {
      // aborted, or cut by the server
    }
  })();
  return { text: () => text, ended, abort: () => controller.abort() };
}
