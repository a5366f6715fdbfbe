"""
The ``oxygen_serve`` command: its help, the starts it refuses, and a real start and stop.

A real start serves openpi's client the engine's actions (the same seed, so the same random
weights and noise, in another process), answers ``/healthz``, and stops cleanly on SIGTERM.
"""

import os
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
from oxygen_ros.serve.auth import API_KEY_ENV
from oxygen_ros.serve.layouts import Layout
from serve_helpers import engine_for, engine_observation, openpi_client, openpi_observation

SERVE = [sys.executable, '-m', 'oxygen_ros.serve']
KEY = 'cli-test-key-0123456789abcdef'


def run(*args, env=None, timeout=120):
    return subprocess.run([*SERVE, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_help_says_the_protocol_the_keys_and_the_security():
    out = run('--help').stdout
    for phrase in ('openpi_client.WebsocketClientPolicy', 'GET /healthz', 'language_requests',
                   'observation/exterior_image_1_left', 'cam_high', '--api-key-file',
                   API_KEY_ENV, '--client-ca', 'binds 127.0.0.1 unless --host',
                   '--max-connections', '--idle-timeout', 'docs/serving.md'):
        assert phrase in out, phrase


def test_a_network_bind_without_credentials_is_refused_at_start():
    start = time.monotonic()
    proc = run('--host', '0.0.0.0', '--preset', 'tiny', '--layout', 'droid')
    assert proc.returncode == 2
    assert "refused to start: --host '0.0.0.0' is reachable from the network, and the " \
        'server would take commands from anyone there: give an API key' in proc.stderr
    assert time.monotonic() - start < 60             # before any model is built


def test_other_refused_starts_say_why():
    cases = [(['--api-key', KEY], 'is not taken on the command line'),
             (['--preset', 'tiny'], 'preset tiny is no robot of its own: give --layout'),
             (['--preset', 'pi05_droid', '--layout', 'aloha'], 'sends a state of 14 dims'),
             (['--preset', 'tiny', '--layout', 'droid', '--client-ca', 'ca.pem'],
              '--keyfile and --client-ca need --certfile'),
             (['--preset', 'tiny', '--layout', 'droid', '--max-connections', '0'],
              'max_connections must be >= 1')]
    for args, message in cases:
        proc = run(*args)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
    proc = run('--preset', 'tiny', '--layout', 'droid', env={API_KEY_ENV: 'short'})
    assert proc.returncode == 2 and 'at least 16 characters' in proc.stderr


def test_a_real_start_serves_openpis_client_and_stops_on_sigterm(tokenizer):
    proc = subprocess.Popen(
        [*SERVE, '--preset', 'tiny', '--layout', 'libero', '--port', '0', '--seed', '3'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, API_KEY_ENV: KEY})
    try:
        line = proc.stdout.readline()
        assert line.startswith('oxygen_serve: listening on ws://127.0.0.1:'), \
            line + proc.stderr.read() if not line else line
        port = int(line.split('ws://127.0.0.1:')[1].split()[0])
        with urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=10) as r:
            assert r.read() == b'OK\n'
        obs = openpi_observation(Layout.LIBERO, 0)
        with openpi_client(port, api_key=KEY) as client:
            assert client.get_server_metadata()['security']['api_key'] is True
            actions = client.infer(obs)['actions']
        want = engine_for(Layout.LIBERO, tokenizer).step(engine_observation(Layout.LIBERO, obs))
        np.testing.assert_allclose(actions, want.action.actions, rtol=0, atol=1e-6)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert 'served 1 frame(s); refusals: none' in err
