// The composer: the box a message is written in, sent with Enter or the
// button (Shift+Enter adds a line), and emptied once the message is taken.
import { useState } from 'preact/hooks';
import { MAX_MESSAGE_CONTENT_CHARS } from '@cs/client';

export function Composer({
  ready,
  onSend,
}: {
  /** The conversation is open: a message may be sent. */
  ready: boolean;
  /** Sends the (trimmed) text; false when it was not taken, and the box keeps it. */
  onSend: (text: string) => boolean;
}) {
  const [draft, setDraft] = useState('');

  const submit = (event?: Event) => {
    event?.preventDefault();
    const text = draft.trim();
    if (!text || !onSend(text)) return;
    setDraft('');
  };

  return (
    <form class="composer" onSubmit={submit}>
      <label for="message" class="visually-hidden">
        Message
      </label>
      <textarea
        id="message"
        rows={2}
        maxLength={MAX_MESSAGE_CONTENT_CHARS}
        placeholder="Write a message (Enter sends, Shift+Enter adds a line)"
        value={draft}
        onInput={(event) => setDraft(event.currentTarget.value)}
        onKeyDown={(event) => {
          if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) submit(event);
        }}
      />
      <button type="submit" class="primary" disabled={!draft.trim() || !ready}>
        Send
      </button>
    </form>
  );
}
