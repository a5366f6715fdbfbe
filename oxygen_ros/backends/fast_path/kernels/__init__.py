"""
Triton kernels of the model, imported only when selected (Triton is optional).

``paged_decode``: attention of a few new tokens per row over a context read in place from the
KV pool (decode steps, causal suffixes, the action tokens of denoise with RoPE on load).
``adarms``: the action expert's gated residual and adaRMS norm in one kernel.
``registration``: how their launchers become PyTorch operators. ``paged_attention.py``
decides where they run and imports them; nothing here imports Triton at package import.
"""
