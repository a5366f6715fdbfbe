"""
oxygen_keystore: the sros2 layout and signatures that the openssl command verifies.

Also the grants of each role, a second run after a remapping, deploy without CA keys, and the
CLI's errors.
"""

from fnmatch import fnmatchcase
import json
import os
from pathlib import Path
import shutil
import subprocess
import sys
from xml.etree import ElementTree as ET

from oxygen_ros.ros.security import (
    NODE_ENCLAVE, OBSERVER_ENCLAVE, OPERATOR_ENCLAVE, ROBOT_ENCLAVE, SecuritySettings)
from oxygen_ros.tools.keystore import pki
from oxygen_ros.tools.keystore.coverage import keystore_problem
from oxygen_ros.tools.keystore.documents import granted_topics
from oxygen_ros.tools.keystore.policy import DEFAULT_ENCLAVE_ROOT, Role
import pytest

ENCLAVES = (NODE_ENCLAVE, OPERATOR_ENCLAVE, OBSERVER_ENCLAVE, ROBOT_ENCLAVE)
OPENSSL = shutil.which('openssl')
pytestmark = pytest.mark.skipif(OPENSSL is None, reason='needs the openssl command')


def keystore_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-m', 'oxygen_ros.tools.keystore', *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope='module')
def keystore(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp('ks') / 'keystore'
    proc = keystore_cli('create', str(path), '--domain-id', '7', '--preset', 'demo',
                        '--ros-args', '-r', '/camera/base/image_raw:=/zed/left')
    assert proc.returncode == 0, proc.stderr
    return path


def enclave_dir(keystore: Path, enclave: str) -> Path:
    return keystore / 'enclaves' / enclave.strip('/')


def openssl_smime_verify(signed: Path, ca: Path) -> subprocess.CompletedProcess:
    return subprocess.run([OPENSSL, 'smime', '-verify', '-text', '-in', str(signed),
                           '-CAfile', str(ca)], capture_output=True)


def allowed(permissions: Path, side: str, topic: str) -> bool:
    """Decide as DDS Security does: the first rule whose topics match (fnmatch), else DENY."""
    root = ET.parse(permissions).getroot()
    [grant] = root.iter('grant')
    for rule in grant:
        if rule.tag in ('allow_rule', 'deny_rule'):
            patterns = [t.text for t in rule.iterfind(f'{side}/topics/topic')]
            if any(fnmatchcase(topic, p) for p in patterns):
                return rule.tag == 'allow_rule'
    return grant.find('default').text == 'ALLOW'


def test_the_keystore_has_the_sros2_layout(keystore):
    # what sros2's is_valid_keystore checks, so `ros2 security create_enclave` works on it
    for rel in ('public/permissions_ca.cert.pem', 'public/identity_ca.cert.pem',
                'private/permissions_ca.key.pem', 'private/identity_ca.key.pem',
                'enclaves/governance.p7s', 'enclaves/governance.xml'):
        assert (keystore / rel).is_file(), rel
    assert (keystore / 'private').stat().st_mode & 0o777 == 0o700
    for key in (keystore / 'private').iterdir():
        assert key.stat().st_mode & 0o777 == 0o600, key
    for enclave in ENCLAVES:
        folder = enclave_dir(keystore, enclave)
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            ['cert.pem', 'key.pem', 'governance.p7s', 'identity_ca.cert.pem',
             'permissions_ca.cert.pem', 'permissions.xml', 'permissions.p7s'])
        assert (folder / 'key.pem').stat().st_mode & 0o777 == 0o600
        for link, target in (('identity_ca.cert.pem', 'public/identity_ca.cert.pem'),
                             ('permissions_ca.cert.pem', 'public/permissions_ca.cert.pem'),
                             ('governance.p7s', 'enclaves/governance.p7s')):
            assert (folder / link).is_symlink() and not os.readlink(folder / link).startswith('/')
            assert (folder / link).resolve() == (keystore / target).resolve()
        # what the node checks before it starts
        settings = SecuritySettings('true', 'Enforce', str(keystore), enclave, True)
        assert settings.problem() is None
    assert [r.enclave(DEFAULT_ENCLAVE_ROOT) for r in Role] == list(ENCLAVES)


def test_signatures_verify_with_openssl_and_only_with_the_permissions_ca(keystore, tmp_path):
    permissions_ca = keystore / 'public' / 'permissions_ca.cert.pem'
    documents = [(keystore / 'enclaves' / 'governance.p7s', keystore / 'enclaves' /
                  'governance.xml')]
    documents += [(enclave_dir(keystore, e) / 'permissions.p7s',
                   enclave_dir(keystore, e) / 'permissions.xml') for e in ENCLAVES]
    for signed, xml in documents:
        proc = openssl_smime_verify(signed, permissions_ca)
        assert proc.returncode == 0, proc.stderr
        assert b'Verification successful' in proc.stderr
        assert proc.stdout.replace(b'\r\n', b'\n') == xml.read_bytes()
        assert pki.verify(permissions_ca, signed) == xml.read_bytes()
        # the identity CA did not sign it
        wrong = openssl_smime_verify(signed, keystore / 'public' / 'identity_ca.cert.pem')
        assert wrong.returncode != 0 and b'Verification failure' in wrong.stderr
    # one changed byte in the signed document: the signature no longer verifies
    signed = enclave_dir(keystore, OBSERVER_ENCLAVE) / 'permissions.p7s'
    tampered = tmp_path / 'tampered.p7s'
    tampered.write_bytes(signed.read_bytes().replace(b'<default>DENY</default>',
                                                     b'<default>ALLOW</default>'))
    proc = openssl_smime_verify(tampered, permissions_ca)
    assert proc.returncode != 0 and b'Verification failure' in proc.stderr
    with pytest.raises(pki.PkiError, match='openssl smime failed'):
        pki.verify(permissions_ca, tampered)


def test_enclave_certificates_name_their_enclave_and_bound_their_permissions(keystore):
    identity_ca = keystore / 'public' / 'identity_ca.cert.pem'
    governance = ET.parse(keystore / 'enclaves' / 'governance.xml').getroot()
    assert governance.find('domain_access_rules/domain_rule/domains/id').text == '7'
    rule = governance.find('domain_access_rules/domain_rule')
    assert rule.find('allow_unauthenticated_participants').text == 'false'
    assert rule.find('discovery_protection_kind').text == 'ENCRYPT'
    topic_rule = rule.find('topic_access_rules/topic_rule')
    assert topic_rule.find('data_protection_kind').text == 'ENCRYPT'
    assert topic_rule.find('enable_write_access_control').text == 'true'
    for enclave in ENCLAVES:
        folder = enclave_dir(keystore, enclave)
        proc = subprocess.run([OPENSSL, 'verify', '-CAfile', str(identity_ca),
                               str(folder / 'cert.pem')], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert pki.subject(folder / 'cert.pem') == f'CN={enclave}'
        not_before, not_after = pki.validity(folder / 'cert.pem')
        assert 364 <= (not_after - not_before).days <= 366            # --days 365
        grant = ET.parse(folder / 'permissions.xml').getroot().find('permissions/grant')
        assert grant.get('name') == enclave
        assert grant.find('subject_name').text == f'CN={enclave}'
        assert grant.find('validity/not_before').text == not_before.strftime('%Y-%m-%dT%H:%M:%S')
        assert grant.find('validity/not_after').text == not_after.strftime('%Y-%m-%dT%H:%M:%S')
        assert {d.text for d in grant.iter('id')} == {'7'}
        assert grant.find('default').text == 'DENY'


def test_each_role_may_do_what_it_is_for_and_nothing_more(keystore):
    node, operator, observer, robot = (enclave_dir(keystore, e) / 'permissions.xml'
                                       for e in ENCLAVES)
    command = ('rt/oxygen/instruction', 'rt/oxygen/ask',
               'rq/oxygen/ask/_action/send_goalRequest', 'rq/oxygen/change_stateRequest',
               'rq/oxygen/set_parametersRequest')
    for topic in command:
        assert allowed(operator, 'publish', topic), topic
        assert not allowed(observer, 'publish', topic), topic
        assert not allowed(robot, 'publish', topic), topic
        assert allowed(node, 'subscribe', topic), topic
    outputs = ('rt/oxygen/action_chunk', 'rt/oxygen/answer', 'rt/oxygen/answer/stream',
               'rt/diagnostics', 'rt/oxygen/ask/_action/feedback')
    for topic in outputs:
        assert allowed(node, 'publish', topic), topic
        assert allowed(operator, 'subscribe', topic), topic
        assert not allowed(operator, 'publish', topic), topic
    for topic in ('rt/oxygen/action_chunk', 'rt/oxygen/answer', 'rt/diagnostics'):
        assert allowed(observer, 'subscribe', topic), topic
    assert not allowed(observer, 'subscribe', 'rt/oxygen/ask/_action/feedback')
    # the robot: the cameras (remapped: /zed/left) and joint states in, the chunks out
    for topic in ('rt/zed/left', 'rt/camera/left_wrist/image_raw', 'rt/joint_states'):
        assert allowed(robot, 'publish', topic) and allowed(node, 'subscribe', topic)
    assert not allowed(node, 'subscribe', 'rt/camera/base/image_raw')     # the old name
    assert allowed(robot, 'subscribe', 'rt/oxygen/action_chunk')
    assert not allowed(robot, 'subscribe', 'rt/oxygen/answer')
    # every client runs a ROS node: its own parameter services under any name ...
    for client in (operator, observer, robot):
        assert allowed(client, 'subscribe', 'rq/_ros2cli_42/get_parametersRequest')
        assert allowed(client, 'publish', 'rr/oxygen_ask/get_parametersReply')
        assert allowed(client, 'publish', 'rt/rosout')
        # ... but never the node's side of the node's services
        assert not allowed(client, 'subscribe', 'rq/oxygen/set_parametersRequest')
        assert not allowed(client, 'publish', 'rr/oxygen/get_parametersReply')
        assert not allowed(client, 'publish', 'rr/oxygen/ask/_action/send_goalReply')
    # nobody else may speak for the node
    for client in (operator, observer, robot):
        assert not allowed(client, 'publish', 'rt/oxygen/action_chunk')
        assert not allowed(client, 'publish', 'rt/oxygen/transition_event')
    # the node: no wildcard, nothing it does not create
    topics = granted_topics(node.read_bytes())
    assert set(topics) == {'allow_rule'}
    assert not [t for side in topics['allow_rule'].values() for t in side if '*' in t]


def test_every_client_may_run_an_rclcpp_node_or_a_lifecycle_controller(keystore):
    # what rclcpp's Node (its time source subscribes to /parameter_events) and a lifecycle
    # node (ros2_control's controllers, with logger services) create at start, under its name
    controller = 'rq/arm/joint_trajectory_controller'
    for enclave in (OPERATOR_ENCLAVE, OBSERVER_ENCLAVE, ROBOT_ENCLAVE):
        client = enclave_dir(keystore, enclave) / 'permissions.xml'
        for topic in ('rt/parameter_events', 'rt/clock', f'{controller}/change_stateRequest',
                      f'{controller}/get_stateRequest', f'{controller}/get_logger_levelsRequest',
                      'rq/robot_state_publisher/get_type_descriptionRequest'):
            assert allowed(client, 'subscribe', topic), (enclave, topic)
        for topic in ('rt/rosout', 'rt/parameter_events',
                      'rt/arm/joint_trajectory_controller/transition_event',
                      'rr/arm/joint_trajectory_controller/get_transition_graphReply',
                      'rr/arm/joint_trajectory_controller/set_logger_levelsReply'):
            assert allowed(client, 'publish', topic), (enclave, topic)
        # never the node's own lifecycle, whatever the wildcards match
        assert not allowed(client, 'subscribe', 'rq/oxygen/change_stateRequest')
        assert not allowed(client, 'publish', 'rr/oxygen/get_available_statesReply')
    # a simulator or a robot driver: the clock, diagnostics and its own outputs, as oxygen_sim
    robot = enclave_dir(keystore, ROBOT_ENCLAVE) / 'permissions.xml'
    for topic in ('rt/clock', 'rt/diagnostics', 'rt/oxygen_sim/joint_command',
                  'rt/oxygen_sim/chunk_events'):
        assert allowed(robot, 'publish', topic), topic
    observer = enclave_dir(keystore, OBSERVER_ENCLAVE) / 'permissions.xml'
    assert not allowed(observer, 'publish', 'rt/diagnostics')
    assert not allowed(observer, 'publish', 'rt/oxygen_sim/joint_command')


def test_a_second_run_keeps_identities_and_rewrites_grants(keystore, tmp_path):
    copy = tmp_path / 'keystore'
    shutil.copytree(keystore, copy, symlinks=True)
    node_dir = enclave_dir(copy, NODE_ENCLAVE)
    cert, key = (node_dir / 'cert.pem').read_bytes(), (node_dir / 'key.pem').read_bytes()
    ca = (copy / 'public' / 'identity_ca.cert.pem').read_bytes()
    # the node is renamed into a namespace, its joint states remapped, another domain
    proc = keystore_cli('create', str(copy), '--domain-id', '9', '--preset', 'demo',
                        '--ros-args', '-r', '__ns:=/arm', '-r', '/joint_states:=/arm/joints')
    assert proc.returncode == 0, proc.stderr
    assert f'    kept  {node_dir / "cert.pem"}' in proc.stdout.splitlines()
    assert (node_dir / 'cert.pem').read_bytes() == cert
    assert (node_dir / 'key.pem').read_bytes() == key
    assert (copy / 'public' / 'identity_ca.cert.pem').read_bytes() == ca
    permissions = node_dir / 'permissions.xml'
    topics = granted_topics(permissions.read_bytes())['allow_rule']
    assert 'rt/arm/oxygen/action_chunk' in topics['publish']
    assert 'rt/arm/joints' in topics['subscribe']
    assert not [t for side in topics.values() for t in side if t.startswith('rt/oxygen/')
                or t == 'rt/joint_states']                       # nothing stale is left
    assert 'rt/zed/left' not in topics['subscribe']              # that remap is gone too
    assert {d.text for d in ET.parse(permissions).getroot().iter('id')} == {'9'}
    assert openssl_smime_verify(node_dir / 'permissions.p7s',
                                copy / 'public' / 'permissions_ca.cert.pem').returncode == 0
    proc = keystore_cli('create', str(copy), '--renew')
    assert proc.returncode == 0, proc.stderr
    assert (node_dir / 'cert.pem').read_bytes() != cert
    assert f' renewed  {node_dir / "cert.pem"}' in proc.stdout.splitlines()


def test_a_keystore_made_for_another_configuration_is_named_with_what_it_lacks(
        keystore, tmp_path):
    roles = {role: role.enclave() for role in Role}
    made_for = ['--ros-args', '-r', '/camera/base/image_raw:=/zed/left']
    assert keystore_problem(keystore, 'demo', made_for, roles) is None
    # the demo's own configuration: its base camera keeps the default name
    assert keystore_problem(keystore, 'demo', [], roles) == (
        f'the keystore {keystore} was made for another configuration of the node: enclave '
        '/oxygen_ros/oxygen lacks subscribe rt/camera/base/image_raw; enclave /oxygen_ros/robot '
        'lacks publish rt/camera/base/image_raw. Make it for this one: oxygen_keystore create '
        f'{keystore} --domain-id 7 --preset demo')
    # the command it names makes one that fits (on a copy; identities kept)
    copy = tmp_path / 'keystore'
    shutil.copytree(keystore, copy, symlinks=True)
    assert keystore_cli('create', str(copy), '--domain-id', '7', '--preset', 'demo',
                        '--ros-args', '-r', '__ns:=/arm').returncode == 0
    problem = keystore_problem(copy, 'demo', ['--ros-args', '-r', '__ns:=/arm'],
                               {Role.NODE: NODE_ENCLAVE})
    assert problem is None
    assert keystore_problem(copy, 'demo', [], {Role.NODE: NODE_ENCLAVE}).startswith(
        f'the keystore {copy} was made for another configuration of the node: enclave '
        '/oxygen_ros/oxygen lacks publish rr/oxygen/ask/_action/cancel_goalReply, ')
    # what the middleware reads is the signed document: without it, nothing is granted
    signed = enclave_dir(copy, NODE_ENCLAVE) / 'permissions.p7s'
    signed.write_bytes(b'not S/MIME')
    assert keystore_problem(copy, 'demo', ['--ros-args', '-r', '__ns:=/arm'],
                            {Role.NODE: NODE_ENCLAVE}) == (
        f'the keystore {copy} was made for another configuration of the node: enclave '
        f'/oxygen_ros/oxygen has no readable permissions ({signed} is not an S/MIME signed '
        'text (openssl smime -sign -text)). Make it for this one: oxygen_keystore create '
        f'{copy} --domain-id 7 --preset demo --ros-args -r __ns:=/arm')


def test_deploy_copies_enclaves_but_never_the_ca_keys(keystore, tmp_path):
    out = tmp_path / 'robot'
    proc = keystore_cli('deploy', str(keystore), str(out), '--enclave', NODE_ENCLAVE)
    assert proc.returncode == 0, proc.stderr
    files = sorted(str(p.relative_to(out)) for p in out.rglob('*') if not p.is_dir())
    assert files == sorted([
        'public/identity_ca.cert.pem', 'public/permissions_ca.cert.pem',
        'enclaves/governance.xml', 'enclaves/governance.p7s',
        *(f'enclaves/oxygen_ros/oxygen/{f}' for f in (
            'cert.pem', 'key.pem', 'permissions.xml', 'permissions.p7s', 'governance.p7s',
            'identity_ca.cert.pem', 'permissions_ca.cert.pem'))])
    assert not (out / 'private').exists()
    assert SecuritySettings('true', 'Enforce', str(out), NODE_ENCLAVE, True).problem() is None
    assert openssl_smime_verify(enclave_dir(out, NODE_ENCLAVE) / 'permissions.p7s',
                                out / 'public' / 'permissions_ca.cert.pem').returncode == 0
    again = keystore_cli('deploy', str(keystore), str(out), '--enclave', NODE_ENCLAVE)
    assert again.returncode == 1
    assert again.stderr == f'oxygen_keystore deploy: {out} exists and is not empty: give a ' \
                           'new folder\n'
    missing = keystore_cli('deploy', str(keystore), str(tmp_path / 'x'), '--enclave', '/nope')
    assert missing.returncode == 1
    assert missing.stderr.startswith(f'oxygen_keystore deploy: enclave /nope in {keystore} '
                                     'lacks cert.pem, key.pem,')


@pytest.mark.parametrize('args, error', [
    (['--domain-id', '233'], 'domain id must be an integer in [0, 232], got 233'),
    (['--preset', 'nope'], 'no params file'),
    (['--ros-args', '-r', '__ns:=relative'], "invalid namespace 'relative'"),
    (['--ros-args', '-r', '/joint_states:=/bad//name'],
     "invalid topic or service name '/bad//name'"),
    (['--ros-args', '-p', 'preset:=tiny', '-p', 'cameras:=[nose]'], 'cameras must be'),
    (['--ros-args', '--bogus'], "unknown ROS argument '--bogus'"),
    (['--enclave-root', 'oxygen_ros/'], "--enclave-root 'oxygen_ros/' must be an absolute path"),
])
def test_create_refuses_a_node_that_could_not_start(tmp_path, args, error):
    proc = keystore_cli('create', str(tmp_path / 'ks'), *args)
    assert proc.returncode == 1
    assert proc.stderr.startswith('oxygen_keystore create: ') and error in proc.stderr
    assert not (tmp_path / 'ks' / 'private').exists()


def test_create_warns_inside_a_git_work_tree(tmp_path):
    (tmp_path / '.git').mkdir()
    proc = keystore_cli('create', str(tmp_path / 'ks'), '--preset', 'demo',
                        env={'ROS_DOMAIN_ID': '12'})
    assert proc.returncode == 0
    assert f'WARNING: {tmp_path / "ks"} is inside the git work tree {tmp_path}' in proc.stderr
    assert 'on domain 12' in proc.stdout


def test_permissions_json_lists_endpoints_and_grants():
    proc = keystore_cli('permissions', '--json', '--preset', 'pi05_libero', '--ros-args',
                        '-p', 'use_sim_time:=true')
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out['node'] == '/oxygen'
    names = {(e['kind'], e['name']) for e in out['endpoints']}
    assert ('publisher', '/oxygen/ee_delta_chunk') in names       # libero: ee_delta
    assert ('subscription', '/clock') in names
    assert 'rt/clock' in out['grants'][ROBOT_ENCLAVE]['publish']
    assert set(out['grants']) == set(ENCLAVES)
