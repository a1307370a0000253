"""Support code for the tests: real children that are always reaped, real servers on free loopback ports,
sample programs and synthetic series. Fixtures live in `tests/conftest.py`; everything they and the tests
share is here, imported as `support.<module>` (pytest puts `tests/` on `sys.path`)."""
