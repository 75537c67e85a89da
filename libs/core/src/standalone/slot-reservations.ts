/**
 * The slots the standalone manager reserves for conversations that a write
 * about to be stored will start (`claimSlot`, under `reject`): each counts
 * against its user's limit until the start takes it over, or until every
 * claim on it is released.
 */
interface Reservation {
  userKey: string;
  claims: number;
}

export class SlotReservations {
  private readonly byConversation = new Map<string, Reservation>();

  has(conversationId: string): boolean {
    return this.byConversation.has(conversationId);
  }

  /** The start takes the conversation's reservation over; false when it had none. */
  takeOver(conversationId: string): boolean {
    return this.byConversation.delete(conversationId);
  }

  /** How many slots `userKey` has reserved. */
  countFor(userKey: string): number {
    let count = 0;
    for (const reservation of this.byConversation.values()) {
      if (reservation.userKey === userKey) count += 1;
    }
    return count;
  }

  /**
   * One more claim on the conversation's reservation (made when it has
   * none); the function returned gives that claim back, once, unless the
   * start has taken the reservation over.
   */
  claim(conversationId: string, userKey: string): () => void {
    let reservation = this.byConversation.get(conversationId);
    if (reservation) reservation.claims += 1;
    else {
      reservation = { userKey, claims: 1 };
      this.byConversation.set(conversationId, reservation);
    }
    const claimed = reservation;
    let released = false;
    return () => {
      if (!released && this.byConversation.get(conversationId) === claimed) {
        claimed.claims -= 1;
        if (claimed.claims === 0) this.byConversation.delete(conversationId);
      }
      released = true;
    };
  }
}
