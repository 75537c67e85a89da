// A test OTLP/HTTP receiver of JSON trace exports (POST /v1/traces) on a free
// port of this machine: it keeps every span with its process's role, its
// instrumentation scope, and everything it carries as text (attributes,
// events, status message), so a test can check what a trace says and what
// it must never say.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface ReceivedSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  name: string;
  /** `service.name` of the process that exported it. */
  service: string;
  /** `service.role` of the process that exported it. */
  role: string;
  scope: string;
  attributes: Record<string, unknown>;
  /** The span's attributes, events and status as one JSON text. */
  text: string;
}

export interface OtlpReceiver {
  /** The value of OTEL_EXPORTER_OTLP_ENDPOINT. */
  url: string;
  spans: ReceivedSpan[];
  close(): Promise<void>;
}

type KeyValue = { key: string; value: AnyValue };
type AnyValue = {
  stringValue?: string;
  intValue?: number | string;
  doubleValue?: number;
  boolValue?: boolean;
  arrayValue?: { values?: AnyValue[] };
  kvlistValue?: { values?: KeyValue[] };
};
type OtlpExport = {
  resourceSpans?: Array<{
    resource?: { attributes?: KeyValue[] };
    scopeSpans?: Array<{
      scope?: { name?: string };
      spans?: Array<{
        traceId: string;
        spanId: string;
        parentSpanId?: string;
        name: string;
        attributes?: KeyValue[];
        events?: unknown[];
        status?: unknown;
      }>;
    }>;
  }>;
};

function valueOf(value: AnyValue): unknown {
  if (value.stringValue !== undefined) return value.stringValue;
  if (value.intValue !== undefined) return Number(value.intValue);
  if (value.doubleValue !== undefined) return value.doubleValue;
  if (value.boolValue !== undefined) return value.boolValue;
  if (value.arrayValue) return (value.arrayValue.values ?? []).map(valueOf);
  if (value.kvlistValue) return attributesOf(value.kvlistValue.values);
  return undefined;
}

function attributesOf(list: KeyValue[] | undefined): Record<string, unknown> {
  return Object.fromEntries((list ?? []).map((kv) => [kv.key, valueOf(kv.value)]));
}

function resourceText(resource: Record<string, unknown>, key: string): string {
  const value = resource[key];
  return typeof value === 'string' ? value : '';
}

export async function startOtlpReceiver(): Promise<OtlpReceiver> {
  const spans: ReceivedSpan[] = [];
  const server: Server = createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      if (request.method === 'POST' && request.url === '/v1/traces') {
        const exported = JSON.parse(Buffer.concat(chunks).toString('utf8')) as OtlpExport;
        for (const resourceSpans of exported.resourceSpans ?? []) {
          const resource = attributesOf(resourceSpans.resource?.attributes);
          for (const scopeSpans of resourceSpans.scopeSpans ?? []) {
            for (const span of scopeSpans.spans ?? []) {
              spans.push({
                traceId: span.traceId,
                spanId: span.spanId,
                parentSpanId: span.parentSpanId || undefined,
                name: span.name,
                service: resourceText(resource, 'service.name'),
                role: resourceText(resource, 'service.role'),
                scope: scopeSpans.scope?.name ?? '',
                attributes: attributesOf(span.attributes),
                text: JSON.stringify({
                  attributes: span.attributes,
                  events: span.events,
                  status: span.status,
                }),
              });
            }
          }
        }
      }
      response.writeHead(200, { 'content-type': 'application/json' });
      response.end('{}');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    spans,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
