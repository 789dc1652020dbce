#!/usr/bin/python3
# fake_systemctl.py — the few systemctl verbs that deb-systemd-helper and
# deb-systemd-invoke use, for deploy.lifecycle's scratch root where no systemd
# runs: it starts a unit's ExecStart as systemd would for Type=notify (User=,
# Group=, WorkingDirectory=, STATE_DIRECTORY, NOTIFY_SOCKET on a socket of its
# own) and returns once the service sent READY=1 (or fails when it exits or
# stays silent); stop sends SIGTERM and waits. Every call is logged to
# /run/fake-systemd/log, so the test can tell start from restart from stop.
# Installed as /usr/local/sbin/systemctl inside the scratch root only.
import os, pwd, signal, socket, sys, time

STATE = "/run/fake-systemd"
os.makedirs(STATE, exist_ok=True)
args = [a for a in sys.argv[1:]
        if a not in ("--system", "--quiet", "--no-reload", "--") and not a.startswith(("--root=", "--preset-mode="))]
with open(STATE + "/log", "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\n")


def unit_file(unit):
    for d in ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system"):
        p = os.path.join(d, unit)
        if os.path.exists(p):
            return p
    return None


def keys(unit):
    kv = {}
    for line in open(unit_file(unit)):
        line = line.strip()
        if "=" in line and not line.startswith(("#", ";", "[")):
            k, v = line.split("=", 1)
            kv.setdefault(k, v)
    return kv


def pid_of(unit):
    try:
        pid = int(open(f"{STATE}/{unit}.pid").read())
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(")")[-1].split()[0] == "Z":
                return None
        return pid
    except (OSError, ValueError):
        return None


def start(unit):
    if pid_of(unit):
        return 0
    kv = keys(unit)
    if kv.get("Type") != "notify":
        print(f"fake systemctl: {unit} is not Type=notify", file=sys.stderr)
        return 1
    sock_path = f"{STATE}/{unit}.notify"
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(sock_path)
    os.chmod(sock_path, 0o777)
    user = kv.get("User")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "NOTIFY_SOCKET": sock_path, "LANG": "C.UTF-8"}
    if "StateDirectory" in kv:
        env["STATE_DIRECTORY"] = "/var/lib/" + kv["StateDirectory"]
    argv = kv["ExecStart"].split()
    log = open(f"{STATE}/{unit}.out", "ab")
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        os.closerange(3, 4096)          # nothing of dpkg's or ours open in the daemon
        if user:
            pw = pwd.getpwnam(user)
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
        os.chdir(kv.get("WorkingDirectory", "/"))
        os.execve(argv[0], argv, env)
    open(f"{STATE}/{unit}.pid", "w").write(str(pid))
    s.settimeout(0.5)
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            msg = s.recv(4096).decode()
            if "READY=1" in msg.split("\n"):
                open(f"{STATE}/{unit}.ready", "a").write(f"{pid}\n")
                return 0
        except socket.timeout:
            pass
        wpid, status = os.waitpid(pid, os.WNOHANG)
        if wpid:
            print(f"fake systemctl: {unit} exited ({status}) before READY=1", file=sys.stderr)
            return 1
    print(f"fake systemctl: {unit}: no READY=1 within 60 s", file=sys.stderr)
    return 1


def stop(unit):
    pid = pid_of(unit)
    if not pid:
        return 0
    os.kill(pid, signal.SIGTERM)
    for _ in range(900):
        if not pid_of(unit):
            return 0
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return 0


def enabled(unit):
    for root, _, files in os.walk("/etc/systemd/system"):
        if unit in files and root.endswith(".wants"):
            return True
    return False


def enable(unit):
    """systemctl preset/enable: the [Install] WantedBy= links."""
    section = ""
    for line in open(unit_file(unit)):
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Install]" and line.startswith("WantedBy="):
            for t in line.split("=", 1)[1].split():
                d = f"/etc/systemd/system/{t}.wants"
                os.makedirs(d, exist_ok=True)
                if not os.path.lexists(f"{d}/{unit}"):
                    os.symlink(unit_file(unit), f"{d}/{unit}")
    return 0


verb, units = (args[0], args[1:]) if args else ("", [])
rc = 0
if verb in ("daemon-reload", "reset-failed"):
    pass
elif verb == "--version":
    print("systemd 252 (252)")
elif verb == "is-enabled":
    ok = all(enabled(u) for u in units)
    print("enabled" if ok else "disabled")
    rc = 0 if ok else 1
elif verb == "is-active":
    rc = 0 if all(pid_of(u) for u in units) else 3
elif verb in ("preset", "enable"):
    rc = max([enable(u) for u in units] or [0])
elif verb == "start":
    rc = max([start(u) for u in units] or [0])
elif verb == "stop":
    rc = max([stop(u) for u in units] or [0])
elif verb == "restart":
    rc = max([stop(u) or start(u) for u in units] or [0])
elif verb == "try-restart":
    rc = max([(stop(u) or start(u)) if pid_of(u) else 0 for u in units] or [0])
elif verb == "list-units":
    pass
else:
    print(f"fake systemctl: '{verb}' is not one this stand-in knows", file=sys.stderr)
    rc = 1
sys.exit(rc)
