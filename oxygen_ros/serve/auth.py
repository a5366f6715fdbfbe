"""
Who may connect: the bind policy, API keys and TLS (stdlib only).

Secure by default (docs/serving.md#security): the server binds 127.0.0.1 unless ``--host``
says otherwise, and on any address that is not loopback it refuses to start unless clients
must prove who they are, with an API key (``Authorization: Api-Key <key>``, the header
openpi's ``WebsocketClientPolicy(api_key=...)`` sends) or a client certificate signed by
``--client-ca`` (TLS, ``--certfile``/``--keyfile``). Keys come from a file or the environment,
never the command line (every user sees a process's arguments); each comparison takes
constant time (``hmac.compare_digest``).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
from pathlib import Path
import socket
import ssl
import stat

API_KEY_ENV = 'OXYGEN_SERVE_API_KEY'
"""The environment variable an API key may come from (one key)."""
MIN_KEY_LENGTH = 16
"""Characters of the shortest key accepted (``openssl rand -hex 32`` gives 64)."""
SCHEME = 'Api-Key'
_LOG = logging.getLogger('oxygen_serve')


class InsecureBind(ValueError):
    """A bind the server refuses at start: reachable from the network without credentials."""


def is_loopback(host: str) -> bool:
    """
    Return whether every address ``host`` names is a loopback address.

    ``''``, ``0.0.0.0`` and ``::`` (every interface) are not; a name is resolved.
    """
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split('%')[0]).is_loopback
                               for info in infos)


def load_api_keys(path: str | None, environ: dict[str, str] | None = None) -> tuple[bytes, ...]:
    """
    Return the keys clients may send: each line of ``path``, and ``$OXYGEN_SERVE_API_KEY``.

    Lines starting with ``#`` are comments. A key file others may read is used, with a
    warning (``chmod 600``).

    :raises ValueError: an unreadable or empty file, a key shorter than ``MIN_KEY_LENGTH``,
        or one with whitespace inside (it could not travel in the header).
    """
    environ = os.environ if environ is None else environ
    keys = []
    if path:
        file = Path(path).expanduser()
        try:
            text = file.read_text(encoding='utf-8')
            mode = file.stat().st_mode
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f'--api-key-file {path}: {exc}') from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            _LOG.warning('--api-key-file %s can be read by other users (mode %o): chmod 600 it',
                         path, stat.S_IMODE(mode))
        keys = [line.strip() for line in text.splitlines()
                if line.strip() and not line.lstrip().startswith('#')]
        if not keys:
            raise ValueError(f'--api-key-file {path} holds no key')
    if environ.get(API_KEY_ENV, '').strip():
        keys.append(environ[API_KEY_ENV].strip())
    for key in keys:
        if len(key) < MIN_KEY_LENGTH or any(c.isspace() for c in key):
            raise ValueError(f'an API key must be at least {MIN_KEY_LENGTH} characters without '
                             f'spaces (e.g. `openssl rand -hex 32`), got one of {len(key)}')
    return tuple(key.encode() for key in keys)


def authorized(header_values: list[str], keys: tuple[bytes, ...]) -> bool:
    """
    Return whether the request's ``Authorization`` headers carry one of ``keys``.

    Exactly one header ``Api-Key <key>``; the key is compared with every allowed one in
    constant time (``hmac.compare_digest``), all of them, whatever matched.
    """
    if len(header_values) != 1:
        return False
    scheme, _, given = header_values[0].strip().partition(' ')
    if scheme.lower() != SCHEME.lower():
        return False
    given_bytes = given.strip().encode('utf-8', errors='replace')
    match = False
    for key in keys:
        match |= hmac.compare_digest(given_bytes, key)
    return match


def tls_context(certfile: str, keyfile: str | None, client_ca: str | None) -> ssl.SSLContext:
    """
    Return the server's TLS context: TLS 1.2 or later, client certificates when ``client_ca``.

    :raises ValueError: a certificate, key or CA file that does not load.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(certfile, keyfile)
        if client_ca:
            ctx.load_verify_locations(cafile=client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f'TLS files ({certfile}, {keyfile}, {client_ca}): {exc}') from None
    ctx.sslobject_class = _LoggedHandshake
    return ctx


class _LoggedHandshake(ssl.SSLObject):
    """Log a refused TLS handshake (asyncio logs it only in debug mode): every refusal logged."""

    def do_handshake(self) -> None:
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as exc:
            detail = getattr(exc, 'verify_message', None)
            _LOG.warning('refused a TLS connection: %s: %s%s', type(exc).__name__,
                         exc.reason or exc, f' ({detail})' if detail else '')
            raise


def check_bind(host: str, *, api_keys: tuple[bytes, ...], tls: bool, client_certs: bool) -> None:
    """
    Refuse a bind reachable from the network without credentials; warn about keys in clear.

    :raises InsecureBind: ``host`` is not loopback and neither API keys nor client
        certificates are required.
    """
    if is_loopback(host):
        return
    if not api_keys and not client_certs:
        raise InsecureBind(
            f'--host {host!r} is reachable from the network, and the server would take '
            f'commands from anyone there: give an API key (--api-key-file FILE or '
            f'${API_KEY_ENV}) or TLS with client certificates (--certfile, --keyfile, '
            f'--client-ca); docs/serving.md#security')
    if api_keys and not tls:
        _LOG.warning('--host %s without TLS: API keys cross the network in clear text '
                     '(--certfile/--keyfile for wss://)', host)


__all__ = ['API_KEY_ENV', 'InsecureBind', 'MIN_KEY_LENGTH', 'SCHEME', 'authorized',
           'check_bind', 'is_loopback', 'load_api_keys', 'tls_context']
