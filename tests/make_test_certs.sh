#!/usr/bin/env bash
# Makes the certificates of the TLS tests in DIR with the openssl CLI:
#   ca.pem ca.key              the CA the server trusts for client certificates
#   server.pem server.key      CN=localhost, SAN DNS:localhost, IP:127.0.0.1 (by ca)
#   server2.pem server2.key    the same names, signed by ca2 (certificate reload)
#   alpha.pem alpha.key        client, URI SAN spiffe://tqkv/alpha, CN=alpha-box (by ca)
#   beta.pem beta.key          client, URI SAN spiffe://tqkv/beta, CN=beta-box (by ca)
#   stranger.pem stranger.key  client, CN=stranger, no mapping (by ca)
#   expired.pem expired.key    client, CN=alpha-box, valid 2020-01-01..2020-01-02 (by ca)
#   rogue.pem rogue.key        client, CN=alpha-box, signed by the untrusted rogue CA
#   ca2.pem rogue-ca.pem       other CAs
# Usage: make_test_certs.sh DIR
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key" 2>/dev/null; }

ca() {  # NAME CN
  key "$1"
  openssl req -x509 -new -key "$1.key" -subj "/CN=$2" -days 3650 -out "$1.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
}

# A minimal `openssl ca` setup per CA, so validity dates can be set
# explicitly (the expired certificate).
ca_conf() {  # NAME
  mkdir -p "$1.db"
  : > "$1.db/index.txt"
  echo 1000 > "$1.db/serial"
  cat > "$1.cnf" <<CNF
[ca]
default_ca = this
[this]
dir = $1.db
database = \$dir/index.txt
serial = \$dir/serial
new_certs_dir = \$dir
certificate = $1.pem
private_key = $1.key
default_md = sha256
policy = anything
unique_subject = no
copy_extensions = copy
[anything]
commonName = supplied
CNF
}

leaf() {  # NAME CA CN EXT [STARTDATE ENDDATE]
  key "$1"
  openssl req -new -key "$1.key" -subj "/CN=$3" -addext "$4" -out "$1.csr"
  local dates=(-days 365)
  if [ $# -ge 6 ]; then dates=(-startdate "$5" -enddate "$6"); fi
  openssl ca -batch -config "$2.cnf" -in "$1.csr" -out "$1.pem" -notext "${dates[@]}" 2>/dev/null
  rm -f "$1.csr"
}

for c in ca ca2 rogue-ca; do
  ca "$c" "tqkv test $c"
  ca_conf "$c"
done
server_san="subjectAltName=DNS:localhost,IP:127.0.0.1"
leaf server ca localhost "$server_san"
leaf server2 ca2 localhost "$server_san"
leaf alpha ca alpha-box "subjectAltName=URI:spiffe://tqkv/alpha"
leaf beta ca beta-box "subjectAltName=URI:spiffe://tqkv/beta"
leaf stranger ca stranger "subjectAltName=URI:spiffe://tqkv/stranger"
leaf expired ca alpha-box "subjectAltName=URI:spiffe://tqkv/alpha" 20200101000000Z 20200102000000Z
leaf rogue rogue-ca alpha-box "subjectAltName=URI:spiffe://tqkv/alpha"
chmod 600 ./*.key
