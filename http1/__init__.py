"""What every HTTP server we write shares: the HTTP/1.1 server core (`server`: one handler a
server, pipelining, back-pressure, a client's going away), request heads read within limits with
header and idle timeouts and the connection cap (`head`, `conn`), the wire format (`wire`),
API-key checks (`auth`) and the servers' connection metrics (`metrics`).

A leaf package: it imports only `core` and the standard library (plus httptools and
prometheus_client). The coordinator's `/v1` and management ports and the builtin engine's
ports (which never import each other) run on `server`; the controller uses `auth`.
"""
