/** The client connections attached to each conversation in this process, counted by conversation. */
export class ConnectionCounts {
  private readonly conversationOf = new Map<string, string>();
  private readonly counts = new Map<string, number>();

  /** `connectionId` now watches `conversationId` (and no longer what it watched before). */
  attach(connectionId: string, conversationId: string): void {
    this.detach(connectionId);
    this.conversationOf.set(connectionId, conversationId);
    this.counts.set(conversationId, (this.counts.get(conversationId) ?? 0) + 1);
  }

  detach(connectionId: string): void {
    const conversationId = this.conversationOf.get(connectionId);
    if (conversationId === undefined) return;
    this.conversationOf.delete(connectionId);
    const count = (this.counts.get(conversationId) ?? 1) - 1;
    if (count > 0) this.counts.set(conversationId, count);
    else this.counts.delete(conversationId);
  }

  count(conversationId: string): number {
    return this.counts.get(conversationId) ?? 0;
  }
}
