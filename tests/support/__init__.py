"""What the test modules share besides fixtures (tests/conftest.py holds only fixtures and hooks).

pytest puts tests/ on sys.path, so a test module imports these as `support.<module>`; each
module is named for what it holds (docs/development.md lists them).
"""
