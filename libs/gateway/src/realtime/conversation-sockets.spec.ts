import { afterEach, describe, expect, it, vi } from 'vitest';
import { UnavailableError } from '@cs/core';
import { StatusId, type StatusUpdate } from '@cs/protocol';
import {
  CLOSE_USER_STREAMS,
  CROSS_GATEWAY_TIMEOUT_MS,
  ConversationSockets,
  userRoomKey,
  type SocketRoomsServer,
} from './conversation-sockets.js';
import { UserStreamRegistry } from './user-stream.registry.js';

/** A Socket.IO server whose rooms answer `fetchSockets` as the test says, and record the rest. */
function fakeServer(
  fetchSockets: (room: string) => Promise<readonly unknown[]>,
): SocketRoomsServer & {
  calls: string[];
  timeouts: number[];
  /** What another gateway's `serverSideEmit` would deliver here. */
  hear: (...args: unknown[]) => void;
} {
  const calls: string[] = [];
  const timeouts: number[] = [];
  let listener: ((...args: unknown[]) => void) | null = null;
  return {
    calls,
    timeouts,
    hear: (...args) => listener?.(...args),
    serverSideEmit: (event, tenantId, userId, status) =>
      calls.push(`others ${event} ${tenantId} ${userId} ${status.id}`),
    on: (_event, heard) => {
      listener = heard;
    },
    in: (room) => ({
      timeout: (ms) => {
        timeouts.push(ms);
        return { fetchSockets: () => fetchSockets(room) };
      },
      emit: (event, message) => calls.push(`${room} emit ${event} ${message.id}`),
      disconnectSockets: (close) => calls.push(`${room} disconnect ${close}`),
    }),
  };
}

const deleted: StatusUpdate = {
  status_update: true,
  type: 'error',
  id: StatusId.ConversationDeleted,
  message: 'the conversation was deleted',
};

afterEach(() => {
  vi.useRealTimers();
});

describe(ConversationSockets.name, () => {
  it('counts the sockets the adapter finds in the room, bounding its wait', async () => {
    const server = fakeServer(async (room) => (room === 'c.1' ? [{}, {}, {}] : []));
    const sockets = new ConversationSockets();
    sockets.serve(server);
    expect(await sockets.count('c.1', 1500)).toBe(3);
    expect(await sockets.count('c.2')).toBe(0);
    expect(server.timeouts).toEqual([1500, CROSS_GATEWAY_TIMEOUT_MS]);
  });

  it('refuses at once with UNAVAILABLE while the adapter cannot reach the other gateways', async () => {
    const fetchSockets = vi.fn(async () => []);
    const sockets = new ConversationSockets(() => {
      throw new UnavailableError('the service cannot reach Redis; try again shortly');
    });
    sockets.serve(fakeServer(fetchSockets));
    await expect(sockets.count('c.1')).rejects.toMatchObject({ code: 'UNAVAILABLE' });
    expect(fetchSockets).not.toHaveBeenCalled();
  });

  it('answers UNAVAILABLE when a gateway does not answer in time, however the adapter waits', async () => {
    vi.useFakeTimers();
    const sockets = new ConversationSockets();
    // The adapter never settles (a server count stuck on Redis).
    sockets.serve(fakeServer(() => new Promise<never>(() => undefined)));
    const counting = sockets.count('c.1', 2000);
    const outcome = expect(counting).rejects.toMatchObject({ code: 'UNAVAILABLE' });
    await vi.advanceTimersByTimeAsync(2000);
    await outcome;
  });

  it("answers UNAVAILABLE for the adapter's own timeout; other failures go on as they are", async () => {
    const sockets = new ConversationSockets();
    sockets.serve(
      fakeServer(async (room) => {
        if (room === 'slow') throw new Error('timeout reached: only 0 responses received out of 1');
        throw new Error('Connection is closed.');
      }),
    );
    await expect(sockets.count('slow')).rejects.toBeInstanceOf(UnavailableError);
    await expect(sockets.count('other')).rejects.toThrow('Connection is closed.');
  });

  it("sends a deleted conversation's room the status, then closes its sockets", () => {
    const server = fakeServer(async () => []);
    const sockets = new ConversationSockets();
    sockets.serve(server);
    sockets.closeDeleted('c.1', deleted);
    expect(server.calls).toEqual([
      'c.1 emit oh_event STATUS$CONVERSATION_DELETED',
      'c.1 disconnect true',
    ]);
  });

  it("closes a user's sockets and streams on every gateway: the room, the streams here, the other gateways told", () => {
    const server = fakeServer(async () => []);
    const streams = new UserStreamRegistry();
    const heard: string[] = [];
    const forget = streams.add('t', 'root', (status) => heard.push(`root ${status.id}`));
    streams.add('t', 'quinn', (status) => heard.push(`quinn ${status.id}`));
    streams.add('other', 'root', (status) => heard.push(`other root ${status.id}`));
    const sockets = new ConversationSockets(() => undefined, streams);
    sockets.serve(server);
    sockets.closeUser('t', 'root', deleted);
    const room = userRoomKey('t', 'root');
    expect(server.calls).toEqual([
      `${room} emit oh_event STATUS$CONVERSATION_DELETED`,
      `${room} disconnect true`,
      `others ${CLOSE_USER_STREAMS} t root STATUS$CONVERSATION_DELETED`,
    ]);
    expect(heard).toEqual(['root STATUS$CONVERSATION_DELETED']);
    forget(); // the stream's own close, after: nothing more
    expect(streams.closeUser('t', 'root', deleted)).toBe(0);
  });

  it('closes the streams here when another gateway tells it to, and ignores what is not such a message', () => {
    const server = fakeServer(async () => []);
    const streams = new UserStreamRegistry();
    const heard: string[] = [];
    streams.add('t', 'root', (status) => heard.push(status.id));
    const sockets = new ConversationSockets(() => undefined, streams);
    sockets.serve(server);
    server.hear('t', 'root', { nonsense: true });
    server.hear('t', 7, deleted);
    expect(heard).toEqual([]);
    server.hear('t', 'root', deleted);
    expect(heard).toEqual(['STATUS$CONVERSATION_DELETED']);
  });

  it('tells no other gateway in the standalone process (its adapter reaches only itself)', () => {
    const server = fakeServer(async () => []);
    const streams = new UserStreamRegistry();
    const heard: string[] = [];
    streams.add('t', 'root', (status) => heard.push(status.id));
    const sockets = new ConversationSockets(null, streams);
    sockets.serve(server);
    sockets.closeUser('t', 'root', deleted);
    expect(server.calls.some((call) => call.startsWith('others'))).toBe(false);
    expect(heard).toEqual(['STATUS$CONVERSATION_DELETED']);
  });
});
