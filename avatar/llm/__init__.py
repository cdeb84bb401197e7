"""Triton-free LLM stage: chat template and persona, tokenizer, sampling, streaming
sentence boundaries, sessions with bounded memory, prefix cache, batched decode scheduler."""
