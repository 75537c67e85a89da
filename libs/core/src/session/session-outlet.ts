/**
 * The one way out of a session, for every part of it: appends fenced by its
 * lease epoch, and its room's live traffic. `SessionWriter` is it. A running
 * turn's writes pass through its `ActiveTurn` (which stores `running` first
 * and keeps them in order) on their way here; nothing else stands between.
 */
import type { StatusUpdate, StoredEvent, StreamDelta } from '@cs/protocol';
import type { EventDraft } from '../conversation.js';

export interface SessionOutlet {
  /** Appends in order; `final` lets a stop's last write through while the session closes. */
  write(drafts: EventDraft[], final?: boolean): Promise<StoredEvent[]>;
  /** Best effort: a status to the room. */
  publishStatus(status: StatusUpdate): void;
  /** Best effort: a step's streamed text to the room. */
  publishStream(delta: StreamDelta): void;
}
