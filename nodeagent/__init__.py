"""The node agent: registers a node, runs its start/stop commands, supervises engines, reports.

The builtin engine (a CPU simulator speaking the vLLM/SGLang HTTP protocol) lives in
`nodeagent.builtin` and runs as its own process.
"""
