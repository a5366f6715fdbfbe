"""
Every backend class implements ``interface.Backend``: each member, with the same signature.

``runtime_checkable`` alone only checks that names exist on an instance; here the classes are
read statically (no warm-up, no export): data members must be declared with the protocol's
annotation, properties must be properties, and methods must take the same parameters (names,
kinds, defaults and annotations) as the protocol's.
"""

import inspect

from oxygen_ros.backends.fast_path.backend import FastPathBackend
from oxygen_ros.backends.interface import Backend, WarmupReport
from oxygen_ros.backends.torch_backend import TorchBackend
from oxygen_ros.config import CAMERA_SLOTS, PrefixAttention
from oxygen_ros.model.lora import SuffixLoRA
from oxygen_ros.tools.tensorrt.tensorrt_backend import TensorRTBackend
import pytest

BACKENDS = [TorchBackend, FastPathBackend, TensorRTBackend]


def _parameters(function) -> list[tuple]:
    """Return what a caller relies on of each parameter (return annotation aside)."""
    return [(p.name, p.kind, p.default, p.annotation)
            for p in inspect.signature(function).parameters.values()]


def contract_violations(cls: type) -> list[str]:
    """Return how ``cls`` departs from ``Backend`` (empty: it implements it)."""
    declared = {}
    for base in reversed(cls.__mro__):
        declared.update(vars(base).get('__annotations__', {}))
    out = [f'{name}: not declared as {want!r}' for name, want in Backend.__annotations__.items()
           if declared.get(name) != want]
    for name, member in vars(Backend).items():
        if name.startswith('_'):
            continue
        got = inspect.getattr_static(cls, name, None)
        if isinstance(member, property):
            if not isinstance(got, property):
                out.append(f'{name}: not a property')
        elif inspect.isfunction(member):
            if not inspect.isfunction(got):
                out.append(f'{name}: not a method')
            elif _parameters(got) != _parameters(member):
                out.append(f'{name}: signature {inspect.signature(got)} is not '
                           f'{inspect.signature(member)}')
    return out


@pytest.mark.parametrize('cls', BACKENDS, ids=lambda c: c.__name__)
def test_every_backend_class_implements_the_protocol(cls):
    assert contract_violations(cls) == []


def test_the_check_finds_a_missing_member_and_a_changed_signature():
    class Drifted(TorchBackend):
        adapter: SuffixLoRA                       # no longer optional

        warmup_report = WarmupReport()            # a plain attribute, not a property

        def execute(self, plan, frames):          # another parameter name
            raise NotImplementedError

        def sharing_pool(self, offset: int):      # another parameter name
            raise NotImplementedError

    found = contract_violations(Drifted)
    assert [v.split(':')[0] for v in found] == ['adapter', 'warmup_report', 'execute',
                                                'sharing_pool']


def test_an_eager_backend_is_a_backend_at_run_time_and_reports_no_warmup(tiny_models):
    model = tiny_models(PrefixAttention.BIDIRECTIONAL, CAMERA_SLOTS[:1])
    backend = TorchBackend(model, 4, 16)
    assert isinstance(backend, Backend) and not isinstance(model, Backend)
    assert backend.source_model is model and backend.num_blocks == 4
    assert backend.warmup_report == WarmupReport(0.0, {}, {}, {}, None)
    shared = backend.sharing_pool(2)
    assert isinstance(shared, Backend) and shared.num_blocks == 2 and shared.cache is backend.cache
