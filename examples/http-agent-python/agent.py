#!/usr/bin/env python3
"""A remote agent for the conversation service's `http` agent, in Python with
the standard library only.

Each step of a turn, the service POSTs the conversation's context here, signed
with AGENT_HTTP_SECRET; this agent answers with NDJSON agent outputs, one per
line, streamed as they are written:

- when the turn has no result of `current_time` yet, it says so in a few
  deltas and calls the service's `current_time` tool;
- on the next step it sees that tool's result in `events` and answers with a
  message saying the time.

Run:  AGENT_HTTP_SECRET=... PORT=8765 python3 agent.py
"""

import hashlib
import hmac
import json
import os
import sys
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = os.environ.get("AGENT_HTTP_SECRET", "")
PORT = int(os.environ.get("PORT", "8765"))
HOST = os.environ.get("HOST", "127.0.0.1")
# Requests signed longer ago than this are refused (replays).
TOLERANCE_SECONDS = 300
# Seconds between two deltas, so that streaming shows.
DELTA_PAUSE = float(os.environ.get("DELTA_PAUSE", "0.05"))

# A request repeated after a failover carries the same idempotency-key: it gets
# the same answer (kept in memory, the most recent ANSWERS_KEPT only; a real
# agent would keep them in its store for as long as a failover may take).
ANSWERS_KEPT = int(os.environ.get("ANSWERS_KEPT", "10000"))
answers = OrderedDict()
answers_lock = threading.Lock()


def answer_for(request, key):
    """The outputs for this idempotency-key: planned once, then repeated."""
    with answers_lock:
        outputs = answers.get(key)
        if outputs is None:
            outputs = plan(request, key)
            answers[key] = outputs
            if len(answers) > ANSWERS_KEPT:
                answers.popitem(last=False)
        else:
            answers.move_to_end(key)
        return outputs


def signature_ok(timestamp, body, signature):
    if not SECRET or not timestamp or not signature or not timestamp.isdigit():
        return False
    if abs(time.time() - int(timestamp)) > TOLERANCE_SECONDS:
        return False
    mac = hmac.new(SECRET.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return hmac.compare_digest("sha256=" + mac.hexdigest(), signature)


def time_result(request):
    """The content of a `current_time` result stored after the turn's trigger, if any."""
    trigger_id = request["trigger"]["id"]
    for event in request["events"]:
        if (
            event["id"] > trigger_id
            and event.get("observation") == "tool_result"
            and event.get("extras", {}).get("tool") == "current_time"
        ):
            return event
    return None


def plan(request, idempotency_key):
    """The outputs of this step, as a list of JSON-able dicts."""
    result = time_result(request)
    if result is not None:
        if result["extras"].get("is_error"):
            text = "I could not read the clock: " + result["content"]
        else:
            text = "It is " + result["content"] + " (UTC)."
        words = text.split(" ")
        deltas = [{"type": "delta", "delta": w + (" " if i < len(words) - 1 else "")} for i, w in enumerate(words)]
        return deltas + [{"type": "message", "content": text}]

    tools = [tool["name"] for tool in request.get("tools", [])]
    if "current_time" not in tools:
        text = "I would tell you the time, but the service offers no current_time tool."
        return [{"type": "delta", "delta": text}, {"type": "message", "content": text}]
    call_id = "time-" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:16]
    return [
        {"type": "delta", "delta": "Let me "},
        {"type": "delta", "delta": "look at "},
        {"type": "delta", "delta": "the clock."},
        {"type": "tool_call", "tool": "current_time", "arguments": {}, "tool_call_id": call_id},
    ]


class AgentHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        if not signature_ok(
            self.headers.get("x-cs-timestamp"), body, self.headers.get("x-cs-signature")
        ):
            self.reply_json(401, {"error": "bad signature"})
            return
        try:
            request = json.loads(body)
        except ValueError:
            self.reply_json(400, {"error": "not JSON"})
            return

        outputs = answer_for(request, self.headers.get("idempotency-key", ""))

        self.send_response(200)
        self.send_header("content-type", "application/x-ndjson")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        try:
            for output in outputs:
                self.write_chunk((json.dumps(output) + "\n").encode())
                if output["type"] == "delta":
                    time.sleep(DELTA_PAUSE)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            # The service stopped the turn (stop, pause, interrupt): nothing to do.
            pass

    def write_chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def reply_json(self, status, value):
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format, *args):
        # One line per request on standard error; never the headers (they carry the signature).
        sys.stderr.write("%s %s\n" % (self.address_string(), format % args))


def main():
    if not SECRET:
        sys.stderr.write("set AGENT_HTTP_SECRET (the same value as the service's)\n")
        sys.exit(1)
    server = ThreadingHTTPServer((HOST, PORT), AgentHandler)
    print("http agent listening on http://%s:%d/" % (HOST, server.server_address[1]), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
