"""The production path's stages on a GPU: each network in PyTorch CUDA inside a python-backend
model of the wheel's tritonserver, the turn's critical path chained by a BLS model whose
tensors stay in GPU memory (DLPack both ways, no host copy).

    python -m perf gpu-stages                     # needs torch with CUDA
    python -m perf.gpu_stages --device cpu --reps 2   # the same code path on a CPU (a check)
    python -m perf gpu-stages --sessions 1 2 4 8 16 32 64   # sessions per GPU

Prints, per stage: the network alone (CUDA events, batch 1 and 8) and the same network as a
Triton model called from BLS (request + DLPack + response), median and p95, and the sum of
the stages that lie between the end of speech and the first audio.

The networks are the served ones' architectures and shapes, in FP16 as the TensorRT engines
run, built from transformers' configs (configs.json, checked against the packaged models):
Whisper base's encoder and decoder step (`export.asr.modules`, the exported graph's own
code), SmolLM2-135M (transformers' LlamaForCausalLM), all-MiniLM-L6-v2 (BertModel), Smart
Turn (a Whisper-tiny encoder on 8 s) and a Piper-medium-sized VITS (VitsModel); lipsync
carries its committed weights. The others are randomly initialised: their weights (hundreds
of MB) do not travel to a lent GPU machine, and a kernel's time depends on the shapes, not
the values. Which served models the chain stands for is read from the repository's configs.

By job: networks.py (the networks, their examples and Triton tensors), timing.py (each
network alone), chain.py (the critical path and its models), served.py (the stage
repository, the server, the chain's figures), sessions.py (the sessions sweep), cli.py
(flags and report); stage_model.py and chain_model.py are the python-backend models.
"""
