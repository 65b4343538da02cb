"""Operator-side entry points: the `ppre` command (CLI, demo, local audits).

The parties themselves live in `tester_service` and `client_service`; this package
only wires them to a command line, as `docker-compose.yml` and an operator would.
"""
