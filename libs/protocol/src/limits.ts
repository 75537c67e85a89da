/**
 * Size limits of the wire contract (docs/protocol.md). Plain TypeScript that
 * imports nothing, on purpose: the client SDK, and through it the web app,
 * compiles this very file (libs/client/src/protocol/limits.ts is a symlink to
 * it), so that the runtime, the store and the web app share one definition.
 */
/** A user message's `content` (socket, REST, `initial_user_msg`, `replay_json`). */
export const MAX_MESSAGE_CONTENT_CHARS = 262_144;
/**
 * An agent's message, and the text one step streams: four times the longest
 * user message, so that an answer quoting it whole (the echo agent's) fits.
 * Text beyond it ends the step in `agent_error`, what fits stored as
 * interrupted.
 */
export const MAX_AGENT_MESSAGE_CHARS = 1_048_576;
export const MAX_CLIENT_EVENT_ID_CHARS = 128;
/** A socket message or REST body above this is refused with PAYLOAD_TOO_LARGE. */
export const MAX_PAYLOAD_BYTES = 1024 * 1024;
/** Socket.IO closes a connection whose message exceeds this (maxHttpBufferSize). */
export const MAX_TRANSPORT_BYTES = 2 * 1024 * 1024;
// Titles (docs/protocol.md "Titles"), longest first.
/** A title given through REST (`title` of a create or a PATCH). */
export const MAX_TITLE_CHARS = 512;
/** A title from an agent's `title()`: a longer one is cut. */
export const MAX_AGENT_TITLE_CHARS = 200;
/** The `llm` agent's title: the model's first line, cut at a word. */
export const MAX_MODEL_TITLE_CHARS = 80;
/** The fallback title: the first user message's prefix that ends at a word boundary. */
export const MAX_FALLBACK_TITLE_CHARS = 60;
export const MAX_INSTRUCTIONS_CHARS = 65_536;
export const MAX_URLS_PER_MESSAGE = 32;
export const MAX_URL_CHARS = 4096;
export const MAX_PAGE_LIMIT = 100;
export const DEFAULT_PAGE_LIMIT = 20;
/** A conversation's `metadata`, as the UTF-8 bytes of its JSON text. */
export const MAX_METADATA_BYTES = 16 * 1024;
/** How deep any JSON document of the wire (a REST body, a socket payload) may nest. */
export const MAX_JSON_DEPTH = 32;
