#!/usr/bin/env python3
"""http_malformed.py: the integration.http_malformed and integration.http_sec
ctests. Raw sockets (Python's own socket and ssl modules, no HTTP library that
would tidy a request up) against a real dspark-edge serving HTTP, behind a
real mosquitto.

malformed: what a broken or hostile client sends: a body over [limits]
max_payload (declared, and sent chunked without a length), bad JSON, JSON that
is not an object, bad UTF-8 inside a string, a NUL, 10,000 headers, a
64 KiB header line, a request line of garbage, a slowloris client that sends
a header a second and one that never finishes its body. Each is answered with
a 4xx or closed, within its bound; a normal request is answered (200) right
after each, and the node's log holds no sanitizer report.

sec: the node with API keys and TLS (a throwaway certificate made with
openssl): no key 401, a wrong key 401, a key over its quota 429 with
Retry-After, a good key 200 (its "high" requests counted as low, its tier
cap, in /metrics), plain HTTP to the TLS port
gets no answer; the official openai npm client (tests/http/keys.test.js) over
HTTPS: a wrong apiKey AuthenticationError, models, a completion and a stream
with its key, then RateLimitError past the key's quota; `dspark-edge --check`
refuses 0.0.0.0 without keys and TLS
(naming insecure = true), takes it with both or with insecure = true, and
refuses a keys file readable by others (chmod 600), a TLS key readable by the
group, a certificate without its key, and a key file that is not a key.

Usage: http_malformed.py malformed|sec BUILD_DIR SOURCE_DIR MODELS_DIR
"""
import json
import os
import select
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time

BODY_CAP = 65536          # [limits] max_payload of the node under test: its HTTP body cap
TIMEOUT_S = 3             # [http] idle_timeout_s of the node under test
PER_IP = 8                # [http] max_connections_per_ip of the node under test


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise SystemExit(f"http: timed out after {timeout} s waiting for {what}")


class Node:
    """mosquitto + dspark-edge with an [http] section, in a temp folder."""

    def __init__(self, build, models, http_extra, name):
        self.work = tempfile.mkdtemp(prefix=f"dspark-http-{name}-")
        self.build, self.models = build, models
        self.mqtt_port, self.http_port = free_port(), free_port()
        conf = os.path.join(self.work, "mosquitto.conf")
        with open(conf, "w") as f:
            f.write(f"listener {self.mqtt_port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        self.broker = subprocess.Popen(["mosquitto", "-c", conf], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        self.edge = None
        self.ini = os.path.join(self.work, "edge.ini")
        with open(self.ini, "w") as f:
            f.write(f"[node]\nname = edge-h\n[mqtt]\nuri = tcp://127.0.0.1:{self.mqtt_port}\n"
                    f"[limits]\nmax_payload = {BODY_CAP}\n"
                    f"[http]\nlisten = 127.0.0.1:{self.http_port}\nidle_timeout_s = {TIMEOUT_S}\n"
                    f"max_connections_per_ip = {PER_IP}\n{http_extra}"
                    f"[model stories]\npath = {models}/stories260K.gguf\nprecision = int8\nctx = 256\n")

    def start(self, tls_ctx=None):
        wait_until(lambda: port_open(self.mqtt_port), 20, "mosquitto")
        self.log_path = os.path.join(self.work, "edge.log")
        # From another folder: relative paths in the config are its folder's.
        self.edge = subprocess.Popen([os.path.abspath(os.path.join(self.build, "edge-agent", "dspark-edge")), "-c",
                                      self.ini], stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT, cwd="/")

        def healthy():
            if self.edge.poll() is not None:
                raise SystemExit(f"http: dspark-edge exited {self.edge.returncode}:\n{self.log()}")
            try:
                st, _, _ = request(self.http_port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", tls_ctx, timeout=2)
                return st == 200
            except OSError:
                return False
        wait_until(healthy, 60, "the node's /health to say 200")

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        status = None
        if self.edge:
            self.edge.terminate()
            try:
                status = self.edge.wait(60)
            except subprocess.TimeoutExpired:
                self.edge.kill()
                status = self.edge.wait()
        # mosquitto 2.0 sets its run flag after installing its SIGTERM handler:
        # a SIGTERM in between (a --check case stops it at once) is lost.
        self.broker.terminate()
        try:
            self.broker.wait(10)
        except subprocess.TimeoutExpired:
            self.broker.kill()
            self.broker.wait()
        return status

    def cleanup(self):
        if not os.environ.get("DS_TEST_KEEP"):
            shutil.rmtree(self.work, ignore_errors=True)
        else:
            print(f"kept {self.work} (DS_TEST_KEEP)")


def port_open(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def connect(port, tls_ctx, timeout):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if tls_ctx:
        s = tls_ctx.wrap_socket(s, server_hostname="localhost")
    return s


def read_response(s):
    """(status, headers dict (lowercase), body) of one response; status 0 when
    the server closed without answering."""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            chunk = b""
        if not chunk:
            return 0, {}, data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(body) < n:
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        while not body.endswith(b"0\r\n\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            body += chunk
    return status, headers, body


def request(port, raw, tls_ctx=None, timeout=10):
    with connect(port, tls_ctx, timeout) as s:
        s.sendall(raw)
        return read_response(s)


def post(path, body, headers=()):
    extra = "".join(f"{h}\r\n" for h in headers)
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n").encode() + body


GOOD = json.dumps({"model": "stories", "prompt": "The dog", "max_tokens": 1}).encode()


def normal_ok(port, tls_ctx=None, headers=()):
    st, _, body = request(port, post("/v1/completions", GOOD, headers), tls_ctx, timeout=30)
    return st == 200 and b'"choices"' in body, st, body[:200]


def malformed(build, source, models):
    node = Node(build, models, "", "malformed")
    wrong, checked = [], 0
    try:
        node.start()
        port = node.http_port

        def after(kind):
            ok, st, body = normal_ok(port)
            if not ok:
                wrong.append(f"{kind}: the normal request after it got {st}: {body!r}")

        def answered_4xx(kind, raw, want=None, timeout=10):
            nonlocal checked
            checked += 1
            try:
                st, _, body = request(port, raw, timeout=timeout)
            except (ConnectionResetError, BrokenPipeError):
                st, body = 0, b""
            except socket.timeout:
                wrong.append(f"{kind}: no answer and not closed within {timeout} s")
                return
            if st == 0:
                pass                                      # closed: allowed
            elif not 400 <= st < 500 or (want and st not in want):
                wrong.append(f"{kind}: status {st} (want {want or '4xx'}): {body[:200]!r}")
            after(kind)

        big = b'{"model":"stories","prompt":"' + b"a" * (BODY_CAP + 10) + b'"}'
        answered_4xx("body over max_body", post("/v1/completions", big), {413})
        chunked = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                   b"Content-Type: application/json\r\nConnection: close\r\n\r\n")
        for i in range(0, len(big), 8192):
            part = big[i:i + 8192]
            chunked += f"{len(part):x}\r\n".encode() + part + b"\r\n"
        answered_4xx("chunked body over max_body", chunked + b"0\r\n\r\n", {413})
        answered_4xx("declared length over max_body", (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {50 * 1024 * 1024}\r\n"
            "Connection: close\r\n\r\n").encode() + b"{", {413})
        for kind, body in [
            ("bad JSON", b'{"model":"stories","prompt":'),
            ("not an object", b'["model","stories"]'),
            ("empty body", b""),
            ("bad UTF-8", b'{"model":"stories","prompt":"\xff\xfe bad"}'),
            ("overlong UTF-8", b'{"model":"stories","prompt":"\xc0\xaf"}'),
            ("surrogate UTF-8", b'{"model":"stories","prompt":"\xed\xa0\x80"}'),
            ("NUL in body", b'{"model":"stories","prompt":"a\x00b"}'),
            ("deep nesting", b'{"model":"stories","prompt":"a","x":' + b"[" * 5000 + b"]" * 5000 + b"}"),
            ("wrong types", b'{"model":"stories","prompt":"a","max_tokens":"many"}'),
            ("unknown model", b'{"model":"nope","prompt":"a"}'),
            ("messages not a list", b'{"model":"stories","messages":"hi"}'),
        ]:
            path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
            answered_4xx(kind, post(path, body))
        headers = b"".join(b"X-H%d: v\r\n" % i for i in range(10000))
        answered_4xx("10,000 headers", b"GET /health HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        answered_4xx("a 64 KiB header", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n")
        answered_4xx("a garbage request line", b"\x16\x03\x01 garbage \xff\r\n\r\n")
        answered_4xx("no HTTP version", b"GET /health\r\n\r\n")
        answered_4xx("a bad Content-Length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")

        # Slowloris: one header line a second never ends its headers; the
        # node closes it by timeout_s (the line rate resets no timer of ours:
        # libmicrohttpd's timeout is idle time, so the client is cut when it
        # pauses longer than timeout_s, and a request's whole head is bounded
        # by the connection memory).
        for kind, opening, pause in [("slowloris headers", b"GET /health HTTP/1.1\r\nHost: x\r\n", b"X-A: b\r\n"),
                                     ("slow body", post("/v1/completions", GOOD)[:-len(GOOD)] + GOOD[:5], None)]:
            checked += 1
            s = connect(port, None, TIMEOUT_S * 4)
            s.sendall(opening)
            t0 = time.monotonic()
            closed = False
            try:
                if pause:
                    for _ in range(2):                  # keep trickling within the timeout...
                        time.sleep(1)
                        s.sendall(pause)
                # ...then go quiet: the node must close it by timeout_s.
                while time.monotonic() - t0 < TIMEOUT_S * 4:
                    if s.recv(4096) == b"":
                        closed = True
                        break
            except (ConnectionResetError, BrokenPipeError):
                closed = True
            except socket.timeout:
                pass
            took = time.monotonic() - t0
            s.close()
            if not closed:
                wrong.append(f"{kind}: still open after {took:.1f} s (timeout_s = {TIMEOUT_S})")
            after(kind)
        # Many half-open connections from one address (127.0.0.2) hold at most
        # [http] max_connections_per_ip; the rest are closed at once, and a
        # normal client (127.0.0.1) is served meanwhile.
        checked += 1
        socks = []
        for _ in range(PER_IP + 8):
            s = socket.socket()
            s.settimeout(5)
            s.bind(("127.0.0.2", 0))
            s.connect(("127.0.0.1", port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        # Those past the limit are closed at once; the others stay open (well
        # within idle_timeout_s): watched for 1 s.
        closed = set()
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            ready, _, _ = select.select([x for x in socks if x not in closed], [], [], 0.1)
            for x in ready:
                try:
                    if x.recv(1) == b"":
                        closed.add(x)
                except OSError:
                    closed.add(x)
        refused = len(closed)
        after(f"{PER_IP + 8} half-open connections from one address")
        if refused != 8:
            wrong.append(f"{PER_IP + 8} half-open connections from one address: {refused} closed at once, "
                         f"want 8 (max_connections_per_ip = {PER_IP})")
        for s in socks:
            s.close()

        status = node.stop()
        log = node.log()
        if "Sanitizer" in log or "runtime error" in log:
            wrong.append("sanitizer report in the node's log")
        if status != 0:
            wrong.append(f"dspark-edge exited {status}")
        print(f"http_malformed: {checked} malformed kinds sent; {len(wrong)} wrong")
        for w in wrong:
            print("  " + w)
        if wrong:
            print("\n".join(log.splitlines()[-20:]))
        return 1 if wrong else 0
    finally:
        node.stop()
        node.cleanup()


def make_cert(work):
    cert, key = os.path.join(work, "http.crt"), os.path.join(work, "http.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.chmod(key, 0o600)
    return cert, key


def check(build, ini):
    p = subprocess.run([os.path.join(build, "edge-agent", "dspark-edge"), "-c", ini, "--check"],
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def sec(build, source, models):
    wrong = []
    tmp = tempfile.mkdtemp(prefix="dspark-http-pki-")
    try:
        cert, key = make_cert(tmp)
        keys = os.path.join(tmp, "keys")
        gen = subprocess.run([os.path.join(build, "shared", "dspark"), "http-key", "--client", "app-1", "--tier", "low",
                              "--quota", "3/min"], capture_output=True, text=True, check=True)
        good_key = gen.stdout.split("key: ", 1)[1].split()[0]
        line = [ln for ln in gen.stdout.splitlines() if ln.startswith("blake2b:")][0]
        # A second key, for the openai npm client: quota 6/min.
        gen2 = subprocess.run([os.path.join(build, "shared", "dspark"), "http-key", "--client", "npm-client",
                               "--quota", "6/min"], capture_output=True, text=True, check=True)
        npm_key = gen2.stdout.split("key: ", 1)[1].split()[0]
        line2 = [ln for ln in gen2.stdout.splitlines() if ln.startswith("blake2b:")][0]
        with open(keys, "w") as f:
            f.write("# test keys\n" + line + "\n" + line2 + "\n")
        os.chmod(keys, 0o600)

        # --check: the listen rule and the files.
        def check_case(what, http, want_ok, says=None):
            node = Node(build, models, http, "check")
            try:
                with open(node.ini) as f:
                    text = f.read()
                with open(node.ini, "w") as f:
                    f.write(text.replace(f"listen = 127.0.0.1:{node.http_port}", f"listen = 0.0.0.0:{node.http_port}"))
                rc, out = check(build, node.ini)
                if (rc == 0) != want_ok or (says and says not in out):
                    wrong.append(f"--check {what}: exit {rc}, want {'0' if want_ok else 'non-zero'}"
                                 f"{' saying ' + repr(says) if says else ''}: {out.strip()[-400:]}")
            finally:
                node.stop()
                node.cleanup()
        check_case("0.0.0.0 without keys or TLS", "", False, "insecure = true")
        check_case("0.0.0.0 with keys only", f"keys_file = {keys}\n", False, "without TLS")
        check_case("0.0.0.0 with keys and TLS", f"keys_file = {keys}\ncert_file = {cert}\nkey_file = {key}\n", True)
        check_case("0.0.0.0 with insecure = true", "insecure = true\n", True)
        os.chmod(keys, 0o644)
        check_case("a keys file of mode 0644", f"keys_file = {keys}\ncert_file = {cert}\nkey_file = {key}\n",
                   False, "chmod 600")
        os.chmod(keys, 0o600)
        os.chmod(key, 0o640)
        check_case("a TLS key of mode 0640", f"keys_file = {keys}\ncert_file = {cert}\nkey_file = {key}\n",
                   False, "chmod 600")
        os.chmod(key, 0o600)
        check_case("a certificate without its key", f"keys_file = {keys}\ncert_file = {cert}\n", False,
                   "cert_file is set without key_file")
        check_case("a certificate as its own key", f"keys_file = {keys}\ncert_file = {cert}\nkey_file = {cert}\n",
                   False, "key_file")

        # Serving: TLS and keys on loopback.
        # The keys file beside the config, named relative to it.
        node = Node(build, models, f"keys_file = http.keys\ncert_file = {cert}\nkey_file = {key}\n", "sec")
        shutil.copy(keys, os.path.join(node.work, "http.keys"))
        os.chmod(os.path.join(node.work, "http.keys"), 0o600)
        ctx = ssl.create_default_context(cafile=cert)
        try:
            node.start(ctx)
            port = node.http_port
            st, _, body = request(port, post("/v1/completions", GOOD), ctx)
            if st != 401:
                wrong.append(f"no key: {st} {body[:200]!r}, want 401")
            st, _, body = request(port, post("/v1/completions", GOOD, ["Authorization: Bearer dsk-wrong-key-000000000"]), ctx)
            if st != 401:
                wrong.append(f"wrong key: {st} {body[:200]!r}, want 401")
            auth = [f"Authorization: Bearer {good_key}"]
            high = json.dumps({"model": "stories", "prompt": "The dog", "max_tokens": 1,
                               "dspark": {"priority": "high"}}).encode()
            for i in range(3):
                st, _, body = request(port, post("/v1/completions", high, auth), ctx, timeout=30)
                if st != 200 or b'"choices"' not in body:
                    wrong.append(f"good key, request {i + 1} of its quota of 3: {st} {body[:200]!r}")
            # The key's tier cap (low): its "high" requests ran as low.
            st, _, body = request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", ctx)
            text = body.decode("utf-8", "replace")
            if 'dspark_requests_total{model="stories",tier="low",outcome="ok"} 3' not in text or \
                    'tier="high",outcome="ok"' in text:
                wrong.append("the key's tier cap: /metrics does not count its 3 high requests as low: " +
                             " ".join(ln for ln in text.splitlines() if ln.startswith("dspark_requests_total")))
            st, hd, body = request(port, post("/v1/completions", GOOD, auth), ctx)
            if st != 429 or not hd.get("retry-after", "").isdigit():
                wrong.append(f"over quota: {st} Retry-After {hd.get('retry-after')!r} {body[:200]!r}, want 429 + Retry-After")
            # Plain HTTP to the TLS port: no answer in HTTP.
            try:
                st, _, _ = request(port, post("/v1/completions", GOOD, auth), None, timeout=5)
            except (ConnectionResetError, socket.timeout):
                st = 0
            if st != 0:
                wrong.append(f"plain HTTP to the TLS port answered {st}")
            # The official openai npm client over HTTPS with its own key.
            mods = os.path.join(source, "tests", "http", "node_modules", "openai", "package.json")
            node_bin = shutil.which("node") or shutil.which("nodejs")
            if not node_bin or not os.path.exists(mods):
                wrong.append(f"the openai npm client: {'node' if not node_bin else mods} missing "
                             "(run `npm ci` in tests/http; deploy/test.sh does)")
            else:
                env = dict(os.environ, NODE_EXTRA_CA_CERTS=cert)
                p = subprocess.run([node_bin, os.path.join(source, "tests", "http", "keys.test.js"),
                                    f"https://localhost:{port}/v1", "stories", npm_key, "6"],
                                   capture_output=True, text=True, timeout=120, env=env)
                if p.returncode != 0 or "PASS" not in p.stdout:
                    wrong.append(f"the openai npm client: exit {p.returncode}: {(p.stdout + p.stderr)[-800:]}")
            status = node.stop()
            log = node.log()
            if "Sanitizer" in log or "runtime error" in log:
                wrong.append("sanitizer report in the node's log")
            if good_key in log or npm_key in log:
                wrong.append("the API key appears in the node's log")
            if status != 0:
                wrong.append(f"dspark-edge exited {status}")
        finally:
            node.stop()
            node.cleanup()
        print(f"http_sec: {len(wrong)} wrong")
        for w in wrong:
            print("  " + w)
        return 1 if wrong else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    mode, build, source, models = sys.argv[1:5]
    return {"malformed": malformed, "sec": sec}[mode](build, source, models)


if __name__ == "__main__":
    sys.exit(main())
