#!/bin/sh
# mkacl.sh — write a mosquitto acl_file for dspark from IDENTITY:ROLE pairs.
#
# usage: mkacl.sh IDENTITY:ROLE ... > /etc/mosquitto/dspark.acl
# IDENTITY is the MQTT username (password clients) or the certificate CN
# (use_identity_as_username on an mTLS listener); for nodes it must equal the
# node's [node] name, because its status/telemetry/rollout/relay/session/chunk
# topics carry that name; for devices it is the last level of the request
# topic, dspark/v1/infer/<model>/<identity>, which the nodes answer only on
# dspark/v1/reply/<identity>/... ROLE is one of device, edge, center, ops, publisher,
# bridge. Every identity gets its own block (mosquitto's %u patterns apply to
# every user, so they cannot give a node topics a device must not have);
# anything not listed is denied. README "Security" has the table.
# mosquitto checks a shared subscription ($share/GROUP/FILTER) against FILTER.
set -eu
[ $# -gt 0 ] || { echo "usage: mkacl.sh IDENTITY:ROLE ..." >&2; exit 2; }
P=dspark/v1
echo "# dspark ACL, made by deploy/mosquitto/mkacl.sh $*"
for pair in "$@"; do
    n=${pair%%:*} role=${pair#*:}
    case $n in ''|*/*|*+*|*'#'*|*' '*) echo "mkacl: bad identity '$n'" >&2; exit 2 ;; esac
    echo
    echo "# $n: $role"
    echo "user $n"
    case $role in
    device)
        echo "topic write $P/infer/+/$n"
        echo "topic write $P/cancel/$n/#"
        echo "topic read $P/reply/$n/#" ;;
    edge)
        echo "topic read $P/infer/+/+"
        echo "topic read $P/cancel/#"
        echo "# cancels of requests it relayed to a center, under its own name only"
        echo "topic write $P/cancel/$n/#"
        echo "topic write $P/reply/#"
        echo "topic write $P/center/infer/+/$n"
        echo "# weighted routing: one named center (center/<center>/infer/<model>/<edge>)"
        echo "topic write $P/center/+/infer/+/$n"
        echo "topic write $P/center/spec/+/$n"
        echo "topic write $P/center/session/+/$n"
        echo "topic read $P/relay/$n"
        echo "topic read $P/status/+"
        echo "topic read $P/center/status/+"
        echo "topic write $P/status/$n"
        echo "topic write $P/telemetry/$n"
        echo "topic write $P/rollout/$n"
        echo "topic write $P/alert/$n"
        echo "topic read $P/control/$n"
        echo "topic read $P/control/all"
        echo "topic read $P/models/+/manifest"
        echo "topic write $P/models/+/fetch"
        echo "topic read $P/models/+/chunk/$n" ;;
    center)
        echo "topic read $P/center/infer/+/+"
        echo "topic read $P/center/$n/infer/+/+"
        echo "topic read $P/center/spec/+/+"
        echo "topic read $P/center/session/$n/+"
        echo "topic read $P/cancel/#"
        echo "topic write $P/relay/+"
        echo "topic write $P/reply/#"
        echo "topic read $P/status/+"
        echo "topic write $P/status/$n"
        echo "# its role, vouched: edges count a status saying center only with it"
        echo "topic write $P/center/status/$n"
        echo "topic write $P/telemetry/$n"
        echo "topic write $P/rollout/$n"
        echo "topic write $P/alert/$n"
        echo "topic read $P/control/$n"
        echo "topic read $P/control/all"
        echo "topic read $P/models/+/manifest"
        echo "topic write $P/models/+/fetch"
        echo "topic read $P/models/+/chunk/$n"
        echo "# [publish] dirs: a center may serve bundles too"
        echo "topic write $P/models/+/manifest"
        echo "topic read $P/models/+/fetch"
        echo "topic write $P/models/+/chunk/+" ;;
    ops)
        echo "topic read $P/status/+"
        echo "topic read $P/telemetry/+"
        echo "topic read $P/rollout/+"
        echo "topic read $P/alert/+" ;;
    publisher)
        echo "topic write $P/models/+/manifest"
        echo "topic read $P/models/+/fetch"
        echo "topic write $P/models/+/chunk/+"
        echo "topic write $P/control/+"
        echo "topic read $P/rollout/+"
        echo "topic read $P/telemetry/+" ;;
    bridge)
        # An edge broker's bridge on the center broker (center-bridge.conf):
        # what that broker's own ACL already let through.
        echo "topic write $P/center/#"
        echo "topic write $P/cancel/#"
        echo "topic read $P/relay/#"
        echo "topic readwrite $P/status/#"
        echo "topic read $P/center/status/#"
        echo "topic write $P/telemetry/#"
        echo "topic write $P/alert/#" ;;
    *) echo "mkacl: $n: unknown role '$role' (device, edge, center, ops, publisher, bridge)" >&2; exit 2 ;;
    esac
done
