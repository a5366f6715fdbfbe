"""A fast-path step that fell back (to eager, step by step) is a WARN naming the step."""

from oxygen_ros.ros.diagnostics import EngineDiagnostics, Level, status_values

FALLBACKS = {'decode': 'parity gate failed: decode step: |compiled - eager| 0.5 > tolerance 0.1'}


def test_fallback_warns_when_inactive_and_active():
    diag = EngineDiagnostics('tiny')
    diag.set_fallbacks(FALLBACKS)
    diag.set_state('inactive', 0.0)
    status = diag.status(1.0, 10.0, 0.5)
    assert status.level == Level.WARN.octet
    assert status.message == \
        'inactive; fast-path step(s) fell back: decode (see "fallback: <step>")'
    assert status_values(status)['fallback: decode'] == FALLBACKS['decode']
    diag.set_state('active', 1.0)
    status = diag.status(1.1, 10.0, 0.5)
    assert status.level == Level.WARN.octet and 'fell back: decode (see' in status.message


def test_no_fallback_no_warning():
    diag = EngineDiagnostics('tiny')
    diag.set_fallbacks({})
    diag.set_state('inactive', 0.0)
    status = diag.status(1.0, 10.0, 0.5)
    assert status.level == Level.OK.octet
    assert not [k for k in status_values(status) if k.startswith('fallback')]
    diag.set_fallbacks(FALLBACKS)
    diag.reset('tiny', False)                      # configure again: forgotten
    assert diag.status(2.0, 10.0, 0.5).level == Level.OK.octet


def test_a_quantization_fallback_is_named_apart_from_the_compiled_steps():
    diag = EngineDiagnostics('tiny')
    reason = 'FP8 weights (scaled_mm kernel) refused by the action check: ...'
    diag.set_fallbacks({'quantization': reason})
    diag.quantization = 'none'
    diag.set_state('inactive', 0.0)
    status = diag.status(1.0, 10.0, 0.5)
    assert status.level == Level.WARN.octet
    assert status.message == 'inactive; quantization fell back (see "fallback: quantization")'
    assert status_values(status)['fallback: quantization'] == reason
    assert status_values(status)['quantization'] == 'none'
    diag.set_fallbacks({**FALLBACKS, 'quantization': reason})
    assert diag.status(2.0, 10.0, 0.5).message == (
        'inactive; fast-path step(s) fell back: decode (see "fallback: <step>"); quantization '
        'fell back (see "fallback: quantization")')
