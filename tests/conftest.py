"""Settings for the whole suite.

Hypothesis's per-example deadline (200 ms by default) is a timing assertion: on a loaded 2-core
CI machine a property test failed with DeadlineExceeded while its property held. Speed is measured
in benchmarks/, not asserted in tests, so the deadline is off; examples stay bounded by their
strategies and each test's own timeout.
"""

from hypothesis import settings

settings.register_profile("tidemq", deadline=None)
settings.load_profile("tidemq")
