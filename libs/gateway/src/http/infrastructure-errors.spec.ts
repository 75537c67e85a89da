import { describe, expect, it } from 'vitest';
import { mapError } from './error-mapping.js';
import {
  INFRASTRUCTURE_UNAVAILABLE_MESSAGE,
  isInfrastructureUnavailable,
} from './infrastructure-errors.js';

/** An error as the drivers make them: a message and a few own fields. */
function driverError(message: string, fields: Record<string, unknown> = {}): Error {
  return Object.assign(new Error(message), fields);
}

describe(isInfrastructureUnavailable.name, () => {
  it.each([
    [
      'a refused connection',
      driverError('connect ECONNREFUSED 127.0.0.1:5432', { code: 'ECONNREFUSED' }),
    ],
    ['a reset connection', driverError('read ECONNRESET', { code: 'ECONNRESET' })],
    [
      'a host name that does not resolve',
      driverError('getaddrinfo ENOTFOUND db', { code: 'ENOTFOUND' }),
    ],
    ['pg: the connection broke', driverError('Connection terminated unexpectedly')],
    ['pg-pool: no connection in time', driverError('timeout exceeded when trying to connect')],
    [
      'Postgres: a connection exception (class 08)',
      driverError('connection failure', { code: '08006' }),
    ],
    [
      'Postgres: shutting down',
      driverError('terminating connection due to administrator command', { code: '57P01' }),
    ],
    ['Postgres: starting up', driverError('the database system is starting up', { code: '57P03' })],
    [
      'Postgres: no connection slot left',
      driverError('sorry, too many clients already', { code: '53300' }),
    ],
    [
      'ioredis: not connected, no offline queue',
      driverError("Stream isn't writeable and enableOfflineQueue options is false"),
    ],
    ['ioredis: no reply in time', driverError('Command timed out')],
    ['ioredis: closed', driverError('Connection is closed.')],
    [
      'ioredis: in flight when the connection went',
      Object.assign(driverError('Reached the max retries per request limit (which is 0).'), {
        name: 'MaxRetriesPerRequestError',
      }),
    ],
    [
      'Redis: still loading its data',
      Object.assign(driverError('LOADING Redis is loading the dataset in memory'), {
        name: 'ReplyError',
      }),
    ],
    [
      'Redis Cluster: the slot has no master',
      Object.assign(driverError('CLUSTERDOWN The cluster is down'), { name: 'ReplyError' }),
    ],
    [
      'Redis Cluster: a slot moving',
      Object.assign(driverError('TRYAGAIN Multiple keys request during rehashing of slot'), {
        name: 'ReplyError',
      }),
    ],
    [
      'ioredis Cluster: no node answers the slot map request',
      Object.assign(driverError('Failed to refresh slots cache.'), {
        name: 'ClusterAllFailedError',
      }),
    ],
    ['ioredis Cluster: no seed node answers', driverError('None of startup nodes is available')],
    [
      'ioredis Cluster: MOVED past its redirections',
      driverError(
        'Too many Cluster redirections. Last error: ReplyError: MOVED 1185 127.0.0.1:7001',
      ),
    ],
    [
      'ioredis Cluster: not ready, no offline queue',
      driverError("Cluster isn't ready and enableOfflineQueue options is false"),
    ],
    [
      'every address refused',
      Object.assign(
        new AggregateError([
          driverError('connect ECONNREFUSED ::1:6379', { code: 'ECONNREFUSED' }),
          driverError('connect ECONNREFUSED 127.0.0.1:6379', { code: 'ECONNREFUSED' }),
        ]),
        {},
      ),
    ],
    [
      'a wrapped outage',
      new Error('could not store', { cause: driverError('Connection terminated unexpectedly') }),
    ],
  ])('says %s is an outage', (_, error) => {
    expect(isInfrastructureUnavailable(error)).toBe(true);
  });

  it.each([
    ['a bug', new TypeError("Cannot read properties of undefined (reading 'id')")],
    ['an SQL error', driverError('syntax error at or near "SELEC"', { code: '42601' })],
    [
      'a constraint violated',
      driverError('duplicate key value violates unique constraint', { code: '23505' }),
    ],
    [
      'keys of several slots in one command (a bug)',
      Object.assign(driverError("CROSSSLOT Keys in request don't hash to the same slot"), {
        name: 'ReplyError',
      }),
    ],
    [
      'a Redis reply that is a bug',
      Object.assign(driverError('ERR wrong number of arguments'), { name: 'ReplyError' }),
    ],
    [
      'the text of an outage in another kind of reply',
      Object.assign(driverError('LOADING'), { name: 'TypeError' }),
    ],
    [
      'one address refused, another failed for a bug',
      new AggregateError([driverError('refused', { code: 'ECONNREFUSED' }), new RangeError('bad')]),
    ],
    ['nothing', undefined],
    ['a string', 'Connection terminated unexpectedly'],
  ])('says %s is not', (_, error) => {
    expect(isInfrastructureUnavailable(error)).toBe(false);
  });

  it('does not loop on an error that is its own cause', () => {
    const error = new Error('odd');
    Object.assign(error, { cause: error });
    expect(isInfrastructureUnavailable(error)).toBe(false);
  });

  it('makes an outage a 503 UNAVAILABLE in the one mapping of errors, and leaves a bug a 500', () => {
    const outage = driverError('connect ECONNREFUSED 127.0.0.1:5432', { code: 'ECONNREFUSED' });
    expect(mapError(outage)).toEqual({
      status: 503,
      body: { error: { code: 'UNAVAILABLE', message: INFRASTRUCTURE_UNAVAILABLE_MESSAGE } },
      headers: {},
    });
    expect(mapError(new TypeError('x is undefined'))).toMatchObject({
      status: 500,
      body: { error: { message: 'internal error' } },
    });
  });
});
