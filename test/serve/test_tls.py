"""
TLS: wss:// for openpi's own client, client certificates required and checked.

openpi's unmodified ``WebsocketClientPolicy`` over wss:// (a server certificate and an API
key); with ``--client-ca`` a client certificate signed by that CA is required, and every
refused TLS handshake is logged.
"""

import logging
import shutil
import ssl
import subprocess

from openpi_client import msgpack_numpy
from oxygen_ros.serve.auth import tls_context
from oxygen_ros.serve.layouts import Layout
import pytest
from serve_helpers import engine_for, logged, openpi_observation, running
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import connect

LAYOUT = Layout.DROID
KEY = 'tls-test-key-0123456789abcdef'
pytestmark = pytest.mark.skipif(shutil.which('openssl') is None, reason='needs openssl')


def openssl(*args: str, cwd) -> None:
    subprocess.run(['openssl', *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope='module')
def pki(tmp_path_factory):
    """Return a folder with a CA, a server certificate, a client's and a foreign client's."""
    d = tmp_path_factory.mktemp('pki')
    for ca in ('ca', 'other_ca'):
        openssl('req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1',
                '-nodes', '-keyout', f'{ca}.key', '-out', f'{ca}.pem', '-days', '2',
                '-subj', f'/CN=oxygen test {ca}', cwd=d)
    (d / 'san.ext').write_text('subjectAltName=DNS:localhost,IP:127.0.0.1\n')
    for name, ca, ext in (('server', 'ca', ['-extfile', 'san.ext']), ('client', 'ca', []),
                          ('stranger', 'other_ca', [])):
        openssl('req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
                '-keyout', f'{name}.key', '-out', f'{name}.csr', '-subj', f'/CN={name}', cwd=d)
        openssl('x509', '-req', '-in', f'{name}.csr', '-CA', f'{ca}.pem', '-CAkey', f'{ca}.key',
                '-CAcreateserial', '-out', f'{name}.pem', '-days', '2', *ext, cwd=d)
    return d


def client_context(pki, name: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / 'ca.pem'))
    if name:
        ctx.load_cert_chain(pki / f'{name}.pem', pki / f'{name}.key')
    return ctx


def test_wss_works_with_openpis_client(pki, tokenizer, monkeypatch):
    """``WebsocketClientPolicy('wss://localhost', port, api_key=...)``: its default context."""
    monkeypatch.setenv('SSL_CERT_FILE', str(pki / 'ca.pem'))   # trust the test CA
    tls = tls_context(str(pki / 'server.pem'), str(pki / 'server.key'), None)
    with running(engine_for(LAYOUT, tokenizer), LAYOUT, ssl_context=tls,
                 api_keys=(KEY.encode(),)) as srv:
        from openpi_client.websocket_client_policy import WebsocketClientPolicy
        client = WebsocketClientPolicy('wss://localhost', srv.port, api_key=KEY)
        try:
            assert client.get_server_metadata()['security'] == {
                'tls': True, 'api_key': True, 'client_certificates': False}
            assert client.infer(openpi_observation(LAYOUT, 0))['actions'].shape == (4, 7)
        finally:
            client._ws.close()


def test_client_certificates_are_required_and_checked(pki, tokenizer, caplog):
    caplog.set_level(logging.INFO, logger='oxygen_serve')
    tls = tls_context(str(pki / 'server.pem'), str(pki / 'server.key'), str(pki / 'ca.pem'))
    with running(engine_for(LAYOUT, tokenizer), LAYOUT, ssl_context=tls,
                 client_certs=True) as srv:
        with connect(srv.uri, ssl=client_context(pki, 'client'), compression=None) as ws:
            assert msgpack_numpy.unpackb(ws.recv())['security']['client_certificates']
            ws.send(msgpack_numpy.packb(openpi_observation(LAYOUT, 0)))
            assert msgpack_numpy.unpackb(ws.recv())['actions'].shape == (4, 7)
        for name in (None, 'stranger'):
            with pytest.raises((ssl.SSLError, ConnectionClosed, InvalidHandshake, OSError)):
                with connect(srv.uri, ssl=client_context(pki, name), compression=None) as ws:
                    ws.recv(timeout=10)
        logged(caplog, 'refused a TLS connection: SSLError: PEER_DID_NOT_RETURN_A_CERTIFICATE')
        logged(caplog, 'refused a TLS connection: SSLCertVerificationError: '
               'CERTIFICATE_VERIFY_FAILED (unable to get local issuer certificate)')


def test_tls_files_that_do_not_load_are_refused(pki):
    with pytest.raises(ValueError, match='TLS files'):
        tls_context(str(pki / 'server.pem'), str(pki / 'client.key'), None)
