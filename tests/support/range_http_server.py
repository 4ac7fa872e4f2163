"""A small HTTP file server with Range support, byte accounting and one-shot connection drops.

Used by the checkpoint unit tests (in a thread) and by the Molecule scenario (inside the lab
Spark, serving on 127.0.0.1). `python3 -m http.server` cannot answer Range requests, so it
cannot show a resumed download.

  GET /<path>                      the file (200, or 206 for `Range: bytes=N-` / `bytes=N-M`)
  GET /_stats                      JSON {"bytes": {path: body bytes sent}, "requests": [[path, range]]}
  GET /_control/reset              clear the stats
  GET /_control/drop?path=P&after=N  the next GET of P sends N body bytes, then closes the connection
  GET /_control/norange?path=P     the server ignores Range for P (answers 200 with the whole file)
  GET /_control/rate?bps=N         send at most N body bytes per second per request (0 = no limit)

Usage: range_http_server.py --root DIR [--bind 127.0.0.1] [--port 8000]
"""
import argparse
import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit


class State(object):
    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.lock = threading.Lock()
        self.bytes = {}
        self.requests = []
        self.drops = {}
        self.norange = set()
        self.rate = 0

    def reset(self):
        with self.lock:
            self.bytes.clear()
            del self.requests[:]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None  # set by make_server

    def log_message(self, fmt, *args):  # quiet
        pass

    def _json(self, obj, code=200):
        body = (json.dumps(obj) + "\n").encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        st = self.state
        url = urlsplit(self.path)
        q = dict((k, v[0]) for k, v in parse_qs(url.query).items())
        if url.path == "/_stats":
            with st.lock:
                return self._json({"bytes": dict(st.bytes), "requests": list(st.requests)})
        if url.path == "/_control/reset":
            st.reset()
            return self._json({"ok": True})
        if url.path == "/_control/drop":
            with st.lock:
                st.drops[q["path"]] = int(q["after"])
            return self._json({"ok": True})
        if url.path == "/_control/rate":
            with st.lock:
                st.rate = int(q["bps"])
            return self._json({"ok": True})
        if url.path == "/_control/norange":
            with st.lock:
                st.norange.add(q["path"])
            return self._json({"ok": True})
        rel = unquote(url.path).lstrip("/")
        full = os.path.abspath(os.path.join(st.root, rel))
        if not full.startswith(st.root + os.sep) or not os.path.isfile(full):
            return self._json({"error": "not found"}, 404)
        size = os.path.getsize(full)
        rng = self.headers.get("Range")
        with st.lock:
            st.requests.append([rel, rng])
            drop = st.drops.pop(rel, None)
            ignore_range = rel in st.norange
            rate = st.rate
        start, end = 0, size - 1
        m = re.match(r"bytes=(\d+)-(\d*)$", rng or "")
        if m and not ignore_range:
            start = int(m.group(1))
            if m.group(2):
                end = min(int(m.group(2)), size - 1)
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % size)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        else:
            self.send_response(200)
        length = end - start + 1
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        limit = length if drop is None else min(drop, length)
        sent = 0
        began = time.monotonic()
        with open(full, "rb") as f:
            f.seek(start)
            while sent < limit:
                b = f.read(min(1 << 18, limit - sent))
                if not b:
                    break
                # Counted before the write: a client that has read these bytes (and a test that
                # asks right after it) finds them counted; counted after, they raced the client.
                with st.lock:
                    st.bytes[rel] = st.bytes.get(rel, 0) + len(b)
                self.wfile.write(b)
                sent += len(b)
                if rate:
                    ahead = sent / rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)
        if drop is not None:
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)


def make_server(root, bind="127.0.0.1", port=0):
    state = State(root)
    handler = type("BoundHandler", (Handler,), {"state": state})
    server = ThreadingHTTPServer((bind, port), handler)
    server.daemon_threads = True
    server.state = state
    return server


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    a = ap.parse_args()
    make_server(a.root, a.bind, a.port).serve_forever()


if __name__ == "__main__":
    main()
