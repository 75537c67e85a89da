/**
 * An `application/x-ndjson` answer written as it is read: one JSON value per
 * line, each chunk waiting until the client took the one before (the
 * socket's buffer drained), so that an export of any size holds one page in
 * memory at a time, whatever the client's speed.
 */
import type { Response } from 'express';
import { firstOf } from '../realtime/live-connection.js';

/** What an export writes its lines to. */
export interface NdjsonSink {
  /** Writes the values, one line each; waits while the client is behind. */
  write(values: readonly unknown[]): Promise<void>;
}

/** The client went away: the export stops. */
export class ClientGoneError extends Error {
  constructor() {
    super('the client closed the connection');
  }
}

/** The headers go with the first line: a failure before it is an ordinary error answer. */
export function ndjsonResponse(response: Response): NdjsonSink {
  const gone = () => response.destroyed || response.writableEnded || !response.socket;
  return {
    async write(values) {
      if (values.length === 0) return;
      if (gone()) throw new ClientGoneError();
      if (!response.headersSent) {
        response.status(200).set({
          'content-type': 'application/x-ndjson; charset=utf-8',
          'cache-control': 'no-store',
          'x-accel-buffering': 'no',
        });
      }
      let chunk = '';
      for (const value of values) chunk += `${JSON.stringify(value)}\n`;
      if (!response.write(chunk)) await firstOf(response, ['drain', 'close']);
      if (gone()) throw new ClientGoneError();
    },
  };
}

/**
 * Runs an export into `response`: ended once `run` is done; cut (destroyed)
 * when it fails after the first line, so that the client sees an export
 * without its last line rather than a whole-looking one. A failure before
 * the first line is thrown, for the usual error answer.
 */
export async function streamNdjson(
  response: Response,
  run: (sink: NdjsonSink) => Promise<void>,
  onCutShort: (error: unknown) => void = () => undefined,
): Promise<void> {
  const sink = ndjsonResponse(response);
  try {
    await run(sink);
    response.end();
  } catch (error) {
    if (!response.headersSent && !(error instanceof ClientGoneError)) throw error;
    response.destroy();
    if (!(error instanceof ClientGoneError)) onCutShort(error);
  }
}

/** Logs an export cut short by a failure after its first line. */
export function cutShort(logger: { warn(message: string): unknown }): (error: unknown) => void {
  return (error) => logger.warn(`export cut short: ${String(error)}`);
}
