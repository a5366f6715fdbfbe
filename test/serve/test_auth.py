"""Who may connect: loopback, API keys from a file or the environment, the bind policy."""

import logging
import os

from oxygen_ros.serve.auth import (
    API_KEY_ENV, authorized, check_bind, InsecureBind, is_loopback, load_api_keys)
import pytest

KEY = 'a' * 20 + '0123456789'


@pytest.mark.parametrize('host, loopback', [
    ('127.0.0.1', True), ('127.8.9.1', True), ('::1', True), ('localhost', True),
    ('0.0.0.0', False), ('::', False), ('', False), ('192.168.1.20', False),
    ('no-such-host.invalid', False)])
def test_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_keys_come_from_a_file_and_the_environment(tmp_path, caplog):
    path = tmp_path / 'keys'
    path.write_text(f'# robot 1\n{KEY}\n\n  {KEY[::-1]}  \n')
    os.chmod(path, 0o600)
    assert load_api_keys(str(path), {}) == (KEY.encode(), KEY[::-1].encode())
    assert load_api_keys(None, {API_KEY_ENV: f' {KEY}\n'}) == (KEY.encode(),)
    assert load_api_keys(None, {}) == ()
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING, logger='oxygen_serve'):
        load_api_keys(str(path), {})
    assert 'can be read by other users (mode 644): chmod 600 it' in caplog.text


@pytest.mark.parametrize('content, match', [
    ('# only a comment\n', 'holds no key'), ('short\n', 'at least 16 characters'),
    (None, 'No such file')])
def test_bad_key_files_are_refused(tmp_path, content, match):
    path = tmp_path / 'keys'
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=match):
        load_api_keys(str(path), {})


def test_the_header_must_carry_one_allowed_key():
    keys = (KEY.encode(), b'b' * 32)
    assert authorized([f'Api-Key {KEY}'], keys) and authorized(['api-key ' + 'b' * 32], keys)
    for headers in ([], [f'Api-Key {KEY}x'], [f'Bearer {KEY}'], [KEY], [f'Api-Key {KEY}'] * 2,
                    ['Api-Key é'], ['Api-Key ']):
        assert not authorized(headers, keys), headers


def test_a_bind_reachable_from_the_network_needs_credentials(caplog):
    check_bind('127.0.0.1', api_keys=(), tls=False, client_certs=False)
    with pytest.raises(InsecureBind, match="--host '0.0.0.0' is reachable from the network"):
        check_bind('0.0.0.0', api_keys=(), tls=False, client_certs=False)
    with pytest.raises(InsecureBind, match='give an API key'):
        check_bind('::', api_keys=(), tls=True, client_certs=False)   # TLS alone: anyone
    check_bind('0.0.0.0', api_keys=(), tls=True, client_certs=True)
    with caplog.at_level(logging.WARNING, logger='oxygen_serve'):
        check_bind('0.0.0.0', api_keys=(KEY.encode(),), tls=False, client_certs=False)
    assert 'API keys cross the network in clear text' in caplog.text
