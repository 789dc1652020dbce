#!/usr/bin/python3
"""probe.py — what of dspark's MQTT 5 use a broker cluster supports, by experiment.

Each check connects third-party clients (Debian's python3-paho-mqtt) to
DIFFERENT nodes of the cluster (publisher on one, subscriber on another) and
prints one line: PASS, FAIL or NOTE (a behaviour to know, not needed by dspark),
with what was seen. deploy/cluster/README.md has the table it gives for ejabberd.

Usage: probe.py HOST:PORT HOST:PORT [HOST:PORT]   (node 1, node 2, node 3)
Environment: DS_PROBE_USER / DS_PROBE_PASSWORD (default "dspark" / "dspark":
ejabberd's mod_mqtt refuses a CONNECT without a password, even anonymous).
Exit status: 0 when every check dspark needs passes, 1 otherwise, 77 when
paho-mqtt is missing.
"""
import os
import sys
import threading
import time
import uuid

try:
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties
except ImportError:
    print("probe.py: python3-paho-mqtt is not installed", file=sys.stderr)
    sys.exit(77)

USER = os.environ.get("DS_PROBE_USER", "dspark")
PASSWORD = os.environ.get("DS_PROBE_PASSWORD", "dspark")
WAIT_S = 10.0
RUN = uuid.uuid4().hex[:8]          # topics of this run only


def addr(s):
    host, port = s.rsplit(":", 1)
    return host, int(port)


class Client:
    """One MQTT 5 client with its received messages and CONNACK."""

    def __init__(self, node, cid, clean=True, expiry=0, max_packet=0, will=None):
        self.msgs, self.cv = [], threading.Condition()
        self.connack, self.disconnected = None, threading.Event()
        self.suback = threading.Event()
        self.c = mqtt.Client(client_id=cid, protocol=mqtt.MQTTv5)
        self.c.username_pw_set(USER, PASSWORD)
        self.c.on_connect = self._on_connect
        self.c.on_message = self._on_message
        self.c.on_subscribe = lambda c, u, mid, codes, props: self.suback.set()
        self.c.on_disconnect = lambda c, u, rc, props=None: self.disconnected.set()
        if will:
            wp = Properties(PacketTypes.WILLMESSAGE)
            self.c.will_set(will[0], will[1], qos=1, retain=False, properties=wp)
        p = Properties(PacketTypes.CONNECT)
        if expiry:
            p.SessionExpiryInterval = expiry
        if max_packet:
            p.MaximumPacketSize = max_packet
        self.connected = threading.Event()
        host, port = addr(node)
        self.c.connect(host, port, keepalive=30, clean_start=clean, properties=p)
        self.c.loop_start()
        if not self.connected.wait(WAIT_S):
            raise RuntimeError("no CONNACK from %s" % node)

    def _on_connect(self, c, u, flags, rc, props):
        self.connack = (flags, rc, props)
        self.connected.set()

    def _on_message(self, c, u, m):
        with self.cv:
            self.msgs.append(m)
            self.cv.notify_all()

    def sub(self, topic, qos=1):
        self.suback.clear()
        self.c.subscribe(topic, qos=qos)
        return self.suback.wait(WAIT_S)

    def wait(self, n=1, timeout=WAIT_S):
        end = time.monotonic() + timeout
        with self.cv:
            while len(self.msgs) < n and time.monotonic() < end:
                self.cv.wait(end - time.monotonic())
            return list(self.msgs)

    def pub(self, topic, payload, qos=1, retain=False, **props):
        p = Properties(PacketTypes.PUBLISH)
        for k, v in props.items():
            setattr(p, k, v)
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=p if props else None)
        if qos:
            info.wait_for_publish(WAIT_S)
        return info

    def close(self, clean=True):
        if clean:
            self.c.disconnect()
        self.c.loop_stop()


results = []


def report(status, what, seen):
    results.append((status, what))
    print("%-4s %-44s %s" % (status, what, seen), flush=True)


def check(what, needed=True):
    def deco(fn):
        def run(nodes):
            try:
                ok, seen = fn(nodes)
            except Exception as e:  # a refused connection, a timeout
                ok, seen = False, "error: %s" % e
            report("PASS" if ok else ("FAIL" if needed else "NOTE"), what, seen)
        return run
    return deco


@check("QoS 1 publish on node 1 reaches node 2 and 3")
def across(nodes):
    t = "probe/%s/across" % RUN
    subs = [Client(n, "p-across-%d-%s" % (i, RUN)) for i, n in enumerate(nodes[1:])]
    for s in subs:
        s.sub(t)
    pub = Client(nodes[0], "p-across-pub-" + RUN)
    t0 = time.monotonic()
    pub.pub(t, b"hello")
    got = [len(s.wait(1)) for s in subs]
    ms = (time.monotonic() - t0) * 1000
    for c in subs + [pub]:
        c.close()
    return all(g == 1 for g in got), "received %s of 1 each, %.1f ms" % (got, ms)


@check("Response Topic, Correlation Data, User Properties")
def request_props(nodes):
    t = "probe/%s/req" % RUN
    s = Client(nodes[1], "p-req-s-" + RUN)
    s.sub(t)
    p = Client(nodes[0], "p-req-p-" + RUN)
    p.pub(t, b"{}", ResponseTopic="probe/reply/x", CorrelationData=b"\x00corr\xff",
          UserProperty=[("k", "v"), ("k2", "v2")], ContentType="application/json",
          PayloadFormatIndicator=1)
    m = s.wait(1)
    s.close()
    p.close()
    if not m:
        return False, "nothing received"
    mp = m[0].properties
    rt = getattr(mp, "ResponseTopic", None)
    cd = getattr(mp, "CorrelationData", None)
    up = getattr(mp, "UserProperty", None)
    ok = rt == "probe/reply/x" and cd == b"\x00corr\xff" and up == [("k", "v"), ("k2", "v2")]
    return ok, "response topic %r, correlation %r, user properties %r" % (rt, cd, up)


@check("Message Expiry: remaining interval forwarded")
def expiry_forwarded(nodes):
    t = "probe/%s/exp" % RUN
    s = Client(nodes[2 % len(nodes)], "p-exp-s-" + RUN)
    s.sub(t)
    p = Client(nodes[0], "p-exp-p-" + RUN)
    p.pub(t, b"x", MessageExpiryInterval=30)
    m = s.wait(1)
    s.close()
    p.close()
    e = getattr(m[0].properties, "MessageExpiryInterval", None) if m else None
    return e is not None and 0 < e <= 30, "expiry interval at the subscriber: %r" % e


@check("Session expiry: QoS 1 queued while away, other node")
def session(nodes):
    t = "probe/%s/sess" % RUN
    cid = "p-sess-" + RUN
    s = Client(nodes[1], cid, clean=True, expiry=60)
    s.sub(t)
    flags = s.connack[0]
    s.close(clean=False)                    # drop the TCP connection: no DISCONNECT
    s.c.socket() and s.c.socket().close()
    time.sleep(0.5)
    p = Client(nodes[0], "p-sess-p-" + RUN)
    p.pub(t, b"kept")
    p.pub(t, b"expired", MessageExpiryInterval=1)
    time.sleep(2.5)                         # the second one's expiry passes while away
    p.close()
    s2 = Client(nodes[2 % len(nodes)], cid, clean=False, expiry=60)   # resume on ANOTHER node
    present = s2.connack[0].get("session present")
    got = [m.payload for m in s2.wait(2, 3)]
    se = getattr(s2.connack[2], "SessionExpiryInterval", None)
    s2.close()
    ok = present == 1 and got == [b"kept"]
    return ok, "session present %r, received %r (expired one dropped: %s), granted expiry %r s; first %r" % (
        present, got, b"expired" not in got, se, flags)


def retained_on(nodes, pub_node, sub_node, tag):
    t = "probe/%s/status/%s" % (RUN, tag)
    p = Client(nodes[pub_node], "p-ret-p-%s-%s" % (tag, RUN))
    p.pub(t, b'{"state":"online"}', retain=True)
    time.sleep(0.2)
    s = Client(nodes[sub_node], "p-ret-s-%s-%s" % (tag, RUN))
    s.sub("probe/%s/status/+" % RUN)
    m = [x for x in s.wait(1, 2.0) if x.topic == t]
    ok = bool(m) and m[0].retain and m[0].payload == b'{"state":"online"}'
    p.pub(t, b"", retain=True)              # clear it
    time.sleep(0.3)
    s2 = Client(nodes[sub_node], "p-ret-s2-%s-%s" % (tag, RUN))
    s2.sub(t)
    cleared = not s2.wait(1, 1.0)
    for c in (p, s, s2):
        c.close()
    return ok, cleared


@check("Retained status, subscriber on the publisher's node")
def retained_same(nodes):
    ok, cleared = retained_on(nodes, 0, 0, "same")
    return ok and cleared, "retained delivered with its flag %s, cleared by an empty retained publish %s" % (ok, cleared)


@check("Retained status, later subscriber on another node", needed=False)
def retained_other(nodes):
    ok, cleared = retained_on(nodes, 0, 1, "other")
    return ok and cleared, "retained delivered %s (ejabberd 23.01 indexes retained topics per node)" % ok


@check("Last will published when a client dies (other node)")
def will(nodes):
    t = "probe/%s/will" % RUN
    s = Client(nodes[1], "p-will-s-" + RUN)
    s.sub(t)
    d = Client(nodes[0], "p-will-d-" + RUN, will=(t, b'{"state":"offline"}'))
    d.c.loop_stop()
    d.c.socket().close()                    # no DISCONNECT: the broker sees the socket die
    m = s.wait(1)
    s.close()
    return bool(m) and m[0].payload == b'{"state":"offline"}', "will received %s" % bool(m)


@check("Maximum Packet Size asked by the client is respected", needed=False)
def max_packet(nodes):
    t = "probe/%s/big" % RUN
    s = Client(nodes[1], "p-max-s-" + RUN, max_packet=1024)
    s.sub(t)
    p = Client(nodes[0], "p-max-p-" + RUN)
    p.pub(t, b"x" * 4000)
    p.pub(t, b"small")
    m = s.wait(2, 3)
    dropped = s.disconnected.is_set()
    s.close()
    p.close()
    sizes = [len(x.payload) for x in m]
    return sizes == [5], "subscriber (max 1024 B) received sizes %s, disconnected %s" % (sizes, dropped)


@check("Broker's own limit: a publish past max_payload_size is refused", needed=False)
def server_max(nodes):
    p = Client(nodes[0], "p-smax-" + RUN)
    p.c.publish("probe/%s/huge" % RUN, b"x" * (5 << 20), qos=1)
    gone = p.disconnected.wait(WAIT_S)
    p.close(clean=False)
    return gone, "a 5 MiB publish: connection closed by the broker %s" % gone


@check("$share subscriptions", needed=False)
def share(nodes):
    s = Client(nodes[0], "p-share-" + RUN)
    shared = getattr(s.connack[2], "SharedSubscriptionAvailable", None)
    s.suback.clear()
    s.c.subscribe("$share/g/probe/%s/x" % RUN, qos=1)
    acked = s.suback.wait(3)
    gone = s.disconnected.wait(3)
    s.close(clean=False)
    return False, "CONNACK Shared Subscription Available = %r; a $share SUBSCRIBE: SUBACK %s, disconnected %s" % (
        shared, acked, gone)


@check("In-flight window (Receive Maximum) of the broker", needed=False)
def receive_max(nodes):
    s = Client(nodes[0], "p-rm-" + RUN)
    rm = getattr(s.connack[2], "ReceiveMaximum", None)
    s.close()
    return False, "CONNACK Receive Maximum %r (absent = 65535)" % rm


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    nodes = sys.argv[1:]
    for fn in (across, request_props, expiry_forwarded, session, retained_same, retained_other, will, max_packet,
               server_max, share, receive_max):
        fn(nodes)
    failed = [w for s, w in results if s == "FAIL"]
    print("%d passed, %d failed" % (sum(s == "PASS" for s, _ in results), len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
