import { ConversationsApi, type FetchFunction } from './conversations-api.js';
import { LiveConversation, type LiveConversationOptions } from './live-conversation.js';
import { TokenSource, type TokenProvider } from './token-source.js';

export interface ClientOptions {
  /** The service's base URL, e.g. `https://chat.example.com` (REST under `/api`, Socket.IO under `/socket.io`). */
  url: string;
  /** A bearer token to start with. */
  token?: string;
  /** Called for a token when there is none, and again whenever the server answers UNAUTHORIZED or a token expires. */
  getToken?: TokenProvider;
  /** Another `fetch` (tests, proxies); default the global one. */
  fetch?: FetchFunction;
}

export interface ConversationServiceClient {
  readonly conversations: ConversationsApi;
  /** A live conversation; nothing is opened until `connect()`, `events()` or `send()`. */
  conversation(id: string, options?: LiveConversationOptions): LiveConversation;
}

export function createClient(options: ClientOptions): ConversationServiceClient {
  // Relative URLs (a page served by the service itself) resolve against the page.
  const page = (globalThis as { location?: { href: string } }).location;
  const base = new URL(options.url, page?.href);
  const prefix = base.pathname.replace(/\/+$/, '');
  const baseUrl = `${base.origin}${prefix}`;
  const tokens = new TokenSource(options.token, options.getToken);
  const fetchFn: FetchFunction = options.fetch ?? ((input, init) => fetch(input, init));
  const conversations = new ConversationsApi(baseUrl, tokens, fetchFn);
  const endpoint = { origin: base.origin, path: `${prefix}/socket.io` };
  return {
    conversations,
    conversation: (id, liveOptions = {}) =>
      new LiveConversation(id, liveOptions, endpoint, tokens, conversations),
  };
}
