#!/usr/bin/env python3
"""malformed.py: the integration.malformed ctest. A third-party MQTT client
(Eclipse Paho's Python client, Debian's python3-paho-mqtt) sends a real
dspark-edge, behind a real mosquitto, at least 1,000 malformed requests of at
least 30 kinds, over MQTT 5 (Response Topic + Correlation Data) and over MQTT
3.1.1 (the JSON reply_to), with valid requests interleaved.

It checks what a device would notice: every malformed request that says where
to answer gets exactly one error with the right code (and the field named,
where tests/data/msg/requests.tsv names one); one that cannot say where to
answer (an MQTT 3.1.1 payload that does not parse) gets nothing; every valid
request is served; nothing is answered twice. The edge's log must hold no
sanitizer report.

Usage: malformed.py BUILD_DIR SOURCE_DIR MODELS_DIR [ROUNDS]
"""
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.01)
    sys.exit(f"malformed: timed out after {timeout} s waiting for {what}")


class Inbox:
    """Every message a client receives, by the key that names its request."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_key = {}
        self.online = False

    def add(self, key, payload):
        with self.lock:
            self.by_key.setdefault(key, []).append(payload)

    def get(self, key):
        with self.lock:
            return list(self.by_key.get(key, []))


def client(name, port, protocol, inbox, reply_filter):
    c = mqtt.Client(client_id=name, protocol=protocol)
    ready = threading.Event()

    def on_connect(cl, ud, flags, rc, props=None):
        cl.subscribe(reply_filter, qos=1)
        if protocol == mqtt.MQTTv5:
            cl.subscribe("dspark/v1/status/edge-m", qos=1)

    def on_subscribe(cl, ud, mid, *rest):
        ready.set()

    def on_message(cl, ud, msg):
        if msg.topic.startswith("dspark/v1/status/"):
            inbox.online = b'"state":"online"' in msg.payload
            return
        if protocol == mqtt.MQTTv5:
            corr = getattr(msg.properties, "CorrelationData", b"") if msg.properties else b""
            key = corr.decode("utf-8", "replace")
        else:
            key = msg.topic                             # one reply_to per request
        inbox.add(key, msg.payload)

    c.on_connect, c.on_subscribe, c.on_message = on_connect, on_subscribe, on_message
    c.max_inflight_messages_set(100)
    c.max_queued_messages_set(0)
    if protocol == mqtt.MQTTv5:
        c.connect("127.0.0.1", port, keepalive=30, clean_start=True)
    else:
        c.connect("127.0.0.1", port, keepalive=30)
    c.loop_start()
    if not ready.wait(20):
        sys.exit(f"malformed: {name} could not subscribe")
    return c


def reply_to_readable(raw):
    """Can the edge read reply_to from raw? It reads the first JSON value
    (cJSON: bytes up to 0x20, NUL and other control bytes included, are white
    space; what follows the value is ignored; no NaN/Infinity; nesting bounded)
    to answer even a request that fails to decode, such as one with a control
    byte between its tokens, which the decoder refuses as not JSON."""
    def no_constants(name):
        raise ValueError(name)
    text = bytes(b if b >= 0x20 else 0x20 for b in raw).decode("utf-8", "replace").lstrip()
    try:
        dec = json.JSONDecoder(parse_constant=no_constants, strict=False)
        return isinstance(dec.raw_decode(text)[0], dict)
    except (ValueError, RecursionError):
        return False


def kinds(source):
    """(kind, topic model, payload bytes, code, field) for every malformed kind."""
    out = []
    data = os.path.join(source, "tests", "data", "msg")
    with open(os.path.join(data, "requests.tsv")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            file, expect, field = line.split("\t")[:3]
            if expect == "OK":
                continue
            with open(os.path.join(data, file), "rb") as p:
                out.append((file[:-5], "stories", p.read(), "invalid_request", field))
    big = b'{"id":"big","model":"stories","prompt":"' + b"a" * 70000 + b'"}'
    deep = b"[" * 5000 + b"]" * 5000
    out += [
        ("empty-payload", "stories", b"", "invalid_request", "-"),
        ("binary-garbage", "stories", bytes(random.Random(7).randrange(256) for _ in range(300)), "invalid_request", "-"),
        ("invalid-utf8", "stories", b'{"id":"u","model":"stories","prompt":"\xff\xfe"}', "invalid_request", "-"),
        ("nul-in-payload", "stories", b'{"id":"n","model":"stories",\x00"prompt":"a"}', "invalid_request", "-"),
        ("over-max-payload", "stories", big, "invalid_request", "-"),
        ("deep-nesting", "stories", deep, "invalid_request", "-"),
        ("trailing-garbage", "stories", b'{"id":"t","model":"stories","prompt":"a"} x', "invalid_request", "-"),
        ("model-not-topic", "stories", b'{"id":"m","model":"other","prompt":"a"}', "invalid_request", "model"),
        ("model-unknown", "nope", b'{"id":"m","model":"nope","prompt":"a"}', "model_not_found", "nope"),
    ]
    return out


def main():
    build, source, models = sys.argv[1:4]
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 8
    work = tempfile.mkdtemp(prefix="dspark-malformed-")
    port = free_port()
    conf = os.path.join(work, "mosquitto.conf")
    with open(conf, "w") as f:
        f.write(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                "max_queued_messages 100000\nlog_dest stderr\n")
    broker_log = open(os.path.join(work, "mosquitto.log"), "w")
    broker = subprocess.Popen(["mosquitto", "-c", conf], stdout=broker_log, stderr=subprocess.STDOUT)
    edge = None
    try:
        def port_open():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        wait_until(port_open, 20, "mosquitto")
        ini = os.path.join(work, "edge.ini")
        with open(ini, "w") as f:
            f.write(f"[node]\nname = edge-m\n[mqtt]\nuri = tcp://127.0.0.1:{port}\n"
                    "[sched]\nqueue_normal = 4096\nclient_max = 0\n"
                    f"[model stories]\npath = {models}/stories260K.gguf\nprecision = int8\nctx = 256\n")
        edge_log = open(os.path.join(work, "edge.log"), "w")
        edge = subprocess.Popen([os.path.join(build, "edge-agent", "dspark-edge"), "-c", ini],
                                stdout=edge_log, stderr=subprocess.STDOUT)
        in5, in3 = Inbox(), Inbox()
        c5 = client("malformed-v5", port, mqtt.MQTTv5, in5, "test/m5")
        c3 = client("malformed-v311", port, mqtt.MQTTv311, in3, "test/m3/#")
        wait_until(lambda: in5.online, 30, "the edge's online status")

        cases = kinds(source)
        expect = {}        # (protocol, key) -> (kind, code or None (no answer) or "final", field)
        sent = {"5": 0, "3": 0}
        valid = 0
        n = 0
        for r in range(rounds):
            for kind, model, payload, code, field in cases:
                n += 1
                topic = f"dspark/v1/infer/{model}"
                # MQTT 5: the Response Topic says where, whatever the payload.
                props = Properties(PacketTypes.PUBLISH)
                props.ResponseTopic = "test/m5"
                props.CorrelationData = f"bad-{n}".encode()
                c5.publish(topic, payload, qos=1, properties=props)
                expect[("5", f"bad-{n}")] = (kind, code, field)
                sent["5"] += 1
                # MQTT 3.1.1: reply_to in the JSON; answered only when the
                # payload still parses with it (else nobody knows where to answer).
                if kind != "over-max-payload" and payload.lstrip().startswith(b"{") and "reply_to" not in kind:
                    at = payload.index(b"{") + 1
                    p3 = payload[:at] + f'"reply_to":"test/m3/bad-{n}",'.encode() + payload[at:]
                    answerable = reply_to_readable(p3)
                    c3.publish(topic, p3, qos=1)
                    expect[("3", f"test/m3/bad-{n}")] = (kind, code if answerable else None, field)
                    sent["3"] += 1
                if n % 3 == 0:                       # valid work between them
                    valid += 1
                    props = Properties(PacketTypes.PUBLISH)
                    props.ResponseTopic = "test/m5"
                    props.CorrelationData = f"good-{valid}".encode()
                    body = json.dumps({"id": f"good-{valid}", "model": "stories", "prompt": "The dog",
                                       "max_tokens": 2})
                    c5.publish("dspark/v1/infer/stories", body.encode(), qos=1, properties=props)
                    expect[("5", f"good-{valid}")] = ("valid", "final", "-")
        # A last valid request per protocol: errors are answered on arrival and
        # finals after compute, so once these are served everything before
        # them that was going to be answered has been.
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = "test/m5"
        props.CorrelationData = b"last-5"
        c5.publish("dspark/v1/infer/stories", b'{"id":"last-5","model":"stories","prompt":"A","max_tokens":1}',
                   qos=1, properties=props)
        c3.publish("dspark/v1/infer/stories",
                   b'{"id":"last-3","model":"stories","prompt":"A","max_tokens":1,"reply_to":"test/m3/last-3"}', qos=1)
        expected_answers = [k for k, v in expect.items() if v[1] is not None]
        inboxes = {"5": in5, "3": in3}
        def missing():
            m = [f"{p} {k} ({expect[(p, k)][0]})" for p, k in expected_answers if not inboxes[p].get(k)]
            return m + [k for k, inbox in (("last-5", in5), ("test/m3/last-3", in3)) if not inbox.get(k)]
        end = time.monotonic() + 300
        while missing() and time.monotonic() < end:
            time.sleep(0.05)
        if missing():
            m = missing()
            print(f"malformed: after 300 s, {len(m)} answers never came: {', '.join(m[:20])}")
            return 1

        wrong, unnamed, doubled, unexpected = [], 0, 0, 0
        kinds_seen = set()
        for (proto, key), (kind, code, field) in expect.items():
            got = inboxes[proto].get(key)
            kinds_seen.add(kind)
            if code is None:
                unexpected += len(got)
                if got:
                    wrong.append(f"{proto} {key} {kind}: answered, but its reply_to cannot be read: {got[0][:200]}")
                continue
            if len(got) != 1:
                doubled += 1
                wrong.append(f"{proto} {key} {kind}: {len(got)} answers")
                continue
            msg = json.loads(got[0])
            if code == "final":
                if msg.get("done") is not True:
                    wrong.append(f"{proto} {key}: valid request not served: {got[0][:200]}")
                continue
            err = msg.get("error") or {}
            if err.get("code") != code:
                wrong.append(f"{proto} {key} {kind}: code {err.get('code')}, want {code}: {got[0][:200]}")
            elif field != "-" and field not in err.get("message", ""):
                unnamed += 1
                wrong.append(f"{proto} {key} {kind}: message does not name '{field}': {err.get('message')}")
        malformed = sent["5"] + sent["3"]
        answered = sum(1 for k, v in expect.items() if v[1] not in (None, "final"))
        silent = sum(1 for v in expect.values() if v[1] is None)
        n_kinds = len(kinds_seen) - 1
        print(f"malformed: {malformed} malformed requests of {n_kinds} kinds ({sent['5']} over MQTT 5, "
              f"{sent['3']} over MQTT 3.1.1); {answered} answered with their error code, {silent} (3.1.1, "
              f"unparsable: reply_to unreadable) rightly unanswered; {valid} valid requests between them served; "
              f"{doubled} answered twice or not at all; {len(wrong)} wrong")
        for w in wrong[:40]:
            print("  " + w)
        edge.terminate()
        status = edge.wait(60)
        edge = None
        with open(os.path.join(work, "edge.log")) as f:
            log = f.read()
        sanitizer = "Sanitizer" in log or "runtime error" in log
        ok = not wrong and malformed >= 1000 and n_kinds >= 30 and status == 0 and not sanitizer
        if not ok:
            print(f"malformed: FAILED (edge exit {status}, sanitizer report: {sanitizer}); edge log tail:")
            print("\n".join(log.splitlines()[-20:]))
        c5.loop_stop()
        c3.loop_stop()
        return 0 if ok else 1
    finally:
        if edge:
            edge.kill()
            edge.wait()
        broker.terminate()
        broker.wait()
        if not os.environ.get("DS_TEST_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work} (DS_TEST_KEEP)")


if __name__ == "__main__":
    sys.exit(main())
