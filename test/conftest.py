"""
Shared fixtures: the tokenizer and random tiny models (built once per session, on demand).

Without CUDA, Triton kernels run in Triton's CPU interpreter: ``TRITON_INTERPRET=1`` is set
here, before anything imports Triton (Dynamo does), because Triton reads it where a kernel,
its own ``triton.language`` helpers included, is defined.
"""

import os

from oxygen_ros.backends.fast_path.compile_cache import COMPILE_CACHE_ENV
from oxygen_ros.config import PrefixAttention
from oxygen_ros.engine.config import EngineConfig
from oxygen_ros.engine.loading import build_model, load_tokenizer
from oxygen_ros.transforms.tokenizer import default_tokenizer_path, PaligemmaTokenizer
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')


@pytest.fixture(scope='session', autouse=True)
def session_compile_cache(tmp_path_factory):
    """
    Hold the fast path's compile caches in this session's temporary folder.

    Inductor's, the steps compiled ahead of time, the recorded gates: a test that counts
    compiles must not load what an earlier run left in ``~/.cache/oxygen_ros`` (seen: a second
    ``make test`` loaded the first one's decode and seed steps, and counted 0 compiles), nor
    fill it.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(COMPILE_CACHE_ENV, str(tmp_path_factory.mktemp('compile_cache')))
        yield


@pytest.fixture(scope='session')
def tokenizer():
    return load_tokenizer(EngineConfig(preset='tiny'))


@pytest.fixture(scope='session')
def tok() -> PaligemmaTokenizer:
    """Return the fetched PaliGemma tokenizer (``make test`` fetches it first)."""
    path = default_tokenizer_path()
    if not path.is_file():
        pytest.fail(f'{path} is missing: run `oxygen_fetch tokenizer` first (`make test` does)')
    return PaligemmaTokenizer(path)


@pytest.fixture(scope='session')
def tiny_models():
    """Random tiny models, keyed by (prefix attention mode, camera slots)."""
    cache = {}

    def get(mode: PrefixAttention, cameras: tuple[str, ...]):
        key = (mode, cameras)
        if key not in cache:
            cfg = EngineConfig(preset='tiny', prefix_attention=mode, cameras=cameras, seed=3)
            cache[key] = build_model(cfg, cfg.model_config())
        return cache[key]
    return get


@pytest.fixture
def fresh_dynamo():
    """
    Run a test without compiled code from the tests before it, and leave none behind.

    Dynamo's recompile limit is per function: compiled code left over from other tests would
    count against it. Modules that compile take it for every test
    (``pytestmark = pytest.mark.usefixtures('fresh_dynamo')``).
    """
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
