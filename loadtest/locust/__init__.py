"""Locust load tests for Parley: users that speak over every public protocol, a step runner
and churn mode (`python -m loadtest.locust.run`), and a JSON + HTML report.

Only `locustfile.py`, `aio.py` and `users.py` import locust (and so gevent's monkey-patching);
the runner drives Locust in a child process, and the report builder is plain Python, so the
test suite and the runner never run patched.
"""
