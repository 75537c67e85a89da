// The REST half of the SDK: `client.conversations`. A 401 asks `getToken` for a
// fresh token and repeats the request once.
import { ConversationServiceError, codeForStatus } from './errors.js';
import type { TokenSource } from './token-source.js';
import { errorDetailOf } from './wire-guards.js';
import type {
  ConversationInfo,
  ConversationState,
  ConversationStatus,
  CreateConversationBody,
  CreateConversationResponse,
  EventPage,
  BranchOptions,
  EventsQuery,
  ForkBody,
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
    let token = await this.token(() => this.tokens.current());
    for (let attempt = 0; ; attempt += 1) {
      const response = await this.send(method, path, options, token);
      if (response.status === 401 && attempt === 0 && this.tokens.canRefresh) {
        const stale = token;
        token = await this.token(() => this.tokens.refresh(stale));
        continue;
      }
      return this.read<T>(response);
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
