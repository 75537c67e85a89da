// The caller's conversations, newest activity first: paged through the SDK's
// list iterator (one more page per "Show more"), refreshed every few seconds
// and overlaid with what the open conversation reports live; create, rename,
// delete.
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import { MAX_TITLE_CHARS, type ConversationInfo, type ConversationServiceClient } from '@cs/client';
import { agentStateLabel, statusLabel } from './timeline.js';

const PAGE = 20;
const REFRESH_MS = 5000;

/** Pulls items from the SDK's iterator a page at a time, looking one item ahead. */
class ConversationPager {
  private readonly iterator: AsyncIterator<ConversationInfo>;
  private ahead: ConversationInfo | undefined;
  private done = false;

  constructor(client: ConversationServiceClient) {
    this.iterator = client.conversations.list({ limit: PAGE })[Symbol.asyncIterator]();
  }

  async take(count: number): Promise<{ items: ConversationInfo[]; more: boolean }> {
    const items: ConversationInfo[] = [];
    while (items.length < count && !this.done) {
      const item = this.ahead ?? (await this.pull());
      this.ahead = undefined;
      if (item) items.push(item);
    }
    if (!this.done && !this.ahead) this.ahead = await this.pull();
    return { items, more: this.ahead !== undefined };
  }

  private async pull(): Promise<ConversationInfo | undefined> {
    const next = await this.iterator.next();
    if (next.done) {
      this.done = true;
      return undefined;
    }
    return next.value;
  }
}

export function ConversationList(props: {
  client: ConversationServiceClient;
  openId: string | null;
  /** Live changes of conversations, by id (the open one's agent state and title). */
  overlay: ReadonlyMap<string, Partial<ConversationInfo>>;
  /** Bumped by the app when the list should be read again. */
  version: number;
  onOpen: (id: string | null) => void;
  onUnauthorized: (message: string) => void;
}) {
  const { client, openId, overlay, onOpen, onUnauthorized } = props;
  const [items, setItems] = useState<ConversationInfo[]>([]);
  const [more, setMore] = useState(false);
  const [loaded, setLoaded] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string>();
  const [renaming, setRenaming] = useState<string | null>(null);
  const [deleting, setDeleting] = useState<string | null>(null);
  const pager = useRef<ConversationPager | undefined>(undefined);
  const shown = useRef(PAGE);

  const fail = useCallback(
    (cause: unknown) => {
      const code = (cause as { code?: string }).code;
      if (code === 'UNAUTHORIZED') onUnauthorized('The service no longer accepts your token.');
      else setError(`Could not load conversations: ${(cause as Error).message}`);
    },
    [onUnauthorized],
  );

  /** Reads the list again from the top, as many as are shown now. */
  const refresh = useCallback(async () => {
    const fresh = new ConversationPager(client);
    try {
      const page = await fresh.take(shown.current);
      pager.current = fresh;
      setItems(page.items);
      setMore(page.more);
      setLoaded(true);
      setError(undefined);
    } catch (cause) {
      fail(cause);
    }
  }, [client, fail]);

  useEffect(() => {
    void refresh();
    const timer = setInterval(() => {
      if (document.visibilityState === 'visible') void refresh();
    }, REFRESH_MS);
    return () => clearInterval(timer);
  }, [refresh, props.version]);

  const showMore = async () => {
    if (!pager.current) return;
    try {
      const page = await pager.current.take(PAGE);
      shown.current += page.items.length;
      setItems((current) => {
        const known = new Set(current.map((c) => c.conversation_id));
        return [...current, ...page.items.filter((c) => !known.has(c.conversation_id))];
      });
      setMore(page.more);
    } catch (cause) {
      fail(cause);
    }
  };

  const create = async () => {
    setBusy(true);
    try {
      const { conversation_id } = await client.conversations.create({});
      onOpen(conversation_id);
      await refresh();
    } catch (cause) {
      fail(cause);
    } finally {
      setBusy(false);
    }
  };

  const rename = async (id: string, title: string) => {
    try {
      const info = await client.conversations.update(id, { title });
      setItems((current) => current.map((c) => (c.conversation_id === id ? info : c)));
      setRenaming(null);
    } catch (cause) {
      fail(cause);
    }
  };

  const remove = async (id: string) => {
    try {
      await client.conversations.delete(id);
      setDeleting(null);
      if (openId === id) onOpen(null);
      setItems((current) => current.filter((c) => c.conversation_id !== id));
    } catch (cause) {
      fail(cause);
    }
  };

  return (
    <nav class="sidebar" aria-label="Conversations">
      <button type="button" class="primary new" onClick={() => void create()} disabled={busy}>
        New conversation
      </button>
      {error && (
        <p class="banner banner-error" role="alert">
          {error}
        </p>
      )}
      {loaded && items.length === 0 && <p class="empty">No conversations yet.</p>}
      <ul class="conversations">
        {items.map((item) => {
          const info = { ...item, ...overlay.get(item.conversation_id) };
          const id = info.conversation_id;
          const title = info.title || 'Untitled conversation';
          return (
            <li key={id} class={id === openId ? 'current' : undefined}>
              {renaming === id ? (
                <RenameForm
                  title={info.title}
                  onSave={(next) => void rename(id, next)}
                  onCancel={() => setRenaming(null)}
                />
              ) : deleting === id ? (
                <div class="confirm" role="group" aria-label={`Delete ${title}?`}>
                  <p>
                    Delete “<bdi>{title}</bdi>” and all its messages?
                  </p>
                  <button type="button" class="danger" onClick={() => void remove(id)}>
                    Delete for good
                  </button>
                  <button type="button" onClick={() => setDeleting(null)}>
                    Keep it
                  </button>
                </div>
              ) : (
                <>
                  <a
                    class="conversation-link"
                    href={`#/c/${id}`}
                    aria-current={id === openId ? 'page' : undefined}
                  >
                    <span class="conversation-title">
                      <bdi>{title}</bdi>
                    </span>
                    <span class="conversation-meta">
                      <span class={`badge badge-${info.status.toLowerCase()}`}>
                        {statusLabel(info.status)}
                      </span>{' '}
                      {agentStateLabel(info.agent_state)}
                    </span>
                  </a>
                  <span class="row-actions">
                    <button
                      type="button"
                      class="small"
                      aria-label={`Rename ${title}`}
                      onClick={() => setRenaming(id)}
                    >
                      Rename
                    </button>
                    <button
                      type="button"
                      class="small"
                      aria-label={`Delete ${title}`}
                      onClick={() => setDeleting(id)}
                    >
                      Delete
                    </button>
                  </span>
                </>
              )}
            </li>
          );
        })}
      </ul>
      {more && (
        <button type="button" class="more" onClick={() => void showMore()}>
          Show more conversations
        </button>
      )}
    </nav>
  );
}

function RenameForm(props: {
  title: string;
  onSave: (title: string) => void;
  onCancel: () => void;
}) {
  const [value, setValue] = useState(props.title);
  const input = useRef<HTMLInputElement>(null);
  useEffect(() => {
    input.current?.focus();
    input.current?.select();
  }, []);
  return (
    <form
      class="rename"
      onSubmit={(event) => {
        event.preventDefault();
        props.onSave(value.trim());
      }}
    >
      <label>
        <span class="visually-hidden">Title</span>
        <input
          ref={input}
          value={value}
          maxLength={MAX_TITLE_CHARS}
          onInput={(event) => setValue(event.currentTarget.value)}
          onKeyDown={(event) => {
            if (event.key === 'Escape') props.onCancel();
          }}
        />
      </label>
      <button type="submit" class="small primary">
        Save
      </button>
      <button type="button" class="small" onClick={props.onCancel}>
        Cancel
      </button>
    </form>
  );
}
