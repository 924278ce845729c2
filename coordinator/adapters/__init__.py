"""P/D protocol adapters, one per engine protocol: vLLM handoff and SGLang bootstrap."""
