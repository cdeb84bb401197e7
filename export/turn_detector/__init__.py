"""Smart Turn v3.2, the end-of-turn model, taken from the pipecat-ai wheel."""
