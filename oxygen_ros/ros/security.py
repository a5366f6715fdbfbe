"""
DDS security as the node starts: on with everything it needs, or off, never half.

rcl reads the environment (rcl ``security.c``): ``ROS_SECURITY_ENABLE`` turns security on
only for the exact value ``true``; ``ROS_SECURITY_STRATEGY`` is ``Enforce`` only for that
exact value, anything else (unset too) is Permissive, which starts a participant *without*
security when the enclave is missing or unusable; the enclave (``--ros-args --enclave``, or
``ROS_SECURITY_ENCLAVE_OVERRIDE`` which wins, default ``/``) is the folder
``$ROS_SECURITY_KEYSTORE/enclaves/<enclave>``. The node refuses to start, with one message
that says what is wrong and how to fix it, when security is asked for and would not hold:
a value of ``ROS_SECURITY_ENABLE`` rcl reads as off, a strategy other than Enforce, no
keystore, no enclave, an enclave folder without its files, or (seen when the participant is
created) a middleware without the DDS security plugins, such as the ROS 2 wheels from PyPI.
docs/security.md has the whole story.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

ENABLE_VAR = 'ROS_SECURITY_ENABLE'
STRATEGY_VAR = 'ROS_SECURITY_STRATEGY'
KEYSTORE_VAR = 'ROS_SECURITY_KEYSTORE'
ENCLAVE_OVERRIDE_VAR = 'ROS_SECURITY_ENCLAVE_OVERRIDE'
ENFORCE = 'Enforce'
ENCLAVE_ROOT = '/oxygen_ros'
"""Where ``oxygen_keystore create`` puts its enclaves (``<root>/<role>``) by default."""
NODE_ENCLAVE = f'{ENCLAVE_ROOT}/oxygen'
"""The node's enclave in such a keystore."""
OPERATOR_ENCLAVE = f'{ENCLAVE_ROOT}/operator'
"""The operator's (``oxygen_ask``, the demo's questions)."""
OBSERVER_ENCLAVE = f'{ENCLAVE_ROOT}/observer'
"""The observer's (the demo's recorder)."""
ROBOT_ENCLAVE = f'{ENCLAVE_ROOT}/robot'
"""The robot drivers' (the demo's bag replay, the simulator)."""
ENCLAVE_FILES = ('cert.pem', 'key.pem', 'identity_ca.cert.pem', 'permissions_ca.cert.pem',
                 'governance.p7s', 'permissions.p7s')
"""What rmw_fastrtps reads from an enclave folder."""
NO_PLUGINS_MARKER = "doesn't have the security libraries"
"""rmw_fastrtps' error when Fast DDS was built without ``-DSECURITY=ON`` (the PyPI wheels)."""
_FALSE_VALUES = ('', 'false')


def enclave_argument(args: Sequence[str]) -> str | None:
    """Return the value of the last ``--enclave`` / ``-e`` inside ``--ros-args`` sections."""
    enclave, inside = None, False
    it = iter(args)
    for arg in it:
        if arg == '--ros-args':
            inside = True
        elif arg == '--':
            inside = False
        elif inside and arg in ('-e', '--enclave'):
            enclave = next(it, None)
        elif inside and arg.startswith('--enclave='):
            enclave = arg.split('=', 1)[1]
    return enclave


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    """
    What rcl will make of the environment and the ROS arguments.

    :ivar enable: the raw ``ROS_SECURITY_ENABLE`` value.
    :ivar strategy: the raw ``ROS_SECURITY_STRATEGY`` value.
    :ivar enclave: the enclave rcl looks up (override first, then ``--enclave``, else ``/``).
    :ivar enclave_given: an enclave was named (``--enclave`` or the override).
    """

    enable: str = ''
    strategy: str = ''
    keystore: str = ''
    enclave: str = '/'
    enclave_given: bool = False

    @classmethod
    def from_environment(cls, args: Sequence[str], environ: Mapping[str, str]
                         ) -> SecuritySettings:
        """Read the settings rcl will use for a process started with ``args``."""
        override = environ.get(ENCLAVE_OVERRIDE_VAR, '')
        argument = enclave_argument(args)
        enclave = override or argument or '/'
        return cls(environ.get(ENABLE_VAR, ''), environ.get(STRATEGY_VAR, ''),
                   environ.get(KEYSTORE_VAR, ''), enclave, bool(override or argument))

    @property
    def enabled(self) -> bool:
        """Return whether rcl turns security on (``ROS_SECURITY_ENABLE`` is exactly ``true``)."""
        return self.enable == 'true'

    @property
    def enclave_dir(self) -> Path:
        """Return the folder rcl reads the enclave from."""
        return Path(self.keystore) / 'enclaves' / self.enclave.strip('/')

    def problem(self, enclave_hint: str = NODE_ENCLAVE) -> str | None:
        """
        Return why starting would not be secure as asked (one message), or None.

        :param enclave_hint: the enclave the message suggests (the program's role).
        """
        fix_enclave = f'--ros-args --enclave {enclave_hint}'
        if enclave_hint == NODE_ENCLAVE:
            fix_enclave += f' (launch: enclave:={NODE_ENCLAVE})'
        if not self.enabled:
            if self.enable.strip().lower() in _FALSE_VALUES:
                return None
            return (f'{ENABLE_VAR}={self.enable!r}: rcl turns DDS security on only for the exact '
                    f"value 'true' and would start this node without it. Set {ENABLE_VAR}=true "
                    '(or unset it to run unsecured, docs/security.md)')
        if self.strategy != ENFORCE:
            shown = repr(self.strategy) if self.strategy else 'unset (Permissive)'
            return (f'{ENABLE_VAR}=true but {STRATEGY_VAR} is {shown}: with Permissive a missing '
                    'or unusable enclave starts the node without security. Set '
                    f'{STRATEGY_VAR}={ENFORCE}')
        if not self.keystore:
            return (f'{ENABLE_VAR}=true but {KEYSTORE_VAR} is not set: make a keystore with '
                    f'oxygen_keystore create DIR and export {KEYSTORE_VAR}=DIR')
        if not self.enclave_given:
            return f'{ENABLE_VAR}=true but no enclave was given: start with {fix_enclave}'
        folder = self.enclave_dir
        if not folder.is_dir():
            return (f'enclave {self.enclave}: {folder} does not exist in the keystore '
                    f'{self.keystore}. Make it with oxygen_keystore create {self.keystore}, or '
                    f'start with {fix_enclave}')
        missing = [name for name in ENCLAVE_FILES if not (folder / name).is_file()]
        if missing:
            return (f'enclave {self.enclave}: {folder} lacks {", ".join(missing)}. Make it again '
                    f'with oxygen_keystore create {self.keystore}')
        return None

    def middleware_failure(self, error: BaseException) -> str:
        """Return the message for a participant that could not be created with security on."""
        text = ' '.join(str(error).split())
        if NO_PLUGINS_MARKER in text:
            return ('DDS security is enabled but this middleware has no security plugins '
                    f'("This Fast DDS version {NO_PLUGINS_MARKER}"): the ROS 2 wheels from PyPI '
                    'are built without them. Install ROS 2 from the official packages (Fast DDS '
                    f'built with -DSECURITY=ON, e.g. apt install ros-jazzy-ros-base), or unset '
                    f'{ENABLE_VAR} to run unsecured (docs/security.md)')
        return (f'DDS security is enabled but the middleware could not create a secure '
                f'participant for enclave {self.enclave} ({self.enclave_dir}): {text}. Check '
                f'the enclave with oxygen_keystore create {self.keystore} (docs/security.md)')

    def describe(self) -> str:
        """Return one line for the log and ``/diagnostics``: ``off`` or ``enforce, enclave X``."""
        if not self.enabled:
            return 'off'
        return f'enforce, enclave {self.enclave}'

    def start_line(self, domain_id: int) -> str:
        """Return the line the node logs at configure: security on (and where) or off."""
        if self.enabled:
            return f'DDS security: {self.describe()} (keystore {self.keystore})'
        return (f'DDS security off: any participant on ROS domain {domain_id} can send '
                'instructions and read the outputs (docs/security.md)')


__all__ = ['ENABLE_VAR', 'ENCLAVE_FILES', 'ENCLAVE_OVERRIDE_VAR', 'ENCLAVE_ROOT', 'ENFORCE',
           'KEYSTORE_VAR', 'NODE_ENCLAVE', 'NO_PLUGINS_MARKER', 'OBSERVER_ENCLAVE',
           'OPERATOR_ENCLAVE', 'ROBOT_ENCLAVE', 'STRATEGY_VAR', 'SecuritySettings',
           'enclave_argument']
