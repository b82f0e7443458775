"""Benchmarks: this project against its reference, side by side in one run, and on any device.

    python -m experiments.bench.embed    # ViT-B/16 image embedding vs transformers (PyTorch)
    python -m experiments.bench.lora     # one rank-16 q/v LoRA step vs a torch LoRA
    python -m experiments.bench.ops      # the LoRA step's op groups one by one vs torch
    python -m experiments.bench.solve    # the closed-form sweep vs a numpy per-problem loop
    python -m experiments.bench.accel    # any backend: TFLOP/s and MFU (``--tiny``: seconds)

``common`` holds what every benchmark prints and how it times (the machine, the load,
alternating medians); ``flops`` the analytic FLOP counts. The figures: ``docs/benchmarks.md``.
"""
