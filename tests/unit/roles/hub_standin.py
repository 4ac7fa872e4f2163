# Copyright: sparkops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A STAND-IN for the Hugging Face Hub's HTTP API (the Hub is not reachable in tests), and a
STAND-IN huggingface_hub package that downloads from it.

The server answers what the checkpoint role asks of the Hub, in the Hub's formats:
  GET /api/models/<repo>/tree/<rev>?recursive=true   the file list, 2 entries a page, `Link: <..>; rel="next"`
                                                      (LFS files carry lfs.oid = sha256 and lfs.size)
  GET /<repo>/resolve/<rev>/<path>                   the file's bytes (optionally corrupted, optionally slow)
and refuses (401) a request without `Authorization: Bearer <token>`.
"""
import hashlib
import json
import os
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REPO = "sparkops-test/tiny"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def tiny_repo():
    """{path: (bytes, is_lfs)}: a config kept in git and two LFS weight files (one in a folder)."""
    weights = bytes((i * 7919) % 251 for i in range(96 * 1024))
    return {
        "config.json": (b'{"architectures": ["LlamaForCausalLM"]}\n', False),
        "model.safetensors": (weights, True),
        "extra/adapter.safetensors": (weights[:4096], True),
    }


class Hub(object):
    def __init__(self, token, files=None):
        self.token = token
        self.files = files or tiny_repo()
        self.served = {}          # path -> bytes actually served (a corruption goes here)
        self.slow_s = 0.0         # pause before serving each file (keeps the download process alive)
        self.auth_seen = []       # (path, Authorization header) of every request
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                hub.auth_seen.append((url.path, self.headers.get("Authorization")))
                if self.headers.get("Authorization") != "Bearer " + hub.token:
                    return self.reply(401, b'{"error": "Invalid credentials"}')
                tree = "/api/models/%s/tree/%s" % (REPO, REVISION)
                resolve = "/%s/resolve/%s/" % (REPO, REVISION)
                if url.path == tree:
                    return self.tree(int(dict(urllib.parse.parse_qsl(url.query)).get("cursor", 0)))
                if url.path.startswith(resolve):
                    rel = urllib.parse.unquote(url.path[len(resolve):])
                    if rel in hub.files:
                        if hub.slow_s:
                            threading.Event().wait(hub.slow_s)
                        return self.reply(200, hub.served.get(rel, hub.files[rel][0]), "application/octet-stream")
                return self.reply(404, b'{"error": "not found"}')

            def tree(self, cursor):
                entries = [{"type": "directory", "oid": "0" * 40, "size": 0, "path": "extra"}]
                for path, (data, lfs) in sorted(hub.files.items()):
                    entry = {"type": "file", "oid": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest(),
                             "size": len(data), "path": path}
                    if lfs:
                        entry.update(size=len(data), lfs={"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134})
                    entries.append(entry)
                page = entries[cursor:cursor + 2]
                headers = {}
                if cursor + 2 < len(entries):
                    headers["Link"] = '<http://%s:%d/api/models/%s/tree/%s?recursive=true&cursor=%d>; rel="next"' % (
                        self.server.server_address[0], self.server.server_address[1], REPO, REVISION, cursor + 2)
                return self.reply(200, json.dumps(page).encode(), "application/json", headers)

            def reply(self, code, body, ctype="application/json", headers=None):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def sha256(self, path):
        return hashlib.sha256(self.files[path][0]).hexdigest()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


# The stand-in huggingface_hub: snapshot_download fetches every listed file from the stand-in Hub
# with the token, as the real library does (the real one also resumes and caches; not needed here).
STANDIN_HF_HUB = '''"""STAND-IN for huggingface_hub (tests only): snapshot_download against a stand-in Hub."""
import json, os, re, urllib.request

__version__ = "0.36.2"


def snapshot_download(repo_id, revision, local_dir, allow_patterns=None, token=None, endpoint=None):
    hdr = {"Authorization": "Bearer " + token} if token else {}
    url, paths = "%s/api/models/%s/tree/%s?recursive=true" % (endpoint, repo_id, revision), []
    while url:
        with urllib.request.urlopen(urllib.request.Request(url, headers=hdr)) as r:
            paths += [e["path"] for e in json.loads(r.read()) if e["type"] == "file"]
            m = re.search(r'<([^>]+)>; rel="next"', r.headers.get("Link") or "")
        url = m.group(1) if m else None
    for p in paths:
        dest = os.path.join(local_dir, p)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with urllib.request.urlopen(urllib.request.Request("%s/%s/resolve/%s/%s" % (endpoint, repo_id, revision, p), headers=hdr)) as r:
            data = r.read()
        with open(dest, "wb") as f:
            f.write(data)
    return local_dir
'''


def make_standin_venv(venv, python):
    """A venv whose huggingface_hub==0.36.2 is the stand-in above (so the role's pip task finds the
    pinned version installed and downloads nothing)."""
    import glob
    import subprocess
    # --without-pip and links to this Python's own pip (package and dist-info) instead of ensurepip
    # copying a fresh pip in (several seconds on a busy machine): the venv's pip is a real pip, and
    # the venv sees no other package of this Python.
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = glob.glob(os.path.join(str(venv), "lib", "python*", "site-packages"))[0]
    pip_src = subprocess.run([python, "-c", "import os, pip; print(os.path.dirname(pip.__file__))"], check=True,
                             capture_output=True, text=True).stdout.strip()
    for entry in [pip_src] + glob.glob(os.path.join(os.path.dirname(pip_src), "pip-*.dist-info")):
        os.symlink(entry, os.path.join(site, os.path.basename(entry)))
    for name in ("pip", "pip3"):
        script = os.path.join(str(venv), "bin", name)
        with open(script, "w") as f:
            f.write("#!%s\nimport sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n" % os.path.join(str(venv), "bin", "python"))
        os.chmod(script, 0o755)
    os.makedirs(os.path.join(site, "huggingface_hub"))
    with open(os.path.join(site, "huggingface_hub", "__init__.py"), "w") as f:
        f.write(STANDIN_HF_HUB)
    dist = os.path.join(site, "huggingface_hub-0.36.2.dist-info")
    os.makedirs(dist)
    with open(os.path.join(dist, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: huggingface_hub\nVersion: 0.36.2\nSummary: stand-in (tests only)\n")
    with open(os.path.join(dist, "INSTALLER"), "w") as f:
        f.write("sparkops-tests\n")
    with open(os.path.join(dist, "RECORD"), "w") as f:
        f.write("huggingface_hub/__init__.py,,\n")
