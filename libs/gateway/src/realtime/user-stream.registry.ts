/**
 * The SSE streams open on this process, by the user they are authenticated
 * as, whatever conversation they follow (an `admin` follows other users'):
 * how an erasure closes every stream of its user. A socket is found through
 * its Socket.IO room of the user instead (`userRoomKey`); a stream has no
 * such room, so each gateway keeps its own here and is told to close them
 * (`ConversationSockets.closeUser`).
 */
import { Injectable } from '@nestjs/common';
import type { StatusUpdate } from '@cs/protocol';

/** Ends one stream after sending it `status`. */
export type StreamCloser = (status: StatusUpdate) => void;

@Injectable()
export class UserStreamRegistry {
  private readonly byUser = new Map<string, Set<StreamCloser>>();

  /** Registers an open stream of the user; the function returned forgets it (idempotent). */
  add(tenantId: string, userId: string, close: StreamCloser): () => void {
    const key = userKey(tenantId, userId);
    let streams = this.byUser.get(key);
    if (!streams) {
      streams = new Set();
      this.byUser.set(key, streams);
    }
    const held = streams;
    held.add(close);
    return () => {
      held.delete(close);
      if (held.size === 0 && this.byUser.get(key) === held) this.byUser.delete(key);
    };
  }

  /** Every stream of the user open here gets `status` and is ended; how many there were. */
  closeUser(tenantId: string, userId: string, status: StatusUpdate): number {
    const key = userKey(tenantId, userId);
    const streams = this.byUser.get(key);
    if (!streams) return 0;
    this.byUser.delete(key);
    const closing = [...streams];
    for (const close of closing) close(status);
    return closing.length;
  }
}

/** Tenant and user, neither able to pass for the other (`/` is escaped in both). */
function userKey(tenantId: string, userId: string): string {
  return `${encodeURIComponent(tenantId)}/${encodeURIComponent(userId)}`;
}
