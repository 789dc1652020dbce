#!/bin/sh
# mkpki.sh — a small PKI for the LAB AND TESTS ONLY: one CA, the broker's
# certificate and one client certificate per identity. Production brings its
# own PKI (keys made on the device, a real CA, revocation); nothing here is
# fit for that: the CA key sits unencrypted beside the certificates.
#
# usage: mkpki.sh DIR [IDENTITY:ROLE ...]
#   DIR gets ca.crt/ca.key, broker.crt/broker.key (SAN 127.0.0.1, ::1,
#   localhost), and NAME.crt/NAME.key for each identity (CN = NAME, which the
#   broker takes as the username with use_identity_as_username). Default
#   identities: edge-1:edge center-1:center dev-1:device dev-2:device
#   ops:ops publisher:publisher.
#   Test extras, made when asked by environment:
#     MKPKI_EXPIRED=1   expired.crt/.key: a broker certificate that expired
#     MKPKI_WRONGHOST=1 wronghost.crt/.key: a broker certificate for wrong.example
#     MKPKI_OTHERCA=1   other-ca.crt: an unrelated CA (a client given it must refuse the broker)
# Keys are mode 0600. Needs openssl 1.1.1 or later.
set -eu
dir=${1:?usage: mkpki.sh DIR [IDENTITY:ROLE ...]}
shift
[ $# -gt 0 ] || set -- edge-1:edge center-1:center dev-1:device dev-2:device ops:ops publisher:publisher
mkdir -p "$dir"
cd "$dir"
umask 077
days=30

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

if [ ! -f ca.key ]; then
    key ca.key
    openssl req -x509 -new -key ca.key -subj "/CN=dspark lab CA" -days $days -out ca.crt \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
fi

# sign NAME CN EXT [extra x509 args]
sign() {
    name=$1 cn=$2 ext=$3
    shift 3
    key "$name.key"
    openssl req -new -key "$name.key" -subj "/CN=$cn" -out "$name.csr"
    printf '%s\n' "$ext" > "$name.ext"
    openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$name.crt" \
        -extfile "$name.ext" "$@" 2>/dev/null
    rm -f "$name.csr" "$name.ext"
}

server_ext='basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth'
client_ext='basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth'

sign broker broker "$server_ext
subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost" -days $days
for id in "$@"; do
    name=${id%%:*}
    sign "$name" "$name" "$client_ext" -days $days
done
if [ "${MKPKI_WRONGHOST:-0}" = 1 ]; then
    sign wronghost wrong.example "$server_ext
subjectAltName=DNS:wrong.example" -days $days
fi
if [ "${MKPKI_EXPIRED:-0}" = 1 ]; then
    # Valid yesterday for one second: openssl x509 -not_after needs 3.x, so
    # back-date with a tiny CA config instead.
    key expired.key
    openssl req -new -key expired.key -subj "/CN=broker" -out expired.csr
    cat > expired.cnf <<CNF
[ca]
default_ca = lab
[lab]
database = expired.idx
new_certs_dir = .
serial = expired.srl
default_md = sha256
policy = any
copy_extensions = none
[any]
commonName = supplied
[ext]
basicConstraints = CA:FALSE
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
CNF
    : > expired.idx
    echo 01 > expired.srl
    openssl ca -batch -config expired.cnf -cert ca.crt -keyfile ca.key -in expired.csr \
        -out expired.crt -extensions ext -startdate 20200101000000Z -enddate 20200102000000Z \
        -notext >/dev/null 2>&1
    rm -f expired.csr expired.cnf expired.idx* expired.srl* 01.pem
fi
if [ "${MKPKI_OTHERCA:-0}" = 1 ]; then
    key other-ca.key
    openssl req -x509 -new -key other-ca.key -subj "/CN=not the dspark CA" -days $days -out other-ca.crt
fi
chmod 600 ./*.key
chmod 644 ./*.crt
echo "mkpki: lab PKI in $(pwd) (CA, broker, $*)"
