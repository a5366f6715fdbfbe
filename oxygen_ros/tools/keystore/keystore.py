"""
A keystore in the sros2 layout: create or refresh it, and copy enclaves out of it for a robot.

Layout (sros2 ``keystore/_keystore.py``, ``_enclave.py``; what rcl and rmw read)::

    KEYSTORE/public/identity_ca.cert.pem     the CA that signs the enclaves' certificates
    KEYSTORE/public/permissions_ca.cert.pem  the CA that signs governance and permissions
    KEYSTORE/private/identity_ca.key.pem     their keys (0600, in a 0700 folder): never on a
    KEYSTORE/private/permissions_ca.key.pem  robot, never in git (docs/security.md)
    KEYSTORE/enclaves/governance.xml, governance.p7s
    KEYSTORE/enclaves/<enclave>/cert.pem, key.pem, permissions.xml, permissions.p7s,
        identity_ca.cert.pem, permissions_ca.cert.pem, governance.p7s   (the last three are
        relative links into public/ and enclaves/)

``create_keystore`` keeps what is there and still good (the CAs, an enclave's key and
certificate while the identity CA verifies it and it is valid for more than ``RENEW_DAYS``),
and always rewrites and re-signs governance and permissions, so running it again after a
remapping or a new domain id updates the grants without new identities. The identity and
permissions CAs are two keys, as DDS Security allows (sros2 makes one and links it twice).
"""

from __future__ import annotations

from dataclasses import dataclass
import datetime
import os
from pathlib import Path
import shutil
from typing import Sequence
from xml.etree import ElementTree

from oxygen_ros.ros.security import ENCLAVE_FILES as RMW_ENCLAVE_FILES
from oxygen_ros.tools.keystore import pki
from oxygen_ros.tools.keystore.documents import governance_xml, permissions_xml
from oxygen_ros.tools.keystore.policy import Grant

PUBLIC, PRIVATE, ENCLAVES = 'public', 'private', 'enclaves'
CAS = ('identity_ca', 'permissions_ca')
ENCLAVE_FILES = (*RMW_ENCLAVE_FILES, 'permissions.xml')
"""What an enclave folder holds (rmw_fastrtps reads all but permissions.xml)."""
RENEW_DAYS = 30
"""An enclave certificate valid for fewer days than this is renewed."""


class KeystoreError(ValueError):
    """A keystore that cannot be used or made as asked (the message says what to do)."""


@dataclass(frozen=True, slots=True)
class Step:
    """One thing ``create_keystore`` did: ``action`` is created, kept, renewed or signed."""

    path: Path
    action: str


def ca_paths(keystore: Path, ca: str) -> tuple[Path, Path]:
    """Return ``(certificate, key)`` of ``identity_ca`` or ``permissions_ca``."""
    return keystore / PUBLIC / f'{ca}.cert.pem', keystore / PRIVATE / f'{ca}.key.pem'


def enclave_dir(keystore: Path, enclave: str) -> Path:
    """Return the folder of an enclave: ``/oxygen_ros/oxygen`` → ``enclaves/oxygen_ros/oxygen``."""
    if not enclave.startswith('/') or enclave == '/' or '..' in enclave.split('/'):
        raise KeystoreError(f'enclave {enclave!r} must be an absolute path like '
                            '/oxygen_ros/oxygen')
    return keystore / ENCLAVES / enclave.strip('/')


def _link(target: Path, link: Path) -> None:
    """Make ``link`` a relative symbolic link to ``target`` (replacing what is there)."""
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(os.path.relpath(target, link.parent))


def _ensure_ca(keystore: Path, ca: str, days: int, steps: list[Step]) -> None:
    cert, key = ca_paths(keystore, ca)
    if cert.exists() and key.exists():
        if validity_left(cert) <= datetime.timedelta(0):
            raise KeystoreError(f'{cert} has expired: make a new keystore (every enclave needs '
                                'new certificates then)')
        steps.append(Step(cert, 'kept'))
        return
    if cert.exists() or key.exists():
        raise KeystoreError(f'{ca}: only one of {cert} and {key} exists; restore the other or '
                            'move the keystore aside and make a new one')
    pki.new_key(key)
    pki.self_signed_ca(key, cert, f'oxygen_ros {ca.replace("_", " ")}', days)
    steps += [Step(key, 'created'), Step(cert, 'created')]


def validity_left(cert: Path) -> datetime.timedelta:
    """Return how long a certificate stays valid (negative once expired)."""
    return pki.validity(cert)[1] - datetime.datetime.now(datetime.timezone.utc)


def _sign(keystore: Path, document: Path, signed: Path, steps: list[Step]) -> None:
    cert, key = ca_paths(keystore, 'permissions_ca')
    pki.sign(cert, key, document, signed)
    steps.append(Step(signed, 'signed'))


def _ensure_identity(keystore: Path, enclave: str, folder: Path, days: int, renew: bool,
                     steps: list[Step]) -> None:
    cert, key = folder / 'cert.pem', folder / 'key.pem'
    ca_cert, ca_key = ca_paths(keystore, 'identity_ca')
    if cert.exists() and key.exists() and not renew and pki.verify_certificate(ca_cert, cert) \
            and validity_left(cert) > datetime.timedelta(days=RENEW_DAYS) \
            and pki.subject(cert) == f'CN={enclave}':
        steps.append(Step(cert, 'kept'))
        return
    action = 'renewed' if cert.exists() else 'created'
    pki.new_key(key)
    pki.issue_certificate(ca_cert, ca_key, key, cert, enclave, days)
    steps += [Step(key, action), Step(cert, action)]


def create_keystore(keystore: Path, grants: Sequence[Grant], domain_id: int, *,
                    days: int = 365, ca_days: int = 3650, renew: bool = False) -> list[Step]:
    """
    Create or refresh a keystore with one enclave per grant.

    :param grants: the enclaves and what each may publish and subscribe.
    :param domain_id: the ROS domain governance and permissions are for.
    :param days: validity of new enclave certificates; permissions are valid as long as the
        certificate of their enclave.
    :param ca_days: validity of new CA certificates.
    :param renew: new keys and certificates for the enclaves even if theirs are still good.
    :returns: what was created, kept, renewed and signed, in order.
    :raises KeystoreError: half a CA, an expired CA, a bad enclave name.
    :raises pki.PkiError: openssl missing or refusing a step.
    """
    steps: list[Step] = []
    for sub in (PUBLIC, ENCLAVES):
        (keystore / sub).mkdir(parents=True, exist_ok=True)
    (keystore / PRIVATE).mkdir(mode=0o700, parents=True, exist_ok=True)
    (keystore / PRIVATE).chmod(0o700)
    for ca in CAS:
        _ensure_ca(keystore, ca, ca_days, steps)
    governance = keystore / ENCLAVES / 'governance.xml'
    governance.write_bytes(governance_xml(domain_id))
    steps.append(Step(governance, 'created'))
    _sign(keystore, governance, governance.with_suffix('.p7s'), steps)
    for grant in grants:
        folder = enclave_dir(keystore, grant.enclave)
        folder.mkdir(parents=True, exist_ok=True)
        for ca in CAS:
            _link(ca_paths(keystore, ca)[0], folder / f'{ca}.cert.pem')
        _link(governance.with_suffix('.p7s'), folder / 'governance.p7s')
        _ensure_identity(keystore, grant.enclave, folder, days, renew, steps)
        not_before, not_after = pki.validity(folder / 'cert.pem')
        permissions = folder / 'permissions.xml'
        permissions.write_bytes(permissions_xml(grant, domain_id, not_before, not_after))
        steps.append(Step(permissions, 'created'))
        _sign(keystore, permissions, folder / 'permissions.p7s', steps)
    return steps


def check_enclave(keystore: Path, enclave: str) -> list[str]:
    """Return the files of ``ENCLAVE_FILES`` an enclave folder lacks (links must resolve)."""
    folder = enclave_dir(keystore, enclave)
    return [name for name in ENCLAVE_FILES if not (folder / name).is_file()]


def deploy(keystore: Path, out: Path, enclaves: Sequence[str]) -> list[Path]:
    """
    Copy what a machine needs to run ``enclaves`` into a new keystore ``out``.

    ``out`` gets ``public/``, the governance files and those enclaves, with their links, and no
    ``private/`` (no CA key leaves the keystore) and no other enclave's key.

    :returns: the files written.
    :raises KeystoreError: ``out`` exists and is not empty, or an enclave is missing files.
    """
    if out.exists() and any(out.iterdir()):
        raise KeystoreError(f'{out} exists and is not empty: give a new folder')
    if not enclaves:
        raise KeystoreError('name at least one enclave to deploy (--enclave)')
    for enclave in enclaves:
        missing = check_enclave(keystore, enclave)
        if missing:
            raise KeystoreError(f'enclave {enclave} in {keystore} lacks {", ".join(missing)} '
                                '(oxygen_keystore create makes it)')
    written = []
    for ca in CAS:
        written.append(_copy(ca_paths(keystore, ca)[0], ca_paths(out, ca)[0]))
    for name in ('governance.xml', 'governance.p7s'):
        written.append(_copy(keystore / ENCLAVES / name, out / ENCLAVES / name))
    for enclave in enclaves:
        src, dst = enclave_dir(keystore, enclave), enclave_dir(out, enclave)
        dst.mkdir(parents=True)
        for name in ('cert.pem', 'key.pem', 'permissions.xml', 'permissions.p7s'):
            written.append(_copy(src / name, dst / name))
        (dst / 'key.pem').chmod(0o600)
        for ca in CAS:
            _link(ca_paths(out, ca)[0], dst / f'{ca}.cert.pem')
        _link(out / ENCLAVES / 'governance.p7s', dst / 'governance.p7s')
    return written


def _copy(src: Path, dst: Path) -> Path:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)
    return dst


def keystore_domain_id(keystore: Path) -> int | None:
    """Return the ROS domain a keystore's governance is for (None: no readable governance)."""
    try:
        root = ElementTree.parse(keystore / ENCLAVES / 'governance.xml').getroot()
        return int(root.findtext('domain_access_rules/domain_rule/domains/id'))
    except (OSError, ElementTree.ParseError, TypeError, ValueError):
        return None


def git_work_tree(path: Path) -> Path | None:
    """Return the git work tree that holds ``path`` (or would), None if there is none."""
    for parent in [path.resolve(), *path.resolve().parents]:
        if (parent / '.git').exists():
            return parent
    return None


__all__ = ['CAS', 'ENCLAVE_FILES', 'KeystoreError', 'RENEW_DAYS', 'Step', 'ca_paths',
           'check_enclave', 'create_keystore', 'deploy', 'enclave_dir', 'git_work_tree',
           'keystore_domain_id', 'validity_left']
