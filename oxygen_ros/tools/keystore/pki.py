"""
The keystore's PKI with the ``openssl`` command alone: keys, certificates, S/MIME signatures.

As sros2 makes them (``sros2/_utilities.py``) and DDS Security's builtin plugins expect
(OMG DDS Security 1.1, §9.3): EC keys on prime256v1 in PKCS#8 PEM, X.509 certificates signed
with SHA-256 (a CA with ``basicConstraints=CA:TRUE``, an enclave's with the subject
``CN=<enclave>``), and documents signed as S/MIME (PKCS#7, detached, ``text/plain``:
``openssl smime -sign -text``), verified with ``openssl smime -verify``.
"""

from __future__ import annotations

import datetime
import email
import os
from pathlib import Path
import secrets
import shutil
import subprocess
import tempfile
from typing import Sequence

CURVE = 'prime256v1'
_DATE_FORMAT = '%b %d %H:%M:%S %Y %Z'
"""How ``openssl x509 -startdate`` prints a time (``Nov 25 10:00:00 2026 GMT``)."""


class PkiError(RuntimeError):
    """openssl is missing or refused a step (the message has its own words)."""


def openssl(args: Sequence[str], *, stdin: bytes | None = None) -> bytes:
    """
    Run ``openssl ARGS`` and return its stdout.

    :raises PkiError: no ``openssl`` on PATH, or it exited non-zero (its stderr is quoted).
    """
    exe = shutil.which('openssl')
    if exe is None:
        raise PkiError('openssl is not installed (Debian/Ubuntu: apt install openssl)')
    proc = subprocess.run([exe, *args], input=stdin, capture_output=True,
                          env=dict(os.environ, LC_ALL='C'))
    if proc.returncode != 0:
        err = proc.stderr.decode(errors='replace').strip()
        raise PkiError(f'openssl {args[0]} failed ({proc.returncode}): {err}')
    return proc.stdout


def new_key(path: Path) -> None:
    """Write a new EC private key (prime256v1, PKCS#8 PEM), readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    old = os.umask(0o077)
    try:
        openssl(['genpkey', '-algorithm', 'EC', '-pkeyopt', f'ec_paramgen_curve:{CURVE}',
                 '-out', str(path)])
    finally:
        os.umask(old)
    path.chmod(0o600)


def _config(common_name: str, extensions: str) -> str:
    """Return an ``openssl req`` configuration with the subject ``CN=common_name``."""
    if any(c in common_name for c in '\n$"\\'):
        raise ValueError(f'common name {common_name!r} holds a character openssl configs treat '
                         'specially')
    return ('[req]\nprompt = no\ndistinguished_name = dn\n'
            f'[dn]\nCN = {common_name}\n[ext]\n{extensions}\n')


def _days(days: int) -> str:
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise ValueError(f'days must be a positive integer, got {days!r}')
    return str(days)


def self_signed_ca(key: Path, cert: Path, common_name: str, days: int) -> None:
    """
    Write a CA certificate for ``key``, self-signed, valid ``days`` from now.

    :raises PkiError: openssl refused.
    """
    ext = ('basicConstraints = critical, CA:TRUE, pathlen:1\n'
           'keyUsage = critical, digitalSignature, keyCertSign, cRLSign\n'
           'subjectKeyIdentifier = hash')
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / 'req.cnf'
        cfg.write_text(_config(common_name, ext))
        openssl(['req', '-x509', '-new', '-key', str(key), '-sha256', '-days', _days(days),
                 '-config', str(cfg), '-extensions', 'ext',
                 '-set_serial', f'0x{secrets.token_hex(16)}', '-out', str(cert)])


def issue_certificate(ca_cert: Path, ca_key: Path, key: Path, cert: Path, common_name: str,
                      days: int) -> None:
    """
    Write a certificate for ``key`` with the subject ``CN=common_name``, signed by the CA.

    :raises PkiError: openssl refused (e.g. the CA key does not match its certificate).
    """
    ext = 'basicConstraints = CA:FALSE'
    with tempfile.TemporaryDirectory() as tmp:
        cfg, csr = Path(tmp) / 'req.cnf', Path(tmp) / 'req.csr'
        cfg.write_text(_config(common_name, ext))
        openssl(['req', '-new', '-key', str(key), '-config', str(cfg), '-out', str(csr)])
        openssl(['x509', '-req', '-in', str(csr), '-CA', str(ca_cert), '-CAkey', str(ca_key),
                 '-sha256', '-days', _days(days), '-set_serial', f'0x{secrets.token_hex(16)}',
                 '-extfile', str(cfg), '-extensions', 'ext', '-out', str(cert)])


def sign(cert: Path, key: Path, document: Path, signed: Path) -> None:
    """Write ``document`` signed with the CA ``cert``/``key`` as S/MIME (``signed``)."""
    openssl(['smime', '-sign', '-text', '-md', 'sha256', '-in', str(document),
             '-signer', str(cert), '-inkey', str(key), '-out', str(signed)])


def verify(ca_cert: Path, signed: Path) -> bytes:
    """
    Return the document of an S/MIME file whose signature chains to ``ca_cert``.

    The signed text travels with CRLF line ends (S/MIME's canonical form); they come back as
    LF, as the document was written.

    :raises PkiError: the signature does not verify (tampered, another CA, malformed).
    """
    out = openssl(['smime', '-verify', '-text', '-in', str(signed), '-CAfile', str(ca_cert)])
    return out.replace(b'\r\n', b'\n')


def signed_content(signed: Path) -> bytes:
    """
    Return the document an S/MIME file carries, without checking its signature.

    What the middleware reads (and verifies itself) from ``permissions.p7s``; LF line ends.

    :raises PkiError: not an S/MIME ``multipart/signed`` file with a ``text/plain`` part.
    :raises OSError: the file cannot be read.
    """
    message = email.message_from_bytes(signed.read_bytes())
    parts = message.get_payload() if message.is_multipart() and \
        message.get_content_type() == 'multipart/signed' else []
    if not parts or parts[0].get_content_type() != 'text/plain':
        raise PkiError(f'{signed} is not an S/MIME signed text (openssl smime -sign -text)')
    return parts[0].get_payload(decode=True).replace(b'\r\n', b'\n')


def verify_certificate(ca_cert: Path, cert: Path) -> bool:
    """Return whether ``cert`` is signed by ``ca_cert`` and valid now."""
    try:
        openssl(['verify', '-CAfile', str(ca_cert), str(cert)])
    except PkiError:
        return False
    return True


def validity(cert: Path) -> tuple[datetime.datetime, datetime.datetime]:
    """Return a certificate's ``(not_before, not_after)`` as aware UTC datetimes."""
    out = openssl(['x509', '-in', str(cert), '-noout', '-startdate', '-enddate']).decode()
    dates = dict(line.split('=', 1) for line in out.splitlines() if '=' in line)
    return tuple(datetime.datetime.strptime(dates[k].strip(), _DATE_FORMAT).replace(
        tzinfo=datetime.timezone.utc) for k in ('notBefore', 'notAfter'))


def subject(cert: Path) -> str:
    """Return a certificate's subject in RFC 2253 form (``CN=/oxygen_ros/oxygen``)."""
    out = openssl(['x509', '-in', str(cert), '-noout', '-subject', '-nameopt', 'RFC2253'])
    return out.decode().strip().removeprefix('subject=')


__all__ = ['CURVE', 'PkiError', 'issue_certificate', 'new_key', 'openssl', 'self_signed_ca',
           'sign', 'signed_content', 'subject', 'validity', 'verify', 'verify_certificate']
