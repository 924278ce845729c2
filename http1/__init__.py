"""What every HTTP server we write shares: request heads read within limits, header and idle
timeouts, the connection cap, and API-key checks.

A leaf package: it imports only `core` and the standard library (plus httptools), and both
the coordinator and the builtin engine (which never import each other) import it; so does
the controller for its key check.
"""
