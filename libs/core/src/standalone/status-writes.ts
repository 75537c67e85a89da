/**
 * The standalone manager's status writes, one after another per conversation,
 * each deciding its status only when its turn comes; a failed write is reported.
 */
import type { ConversationStatus } from '@cs/protocol';
import type { ConversationRef } from '../conversation.js';
import type { ConversationStore } from '../ports/conversation-store.port.js';

export class StatusWrites {
  private readonly pending = new Map<string, Promise<void>>();

  constructor(
    private readonly store: ConversationStore,
    private readonly reportError: (message: string, error: unknown) => void,
  ) {}

  /** Stores the status `decide` picks (nothing for null) once the conversation's earlier writes settled. */
  persist(ref: ConversationRef, decide: () => ConversationStatus | null): Promise<void> {
    const id = ref.conversationId;
    const previous = this.pending.get(id) ?? Promise.resolve();
    const next = previous.then(async () => {
      const status = decide();
      if (status) await this.store.setStatus(ref.tenantId, id, status);
    });
    const settled = next.catch((error: unknown) =>
      this.reportError(`could not record the status of ${id}`, error),
    );
    this.pending.set(id, settled);
    void settled.then(() => {
      if (this.pending.get(id) === settled) this.pending.delete(id);
    });
    return settled;
  }

  /** Settles once every write pending now has. */
  async settled(): Promise<void> {
    await Promise.all([...this.pending.values()]);
  }
}
