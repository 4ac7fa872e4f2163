"""A stand-in Docker Engine API on a unix socket (DOCKER_HOST=unix://PATH), for the unit tests of the
roles that build and inspect images with community.docker (docker_image, docker_image_info): no
engine, no base image, no GPU needed. It answers what those modules ask:

- GET /version; GET /images/json (filter reference=REPO), GET /images/ID-or-NAME/json;
- POST /build: the Dockerfile is read from the context tar; the new image has the labels of its FROM
  image (a build argument in FROM is substituted), the Dockerfile's `LABEL k="v"` lines and the
  build's labels; it is tagged t. An error of the FROM line (an image it does not have where pull is
  false) is a build error, as the engine's;
- DELETE /images/NAME: the tag is removed (the image stays, as under a child image).

`Engine(path)`, a context manager serving in a thread of the test process.

write_docker_cli(bin_dir): a stand-in docker CLI for what the roles run with it: `version` and
`info` (an engine that answers, runtime runc), `ps` (no container), and `run ... --entrypoint X IMAGE`
(the runtime_image role's version probe): it prints the answer FAKE_PROBES (a JSON file) gives for
IMAGE's repository. Every call is logged to FAKE_LOG_DIR/docker.log as JSON {args, stdin sha256}. `engine.calls`: every request, (method, path without /v1.41,
query); `engine.builds`: each build's query; `engine.images`: {id: inspect}; `engine.tags`: {name: id}.
"""
import hashlib
import io
import json
import os
import re
import socketserver
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlsplit

API = "1.41"

DOCKER_CLI = """#!%s
import hashlib, json, os, sys
args = sys.argv[1:]
stdin = sys.stdin.buffer.read() if args[:1] == ["run"] else b""
with open(os.path.join(os.environ["FAKE_LOG_DIR"], "docker.log"), "a") as log:
    log.write(json.dumps({"args": args, "stdin": hashlib.sha256(stdin).hexdigest()}) + "\\n")
if args[:1] == ["version"]:
    print("20.10.24-standin")
elif args[:1] == ["info"]:
    print(json.dumps({"runc": {"path": "runc"}}))
elif args[:1] == ["run"]:
    image = args[args.index("--entrypoint") + 2]
    with open(os.environ["FAKE_PROBES"]) as handle:
        print(json.dumps(json.load(handle)[image.rsplit(":", 1)[0]]))
elif args[:1] != ["ps"]:
    sys.exit("stand-in docker: %%s is not played" %% args[:1])
""" % sys.executable


def write_docker_cli(bin_dir):
    path = os.path.join(str(bin_dir), "docker")
    with open(path, "w") as handle:
        handle.write(DOCKER_CLI)
    os.chmod(path, 0o755)
    return path


class Engine(object):
    def __init__(self, socket_path):
        self.path = str(socket_path)
        self.images, self.tags, self.calls, self.builds = {}, {}, [], []
        self.lock = threading.Lock()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *_args):
                pass

            def _body(self):
                if "chunked" in (self.headers.get("Transfer-Encoding") or ""):
                    data = b""
                    while True:
                        size = int(self.rfile.readline().strip() or b"0", 16)
                        if size == 0:
                            self.rfile.readline()
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _answer(self, status, doc):
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self, method):
                url = urlsplit(self.path)
                path = re.sub(r"^/v[0-9.]+", "", url.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                body = self._body() if method == "POST" else b""
                with engine.lock:
                    engine.calls.append((method, path, query))
                    status, doc = engine.answer(method, path, query, body)
                self._answer(status, doc)

            def do_GET(self):   # noqa: N802 - BaseHTTPRequestHandler's names
                self._handle("GET")

            def do_POST(self):   # noqa: N802
                self._handle("POST")

            def do_DELETE(self):   # noqa: N802
                self._handle("DELETE")

        self.server = socketserver.ThreadingUnixStreamServer(self.path, Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *_exc):
        self.server.shutdown()
        self.server.server_close()

    # --- the engine's side -------------------------------------------------------------------
    def _lookup(self, name):
        """The inspect output of a tag or an id, or None."""
        if name in self.images:
            return self.images[name]
        if ":" not in name.rsplit("/", 1)[-1]:
            name += ":latest"
        if name in self.tags:
            return self.images[self.tags[name]]
        return None

    def _add(self, tag, labels, parent):
        digest = "sha256:" + hashlib.sha256(json.dumps([tag, labels, parent], sort_keys=True).encode()).hexdigest()
        old = self.tags.get(tag)
        if old and old != digest:
            self.images[old]["RepoTags"].remove(tag)
        image = self.images.setdefault(digest, {"Id": digest, "RepoTags": [], "Parent": parent,
                                                "Config": {"Labels": labels}})
        if tag not in image["RepoTags"]:
            image["RepoTags"].append(tag)
        self.tags[tag] = digest
        return image

    def answer(self, method, path, query, body):
        if method == "GET" and path in ("/version", "/_ping"):
            return 200, {"ApiVersion": API, "MinAPIVersion": "1.12", "Version": "20.10.24-standin", "Os": "linux"}
        if method == "GET" and path == "/images/json":
            refs = json.loads(query.get("filters") or "{}").get("reference") or []
            ref = (list(refs) if isinstance(refs, list) else list(refs.keys()))[0] if refs else ""
            return 200, [{"Id": i["Id"], "RepoTags": list(i["RepoTags"])} for i in self.images.values()
                         if any(t.rsplit(":", 1)[0] == ref for t in i["RepoTags"])]
        found = re.match(r"^/images/(.+)/json$", path)
        if method == "GET" and found:
            image = self._lookup(unquote(found.group(1)))
            return (200, image) if image else (404, {"message": "No such image: %s" % unquote(found.group(1))})
        if method == "POST" and path == "/build":
            return self._build(query, body)
        found = re.match(r"^/images/(.+)$", path)
        if method == "DELETE" and found:
            name = unquote(found.group(1))
            if name not in self.tags:
                return 404, {"message": "No such image: %s" % name}
            self.images[self.tags.pop(name)]["RepoTags"].remove(name)
            return 200, [{"Untagged": name}]
        return 404, {"message": "stand-in engine: %s %s is not served" % (method, path)}

    def _build(self, query, body):
        self.builds.append(query)
        name = query.get("dockerfile") or "Dockerfile"
        with tarfile.open(fileobj=io.BytesIO(body)) as context:
            dockerfile = context.extractfile(name).read().decode()
        args = json.loads(query.get("buildargs") or "{}")
        base, labels = None, {}
        for line in dockerfile.splitlines():
            words = line.split(None, 1)
            if not words or words[0].startswith("#"):
                continue
            if words[0] == "FROM":
                ref = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), words[1].strip())
                base = self._lookup(ref)
                if base is None and query.get("pull") in ("0", "False", "false", None):
                    return 200, {"error": "pull access denied for %s" % ref,
                                 "errorDetail": {"message": "pull access denied for %s" % ref}}
                labels = dict((base or {}).get("Config", {}).get("Labels") or {})
            elif words[0] == "LABEL":
                for key, value in re.findall(r'([\w.-]+)="?([^"\s]*)"?', words[1]):
                    labels[key] = value
        labels.update(json.loads(query.get("labels") or "{}"))
        image = self._add(query["t"], labels, parent=(base or {}).get("Id", ""))
        return 200, {"stream": "Successfully built %s\n" % image["Id"][7:19]}
