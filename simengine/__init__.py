"""The builtin engine: a CPU simulator speaking vLLM's and SGLang's HTTP protocol.

Started as its own process (`python -m simengine --port P ...`, see `cli.py`); `app.BuiltinEngine`
owns one engine. Imports only `core` and `http1`.
"""
