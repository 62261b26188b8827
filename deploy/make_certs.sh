#!/usr/bin/env bash
# Makes a CA and one TLS certificate per host of a hosts file, for the coordinator's port
# (--tls-cert/--tls-key/--tls-ca on `longhaul coordinator` and `longhaul worker`).
# Usage: bash deploy/make_certs.sh HOSTS_FILE OUT_DIR [DAYS]
#   HOSTS_FILE: one host per line (a name or an IP address; '#' starts a comment; extra words, such
#   as deploy/launch.sh's ssh targets, are ignored). OUT_DIR gets ca.pem and ca.key (keep the key
#   off the hosts), and HOST.pem and HOST.key for each host, valid for DAYS (365) with the host as
#   its subject alternative name (a DNS name, or an IP address where it is one).
# Needs the openssl command. Existing files are never overwritten: remove OUT_DIR to start again.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 HOSTS_FILE OUT_DIR [DAYS]" >&2; exit 2; }
hosts_file="$1"
out="$2"
days="${3:-365}"
[ -r "$hosts_file" ] || { echo "make_certs: cannot read the hosts file $hosts_file" >&2; exit 2; }
command -v openssl >/dev/null || { echo "make_certs: needs openssl (apt-get install openssl)" >&2; exit 2; }
mkdir -p "$out"
umask 077

if [ ! -e "$out/ca.pem" ]; then
  openssl req -x509 -newkey rsa:3072 -nodes -days "$days" -subj "/CN=longhaul job CA" \
    -keyout "$out/ca.key" -out "$out/ca.pem" 2>/dev/null
  echo "make_certs: CA $out/ca.pem"
fi

while read -r host _; do
  host="${host%%#*}"
  [ -n "$host" ] || continue
  [ -e "$out/$host.pem" ] && { echo "make_certs: $out/$host.pem exists, kept"; continue; }
  if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then san="IP:$host"; else san="DNS:$host"; fi
  openssl req -newkey rsa:3072 -nodes -subj "/CN=$host" -keyout "$out/$host.key" -out "$out/$host.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >"$out/$host.ext"
  openssl x509 -req -in "$out/$host.csr" -CA "$out/ca.pem" -CAkey "$out/ca.key" -CAcreateserial -days "$days" \
    -extfile "$out/$host.ext" -out "$out/$host.pem" 2>/dev/null
  rm -f "$out/$host.csr" "$out/$host.ext"
  echo "make_certs: $out/$host.pem ($san)"
done <"$hosts_file"
