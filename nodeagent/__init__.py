"""The node agent: registers a node, runs its start/stop commands, supervises engines, reports.

The builtin engine (a CPU simulator speaking the vLLM/SGLang HTTP protocol) lives in
`simengine` and runs as its own process.
"""
