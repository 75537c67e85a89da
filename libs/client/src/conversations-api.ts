// The REST half of the SDK: `client.conversations`. A 401 asks `getToken` for a
// fresh token and repeats the request once.
import { ConversationServiceError, codeForStatus } from './errors.js';
import type { TokenSource } from './token-source.js';
import { errorDetailOf } from './wire-guards.js';
import type {
  ConversationExportLine,
  ConversationInfo,
  ConversationState,
  ConversationStatus,
  CreateConversationBody,
  CreateConversationResponse,
  EventPage,
  BranchOptions,
  EventsQuery,
  ForkBody,
  StoredEvent,
  ListConversationsOptions,
  PatchConversationBody,
} from './wire.js';

export type FetchFunction = (input: string, init: RequestInit) => Promise<Response>;

type Query = Record<string, string | number | boolean | undefined>;

export class ConversationsApi {
  constructor(
    private readonly baseUrl: string,
    private readonly tokens: TokenSource,
    private readonly fetchFn: FetchFunction,
  ) {}

  create(body: CreateConversationBody = {}): Promise<CreateConversationResponse> {
    return this.request('POST', '/conversations', { body });
  }

  /** Every conversation of the caller, newest activity first, page after page. */
  async *list(options: ListConversationsOptions = {}): AsyncGenerator<ConversationInfo> {
    let pageId: string | undefined;
    do {
      const page = await this.request<{ results: ConversationInfo[]; next_page_id: string | null }>(
        'GET',
        '/conversations',
        { query: { limit: options.limit, all: options.all || undefined, page_id: pageId } },
      );
      yield* page.results;
      pageId = page.next_page_id ?? undefined;
    } while (pageId);
  }

  get(id: string): Promise<ConversationInfo> {
    return this.request('GET', `/conversations/${encodeURIComponent(id)}`);
  }

  update(id: string, patch: PatchConversationBody): Promise<ConversationInfo> {
    return this.request('PATCH', `/conversations/${encodeURIComponent(id)}`, { body: patch });
  }

  async delete(id: string): Promise<void> {
    await this.request('DELETE', `/conversations/${encodeURIComponent(id)}`);
  }

  start(id: string): Promise<{ conversation_status: ConversationStatus }> {
    return this.request('POST', `/conversations/${encodeURIComponent(id)}/start`);
  }

  stop(id: string): Promise<{ conversation_status: ConversationStatus }> {
    return this.request('POST', `/conversations/${encodeURIComponent(id)}/stop`);
  }

  events(id: string, query: EventsQuery = {}): Promise<EventPage> {
    return this.request('GET', `/conversations/${encodeURIComponent(id)}/events`, {
      query: { ...query },
    });
  }

  state(id: string): Promise<ConversationState> {
    return this.request('GET', `/conversations/${encodeURIComponent(id)}/state`);
  }

  /**
   * The conversation's export (`GET …/export`, NDJSON), read as it arrives:
   * one line at a time in memory, however long the history.
   */
  async *export(id: string): AsyncGenerator<ConversationExportLine> {
    const response = await this.authorized(
      'GET',
      `/conversations/${encodeURIComponent(id)}/export`,
    );
    if (!response.ok || !response.body) {
      await this.read(response);
      return;
    }
    let index = 0;
    let ended = false;
    for await (const value of ndjsonValues(response.body)) {
      if (index === 0) yield { kind: 'conversation', conversation: value as ConversationInfo };
      else if (isStateLine(value)) {
        ended = true;
        yield { kind: 'state', state: value.state };
      } else yield { kind: 'event', event: value as StoredEvent };
      index += 1;
    }
    // The service cuts an export that fails midway: it then lacks its state line.
    if (!ended) throw new ConversationServiceError('UNAVAILABLE', 'the export was cut short');
  }

  /** A new conversation with the events up to `at_event_id` (default: all), stopped. */
  fork(
    id: string,
    body: ForkBody = {},
    options: BranchOptions = {},
  ): Promise<CreateConversationResponse> {
    return this.request('POST', `/conversations/${encodeURIComponent(id)}/fork`, {
      body,
      headers: idempotencyHeaders(options),
    });
  }

  /** Undoes every event after `toEventId`; resolves with the rewind event's id. */
  rewind(
    id: string,
    toEventId: number,
    options: BranchOptions = {},
  ): Promise<{ event_id: number }> {
    return this.request('POST', `/conversations/${encodeURIComponent(id)}/rewind`, {
      body: { to_event_id: toEventId },
      headers: idempotencyHeaders(options),
    });
  }

  /** Replaces user message `eventId` with `content`; resolves with the new message's id. */
  edit(
    id: string,
    eventId: number,
    content: string,
    options: BranchOptions = {},
  ): Promise<{ event_id: number }> {
    return this.request(
      'POST',
      `/conversations/${encodeURIComponent(id)}/events/${encodeURIComponent(String(eventId))}/edit`,
      { body: { content }, headers: idempotencyHeaders(options) },
    );
  }

  /** Answers the last user message again; resolves with the rewind event's id. */
  regenerate(id: string, options: BranchOptions = {}): Promise<{ event_id: number }> {
    return this.request('POST', `/conversations/${encodeURIComponent(id)}/regenerate`, {
      body: {},
      headers: idempotencyHeaders(options),
    });
  }

  private async request<T>(
    method: string,
    path: string,
    options: { body?: unknown; query?: Query; headers?: Record<string, string> } = {},
  ): Promise<T> {
    return this.read<T>(await this.authorized(method, path, options));
  }

  /** The response, after one fresh token when the first was refused (401). */
  private async authorized(
    method: string,
    path: string,
    options: { body?: unknown; query?: Query } = {},
  ): Promise<Response> {
    let token = await this.token(() => this.tokens.current());
    for (let attempt = 0; ; attempt += 1) {
      const response = await this.send(method, path, options, token);
      if (response.status === 401 && attempt === 0 && this.tokens.canRefresh) {
        await response.body?.cancel().catch(() => undefined);
        const stale = token;
        token = await this.token(() => this.tokens.refresh(stale));
        continue;
      }
      return response;
    }
  }

  private async token(get: () => Promise<string | undefined>): Promise<string | undefined> {
    try {
      return await get();
    } catch (error) {
      throw new ConversationServiceError('UNAUTHORIZED', `getToken failed: ${String(error)}`, {
        cause: error,
      });
    }
  }

  private async send(
    method: string,
    path: string,
    options: { body?: unknown; query?: Query; headers?: Record<string, string> },
    token: string | undefined,
  ): Promise<Response> {
    const headers: Record<string, string> = { accept: 'application/json', ...options.headers };
    if (token !== undefined) headers.authorization = `Bearer ${token}`;
    const init: RequestInit = { method, headers };
    if (options.body !== undefined) {
      headers['content-type'] = 'application/json';
      init.body = JSON.stringify(options.body);
    }
    try {
      return await this.fetchFn(`${this.baseUrl}/api${path}${queryString(options.query)}`, init);
    } catch (error) {
      throw new ConversationServiceError(
        'UNAVAILABLE',
        `the service did not answer: ${String(error)}`,
        {
          cause: error,
        },
      );
    }
  }

  private async read<T>(response: Response): Promise<T> {
    const text = await response.text().catch(() => '');
    let body: unknown;
    try {
      body = text ? JSON.parse(text) : undefined;
    } catch {
      body = undefined;
    }
    if (!response.ok) {
      const detail = errorDetailOf(body);
      throw new ConversationServiceError(
        detail?.code ?? codeForStatus(response.status),
        detail?.message ?? `HTTP ${response.status}`,
        { status: response.status, ...(detail?.field ? { field: detail.field } : {}) },
      );
    }
    return body as T;
  }
}

function idempotencyHeaders(options: BranchOptions): Record<string, string> {
  return options.idempotencyKey === undefined ? {} : { 'idempotency-key': options.idempotencyKey };
}

function queryString(query: Query | undefined): string {
  if (!query) return '';
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined) params.set(key, String(value));
  }
  const text = params.toString();
  return text ? `?${text}` : '';
}

/** The JSON values of an NDJSON body, one line at a time as the bytes arrive. */
async function* ndjsonValues(body: ReadableStream<Uint8Array>): AsyncGenerator<unknown> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffered = '';
  try {
    for (;;) {
      const { done, value } = await reader.read();
      buffered += done ? decoder.decode() : decoder.decode(value, { stream: true });
      let newline = buffered.indexOf('\n');
      while (newline >= 0) {
        const line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        if (line.trim() !== '') yield JSON.parse(line) as unknown;
        newline = buffered.indexOf('\n');
      }
      if (done) break;
    }
  } catch (error) {
    if (error instanceof SyntaxError) throw error;
    throw new ConversationServiceError(
      'UNAVAILABLE',
      `the export was cut short: ${String(error)}`,
      {
        cause: error,
      },
    );
  } finally {
    reader.releaseLock();
  }
  // A body cut short ends without its last line: not a whole export.
  if (buffered.trim() !== '') {
    throw new ConversationServiceError('UNAVAILABLE', 'the export was cut short');
  }
}

function isStateLine(value: unknown): value is { state: Record<string, unknown> } {
  return (
    typeof value === 'object' &&
    value !== null &&
    Object.keys(value).length === 1 &&
    'state' in value
  );
}
