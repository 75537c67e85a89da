import { describe, expect, it } from 'vitest';
import { roomKey, type ConversationRecord } from '@cs/core';
import { StatusId, type ServerEvent, type StatusUpdate } from '@cs/protocol';
import { ConversationRoomHub } from './conversation-room-hub.js';
import { LiveConnection, type ConnectionTransport } from './live-connection.js';

const ref = { tenantId: 't', userId: 'u', conversationId: 'c', incarnation: '1' };
// Only what a connection reads of its conversation: the room and the log fields.
const conversation = {
  id: ref.conversationId,
  tenantId: ref.tenantId,
  userId: ref.userId,
  incarnation: ref.incarnation,
} as ConversationRecord;

function transport(): ConnectionTransport & { sent: ServerEvent[]; closed: boolean[] } {
  const sent: ServerEvent[] = [];
  const closed: boolean[] = [];
  return {
    sent,
    closed,
    send: (message) => sent.push(message),
    unsentBytes: () => 0,
    drained: () => Promise.resolve(),
    close: (graceful) => closed.push(graceful),
  };
}

function status(id: string): StatusUpdate {
  return { status_update: true, type: 'error', id, message: id };
}

async function connect(hub: ConversationRoomHub, endsOnDeletion?: boolean) {
  const carried = transport();
  const connection = new LiveConnection({
    hub,
    conversation,
    principal: { tenantId: 't', userId: 'u', roles: [], isAdmin: false, expiresAt: 8e15 },
    afterId: -1,
    read: async () => ({ events: [], hasMore: false }),
    transport: carried,
    ...(endsOnDeletion === undefined ? {} : { endsOnDeletion }),
  });
  await connection.start();
  return { connection, carried };
}

describe(LiveConnection.name, () => {
  it("ends on the room's deletion notice by default (an SSE stream), after sending it", async () => {
    const hub = new ConversationRoomHub();
    const { carried } = await connect(hub);
    hub.publishStatus(roomKey(ref), status(StatusId.ConversationDeleted));
    expect(carried.sent).toEqual([status(StatusId.ConversationDeleted)]);
    expect(carried.closed).toEqual([true]);
    expect(hub.hasSubscribers(roomKey(ref))).toBe(false);
  });

  it("ignores the room's deletion notice when the Socket.IO adapter sends it and closes the socket", async () => {
    const hub = new ConversationRoomHub();
    const { connection, carried } = await connect(hub, false);
    hub.publishStatus(roomKey(ref), status(StatusId.ConversationDeleted));
    expect(carried.sent).toEqual([]);
    expect(carried.closed).toEqual([]);
    // Other closing notices still end it.
    hub.publishStatus(roomKey(ref), status(StatusId.TokenExpired));
    expect(carried.sent).toEqual([status(StatusId.TokenExpired)]);
    expect(carried.closed).toEqual([true]);
    connection.dispose();
  });
});
