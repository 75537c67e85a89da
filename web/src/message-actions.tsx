// The branching controls of a message still in force (docs/protocol.md
// "Branching"): its Edit, Regenerate and Fork buttons, and the edit form.
import { useEffect, useRef } from 'preact/hooks';
import { MAX_MESSAGE_CONTENT_CHARS } from '@cs/client';
import type { TimelineItem } from './timeline.js';

/** What the messages still in force offer (docs/protocol.md "Branching"). */
export interface BranchControls {
  /** The conversation is open: the controls may act. */
  ready: boolean;
  /** The key of the last agent answer: the one with "Regenerate". */
  regenerable: string | undefined;
  editing: { eventId: number; text: string } | null;
  startEdit: (eventId: number, text: string) => void;
  changeEdit: (text: string) => void;
  cancelEdit: () => void;
  saveEdit: () => void;
  regenerate: () => void;
  fork: (eventId: number) => void;
}

/** A message's buttons: "Edit" (user messages), "Regenerate" (the last answer), "Fork from here". */
export function MessageActions({
  item,
  branch,
}: {
  item: Extract<TimelineItem, { kind: 'user' | 'agent' }>;
  branch: BranchControls;
}) {
  return (
    <div class="message-actions" role="group" aria-label="Message actions">
      {item.kind === 'user' && (
        <button
          type="button"
          class="small"
          disabled={!branch.ready}
          onClick={() => branch.startEdit(item.event.id, item.text)}
        >
          Edit
        </button>
      )}
      {item.kind === 'agent' && item.key === branch.regenerable && (
        <button type="button" class="small" disabled={!branch.ready} onClick={branch.regenerate}>
          Regenerate
        </button>
      )}
      <button
        type="button"
        class="small"
        disabled={!branch.ready}
        onClick={() => branch.fork(item.event.id)}
      >
        Fork from here
      </button>
    </div>
  );
}

/** A user message being edited: its text in a box, then "Save and send". */
export function EditForm({ eventId, branch }: { eventId: number; branch: BranchControls }) {
  const text = branch.editing?.text ?? '';
  const inputId = `edit-${eventId}`;
  // Opened from its "Edit" button: the keyboard goes on in the box. (The
  // autofocus attribute does nothing here: a document honours it once.)
  const box = useRef<HTMLTextAreaElement>(null);
  useEffect(() => box.current?.focus(), []);
  return (
    <form
      class="edit-form"
      onSubmit={(event) => {
        event.preventDefault();
        branch.saveEdit();
      }}
    >
      <label for={inputId} class="visually-hidden">
        Edit message
      </label>
      <textarea
        id={inputId}
        rows={2}
        maxLength={MAX_MESSAGE_CONTENT_CHARS}
        ref={box}
        value={text}
        onInput={(event) => branch.changeEdit(event.currentTarget.value)}
        onKeyDown={(event) => {
          if (event.key === 'Escape') branch.cancelEdit();
        }}
      />
      <button type="submit" class="primary small" disabled={!text.trim()}>
        Save and send
      </button>
      <button type="button" class="small" onClick={branch.cancelEdit}>
        Cancel
      </button>
    </form>
  );
}
