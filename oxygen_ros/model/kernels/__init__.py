"""
Triton kernels of the model, imported only when selected (Triton is optional).

``paged_decode``: attention of a few new tokens per row over a context read in place from the
KV pool (decode steps and causal suffixes). ``model/paged_attention.py`` decides where it
runs and imports it; nothing here imports Triton at package import.
"""
