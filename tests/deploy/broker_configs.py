#!/usr/bin/env python3
"""deploy.broker_configs — the shipped field broker configs, installed as their
headers say (issue N4): deploy/mosquitto/edge.conf and center.conf with a lab PKI
(deploy/pki/mkpki.sh), a password file and the ACL (mkacl.sh); only the paths and
port numbers are rewritten (to a scratch folder and free ports) and a "user" line
added (the broker runs as the test's user), every other line runs as shipped in a
real mosquitto.

Checks, for each config:
  - ss: every socket mosquitto listens on is either bound to loopback or speaks
    TLS (a TLS handshake against the lab CA completes on it); a plain MQTT
    CONNECT gets no CONNACK on any of them;
  - an anonymous client is refused on every listener: TLS + CONNECT without
    credentials gets CONNACK "not authorised", the mutual-TLS listener ends the
    session of a client without a certificate (at the handshake, or with TLS 1.3
    just after it, before any CONNACK), wss:// (WebSocket upgrade + CONNECT)
    gets "not authorised" too;
  - positive controls: the ops identity with its password is accepted over TLS and
    over wss://, and edge-1 by its certificate over mutual TLS.
And edge-lab.conf says LAB in its name and its header (the anonymous one).

usage: broker_configs.py SOURCE_DIR   (exit 77: mosquitto, openssl or ss missing)
"""
import base64
import os
import pwd
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time

SRC = sys.argv[1]
for tool in ("mosquitto", "mosquitto_passwd", "openssl", "ss"):
    if not shutil.which(tool):
        print(f"{tool} missing: skipped")
        sys.exit(77)

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def connect_packet(user=None, password=None):
    flags = 0x02 | (0x80 if user else 0) | (0x40 if password else 0)
    vh = b"\x00\x04MQTT\x04" + bytes([flags]) + b"\x00\x3c"
    pl = b""
    for f in ("probe-%d" % os.getpid(), user, password):
        if f is not None:
            b = f.encode()
            pl += len(b).to_bytes(2, "big") + b
    body = vh + pl
    return bytes([0x10, len(body)]) + body


def connack(data):
    """CONNACK return code in data, or None when data holds none."""
    if len(data) >= 4 and data[0] == 0x20 and data[1] == 0x02:
        return data[3]
    return None


def recv_some(s, n=64, timeout=3.0):
    s.settimeout(timeout)
    try:
        return s.recv(n)
    except (socket.timeout, OSError):
        return b""


def tls_ctx(ca, cert=None, key=None):
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def mqtt_tls(port, ca, user=None, password=None, cert=None, key=None):
    """CONNACK code over TLS; 'handshake' when TLS is refused; None without CONNACK."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s = tls_ctx(ca, cert, key).wrap_socket(raw)
        s.sendall(connect_packet(user, password))
        s.settimeout(3.0)
        try:
            data = s.recv(64)
        except socket.timeout:
            return None
        # TLS 1.3: a server that wants a client certificate ends the session
        # after the client's handshake is done, so the refusal comes here.
        return connack(data) if data else "closed"
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError, OSError):
        return "handshake"
    finally:
        raw.close()


def mqtt_plain(port):
    """CONNACK code for a plain-text CONNECT (None: no MQTT answer)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(connect_packet())
        return connack(recv_some(s))
    except OSError:
        return None
    finally:
        s.close()


def mqtt_wss(port, ca, user=None, password=None):
    """CONNACK code over wss:// (HTTP upgrade, one masked binary frame)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s = tls_ctx(ca).wrap_socket(raw)
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(("GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n")
                  .encode())
        head = b""
        while b"\r\n\r\n" not in head:
            part = recv_some(s, 1024)
            if not part:
                return None
            head += part
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            return None
        rest = head.split(b"\r\n\r\n", 1)[1]
        pkt = connect_packet(user, password)
        mask = os.urandom(4)
        s.sendall(bytes([0x82, 0x80 | len(pkt)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(pkt)))
        data = rest + recv_some(s)
        if len(data) >= 2 and data[0] & 0x0F == 2:
            return connack(data[2:2 + (data[1] & 0x7F)])
        return None
    except (ssl.SSLError, OSError):
        return "handshake"
    finally:
        raw.close()


def listening(pid):
    """[(addr, port)] of the TCP sockets process pid listens on (ss -ltnp)."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    socks = []
    for line in out.splitlines():
        if f"pid={pid}," not in line:
            continue
        local = line.split()[3]
        addr, port = local.rsplit(":", 1)
        socks.append((addr.strip("[]"), int(port)))
    return socks


def is_loopback(addr):
    return addr.startswith("127.") or addr == "::1"


# Debian's /etc/mosquitto/mosquitto.conf as the package ships it (used when this
# machine has none), and the keys it sets.
STOCK = """pid_file /run/mosquitto/mosquitto.pid
persistence true
persistence_location /var/lib/mosquitto/
log_dest file /var/log/mosquitto/mosquitto.log
include_dir /etc/mosquitto/conf.d
"""
STOCK_KEYS = ("pid_file", "persistence", "persistence_location", "log_dest")


def stock_main(store, dropins):
    """A copy of Debian's main mosquitto.conf with its paths moved into the scratch folder."""
    path = "/etc/mosquitto/mosquitto.conf"
    text = open(path).read() if os.path.exists(path) else STOCK
    text = re.sub(r"^pid_file .*$", "pid_file " + os.path.join(store, "mosquitto.pid"), text, flags=re.M)
    text = re.sub(r"^persistence_location .*$", "persistence_location " + store + "/", text, flags=re.M)
    text = re.sub(r"^log_dest .*$", "log_dest stderr", text, flags=re.M)
    text = re.sub(r"^include_dir .*$", "include_dir " + dropins, text, flags=re.M)
    return text


def run(conf_name, broker_cert, tmp, pki):
    print(f"--- {conf_name}")
    text = open(os.path.join(SRC, "deploy/mosquitto", conf_name)).read()
    ports = {}
    for p in sorted(set(re.findall(r"^listener (\d+)", text, re.M))):
        ports[int(p)] = free_port()
    for old, new in ports.items():
        text = re.sub(rf"^listener {old}\b", f"listener {new}", text, flags=re.M)
    text = text.replace("/etc/mosquitto/certs/", pki + "/")
    text = text.replace("/etc/mosquitto/dspark.passwd", os.path.join(tmp, "passwd"))
    text = text.replace("/etc/mosquitto/dspark.acl", os.path.join(tmp, "acl"))
    # A conf.d drop-in beside Debian's own main file: it must set nothing that file
    # sets (mosquitto exits 3 on a second persistence_location).
    for key in STOCK_KEYS:
        check(not re.search(rf"^{key}\b", text, re.M), f"{conf_name}: sets no {key} (Debian's mosquitto.conf does)")
    store = os.path.join(tmp, "store-" + conf_name)
    dropins = os.path.join(tmp, "conf.d-" + conf_name)
    os.makedirs(store)
    os.makedirs(dropins)
    # Run as this test's user (as tests/support/broker.c does): mosquitto started
    # as root would switch to the mosquitto user, which cannot read the scratch folder.
    text += "\nuser %s\n" % pwd.getpwuid(os.getuid()).pw_name
    check(not re.search(r"^allow_anonymous true", text, re.M), f"{conf_name}: no allow_anonymous true")
    open(os.path.join(dropins, conf_name), "w").write(text)
    conf = os.path.join(tmp, "mosquitto-" + conf_name)
    open(conf, "w").write(stock_main(store, dropins))
    log = open(os.path.join(tmp, conf_name + ".log"), "w")
    broker = subprocess.Popen(["mosquitto", "-c", conf], stdout=log, stderr=subprocess.STDOUT)
    try:
        want = set(ports.values())
        for _ in range(100):
            if want <= {p for _, p in listening(broker.pid)}:
                break
            time.sleep(0.05)
        socks = listening(broker.pid)
        print("ss:", ", ".join(f"{a}:{p}" for a, p in socks))
        check(want <= {p for _, p in socks}, f"{conf_name}: mosquitto listens on every configured port")
        ca = os.path.join(pki, "ca.crt")
        ws_ports = {ports[int(p)] for p in re.findall(r"^listener (\d+)\nprotocol websockets", open(
            os.path.join(SRC, "deploy/mosquitto", conf_name)).read(), re.M)}
        for addr, port in socks:
            if is_loopback(addr):
                continue
            # Not loopback: it must speak TLS (any client certificate aside).
            r = subprocess.run(["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-CAfile", ca,
                                "-verify_return_error", "-brief"], input="", capture_output=True, text=True,
                               timeout=20)
            tls = "Verification: OK" in r.stderr or "Verify return code: 0" in r.stdout
            check(tls, f"{conf_name}: {addr}:{port} speaks TLS (no plain-text listener off loopback)")
        for port in sorted(want):
            plain = mqtt_plain(port)
            check(plain is None, f"{conf_name}: port {port}: a plain-text CONNECT gets no CONNACK ({plain})")
            anon = mqtt_wss(port, ca) if port in ws_ports else mqtt_tls(port, ca)
            check(anon in (5, "handshake", "closed"), f"{conf_name}: port {port}: anonymous refused ({anon})")
        p_pw, p_mtls, p_ws = ports[8883], ports[8884], ports[9443]
        check(mqtt_tls(p_pw, ca, "ops", "pw-ops") == 0, f"{conf_name}: ops by password over TLS accepted")
        check(mqtt_wss(p_ws, ca, "ops", "pw-ops") == 0, f"{conf_name}: ops by password over wss:// accepted")
        check(mqtt_wss(p_ws, ca, "ops", "wrong") == 5, f"{conf_name}: a wrong password over wss:// refused")
        check(mqtt_tls(p_mtls, ca, cert=os.path.join(pki, "edge-1.crt"), key=os.path.join(pki, "edge-1.key")) == 0,
              f"{conf_name}: edge-1 by certificate over mutual TLS accepted")
    finally:
        broker.terminate()
        broker.wait(10)
        log.close()
        if failures:
            print(open(os.path.join(tmp, conf_name + ".log")).read()[-2000:])


def main():
    tmp = tempfile.mkdtemp(prefix="dspark-broker-configs-")
    try:
        pki = os.path.join(tmp, "pki")
        subprocess.run(["sh", os.path.join(SRC, "deploy/pki/mkpki.sh"), pki, "edge-1:edge", "center-1:center",
                        "ops:ops"], check=True, stdout=subprocess.DEVNULL)
        # center.conf names its certificate center.crt: the same lab broker certificate.
        shutil.copy(os.path.join(pki, "broker.crt"), os.path.join(pki, "center.crt"))
        shutil.copy(os.path.join(pki, "broker.key"), os.path.join(pki, "center.key"))
        acl = subprocess.run(["sh", os.path.join(SRC, "deploy/mosquitto/mkacl.sh"), "edge-1:edge", "center-1:center",
                              "ops:ops"], check=True, capture_output=True, text=True).stdout
        open(os.path.join(tmp, "acl"), "w").write(acl)
        subprocess.run(["mosquitto_passwd", "-c", "-b", os.path.join(tmp, "passwd"), "ops", "pw-ops"], check=True)
        for conf in ("edge.conf", "center.conf"):
            run(conf, "broker", tmp, pki)
        # The shipped example is mkacl.sh's output for the users its first line names.
        example = os.path.join(SRC, "deploy/mosquitto/dspark.acl.example")
        first = open(example).read().split("\n", 1)[0]
        made = subprocess.run(["sh", os.path.join(SRC, "deploy/mosquitto/mkacl.sh")] + first.split("mkacl.sh", 1)[1].split(),
                              check=True, capture_output=True, text=True).stdout
        check(made == open(example).read(), "dspark.acl.example is mkacl.sh's output for its own first line "
              "(regenerate it after changing mkacl.sh)")
        lab = os.path.join(SRC, "deploy/mosquitto/edge-lab.conf")
        head = open(lab).read().split("\n\n", 1)[0]
        check("LAB" in head and "allow_anonymous true" in open(lab).read(),
              "edge-lab.conf: the anonymous config says LAB in its name and header")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


main()
