"""The builtin engine: a CPU simulator speaking vLLM's and SGLang's HTTP protocol.

Started as its own process (`motor engine builtin --port P ...`); see `app.BuiltinEngine`.
"""
