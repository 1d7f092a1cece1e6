#!/usr/bin/env bash
# A throwaway CA and, signed by it, a server certificate for 127.0.0.1/localhost and a client
# certificate, for trying doppelchip's TLS and mutual TLS (docs/OPERATIONS.md). Writes ca.pem,
# server.pem, server.key, client.pem, client.key into DIR (default: the current folder).
# For local tests only: the keys are unencrypted and the CA trusts whoever holds ca.key.
#
#   examples/tls/make_certs.sh [DIR]
set -euo pipefail
dir="${1:-.}"
mkdir -p "$dir"
cd "$dir"
subj() { echo "/CN=$1"; }
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "$(subj doppelchip-test-ca)" -keyout ca.key -out ca.pem 2>/dev/null
for who in server client; do
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -subj "$(subj "doppelchip-test-$who")" -keyout "$who.key" -out "$who.csr" 2>/dev/null
    if [ "$who" = server ]; then
        ext="subjectAltName=IP:127.0.0.1,DNS:localhost"$'\n'"extendedKeyUsage=serverAuth"
    else
        ext="extendedKeyUsage=clientAuth"
    fi
    openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
        -extfile <(echo "$ext") -out "$who.pem" 2>/dev/null
    rm -f "$who.csr"
done
rm -f ca.srl
echo "ca.pem server.pem server.key client.pem client.key in $(pwd)"
