"""TLS and mutual TLS through the Python client, against a real tqkv-server
with certificates made at test time by the openssl CLI
(tests/make_test_certs.sh): a client certificate mapped in the auth file is
its tenant; a missing or expired certificate, an untrusted server CA and
plaintext fail the handshake (Unavailable)."""
import os
import subprocess
import tempfile

import numpy as np
import pytest

import tqkv
from conftest import Server
from helpers import unique


@pytest.fixture(scope="module")
def certs():
    d = tempfile.mkdtemp(prefix="tqkv-certs-", dir=os.environ.get("TEST_TMPDIR"))
    root = os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", "tqkv"))
    subprocess.run([os.path.join(root, "tests/make_test_certs.sh"), d], check=True,
                   capture_output=True)
    return d


@pytest.fixture(scope="module")
def mtls(certs):
    tokens = os.path.join(certs, "tokens")
    with open(tokens, "w") as f:
        f.write("x509-uri:spiffe://tqkv/alpha alpha\n")
    os.chmod(tokens, 0o600)
    s = Server(os.environ["TQKV_SERVER"], [
        "--tls_cert_file", os.path.join(certs, "server.pem"),
        "--tls_key_file", os.path.join(certs, "server.key"),
        "--tls_client_ca_file", os.path.join(certs, "ca.pem"),
        "--auth_tokens_file", tokens])
    yield s
    s.stop()


def connect(server, certs, ca="ca.pem", who=None):
    creds = None
    if ca is not None:
        creds = tqkv.tls_credentials(
            os.path.join(certs, ca),
            cert_file=os.path.join(certs, who + ".pem") if who else None,
            key_file=os.path.join(certs, who + ".key") if who else None)
    return tqkv.Client(server.address, credentials=creds, timeout=20, retries=0)


def test_a_mapped_client_certificate_is_a_tenant(mtls, certs):
    with connect(mtls, certs, who="alpha") as c:
        m = c.register_model(unique(), num_layers=2, num_kv_heads=2, head_dim=64, block_size=8,
                             cache_dtype="tq4")
        assert c.lookup(m, [b"h0"]).hits == 0
        assert any(s.model_id == m.model_id for s in c.stats().models)


@pytest.mark.parametrize("ca,who", [("ca.pem", None), ("ca.pem", "expired"),
                                    ("ca.pem", "rogue"), ("rogue-ca.pem", "alpha"),
                                    (None, None)])
def test_refused_handshakes_are_unavailable(mtls, certs, ca, who):
    with connect(mtls, certs, ca=ca, who=who) as c:
        with pytest.raises(tqkv.Unavailable):
            c.stats()


def test_unmapped_certificate_is_unauthenticated(mtls, certs):
    with connect(mtls, certs, who="beta") as c:
        with pytest.raises(tqkv.Unauthenticated):
            c.stats()


def test_cert_without_key_is_refused(certs):
    with pytest.raises(ValueError):
        tqkv.tls_credentials(os.path.join(certs, "ca.pem"), cert_file=os.path.join(certs, "alpha.pem"))


def data_plane(server, certs, ca="ca.pem", who=None, token=None):
    tls = None
    if ca is not None:
        tls = tqkv.data_plane_tls(
            os.path.join(certs, ca),
            cert_file=os.path.join(certs, who + ".pem") if who else None,
            key_file=os.path.join(certs, who + ".key") if who else None)
    return tqkv.DataPlane(server.data_address, token=token, timeout=20, tls=tls)


def test_data_plane_tls_serves_the_certificates_tenant(mtls, certs):
    ca, alpha_pem, alpha_key = (os.path.join(certs, f) for f in ("ca.pem", "alpha.pem", "alpha.key"))
    with tqkv.Client(mtls.address, credentials=tqkv.tls_credentials(ca, alpha_pem, alpha_key),
                     timeout=20, retries=0, data_address="auto",
                     data_tls=tqkv.data_plane_tls(ca, alpha_pem, alpha_key)) as c:
        m = c.register_model(unique(), num_layers=2, num_kv_heads=2, head_dim=64, block_size=8,
                             cache_dtype="tq4")
        k = np.random.default_rng(3).standard_normal((2, 8, 2, 64)).astype(np.float16)
        with data_plane(mtls, certs, who="alpha") as dp:
            assert dp.put_blocks(m, [tqkv.Block(b"h0", k=k, v=-k)]).committed == 1
            got = dp.get_blocks(m, [b"h0"])[0].payload
        assert got == c.get_blocks(m, [b"h0"])[0].payload  # Client reads over the TLS data plane
        assert len(got) > 1000
        c.data_address = None
        assert got == c.get_blocks(m, [b"h0"])[0].payload  # the same bytes over gRPC
        with data_plane(mtls, certs, who="beta") as dp:  # beta is not mapped: nobody
            with pytest.raises(tqkv.Unauthenticated):
                dp.get_blocks(m, [b"h0"])


@pytest.mark.parametrize("ca,who", [("ca.pem", None), ("ca.pem", "expired"),
                                    ("ca.pem", "rogue"), ("rogue-ca.pem", "alpha"),
                                    (None, None)])
def test_data_plane_refused_handshakes_are_unavailable(mtls, certs, ca, who):
    with data_plane(mtls, certs, ca=ca, who=who) as dp:
        with pytest.raises(tqkv.Unavailable):
            dp.get_blocks((1, "f"), [b"h0"])
